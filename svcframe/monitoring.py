"""Monitoring: where every call's time goes, per callpath and peer, at low cost.

Source: Ramesh et al., SYMBIOSYS (papers/ramesh-symbiosys.txt), Table III (the steps of an RPC) and
section III (callpath ancestry); Margo's monitoring keys ("parent_rpc:parent_provider:rpc:provider").

Calls and errors are counted exactly. Step times and sizes are recorded for the first ``ALWAYS_TIMED``
calls of every callpath and then for one call in ``sample_every`` (Margo samples its statistics the same
way, ``statistics.sample_progress_every``); the histograms' ``count`` is the number of timed calls.

Steps recorded (nanoseconds), per key ``(side, parent_rpc_id, parent_provider_id, rpc_id, provider_id, peer)``:

* origin: ``total`` (call issued to result decoded; a call that waits for a new connection counts the wait,
  as its caller does: the time a handler spends in its nested calls), ``serialize`` (argument packed and framed);
* target: ``queue`` (request received to handler started), ``handler``, ``respond`` (result packed,
  framed and queued for sending);
* both: ``request_bytes``, ``response_bytes`` (body sizes).

Bulk transfers are recorded per direction and peer, every one (bytes and nanoseconds; ``calls`` counts transfers).

Cost: the hot path appends the raw values of one call to one list with a single ``extend`` (a list, not
an ``array('q')``: the array converts each value through argument parsing, about 5x the cost).
``fold()`` (on read, or when a buffer fills) turns them into count / sum / min / max and a log-linear
histogram (HdrHistogram's layout: 32 buckets per power of two, so a percentile is within 1/64 = 1.6% of the
value of its rank) without numpy: each step's values are sorted and bisected at the bucket bounds, loops
that run in C, at about the cost per value of numpy's vectorised fold with 4 buckets per power of two, and a
fraction of that per call at the default one call in 16 timed (``tools/fold_bench.py``).
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from itertools import pairwise, repeat
from typing import Any

ORIGIN_STEPS = ("total", "serialize", "request_bytes", "response_bytes")
TARGET_STEPS = ("queue", "handler", "respond", "request_bytes", "response_bytes")
BULK_STEPS = ("bytes", "duration")
TIME_STEPS = {"total", "serialize", "queue", "handler", "respond", "duration"}
#: Sub-buckets per power of two: a bucket spans 1/32 of its lower bound, its midpoint is within 1/64 of
#: any value in it.
SUB_BUCKETS = 32
FOLD_AT = 4096 * 5  # values buffered before folding (about 1.4 MB of small ints at most)
#: The first calls of every callpath are always timed; after that one call in ``sample_every``.
ALWAYS_TIMED = 64
#: Served-callpath records kept before callers' claimed parents share records (``Monitor.target_record``).
MAX_TARGET_RECORDS = 4096
#: The parent fields of a record that stands for many claimed parents (not a CRC-32 an RPC name can have:
#: -1 is no 32-bit unsigned value).
OTHER_PARENT = -1


def _bucket_bounds() -> list[int]:
    """The lower bound of every bucket: each integer below 64, then 32 equal steps in each power of two."""
    bounds = list(range(2 * SUB_BUCKETS))
    for exponent in range(6, 64):
        bounds.extend(range(1 << exponent, 1 << (exponent + 1), 1 << (exponent - 5)))
    return bounds


#: The lower bound of bucket ``i`` is ``BUCKET_BOUNDS[i]`` (increasing ints; 0 also holds negative values,
#: which no step produces; the last bucket ends at 2**64).
BUCKET_BOUNDS = _bucket_bounds()


def bucket_of(value: int) -> int:
    """The index of the bucket ``value`` falls in."""
    return max(bisect_right(BUCKET_BOUNDS, value) - 1, 0)


def bucket_value(index: int) -> float:
    """The middle of the integers a bucket holds (the value percentiles report for it)."""
    high = BUCKET_BOUNDS[index + 1] if index + 1 < len(BUCKET_BOUNDS) else 1 << 64
    return (BUCKET_BOUNDS[index] + high - 1) / 2


class Summary:
    """count / sum / min / max and a sparse histogram (bucket index -> count) of one step."""

    __slots__ = ("count", "hist", "max", "min", "sum")

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0
        self.min = 0
        self.max = 0
        self.hist: dict[int, int] = {}

    def add_many(self, values: list[int]) -> None:
        """Fold ``values`` in: sorted once (in C), the ends are the min and the max, and a bucket's count is
        the distance between the positions of its bounds (``bisect``, in C, once per bucket in the range)."""
        if not values:
            return
        ordered = sorted(values)
        lo, hi = ordered[0], ordered[-1]
        self.min = lo if self.count == 0 else min(self.min, lo)
        self.max = max(self.max, hi)
        self.count += len(ordered)
        self.sum += sum(ordered)
        first, last = bucket_of(lo), bucket_of(hi)
        cuts = [0, *map(bisect_left, repeat(ordered), BUCKET_BOUNDS[first + 1 : last + 1]), len(ordered)]
        hist = self.hist
        for index, (start, end) in enumerate(pairwise(cuts), first):
            if end > start:
                hist[index] = hist.get(index, 0) + end - start

    def percentile(self, q: float) -> float:
        """Approximate q-th percentile (0..100) from the histogram (bucket middle, clamped to min/max)."""
        return self.percentiles((q,))[0]

    def percentiles(self, qs: tuple[float, ...]) -> list[float]:
        """Several percentiles (ascending ``qs``) in one walk of the histogram."""
        if self.count == 0:
            return [0.0] * len(qs)
        ranks = [max(q / 100.0 * self.count, 1) for q in qs]
        out: list[float] = []
        cumulative = 0
        hist = self.hist
        for index in sorted(hist):
            cumulative += hist[index]
            while len(out) < len(ranks) and cumulative >= ranks[len(out)]:
                out.append(float(min(max(bucket_value(index), self.min), self.max)))
            if len(out) == len(ranks):
                break
        while len(out) < len(ranks):  # rounding: the last bucket holds the top ranks
            out.append(float(self.max))
        return out

    def to_dict(self, scale: float = 1.0) -> dict[str, float]:
        """Values multiplied by ``scale`` (1e-3 turns nanoseconds into microseconds)."""
        if self.count == 0:
            return {"count": 0, "sum": 0.0, "min": 0.0, "max": 0.0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
        p50, p90, p99 = self.percentiles((50, 90, 99))
        return {
            "count": self.count,
            "sum": self.sum * scale,
            "min": self.min * scale,
            "max": self.max * scale,
            "mean": self.sum / self.count * scale,
            "p50": p50 * scale,
            "p90": p90 * scale,
            "p99": p99 * scale,
        }


class Record:
    """One key's buffered samples and folded summaries."""

    def __init__(self, steps: tuple[str, ...]) -> None:
        self.steps = steps
        self.buffer: list[int] = []
        self.summaries = {s: Summary() for s in steps}
        self.calls = 0  # exact
        self.errors = 0  # exact
        self._shown: dict[str, Any] | None = None  # the last to_dict, while calls and errors are as then
        self._shown_at = (-1, -1)

    def reset(self) -> None:
        self.buffer = []
        self.summaries = {s: Summary() for s in self.steps}
        self.calls = 0
        self.errors = 0
        self._shown = None

    @property
    def empty(self) -> bool:
        return not self.calls and not self.buffer and not self.errors

    def fold(self) -> None:
        """Fold the buffered samples into the summaries, one step (a strided slice of the buffer) at a time."""
        if not self.buffer:
            return
        buffer, self.buffer = self.buffer, []
        width = len(self.steps)
        for i, step in enumerate(self.steps):
            self.summaries[step].add_many(buffer[i::width])

    def to_dict(self) -> dict[str, Any]:
        """The record's figures; kept until it changes, so reading the statistics of many idle callpaths and
        peers costs a lookup each (rebuilding every record on each read would hold the event loop)."""
        if self._shown is not None and not self.buffer and self._shown_at == (self.calls, self.errors):
            return self._shown
        self.fold()
        out: dict[str, Any] = {"calls": self.calls, "errors": self.errors}
        for step, summary in self.summaries.items():
            if step in TIME_STEPS:
                out[f"{step}_usec"] = summary.to_dict(1e-3)
            else:
                out[step] = summary.to_dict()
        self._shown, self._shown_at = out, (self.calls, self.errors)
        return out


