"""Per-RPC monitoring: counts and time per provider and RPC, at the origin and at the target.

Steps follow Ramesh et al., SYMBIOSYS, Table III: origin total (call issued to result decoded) and,
at the target, handler time (handler entered to response queued). Each step is a ``Stat`` (count,
sum, min, max, in seconds).
"""

from __future__ import annotations

from typing import Any


class Stat:
    """Running count / sum / min / max of one measured step (seconds or bytes)."""

    __slots__ = ("count", "max", "min", "sum")

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.min = float("inf")
        self.max = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.sum += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def to_dict(self) -> dict[str, float]:
        return {
            "count": self.count,
            "sum": self.sum,
            "min": self.min if self.count else 0.0,
            "max": self.max,
            "mean": self.sum / self.count if self.count else 0.0,
        }


class RPCStats:
    """One RPC's statistics on one side (origin or target)."""

    __slots__ = ("bulk_bytes", "errors", "time")

    def __init__(self) -> None:
        self.time = Stat()
        self.errors = 0
        self.bulk_bytes = 0

    def to_dict(self) -> dict[str, Any]:
        return {"time_seconds": self.time.to_dict(), "errors": self.errors}


class Monitor:
    """All statistics of one engine. Keys are ``(provider_id, rpc_name)``."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.origin: dict[tuple[int, str], RPCStats] = {}
        self.target: dict[tuple[int, str], RPCStats] = {}
        self.bulk = {"pull": Stat(), "push": Stat(), "served_pull": Stat(), "served_push": Stat()}

    def origin_stats(self, key: tuple[int, str]) -> RPCStats:
        stats = self.origin.get(key)
        if stats is None:
            stats = self.origin[key] = RPCStats()
        return stats

    def target_stats(self, key: tuple[int, str]) -> RPCStats:
        stats = self.target.get(key)
        if stats is None:
            stats = self.target[key] = RPCStats()
        return stats

    def reset(self) -> None:
        self.origin.clear()
        self.target.clear()
        for stat in self.bulk.values():
            stat.__init__()  # type: ignore[misc]

    def to_dict(self) -> dict[str, Any]:
        def table(side: dict[tuple[int, str], RPCStats]) -> list[dict[str, Any]]:
            return [{"provider_id": pid, "rpc": name, **stats.to_dict()} for (pid, name), stats in sorted(side.items())]

        return {
            "enabled": self.enabled,
            "origin": table(self.origin),
            "target": table(self.target),
            "bulk_bytes": {k: v.to_dict() for k, v in self.bulk.items()},
        }
