"""The self-test driver (Quintain's ``quintain-benchmark``): many client processes against a live service.

``run_selftest(params, servers)`` starts ``params.clients`` client processes (``spawn`` context, each
with its own engine and event loop). Client *i* talks to ``servers[i % S]`` and keeps ``depth`` calls
outstanding (1 = synchronous, like Quintain). The sequence:

1. every client connects and performs ``warmup_iterations`` calls, then waits at a barrier;
2. the driver samples every server's CPU time (``stat`` RPC) and reads its statistics (admin ``statistics``),
   then the barrier releases everyone;
3. each client runs its timed loop for ``duration_seconds`` and measures its own elapsed time;
4. the driver samples server CPU and reads the statistics again, and merges everything into ONE results document.

Measuring a live service changes nothing its users see: the driver keeps its own counts (each client counts its
calls) and diagnoses the difference of its two statistics reads; it never resets the service's statistics, so
their Prometheus counters and ``svcframe monitor``'s rates go on as before. The service's statistics count the
self-test's calls as any client's: its warm-up calls and its timed ones (``aggregate.warmup_ops`` and ``ops``).

Workloads: ``noop`` (the ``work`` RPC with request/response buffers), ``bulk`` (``work`` with a bulk pull or
push of ``bulk_size`` bytes), ``storage`` (the ``storage`` RPC: the server writes or reads
``storage_block_size`` bytes at a random offset of a file on its own disk; ``selftest/provider.py``) and
``rpc`` (any provider's RPC, ``rpc``, with a JSON argument or a generator's; ``selftest/rpc_workload.py``:
the results then hold ``rpc``, the RPC resolved and its measured bytes per call).
``selftest/pool.py`` runs the same sequence on client processes started once for many runs.

Rates divide by the measured elapsed time, never by the nominal duration (quintain-benchmark uses the latter). Server CPU
is sampled on every server (Quintain only sampled the first). Utilisation is CPU seconds over wall seconds, a
fraction of one core per process: each server's over the driver's two samples, each client's over its timed
loop. Demand is what a process wanted of a core, ``(run + runqueue wait) / wall`` from the kernel's scheduler
statistics (``selftest.provider.scheduler_seconds``; None where it keeps none): a process that used 15% of a
core while waiting for it 70% of the time was starved by other processes, not idle. A server no client called
(fewer clients than servers) served nothing: ``servers_serving`` counts the others, and the rate, utilisation
and demand per server are over them.

Results document (``to_json``)::

    {"parameters": {...every parameter, defaults filled...},
     "servers": [{"address", "pid", "progress_mode", "cpu_seconds", "cpu_user_seconds", "cpu_system_seconds",
                  "utilization", "run_seconds", "runqueue_wait_seconds", "demand", "clients",
                  "rate_ops_per_second", "max_rss_bytes"}...],
     "server_config": {...live config of server 0...},
     "environment": {"host", "cores", "python", "svcframe", "uvloop", "msgpack", "platform", "cpu_model"},
     "clients": [{"rank", "server", "ops", "elapsed_seconds", "rate_ops_per_second", "latency_usec": {...},
                  "cpu_seconds", "cpu_user_seconds", "cpu_system_seconds", "utilization", "run_seconds",
                  "runqueue_wait_seconds", "demand", "progress_mode",
                  "timeline": [...],
                  "sample_trace": [[start_seconds, latency_seconds], ...] (trace_samples) or null}...],
     "progress_modes": {"client": MODE, "servers": {ADDRESS: MODE}},
     "aggregate": {"ops", "warmup_ops", "rate_ops_per_second", "rate_per_client_ops_per_second",
                   "servers_serving", "rate_per_server_ops_per_second", "bandwidth_bytes_per_second",
                   "bandwidth_gib_per_second", "latency_usec": {min, q1, p50, q3, p90, p99, max, mean},
                   "server_cpu_seconds", "server_cpu_usec_per_op", "server_utilization", "server_demand",
                   "server_run_seconds", "server_runqueue_wait_seconds", "client_cpu_seconds", "client_utilization", "client_demand",
                   "client_run_seconds", "client_runqueue_wait_seconds", "elapsed_seconds",
                   "server_cpu_user_seconds", "server_cpu_system_seconds", "client_cpu_user_seconds",
                   "client_cpu_system_seconds"},
     "rpc": {"provider_id", "name", "provider", "type", "requested", "calls", "sampled_calls",
             "request_bytes_per_call", "response_bytes_per_call", "bulk_bytes_per_call", "bytes_per_call"}
            (the rpc workload only; each client row then has its "rpc_sizes"),
     "diagnosis": {ADDRESS: svcframe.diagnosis.diagnose(...) of the timed loop's window}}

``sample_trace`` (``trace_samples``: Quintain's ``trace``, bounded) holds each client's first N timed calls,
their start relative to the client's timed loop and their latency, in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import platform
import socket
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from svcframe.errors import SvcframeError
from svcframe.settings import EventLoop, OneOf, ProgressMode

from .provider import DIRECTIONS, STORAGE_OPS, scheduler_seconds, work_arg

#: The self-test's workloads (Quintain's, and storage, the future work of Carns et al. 2025 §4.3): ``noop``
#: calls ``work`` with request/response payloads only, ``bulk`` adds a bulk pull or push of ``bulk_size`` bytes,
#: ``storage`` calls ``storage`` (server-local disk I/O of ``storage_block_size`` bytes), ``rpc`` calls any
#: provider's RPC (a service's own workload, ``selftest/rpc_workload.py``).
WORKLOADS = ("noop", "bulk", "storage", "rpc")


class SelftestError(SvcframeError):
    """The self-test could not run (a client failed, a barrier timed out, a server is unreachable)."""


class SelftestParams(BaseModel):
    """Workload parameters (Quintain's names where it has them)."""

    model_config = ConfigDict(extra="forbid")

    workload: Annotated[str, OneOf(WORKLOADS)] = "noop"
    provider_id: int = Field(1, ge=0, le=65535, description="self-test provider id on the servers")
    duration_seconds: float = Field(2.0, gt=0)
    warmup_iterations: int = Field(10, ge=0)
    req_buffer_size: int = Field(128, ge=0)
    resp_buffer_size: int = Field(128, ge=0)
    bulk_size: int = Field(1024 * 1024, ge=0, description="bytes per op, bulk workload only")
    bulk_direction: Annotated[str, OneOf(DIRECTIONS)] = "pull"
    storage_op: Annotated[str, OneOf(STORAGE_OPS)] = Field(
        "write", description="storage workload: what the server does"
    )
    storage_block_size: int = Field(4096, gt=0, description="bytes per op, storage workload only")
    storage_fsync: bool = Field(False, description="storage workload: fdatasync after each write")
    clients: int = Field(1, ge=1)
    depth: int = Field(1, ge=1, description="outstanding calls per client")
    client_cores: list[int] | None = Field(None, description="pin client i to client_cores[i % len]")
    progress_mode: ProgressMode = "spindown"
    timeline_interval_seconds: float | None = Field(None, gt=0)
    timeout_seconds: float = Field(30.0, gt=0, description="deadline of each call")
    event_loop: EventLoop = "auto"
    trace_samples: int | None = Field(
        None, ge=1, description="per-sample trace: start and latency of each client's first N timed calls"
    )
    rpc: str | None = Field(
        None, description="rpc workload: PROVIDER_ID:NAME or PROVIDER_NAME:NAME (resolved through the admin provider)"
    )
    rpc_arg: Any = Field(None, description="rpc workload: the argument of every call (JSON)")
    rpc_arg_generator: str | None = Field(
        None, description="rpc workload: module:function(ctx, call) returning each call's argument"
    )
    rpc_arg_options: dict[str, Any] = Field(default_factory=dict, description="rpc workload: the generator's options")

    @model_validator(mode="after")
    def _rpc_fields(self) -> SelftestParams:
        if (self.workload == "rpc") != (self.rpc is not None):
            raise ValueError("the rpc workload needs rpc (PROVIDER:NAME), and rpc needs workload 'rpc'")
        if self.rpc_arg is not None and self.rpc_arg_generator is not None:
            raise ValueError("give rpc_arg or rpc_arg_generator, not both")
        if self.rpc_arg_options and self.rpc_arg_generator is None:
            raise ValueError("rpc_arg_options are options of rpc_arg_generator: give one")
        return self


#: Quintain's benchmark parameters that svcframe's self-test does not have, and the defaults quintain-benchmark
#: fills in (``parse_json`` in src/quintain-benchmark.c, mochi-quintain 96a74b1): a parameters file with one of the
#: first is Quintain's, and runs what quintain-benchmark would run on it.
#: Quintain's default provider id (1) is not filled in: the self-test provider is found where the servers host it,
#: as without a file (configs/kv.json hosts its kv store at 1, the self-test provider at 2).
QUINTAIN_ONLY = ("nranks", "trace", "use_server_poolset", "margo")
QUINTAIN_DEFAULTS = {"duration_seconds": 2, "req_buffer_size": 128, "resp_buffer_size": 128, "bulk_size": 16384,
                     "bulk_direction": "pull", "warmup_iterations": 10, "trace": True}  # fmt: skip
#: Quintain settings with no meaning here: the server's bulk buffer pool (svcframe exposes the client's buffer
#: and the server pulls into its own) and the client's Margo configuration.
QUINTAIN_IGNORED = ("use_server_poolset", "margo")
#: Calls per client a Quintain ``trace: true`` records (Quintain records every one, up to 32 Mi per rank).
QUINTAIN_TRACE_SAMPLES = 10_000


def quintain_params(values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Self-test parameters from a Quintain benchmark parameters file (``quintain-benchmark -j FILE``).

    A file with none of ``QUINTAIN_ONLY`` is returned as it is. Otherwise Quintain's defaults fill what it
    lacks (but the provider id: the self-test provider is found where it is), then: ``nranks`` -> ``clients``; ``bulk_size`` > 0 -> the ``bulk`` workload (0: ``noop``), unless the
    file names a ``workload``; ``trace`` -> ``trace_samples`` (``QUINTAIN_TRACE_SAMPLES`` per client);
    ``bulk_direction`` keeps its documented meaning (``pull``: the server reads from the client; Quintain's code
    inverts it). ``QUINTAIN_IGNORED`` keys are dropped.

    Returns:
        ``(parameters, ignored keys present in the file)``; the parameters are validated by ``SelftestParams``.
    """
    if not any(key in values for key in QUINTAIN_ONLY):
        return values, []
    out = {**QUINTAIN_DEFAULTS, **values}
    ignored = [key for key in QUINTAIN_IGNORED if key in values]
    for key in QUINTAIN_IGNORED:
        out.pop(key, None)
    if "nranks" in out:
        out["clients"] = out.pop("nranks")
    if out.pop("trace"):
        out.setdefault("trace_samples", QUINTAIN_TRACE_SAMPLES)
    if "workload" not in out and isinstance(out["bulk_size"], int):
        out["workload"] = "bulk" if out["bulk_size"] > 0 else "noop"
    return out, ignored


LAT_KEYS = ("min", "q1", "p50", "q3", "p90", "p99", "max", "mean")


def latency_summary(samples_usec: Any) -> dict[str, float]:
    """min / q1 / p50 / q3 / p90 / p99 / max / mean of latency samples (µs; q1 and q3 the 25th and 75th
    percentiles, Quintain's ``sample_stats`` quartiles); zeros for no samples."""
    import numpy as np

    a = np.asarray(samples_usec, dtype=float)
    if a.size == 0:
        return dict.fromkeys(LAT_KEYS, 0.0)
    q1, p50, q3, p90, p99 = np.percentile(a, [25, 50, 75, 90, 99])
    return {
        "min": float(a.min()),
        "q1": float(q1),
        "p50": float(p50),
        "q3": float(q3),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(a.max()),
        "mean": float(a.mean()),
    }


# -- the client process -----------------------------------------------------------------------------------
def _client_main(rank: int, server: str, params_json: str, barrier: Any, results: Any) -> None:
    params = SelftestParams.model_validate_json(params_json)
    if params.client_cores:
        os.sched_setaffinity(0, [params.client_cores[rank % len(params.client_cores)]])
    from svcframe.loops import run

    try:
        out = run(_client(rank, server, params, barrier), params.event_loop)
    except BaseException as exc:  # report, never hang the driver
        with contextlib.suppress(Exception):
            barrier.abort()
        results.put({"rank": rank, "error": _one_line(exc)})
        return
    results.put(out)


def _one_line(exc: BaseException) -> str:
    """An error as one line: a remote handler's error by its type and message, without the remote traceback."""
    from svcframe.errors import RemoteError

    if isinstance(exc, RemoteError):
        return f"remote {exc.remote_type}: {exc.remote_message}"
    return f"{type(exc).__name__}: {exc}"


async def _client(rank: int, server: str, params: SelftestParams, barrier: Any) -> dict[str, Any]:
    from svcframe.engine import Engine

    engine = Engine(None, progress_mode=params.progress_mode, default_timeout_seconds=params.timeout_seconds)
    await engine.start()
    loop = asyncio.get_running_loop()
    try:
        bulk = None
        buf = None
        direction = None
        if params.workload == "bulk":
            buf = bytearray(os.urandom(min(params.bulk_size, 4096)) * (params.bulk_size // 4096 + 1))[
                : params.bulk_size
            ]
            direction = params.bulk_direction
            bulk = engine.expose(buf, "r" if direction == "pull" else "w")
        arg = work_arg(params.resp_buffer_size, direction, bulk, bytes(params.req_buffer_size))
        rpc_name = "work"
        if params.workload == "storage":  # server-local disk I/O: no payload crosses the network
            rpc_name, arg = "storage", [params.storage_op, params.storage_block_size, params.storage_fsync]
        call = engine.call
        pid = params.provider_id
        next_arg = itertools.repeat(arg).__next__  # the same argument every call (a C call: no cost to speak of)
        if params.workload == "rpc":
            pid, rpc_name, next_arg = _rpc_calls(params, rank, engine)
        for _ in range(params.warmup_iterations):
            await call(server, rpc_name, next_arg(), provider_id=pid)
        await engine.connection(server)
        await loop.run_in_executor(None, barrier.wait, 120.0)  # warmed up; driver samples servers
        await loop.run_in_executor(None, barrier.wait, 120.0)  # go
        cpu0, sched0 = os.times(), scheduler_seconds()
        latencies = array("d")
        trace = array("d")  # start, latency of the first trace_samples calls (Quintain's sample_trace)
        trace_limit = 2 * (params.trace_samples or 0)
        interval = params.timeline_interval_seconds
        timeline: list[int] = []
        perf = time.perf_counter
        start = perf()
        end = start + params.duration_seconds

        async def worker() -> None:
            append = latencies.append
            while True:
                t0 = perf()
                if t0 >= end:
                    return
                await call(server, rpc_name, next_arg(), provider_id=pid)
                t1 = perf()
                append(t1 - t0)
                if len(trace) < trace_limit:
                    trace.extend((t0 - start, t1 - t0))
                if interval is not None:
                    slot = int((t1 - start) / interval)
                    while len(timeline) <= slot:
                        timeline.append(0)
                    timeline[slot] += 1

        if params.depth == 1:
            await worker()
        else:
            await asyncio.gather(*(worker() for _ in range(params.depth)))
        elapsed = perf() - start
        cpu1, sched1 = os.times(), scheduler_seconds()
        sizes = _rpc_sizes(engine, rpc_name, pid) if params.workload == "rpc" else None
    finally:
        await engine.close()
    ops = len(latencies)
    return {
        **({"rpc_sizes": sizes} if sizes is not None else {}),
        "rank": rank,
        "server": server,
        "ops": ops,
        "elapsed_seconds": elapsed,
        "rate_ops_per_second": ops / elapsed,
        "cpu_seconds": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
        "cpu_user_seconds": cpu1.user - cpu0.user,
        "cpu_system_seconds": cpu1.system - cpu0.system,
        "run_seconds": sched1[0] - sched0[0] if sched0 and sched1 else None,
        "runqueue_wait_seconds": sched1[1] - sched0[1] if sched0 and sched1 else None,
        "progress_mode": engine.progress.mode,
        "sample_trace": [trace[i : i + 2].tolist() for i in range(0, len(trace), 2)] if trace_limit else None,
        "latencies": latencies.tobytes(),
        "timeline": timeline if interval is not None else None,
    }


def _rpc_calls(params: SelftestParams, rank: int, engine: Any) -> tuple[int, str, Any]:
    """The rpc workload's (provider id, RPC name, next argument) in client ``rank`` (``params.rpc`` resolved to
    ``PROVIDER_ID:NAME`` by :func:`run_selftest`)."""
    from .rpc_workload import arguments, parse_rpc_spec

    provider, name = parse_rpc_spec(str(params.rpc))
    if not isinstance(provider, int):
        raise SelftestError(f"rpc {params.rpc!r} was not resolved to PROVIDER_ID:NAME before the clients started")
    return provider, name, arguments(params, rank, engine)


def _rpc_sizes(engine: Any, rpc_name: str, pid: int) -> dict[str, Any]:
    """This client's bytes per call of the rpc workload, from its engine's statistics."""
    from .rpc_workload import call_sizes

    return call_sizes(engine.statistics(), rpc_name, pid)


# -- the driver -------------------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    """Where the measurement ran: host, cores, software versions, CPU model."""
    from importlib.metadata import PackageNotFoundError, version

    import msgpack

    import svcframe
    from svcframe import compiled

    uv: str | None
    try:
        uv = version("uvloop")
    except PackageNotFoundError:
        uv = None
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "host": socket.gethostname(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "svcframe": svcframe.__version__,
        # the hot paths: compiled, or the same source interpreted (svcframe.compiled)
        "svcframe_build": compiled.build(),
        "uvloop": uv,
        "msgpack": ".".join(map(str, msgpack.version)),
        "time": time.time(),
    }


async def _server_stats(engine: Any, servers: list[str], provider_id: int) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(engine.call(s, "stat", None, provider_id=provider_id) for s in servers)))


def run_selftest(
    params: SelftestParams,
    servers: list[str],
    *,
    admin_provider_id: int = 0,
    on_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run one self-test against ``servers`` (addresses hosting the self-test provider).

    ``on_start()`` is called once every client is connected and warmed up, as the timed loop starts (progress
    display: what fails before it, a bad RPC or argument, is reported alone).

    Returns:
        the results document (see the module docstring).

    Raises:
        SelftestError: a client failed or timed out, or a server cannot be reached.
    """
    if not servers:
        raise SelftestError("no servers to test")
    from svcframe.engine import Engine
    from svcframe.loops import loop_factory

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(params.clients + 1)
    reports: Any = ctx.Queue()
    assignment = [servers[i % len(servers)] for i in range(params.clients)]
    procs: list[Any] = []
    runner = asyncio.Runner(loop_factory=loop_factory(params.event_loop))
    engine = Engine(None, default_timeout_seconds=params.timeout_seconds)
    requested, target = params.rpc, None
    try:
        runner.run(engine.start())
        if params.workload == "rpc":  # resolved once, here: the clients call PROVIDER_ID:NAME
            target = runner.run(_resolve_rpc(engine, servers, admin_provider_id, str(params.rpc)))
            params = params.model_copy(update={"rpc": target.spec})
        try:
            server_config = runner.run(engine.call(servers[0], "get_config", None, provider_id=admin_provider_id))
        except SvcframeError:
            server_config = None
        procs = [
            ctx.Process(
                target=_client_main, args=(i, assignment[i], params.model_dump_json(), barrier, reports), daemon=True
            )
            for i in range(params.clients)
        ]
        for p in procs:
            p.start()
        warmup_timeout = 120.0
        try:
            barrier.wait(warmup_timeout)  # everyone connected and warmed up
        except Exception:
            raise SelftestError(_client_failure(reports, "clients did not finish warm-up")) from None
        if on_start is not None:
            on_start()
        before = runner.run(_server_stats(engine, servers, params.provider_id))
        statistics_before = runner.run(_server_statistics(engine, servers, admin_provider_id))
        wall0 = time.monotonic()
        try:
            barrier.wait(warmup_timeout)  # go
        except Exception:
            raise SelftestError(_client_failure(reports, "clients did not start")) from None
        outs: list[dict[str, Any]] = []
        deadline = time.monotonic() + params.duration_seconds + params.timeout_seconds + 60
        while len(outs) < params.clients:
            try:
                out = reports.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                raise SelftestError(f"only {len(outs)} of {params.clients} clients reported results in time") from None
            if "error" in out:
                raise SelftestError(f"client {out['rank']} failed: {out['error']}")
            outs.append(out)
        wall1 = time.monotonic()
        after = runner.run(_server_stats(engine, servers, params.provider_id))
        statistics_after = runner.run(_server_statistics(engine, servers, admin_provider_id))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        runner.run(engine.close())
        runner.close()
    results = summarize(params, servers, server_config, outs, before, after, wall1 - wall0)
    if target is not None:
        results["rpc"] = {**vars(target), "requested": requested, **results["rpc"]}
    results["diagnosis"] = diagnose_window(statistics_before, statistics_after)
    return results


def diagnose_window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Each server's diagnosis (``svcframe.diagnosis``) of its statistics over the timed loop: the difference of
    two reads (``svcframe.diagnosis.window``), so the live service's statistics are never reset. Servers whose
    admin provider did not answer both reads are left out."""
    from svcframe.diagnosis import diagnose, rpc_names, window

    windows = {a: window(before[a], st) for a, st in after.items() if st is not None and before.get(a) is not None}
    names = rpc_names(*windows.values())
    return {a: diagnose(st, names=names) for a, st in windows.items()}


async def _resolve_rpc(engine: Any, servers: list[str], admin_id: int, spec: str) -> Any:
    """The rpc workload's :class:`~selftest.rpc_workload.RpcTarget`, checked on every server."""
    from .rpc_workload import resolve_rpc

    try:
        return await resolve_rpc(engine, [(s, admin_id) for s in servers], spec)
    except ValueError as exc:
        raise SelftestError(str(exc)) from None
    except SvcframeError as exc:
        raise SelftestError(f"--rpc {spec}: cannot ask the servers' admin providers: {exc}") from exc


async def _server_statistics(engine: Any, servers: list[str], admin_id: int) -> dict[str, Any]:
    """Each server's engine statistics, read without resetting them (None where the admin provider is not
    reachable)."""
    outs = await asyncio.gather(
        *(engine.call(s, "statistics", None, provider_id=admin_id) for s in servers), return_exceptions=True
    )
    return {s: (None if isinstance(o, BaseException) else o) for s, o in zip(servers, outs, strict=True)}


def _client_failure(results: Any, what: str) -> str:
    try:
        out = results.get(timeout=2.0)
    except Exception:
        return what
    return f"{what}: client {out.get('rank')} failed: {out.get('error')}"


def summarize(
    params: SelftestParams,
    servers: list[str],
    server_config: Any,
    outs: list[dict[str, Any]],
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    window_seconds: float,
) -> dict[str, Any]:
    """Merge per-client outputs and server samples into the results document."""
    import numpy as np

    outs = sorted(outs, key=lambda o: o["rank"])
    all_lat = []
    clients = []
    for o in outs:
        lat = np.frombuffer(o.pop("latencies"), dtype=float) * 1e6
        all_lat.append(lat)
        clients.append({**o, "latency_usec": latency_summary(lat)})
    total_ops = sum(o["ops"] for o in outs)
    rate = sum(o["rate_ops_per_second"] for o in outs)
    per_server_rate: dict[str, float] = {s: 0.0 for s in servers}
    per_server_clients: dict[str, int] = {s: 0 for s in servers}
    for o in outs:
        per_server_rate[o["server"]] += o["rate_ops_per_second"]
        per_server_clients[o["server"]] += 1
    server_rows = []
    server_cpu = 0.0
    for s, b, a in zip(servers, before, after, strict=True):
        cpu = a["cpu_seconds"] - b["cpu_seconds"]
        wall = a["wall_seconds"] - b["wall_seconds"]
        server_cpu += cpu
        scheduled = a.get("run_seconds") is not None and b.get("run_seconds") is not None
        server_rows.append(
            {
                "address": s,
                "pid": a["pid"],
                "progress_mode": a.get("progress_mode"),
                "cpu_seconds": cpu,
                "cpu_user_seconds": a["user_seconds"] - b["user_seconds"],
                "cpu_system_seconds": a["system_seconds"] - b["system_seconds"],
                "utilization": cpu / wall if wall > 0 else 0.0,
                **_demand(
                    a["run_seconds"] - b["run_seconds"] if scheduled else None,
                    a["runqueue_wait_seconds"] - b["runqueue_wait_seconds"] if scheduled else None,
                    wall,
                ),
                "clients": per_server_clients[s],
                "rate_ops_per_second": per_server_rate[s],
                "max_rss_bytes": a["max_rss_bytes"],
            }
        )
    bytes_per_op = {"bulk": params.bulk_size, "storage": params.storage_block_size}.get(params.workload, 0)
    rpc = _rpc_summary(clients) if params.workload == "rpc" else None
    if rpc is not None:
        bytes_per_op = rpc["bytes_per_call"]
    elapsed = max(o["elapsed_seconds"] for o in outs)
    server_ops = total_ops  # warm-up calls precede the first server sample; nothing follows the loop
    # servers no client called (fewer clients than servers) served nothing: rates and utilisation per server are
    # over the servers that served, and say how many those were
    serving = [r for r in server_rows if r["clients"] > 0] or server_rows
    for c in clients:
        c["utilization"] = c["cpu_seconds"] / c["elapsed_seconds"] if c["elapsed_seconds"] > 0 else 0.0
        c.update(_demand(c.get("run_seconds"), c.get("runqueue_wait_seconds"), c["elapsed_seconds"]))
    return {
        "kind": "svcframe-selftest",
        "parameters": params.model_dump(mode="json"),
        "servers": server_rows,
        "server_config": server_config,
        "environment": environment(),
        "clients": clients,
        "aggregate": {
            "ops": total_ops,
            "warmup_ops": params.warmup_iterations * len(outs),
            "elapsed_seconds": elapsed,
            "rate_ops_per_second": rate,
            "rate_per_client_ops_per_second": rate / len(outs),
            "servers_serving": len(serving),
            "rate_per_server_ops_per_second": rate / len(serving),
            "bandwidth_bytes_per_second": rate * bytes_per_op,
            "bandwidth_gib_per_second": rate * bytes_per_op / 2**30,
            "latency_usec": latency_summary(np.concatenate(all_lat) if all_lat else []),
            "server_cpu_seconds": server_cpu,
            "server_cpu_usec_per_op": server_cpu / server_ops * 1e6 if server_ops else 0.0,
            "server_utilization": sum(r["utilization"] for r in serving) / len(serving),
            "server_demand": _mean_of(serving, "demand"),
            "server_run_seconds": _sum_of(serving, "run_seconds"),
            "server_runqueue_wait_seconds": _sum_of(serving, "runqueue_wait_seconds"),
            "client_cpu_seconds": sum(o["cpu_seconds"] for o in outs),
            "client_utilization": sum(c["utilization"] for c in clients) / len(clients),
            "client_demand": _mean_of(clients, "demand"),
            "client_run_seconds": _sum_of(clients, "run_seconds"),
            "client_runqueue_wait_seconds": _sum_of(clients, "runqueue_wait_seconds"),
            **cpu_split(server_rows, clients),
        },
        "progress_modes": progress_modes(server_rows, clients),
        **({"rpc": rpc} if rpc is not None else {}),
    }


def _demand(run: float | None, wait: float | None, wall: float) -> dict[str, float | None]:
    """A process's scheduler figures over ``wall`` seconds: the seconds it ran and waited for a core (None where
    the kernel keeps none), and its demand, ``(run + wait) / wall``: the fraction of a core it wanted."""
    known = run is not None and wait is not None and wall > 0
    return {"run_seconds": run, "runqueue_wait_seconds": wait,
            "demand": (run + wait) / wall if known else None}  # type: ignore[operator]  # fmt: skip


def _mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values and len(values) == len(rows) else None


def _sum_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) if values and len(values) == len(rows) else None


def cpu_split(server_rows: list[dict[str, Any]], clients: list[dict[str, Any]]) -> dict[str, float]:
    """User and system CPU seconds of the servers and of the clients, summed over the processes (Quintain's
    ``server_stats`` / ``client_stats`` utime and stime)."""
    return {
        f"{side}_cpu_{part}_seconds": sum(r.get(f"cpu_{part}_seconds", 0.0) for r in rows)
        for side, rows in (("server", server_rows), ("client", clients))
        for part in ("user", "system")
    }


def progress_modes(server_rows: list[dict[str, Any]], clients: list[dict[str, Any]]) -> dict[str, Any]:
    """The progress mode each side ran: every client's engine (one mode when they agree) and every server's
    live engine, by address."""
    modes = sorted({c.get("progress_mode") or "?" for c in clients})
    return {
        "client": modes[0] if len(modes) == 1 else modes,
        "servers": {r["address"]: r["progress_mode"] for r in server_rows},
    }


def _rpc_summary(clients: list[dict[str, Any]]) -> dict[str, Any]:
    """The rpc workload's bytes per call over every client (``selftest.rpc_workload.merge_call_sizes``)."""
    from .rpc_workload import merge_call_sizes

    return merge_call_sizes([c["rpc_sizes"] for c in clients])


def save_results(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(results, indent=2))
    return p
