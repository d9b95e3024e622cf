"""Interpretation of engine statistics: which callpaths dominate, and where their time goes.

SYMBIOSYS (papers/ramesh-symbiosys.txt, sections IV-V) shows that per-callpath step breakdowns are what
makes a composed service tunable; this module turns them into a short diagnosis with the setting that
usually helps.

How time is estimated. Calls are counted exactly; step times are sampled (``svcframe.monitoring``: the first
``always_timed`` calls of a callpath, then one in ``timing_sample_every``). A callpath's time in a step is
therefore its *exact call count x the sampled mean* of that step: callpaths sampled at different rates (a
busy ``work`` RPC and a single ``statistics`` call) compare fairly, and shares never mix sampled with
unsampled sums. Bulk transfers are recorded for every transfer (exact), per peer; a peer's bulk time is
counted inside the handler time of that peer's busiest callpath on this server (the handler that awaited it).

What is shown. Target-side callpaths are merged over their peers (the peers are named); calls to the admin
provider (``admin_provider_id`` in the admin ``statistics`` result: the tools' own ``statistics`` calls,
configuration queries) are left out of the shares and listed apart. Parent RPCs are named from the
``names`` tables of the statistics given (a parent that ran in another process is named by that process).

Steps and advice:

* ``queue`` (requests wait before their handler runs): the server is saturated: add server processes;
* ``handler``: the provider's own work; a sync handler that waits should become async, an async one is told
  what it awaits;
* ``nested``: an async handler waiting for the calls it makes: diagnose the servers those calls go to;
* ``bulk``: transfers of bulk data: the network and memory bandwidth are the limit (the bandwidth roofline);
* ``respond`` (serialising and framing results): return large data by bulk transfer;
* ``overhead``: every step is short: the runtime's per-call cost; batch work into fewer calls;
* origin side: ``serialize`` (large inline arguments: use bulk handles) or ``network`` (waiting on the peer).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .units import quantity

ADVICE = {
    "queue": "requests wait before their handler runs: the server is saturated; add server processes "
    "(a higher service ratio) or move blocking work off the event loop",
    "handler_sync": "a sync handler holds the event loop while it runs: if it waits on I/O, make it async or move "
    "the blocking work to a thread; otherwise optimise the provider's work",
    "handler_async": "the async handler's own work and awaits (not calls it makes): optimise that work, or "
    "what it awaits (storage, locks, executors)",
    "handler": "time is spent in the handler itself: optimise the provider's work; if it waits on I/O, make it async",
    "nested": "the handler waits for the RPCs it makes: diagnose the servers they go to (their callpaths are "
    "named after this RPC there)",
    "bulk": "bulk transfers take the handler's time: bandwidth is the limit; compare with the bandwidth roofline "
    "(svcframe roofline collect); larger transfers amortise the per-transfer cost, more server processes help "
    "only until the network or memory bandwidth is saturated",
    "respond": "packing and queueing results dominates: if results are large, return them through a bulk transfer",
    "overhead": "every step is short: the call costs what the runtime does per call (framing, event loop); "
    "batch work into fewer, larger calls if the rate matters",
    "serialize": "serialising arguments is expensive: send large data as a bulk handle instead of inline",
    "network": "most of the round trip is outside this process: the network or the server it calls; "
    "see that server's target-side diagnosis",
}
INLINE_LARGE_BYTES = 64 * 1024
#: Below this mean time per call (µs) on the target, no single step is worth tuning.
SHORT_CALL_USEC = 20.0
#: Callpaths under this share of their side's time are not reported.
MIN_SHARE = 0.01
#: Bulk directions this process initiated (their durations are measured; ``served_*`` are the owner's side).
TIMED_BULK = ("pull", "push", "cma_pull", "cma_push")
TARGET_STEPS = ("queue", "handler", "respond")


#: The exact counters of a statistics row, and of the progress loop, a window subtracts.
_ROW_COUNTERS = ("calls", "errors")
_PROGRESS_COUNTERS = ("polls", "blocks", "wakeups", "contended")


def window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The statistics of what happened between two reads of the same engine's statistics (``Engine.statistics()``
    or the admin ``statistics`` RPC), without resetting them: how a tool measures a live service and leaves its
    statistics, Prometheus counters and monitor rates as its users see them.

    Per callpath and peer (and per bulk direction and peer): ``calls`` and ``errors`` are the differences (exact);
    each step keeps ``count``, ``sum`` and ``mean`` over the window (the timed calls of the window: differences of
    the two reads' counts and sums); the percentiles, ``min`` and ``max`` of a window cannot be told from two
    summaries, so a step of the window has none. Rows with no call and no error in the window are left out. The
    progress loop's counters are differences too. Everything else (``handlers``, ``admin_provider_id``, names)
    is the later read's.

    If the statistics were reset between the reads (``rpcs.since`` differs), everything the later read holds
    happened in the window: it is returned as it is, with ``window.reset`` true.

    Returns:
        a statistics document :func:`diagnose` reads, with ``window``: ``{"from", "to", "reset"}`` (the reads'
        ``time`` of their last process sample when known, else None).
    """
    rpcs_a, rpcs_b = after.get("rpcs") or {}, before.get("rpcs") or {}
    reset = rpcs_a.get("since") != rpcs_b.get("since")
    out = {**after, "window": {"reset": reset}}
    if reset:
        return out

    def identity(row: dict[str, Any]) -> tuple[Any, ...]:
        if "direction" in row:
            return (row["direction"], row["peer"])
        return (row["parent_rpc"], row["parent_provider_id"], row["rpc"], row["provider_id"], row["peer"])

    def difference(new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any] | None:
        row: dict[str, Any] = {}
        for key, value in new.items():
            old_value = old.get(key) if old is not None else None
            if key in _ROW_COUNTERS:
                row[key] = value - (old_value or 0)
            elif isinstance(value, dict) and "count" in value:
                count = value["count"] - (old_value or {}).get("count", 0)
                total = value["sum"] - (old_value or {}).get("sum", 0.0)
                row[key] = {"count": count, "sum": total, "mean": total / count if count > 0 else 0.0}
            else:
                row[key] = value
        return row if row.get("calls", 0) > 0 or row.get("errors", 0) > 0 else None

    rpcs = dict(rpcs_a)
    for table in ("origin", "target", "bulk"):
        old_rows = {identity(r): r for r in rpcs_b.get(table) or []}
        rows = (difference(r, old_rows.get(identity(r))) for r in rpcs_a.get(table) or [])
        rpcs[table] = [r for r in rows if r is not None]
    out["rpcs"] = rpcs
    progress_a, progress_b = after.get("progress"), before.get("progress")
    if isinstance(progress_a, dict) and isinstance(progress_b, dict):
        out["progress"] = {
            **progress_a, **{k: progress_a[k] - progress_b.get(k, 0) for k in _PROGRESS_COUNTERS if k in progress_a}
        }  # fmt: skip
    return out