class Monitor:
    """All statistics of one engine. ``enabled`` false makes every record call a no-op at the call site."""

    def __init__(self, enabled: bool = True, sample_every: int = 16) -> None:
        self.enabled = enabled
        self.sample_every = sample_every
        self.origin: dict[tuple[Any, ...], Record] = {}
        self.target: dict[tuple[Any, ...], Record] = {}
        self.bulk: dict[tuple[str, str], Record] = {}
        self.names: dict[int, str] = {}  # rpc id -> name, for every RPC this engine registered or called
        self.started = time.time()

    def origin_record(self, key: tuple[Any, ...]) -> Record:
        rec = self.origin.get(key)
        if rec is None:
            rec = self.origin[key] = Record(ORIGIN_STEPS)
        return rec

    def target_record(self, key: tuple[Any, ...]) -> Record:
        """The record of a served callpath. Its parent fields come from the caller's header (a claim): past
        MAX_TARGET_RECORDS records, new parents share one record per RPC, provider and peer (parent shown as
        "other"), and past twice that, one per RPC and provider (peer "other"): a peer claiming ever new
        parents must not make a record, and its memory, for each."""
        rec = self.target.get(key)
        if rec is None:
            table = self.target
            if len(table) >= MAX_TARGET_RECORDS:
                _, _, rpc, provider_id, peer = key
                key = (OTHER_PARENT, OTHER_PARENT, rpc, provider_id, peer)
                if key not in table and len(table) >= 2 * MAX_TARGET_RECORDS:
                    key = (OTHER_PARENT, OTHER_PARENT, rpc, provider_id, "other")
                rec = table.get(key)
            if rec is None:
                rec = table[key] = Record(TARGET_STEPS)
        return rec

    def record_bulk(self, direction: str, peer: str, nbytes: int, duration_ns: int) -> None:
        if not self.enabled:
            return
        key = (direction, peer)
        rec = self.bulk.get(key)
        if rec is None:
            rec = self.bulk[key] = Record(BULK_STEPS)
        rec.calls += 1  # transfers, exact (and every one is recorded: a record with calls is never empty)
        rec.buffer.extend((nbytes, duration_ns))

    def reset(self) -> None:
        """Zero every record in place (callers may hold references to them)."""
        for table in (self.origin, self.target, self.bulk):
            for rec in table.values():
                rec.reset()
        self.started = time.time()

    def _name(self, rpc: int) -> str:
        if rpc == OTHER_PARENT:
            return "other"
        return self.names.get(rpc, f"#{rpc:08x}") if rpc else ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready statistics: ``{"enabled", "since", "always_timed", "timing_sample_every", "names",
        "origin": [...], "target": [...], "bulk": [...]}``.

        ``calls`` and ``errors`` are exact; each step's ``count`` is the number of timed calls (the first
        ``always_timed`` of a callpath, then one in ``timing_sample_every``). Each origin/target row names its
        callpath (``parent_rpc``, ``parent_provider_id``, ``rpc``, ``provider_id``; the parent is empty for a
        call made outside any handler), its ``peer``, and every step as count/sum/min/max/mean/p50/p90/p99
        (times in µs, sizes in bytes).
        """

        def rows(table: dict[tuple[Any, ...], Record]) -> list[dict[str, Any]]:
            out = []
            for (parent_rpc, parent_provider, rpc, provider_id, peer), rec in list(table.items()):
                if rec.empty:
                    continue
                out.append(
                    {
                        "parent_rpc": self._name(parent_rpc),
                        "parent_provider_id": parent_provider if parent_rpc and parent_rpc != OTHER_PARENT else None,
                        "rpc": self._name(rpc),
                        "provider_id": provider_id,
                        "peer": peer,
                        **rec.to_dict(),
                    }
                )
            return out

        return {
            "enabled": self.enabled,
            "since": self.started,
            "always_timed": ALWAYS_TIMED,
            "timing_sample_every": self.sample_every,
            "names": {f"{k:08x}": v for k, v in self.names.items()},
            "origin": rows(self.origin),
            "target": rows(self.target),
            "bulk": [
                {"direction": d, "peer": p, **rec.to_dict()}
                for (d, p), rec in sorted(self.bulk.items())
                if not rec.empty
            ],
        }


class ProcessSampler:
    """Samples the process beside the statistics every ``interval_seconds``: event-loop lag, tasks
    pending, calls in flight, CPU utilisation and RSS (psutil). Keeps the last ``keep`` samples.

    Loop lag is how late the sampler's own timer fired (seconds): a loop blocked by a slow callback
    shows it directly.
    """

    def __init__(self, interval_seconds: float = 1.0, keep: int = 600) -> None:
        from collections import deque

        import psutil

        self.interval_seconds = interval_seconds
        self.samples: deque[dict[str, float]] = deque(maxlen=keep)
        self._proc = psutil.Process()
        self._handle: Any = None
        self._loop: Any = None
        self._inflight: Any = None
        self._due = 0.0
        self._cpu = 0.0
        self._wall = 0.0

    def start(self, loop: Any, inflight: Any) -> None:
        """Begin sampling on ``loop``; ``inflight()`` returns the number of operations in flight."""
        self._loop, self._inflight = loop, inflight
        self._cpu, self._wall = self._cpu_seconds(), time.monotonic()
        self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _cpu_seconds(self) -> float:
        t = self._proc.cpu_times()
        return t.user + t.system

    def _schedule(self) -> None:
        self._due = self._loop.time() + self.interval_seconds
        self._handle = self._loop.call_at(self._due, self._sample)

    def _sample(self) -> None:
        import asyncio

        now = self._loop.time()
        cpu, wall = self._cpu_seconds(), time.monotonic()
        self.samples.append(
            {
                "time": time.time(),
                "loop_lag_seconds": max(0.0, now - self._due),
                "tasks": len(asyncio.all_tasks(self._loop)),
                "inflight": self._inflight(),
                "cpu_utilization": (cpu - self._cpu) / (wall - self._wall) if wall > self._wall else 0.0,
                "rss_bytes": self._proc.memory_info().rss,
            }
        )
        self._cpu, self._wall = cpu, wall
        self._schedule()


def to_prometheus(stats: dict[str, Any], labels: dict[str, str] | None = None) -> bytes:
    """Engine statistics (``Engine.statistics()``) in the Prometheus text exposition format; one server.
    See ``to_prometheus_many``."""
    return to_prometheus_many([(dict(labels or {}), stats)])


def to_prometheus_many(servers: list[tuple[dict[str, str], dict[str, Any]]]) -> bytes:
    """The statistics of several servers as one valid exposition: each metric name has one HELP and one
    TYPE line, and each server's series carry its labels (e.g. ``{"server": ADDRESS}``).

    Names follow Prometheus conventions (base units, ``_total`` counters, ``_seconds``, ``_bytes``).
    Latency steps become summaries in seconds, payload sizes summaries in bytes; both are *sampled* (one
    call in ``timing_sample_every`` is timed), so their ``_count`` is the timed calls, while
    ``svcframe_rpc_calls_total`` counts every call. Labels: side, rpc, provider_id, parent_rpc; never
    request ids or peers' ports (low cardinality).
    """
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

    extra = sorted({k for labels, _ in servers for k in labels})

    class _Collector:
        def collect(self) -> Any:
            names = ["side", "rpc", "provider_id", "parent_rpc", *extra]
            steps: dict[str, SummaryMetricFamily] = {}
            errors = CounterMetricFamily(
                "svcframe_rpc_errors", "RPCs that ended in an error (exact, dropped at the deadline included)",
                labels=names,
            )  # fmt: skip
            calls = CounterMetricFamily("svcframe_rpc_calls", "RPCs (exact; step summaries are sampled)", labels=names)
            gauges = {
                key: (CounterMetricFamily if key != "connections" else GaugeMetricFamily)(
                    f"svcframe_progress_{key}" if key != "connections" else "svcframe_connections",
                    f"progress loop {key}" if key != "connections" else "open connections",
                    labels=extra,
                )
                for key in ("polls", "blocks", "wakeups", "contended", "connections")
            }
            for labels, stats in servers:
                base = [labels.get(k, "") for k in extra]
                rpcs = stats.get("rpcs", {})
                # one series per label set: rows of the same callpath from different peers are summed
                merged: dict[tuple[str, ...], dict[str, list[float]]] = {}
                for side in ("origin", "target"):
                    for row in rpcs.get(side, []):
                        values = (side, row["rpc"], str(row["provider_id"]), row["parent_rpc"], *base)
                        acc = merged.setdefault(values, {"errors": [0.0, 0.0], "calls": [0.0, 0.0]})
                        acc["errors"][0] += row["errors"]
                        acc["calls"][0] += row["calls"]
                        for key, summary in row.items():
                            if isinstance(summary, dict) and "count" in summary:
                                pair = acc.setdefault(key, [0.0, 0.0])
                                pair[0] += summary["count"]
                                pair[1] += summary["sum"]
                for values, acc in merged.items():
                    errors.add_metric(list(values), acc.pop("errors")[0])
                    calls.add_metric(list(values), acc.pop("calls")[0])
                    for key, (count, total) in acc.items():
                        is_time = key.endswith("_usec")
                        stem = key.removesuffix("_usec").removesuffix("_bytes")
                        name = f"svcframe_rpc_{stem}_{'seconds' if is_time else 'bytes'}"
                        family = steps.get(name)
                        if family is None:
                            what = f"time of the RPC step {stem}" if is_time else f"RPC {stem} size"
                            family = steps[name] = SummaryMetricFamily(
                                name, f"{what} (sampled: one call in timing_sample_every)", labels=names
                            )
                        family.add_metric(list(values), int(count), total * (1e-6 if is_time else 1.0))
                progress = stats.get("progress", {})
                for key, gauge in gauges.items():
                    value = stats.get("connections", 0) if key == "connections" else progress.get(key, 0)
                    gauge.add_metric(base, value)
            yield from steps.values()
            yield errors
            yield calls
            yield from gauges.values()

    registry = CollectorRegistry()
    registry.register(_Collector())
    return generate_latest(registry)