def rpc_names(*stats: dict[str, Any]) -> dict[str, str]:
    """The RPC names (``{"%08x" id: name}``) known to any of these statistics documents."""
    names: dict[str, str] = {}
    for st in stats:
        names.update(st.get("rpcs", {}).get("names", {}))
    return names


def unnamed_parents(stats: dict[str, Any], names: dict[str, str]) -> dict[str, set[str]]:
    """Parent RPCs ``names`` cannot name, by the peer that made the call: ``{peer: {"#%08x", ...}}``."""
    out: dict[str, set[str]] = defaultdict(set)
    for row in stats.get("rpcs", {}).get("target", []):
        parent = row.get("parent_rpc") or ""
        if parent.startswith("#") and parent[1:] not in names:
            out[row["peer"]].add(parent)
    return dict(out)


def _name(rpc: str, names: dict[str, str]) -> str:
    return names.get(rpc[1:], rpc) if rpc.startswith("#") else rpc


def _callpath(row: dict[str, Any], names: dict[str, str]) -> str:
    parent = f"{_name(row['parent_rpc'], names)}[{row['parent_provider_id']}] -> " if row.get("parent_rpc") else ""
    return f"{parent}{_name(row['rpc'], names)}[{row['provider_id']}]"


def _mean(row: dict[str, Any], key: str) -> float:
    return float(row.get(key, {}).get("mean", 0.0))


def _typical(row: dict[str, Any], key: str) -> float:
    """A step's median, or its mean where the statistics have no percentiles (a :func:`window`)."""
    summary = row.get(key, {})
    return float(summary["p50"] if "p50" in summary else summary.get("mean", 0.0))


def diagnose(stats: dict[str, Any], top: int = 3, *, names: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``top`` callpaths by time on each side, the step their time goes to, and what helps.

    Args:
        stats: ``Engine.statistics()`` or the admin ``statistics`` RPC's result (which adds
            ``admin_provider_id`` and ``handlers``: whether each RPC's handler is async).
        names: more RPC names (``{"%08x": name}``), e.g. those of other servers (see ``rpc_names``).

    Returns:
        ``{"method", "findings": [{"side", "callpath", "peers", "calls", "errors", "time_seconds", "share",
        "mean_usec", "dominant_step", "step_shares", "advice"}, ...], "excluded": [{"callpath", "calls"}]}``;
        ``calls`` exact, ``time_seconds`` = calls x sampled mean (module docstring), ``share`` the callpath's
        fraction of its side's time, ``step_shares`` fractions of the callpath's time.
    """
    rpcs = stats.get("rpcs", {})
    names = {**rpc_names(stats), **(names or {})}
    admin_id = stats.get("admin_provider_id")
    kinds = {(h["rpc"], h["provider_id"]): h["async"] for h in stats.get("handlers", [])}
    every = rpcs.get("timing_sample_every")
    method = "time = exact calls x sampled mean per step" + (
        f" (the first {rpcs.get('always_timed')} calls of a callpath timed, then one in {every})" if every else ""
    )
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    excluded: dict[str, int] = defaultdict(int)
    for row in rpcs.get("target", []):
        label = _callpath(row, names)
        if admin_id is not None and row["provider_id"] == admin_id:
            excluded[label] += row["calls"]
            continue
        key = (row["parent_rpc"], row["parent_provider_id"], row["rpc"], row["provider_id"])
        g = groups.setdefault(key, {"callpath": label, "row": row, "peers": [], "calls": 0, "errors": 0,
                                    "steps": dict.fromkeys(TARGET_STEPS, 0.0), "bulk": 0.0})  # fmt: skip
        g["peers"].append(row["peer"])
        g["calls"] += row["calls"]
        g["errors"] += row["errors"]
        for step in TARGET_STEPS:
            g["steps"][step] += row["calls"] * _mean(row, f"{step}_usec")
    _attribute_bulk(rpcs.get("bulk", []), groups)
    nested = _nested_time(rpcs.get("origin", []))
    all_time = sum(sum(g["steps"].values()) for g in groups.values()) or 1.0
    findings: list[dict[str, Any]] = []
    for g in sorted(groups.values(), key=lambda g: -sum(g["steps"].values())):
        total = sum(g["steps"].values())
        if len(findings) >= top or total / all_time < MIN_SHARE:
            break
        row = g["row"]
        handler = g["steps"]["handler"]
        bulk = min(g["bulk"], handler)
        waits = min(nested.get((row["rpc"], row["provider_id"]), 0.0), handler - bulk)
        shares = {"queue": g["steps"]["queue"], "handler": handler - bulk - waits, "nested": waits, "bulk": bulk,
                  "respond": g["steps"]["respond"]}  # fmt: skip
        shares = {k: v / total for k, v in shares.items() if v or k in TARGET_STEPS}
        dominant = max(shares, key=shares.__getitem__)
        if total / max(g["calls"], 1) < SHORT_CALL_USEC:
            dominant = "overhead"
        advice = ADVICE[dominant]
        if dominant == "handler":
            kind = kinds.get((_name(row["rpc"], names), row["provider_id"]))
            advice = ADVICE["handler" if kind is None else "handler_async" if kind else "handler_sync"]
        if dominant != "bulk" and _typical(row, "response_bytes") > INLINE_LARGE_BYTES:
            advice += "; responses are large (over 64 KiB): use bulk transfers"
        findings.append(_finding("target", g, total, all_time, dominant, shares, advice))
    origin: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rpcs.get("origin", []):
        key = (row["parent_rpc"], row["parent_provider_id"], row["rpc"], row["provider_id"])
        g = origin.setdefault(key, {"callpath": _callpath(row, names), "row": row, "peers": [], "calls": 0,
                                    "errors": 0, "steps": {"serialize": 0.0, "total": 0.0}})  # fmt: skip
        g["peers"].append(row["peer"])
        g["calls"] += row["calls"]
        g["errors"] += row["errors"]
        g["steps"]["serialize"] += row["calls"] * _mean(row, "serialize_usec")
        g["steps"]["total"] += row["calls"] * _mean(row, "total_usec")
    all_origin = sum(g["steps"]["total"] for g in origin.values()) or 1.0
    for g in sorted(origin.values(), key=lambda g: -g["steps"]["total"])[:top]:
        total = g["steps"]["total"]
        if total / all_origin < MIN_SHARE:
            break
        ser = g["steps"]["serialize"] / total if total else 0.0
        large = _typical(g["row"], "request_bytes") > INLINE_LARGE_BYTES
        dominant = "serialize" if ser > 0.3 or large else "network"
        shares = {"serialize": ser, "network": 1.0 - ser}
        findings.append(_finding("origin", g, total, all_origin, dominant, shares, ADVICE[dominant]))
    return {
        "method": method,
        "findings": findings,
        "excluded": [{"callpath": k, "calls": v} for k, v in sorted(excluded.items())],
    }


def _attribute_bulk(bulk_rows: list[dict[str, Any]], groups: dict[tuple[Any, ...], dict[str, Any]]) -> None:
    """Add each peer's bulk transfer time (µs, every transfer recorded) to the callpath from that peer with
    the most handler time: the handler that awaited the transfers."""
    per_peer: dict[str, float] = defaultdict(float)
    for b in bulk_rows:
        if b["direction"] in TIMED_BULK:
            per_peer[b["peer"]] += b["duration_usec"]["sum"]
    for peer, usec in per_peer.items():
        candidates = [g for g in groups.values() if peer in g["peers"]]
        if candidates:
            max(candidates, key=lambda g: g["steps"]["handler"])["bulk"] += usec


def _nested_time(origin_rows: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """Time (µs, calls x sampled mean round trip) of the calls each RPC's handlers made, by (rpc, provider)."""
    out: dict[tuple[str, int], float] = defaultdict(float)
    for row in origin_rows:
        if row.get("parent_rpc"):
            out[(row["parent_rpc"], row["parent_provider_id"])] += row["calls"] * _mean(row, "total_usec")
    return out


def _finding(
    side: str, g: dict[str, Any], total: float, all_time: float, dominant: str, shares: dict[str, float], advice: str
) -> dict[str, Any]:
    return {
        "side": side, "callpath": g["callpath"], "peers": sorted(set(g["peers"])), "calls": g["calls"],
        "errors": g["errors"], "time_seconds": total * 1e-6, "share": total / all_time,
        "mean_usec": total / max(g["calls"], 1), "dominant_step": dominant, "step_shares": shares, "advice": advice,
    }  # fmt: skip


def _calls(n: int) -> str:
    return f"{n:,} call{'' if n == 1 else 's'}"


def format_diagnosis(diagnosis: dict[str, Any]) -> str:
    """Human-readable lines: one per finding, then the method and what was left out."""
    lines = []
    for f in diagnosis["findings"]:
        steps = ", ".join(f"{k} {v:.0%}" for k, v in f["step_shares"].items())
        peers = f["peers"]
        where = f"from {peers[0]}" if len(peers) == 1 else f"from {len(peers)} peers ({', '.join(peers)})"
        if f["side"] == "origin":
            where = "to " + where.removeprefix("from ")
        errors = f", {f['errors']:,} errors" if f["errors"] else ""
        lines.append(
            f"{f['side']}: {f['callpath']} {where}: {f['calls']:,} calls{errors}, {f['share']:.0%} of "
            f"{f['side']} time, {quantity(f['mean_usec'], 'usec')} per call ({steps}): {f['dominant_step']} dominates: "
            f"{f['advice']}"
        )
    if not lines:
        lines.append("no calls recorded")
    lines.append(f"({diagnosis['method']})")
    if diagnosis["excluded"]:
        left = ", ".join(f"{e['callpath']} {_calls(e['calls'])}" for e in diagnosis["excluded"])
        lines.append(f"(not counted: admin provider calls, such as this tool's own: {left})")
    return "\n".join(lines)
