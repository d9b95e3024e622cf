"""A measured workload placed on the data-service rooflines of a platform: how far it is from what the
machine allows, what bounds it, and what to change (Carns et al. 2025, section 7: "apply the
roofline to real-world data service implementations", combining metric rooflines to suit a use case).

A *workload* (:class:`Workload`, a small JSON document validated with pydantic) is one RPC measured at one
or more service ratios: each point gives the server and client processes, the calls per second each client
process made, and the bytes each call moved. The self-test's results (:meth:`Workload.from_selftest_results`)
and a live service's statistics over a window (calls per client process, servers, clients, bytes per call)
both give this shape.

Each point (:func:`place`) is set against the ceilings that apply to one call, in calls per second per
client process at its service ratio ``X = servers / clients``:

* the RPC rate roofline, ``R_rpc(X) = min(Pc, Ps * min(X, 1))`` (Carns 2025, section 4.2): a call is an RPC;
* the bandwidth roofline divided by the bytes per call, ``R_bw(X) / bytes_per_call``, when the call moves
  bytes (a bandwidth ceiling in calls/s);

its attainable rate is the lower one (the metric that limits it); its ``region`` that roofline's at ``X``
(server-bound below the ridge: more servers help, up to ``servers_at_ridge``; client-bound above it:
each client process is at its peak, more servers do not help); its ``score`` ``1 / (1 + |log10(attainable /
measured)|)`` (Zhu & Neuwirth eqs. 10-11, one dimension, as DESIGN.md section 6 scores validation samples);
its ``headroom`` ``attainable / measured`` (how much faster the machine allows). Points whose processes
share cores (more than one per core) are marked: the model does not predict them
(:attr:`~selftest.roofline.dataservice.Sample.oversubscribed`).

:func:`io_points` gives the same points on the network I/O roofline, at their operations per byte.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .dataservice import BYTE_RATE_UNITS, Bound, Platform, Roofline, Sample, bytes_per_second
from .io import IOPoint, Side
from .scores import rate_score, weighted_geometric_mean

PLACEMENT_KIND = "svcframe-placement"


class WorkloadPoint(BaseModel):
    """One measurement of the workload at one service ratio."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    servers: int = Field(ge=1, description="server processes serving the workload")
    clients: int = Field(ge=1, description="client processes issuing it")
    rate_per_client_ops_per_second: float = Field(
        ge=0, allow_inf_nan=False, description="calls per second each client process completed (aggregate / clients)"
    )
    bytes_per_call: int = Field(
        default=0, ge=0, description="bytes one call moves over the network (request + response + bulk)"
    )
    server_processes_per_core: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="server processes per core of the busiest server node, if known",
    )
    client_processes_per_core: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="client processes per core of the busiest client node, if known",
    )
    label: str = Field(default="", description="what tells this point apart (a run id, a time window)")

    @property
    def service_ratio(self) -> float:
        """``X = servers / clients`` (Carns 2025, section 4.2)."""
        return self.servers / self.clients

    def sample(self) -> Sample:
        """This point as a data-service :class:`~selftest.roofline.dataservice.Sample` (rate in calls/s)."""
        return Sample(
            self.servers,
            self.clients,
            self.rate_per_client_ops_per_second,
            self.server_processes_per_core,
            self.client_processes_per_core,
        )


class Workload(BaseModel):
    """A workload: one RPC of a service, measured at one or more service ratios.

    JSON shape::

        {"kind": "svcframe-workload", "name": "kv put", "rpc": "1:put",
         "points": [{"servers": 4, "clients": 32, "rate_per_client_ops_per_second": 9000.0,
                     "bytes_per_call": 1100, "server_processes_per_core": 1.0,
                     "client_processes_per_core": 1.0, "label": "run 12"}],
         "source": {...where the points came from...}}
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    kind: Literal["svcframe-workload"] = "svcframe-workload"
    name: str = Field(min_length=1, description="what the workload is, e.g. 'kv put 1 KiB values'")
    rpc: str | None = Field(default=None, description="the RPC measured: 'PROVIDER_ID:NAME' or 'PROVIDER:NAME'")
    points: list[WorkloadPoint] = Field(min_length=1)
    source: dict[str, Any] = Field(default_factory=dict, description="provenance: results file, service, window")

    @classmethod
    def from_document(cls, doc: Any, source: str = "workload") -> Workload:
        """Validate a decoded JSON document.

        Raises:
            ValueError: one line per problem, naming ``source``, the JSON path, the value and what was expected.
        """
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            # the framework's formatter (one line per problem); imported here, on the error path only
            from svcframe.config import format_validation_error

            raise ValueError(format_validation_error(exc, source)) from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Workload:
        """Read and validate a workload JSON file.

        Raises:
            ValueError: the file cannot be read, is not JSON, or is not a valid workload (lines name the path).
        """
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read a workload: {exc}") from None
        return cls.from_document(doc, str(path))

    @classmethod
    def from_selftest_results(cls, results: dict[str, Any], name: str | None = None, label: str = "") -> Workload:
        """A one-point workload from a self-test results document (``selftest/driver.py``, ``to_json``).

        Servers are the results' servers that served (a server no client called, with fewer clients than
        servers, is not counted: X is servers that served / clients), clients ``parameters.clients``, the rate
        ``aggregate.rate_per_client_ops_per_second``. Bytes per call: an ``rpc`` run's measured
        ``rpc.bytes_per_call`` (request and response bodies and bulk bytes, ``selftest/rpc_workload.py``);
        otherwise the request and response buffers plus the bulk transfer of a ``bulk`` run (a ``storage``
        run's block goes to the server's disk, not over the network). Processes per core: when every server is
        on the driver's host (a unix address, a loopback one, or its host name), servers and clients share its
        ``environment.usable_cores``: ``(servers + clients) / usable cores`` on both sides (a lower bound of the
        busiest core's share); else the clients' alone, ``clients / distinct client_cores`` when pinned.

        Raises:
            ValueError: the document is not a self-test results document (names the missing key).
        """
        try:
            params, agg = results["parameters"], results["aggregate"]
            clients = int(params["clients"])
            serving = serving_servers(results)
            rpc = results.get("rpc")
            if rpc is not None:
                payload = int(rpc["bytes_per_call"])
            else:
                payload = int(params.get("req_buffer_size", 0)) + int(params.get("resp_buffer_size", 0))
                if params.get("workload") == "bulk":
                    payload += int(params["bulk_size"])
            server_share, client_share = _processes_per_core(results, serving, clients)
            point = WorkloadPoint(
                servers=serving,
                clients=clients,
                rate_per_client_ops_per_second=float(agg["rate_per_client_ops_per_second"]),
                bytes_per_call=payload,
                server_processes_per_core=server_share,
                client_processes_per_core=client_share,
                label=label,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a self-test results document (no {exc})") from None
        if rpc is not None:
            return cls(
                name=name or f"{rpc['type']} {rpc['name']}",
                rpc=str(rpc.get("requested") or f"{rpc['provider_id']}:{rpc['name']}"),
                points=[point],
                source={"selftest": params, "rpc": rpc},
            )
        workload = params.get("workload", "noop")
        return cls(
            name=name or f"self-test {workload}",
            rpc=f"{params.get('provider_id', '?')}:{workload}",
            points=[point],
            source={"selftest": params},
        )

    @classmethod
    def from_statistics(
        cls,
        first: Mapping[str, Any],
        second: Mapping[str, Any],
        *,
        rpc: str,
        name: str,
        rpc_name: str,
        provider_id: int,
        window_seconds: float,
        clients: int | None = None,
    ) -> Workload:
        """A one-point workload from a running service's statistics read twice (``Engine.statistics()`` per
        server address, e.g. from the admin ``statistics`` RPC), ``window_seconds`` apart.

        From the target side of RPC ``rpc_name`` at ``provider_id`` (svcframe/monitoring.py), counted over the
        window (second read minus first):

        * calls: completed calls (calls - errors, exact) over every server and calling peer;
        * servers: the servers that served at least one call of it;
        * client processes: ``clients`` if given, else the distinct calling peers: a *lower bound*, because
          the statistics keep one label per client host for client-only engines (``clients@HOST``), however
          many processes run there (the notes say so);
        * rate per client process: calls / window / client processes;
        * bytes per call: mean request and response bodies of the calls the engine timed (sampled), plus every
          bulk byte the servers moved with the calling peers over the window divided by the calls (bulk
          transfers are counted per peer, not per RPC: exact when no other RPC of those peers moves bulk data);
        * processes per core: unknown (the point is not checked for shared cores).

        Args:
            first, second: ``{server address: statistics}``, the earlier and the later read.
            rpc: how the user named the RPC (``"store:put"``), kept in the workload.
            name: the workload's name (``"kv put"``).
            window_seconds: time between the two reads (measured by the reader), > 0.
            clients: the client processes, when the user knows them.

        Raises:
            ValueError: no call of the RPC in the window, statistics reset or switched off in between, a
                server missing from a read, or a window that is not > 0.
        """
        if not window_seconds > 0:
            raise ValueError(f"the window must be > 0 seconds, got {window_seconds!r}")
        calls = errors = request_count = response_count = 0
        request_sum = response_sum = 0.0
        peers: set[str] = set()
        serving: list[str] = []
        for address, after in second.items():
            before = first.get(address)
            if before is None:
                raise ValueError(f"{address} answered the second statistics read but not the first")
            for doc in (before, after):
                if not (doc.get("rpcs") or {}).get("enabled", False):
                    raise ValueError(f"{address} has monitoring off: no statistics to read (engine.monitoring)")
            if after["rpcs"].get("since") != before["rpcs"].get("since"):
                raise ValueError(f"{address}'s statistics were reset during the window: read again")
            old, new = _target_rows(before, rpc_name, provider_id), _target_rows(after, rpc_name, provider_id)
            served = 0
            for peer, row in new.items():
                d_calls, d_errors, d_requests, d_request_bytes, d_responses, d_response_bytes = (
                    a - b for a, b in zip(row, old.get(peer, (0, 0, 0, 0, 0, 0)), strict=True)
                )
                if d_calls <= 0:
                    continue
                peers.add(peer)
                served += int(d_calls)
                calls, errors = calls + int(d_calls), errors + int(d_errors)
                request_count, request_sum = request_count + int(d_requests), request_sum + d_request_bytes
                response_count, response_sum = response_count + int(d_responses), response_sum + d_response_bytes
            if served:
                serving.append(address)
        completed = calls - errors
        if completed <= 0:
            raise ValueError(
                f"no completed call of {rpc} on {len(second)} server(s) in the {window_seconds:.3g} s window: "
                f"is the workload running?"
            )
        bulk = 0.0
        for address in serving:
            old_bulk, new_bulk = _bulk_bytes(first[address], peers), _bulk_bytes(second[address], peers)
            bulk += new_bulk - old_bulk
        host_labels = sorted(p for p in peers if p.startswith("clients@"))
        notes = []
        if clients is None:
            clients = len(peers)
            notes.append(
                f"client processes: {clients}, the distinct calling peers, a lower bound"
                + (f" ({', '.join(host_labels)} count each host's client-only processes as one)" if host_labels else "")
                + ": give the number if you know it (--clients)"
            )
        notes.append(f"servers: the {len(serving)} of {len(second)} read that served {rpc} in the window")
        notes.append(
            f"request and response bytes: means of the {request_count} calls the servers timed (sampled); "
            "processes per core are unknown from statistics (not checked for shared cores)"
        )
        if bulk > 0:
            notes.append(
                f"bulk bytes: {bulk:,.0f} moved with the calling peers in the window, all attributed to {rpc} "
                "(counted per peer, not per RPC: exact if no other RPC of theirs moves bulk data)"
            )
        if errors:
            notes.append(f"{errors} of {calls} calls failed in the window and are not counted in the rate")
        request = request_sum / request_count if request_count else 0.0
        response = response_sum / response_count if response_count else 0.0
        point = WorkloadPoint(
            servers=len(serving),
            clients=clients,
            rate_per_client_ops_per_second=completed / window_seconds / clients,
            bytes_per_call=round(request + response + bulk / completed),
            label=f"live {window_seconds:g} s",
        )
        return cls(
            name=name,
            rpc=rpc,
            points=[point],
            source={
                "statistics": {
                    "window_seconds": window_seconds,
                    "calls": calls,
                    "errors": errors,
                    "peers": sorted(peers),
                    "servers": serving,
                    "servers_read": sorted(second),
                    "request_bytes_per_call": request,
                    "response_bytes_per_call": response,
                    "bulk_bytes": bulk,
                },
                "notes": notes,
            },
        )


def _target_rows(stats: Mapping[str, Any], rpc_name: str, provider_id: int) -> dict[str, tuple[float, ...]]:
    """Per calling peer: (calls, errors, request sampled count, request bytes sum, response count, response sum)
    of the RPC, over every callpath that ends in it."""
    out: dict[str, tuple[float, ...]] = {}
    for row in (stats.get("rpcs") or {}).get("target") or []:
        if row["rpc"] != rpc_name or row["provider_id"] != provider_id:
            continue
        values = (row["calls"], row["errors"], row["request_bytes"]["count"], row["request_bytes"]["sum"],
                  row["response_bytes"]["count"], row["response_bytes"]["sum"])  # fmt: skip
        old = out.get(row["peer"], (0, 0, 0, 0, 0, 0))
        out[row["peer"]] = tuple(a + b for a, b in zip(old, values, strict=True))
    return out


def _bulk_bytes(stats: Mapping[str, Any], peers: set[str]) -> float:
    """Bulk bytes moved with ``peers``, every direction."""
    return float(
        sum(row["bytes"]["sum"] for row in (stats.get("rpcs") or {}).get("bulk") or [] if row["peer"] in peers)
    )


def serving_servers(results: Mapping[str, Any]) -> int:
    """The servers of a self-test results document that served calls: ``aggregate.servers_serving``, else (older
    documents) the servers its clients were spread over, ``min(servers, clients)`` (client i calls server i mod S).
    """
    agg = results["aggregate"]
    if agg.get("servers_serving") is not None:
        return int(agg["servers_serving"])
    return min(len(results["servers"]), int(results["parameters"]["clients"]))


def _on_host(address: str, host: str | None) -> bool:
    """The address is on the host of ``host`` (a unix socket, a loopback address, or that host name)."""
    if address.startswith("unix://"):
        return True
    name = address.partition("://")[2].rpartition(":")[0].strip("[]")
    return name in ("localhost", "::1", host) or name.startswith("127.")


def _processes_per_core(results: dict[str, Any], servers: int, clients: int) -> tuple[float | None, float | None]:
    """(server, client) processes per core of a self-test run, as far as the results tell (see
    :meth:`Workload.from_selftest_results`)."""
    env = results.get("environment") or {}
    cores = env.get("usable_cores")
    pinned = results["parameters"].get("client_cores")
    client_share = clients / len(set(pinned)) if pinned else None
    if cores and all(_on_host(str(s.get("address", "")), env.get("host")) for s in results["servers"]):
        shared = (servers + clients) / int(cores)
        return shared, max(shared, client_share or 0.0)
    return None, client_share


def _ceiling(rl: Roofline, point: WorkloadPoint, bound: Bound) -> float:
    """The roofline's attainable rate at the point's service ratio, in calls/s per client process (a
    bandwidth divided by the bytes per call)."""
    rate = rl.attainable(point.service_ratio, bound)
    return bytes_per_second(rl.metric, rate) / point.bytes_per_call if rl.metric.unit in BYTE_RATE_UNITS else rate


def place(platform: Platform, workload: Workload, bound: Bound = "max") -> dict[str, Any]:
    """Place every point of ``workload`` on the platform's data-service ceilings.

    Args:
        platform: the measured platform; it needs ``rpc_rate``, and ``bandwidth`` for points that move bytes
            (without it those are placed on the RPC rate alone, which the result says).
        workload: the measured workload.
        bound: ``"max"`` (default) or ``"min"`` ceilings (the parameters' measured range).

    Returns:
        A JSON-ready document::

            {"kind": "svcframe-placement", "workload": name, "rpc", "platform": label, "bound",
             "points": [{"label", "servers", "clients", "service_ratio", "rate_per_client_ops_per_second",
                         "bytes_per_call", "attainable_ops_per_second", "limited_by": metric,
                         "region", "ridge", "servers_at_ridge", "score", "headroom",
                         "oversubscribed", "ceilings": {metric: calls/s per client}}],
             "summary": {"count", "score", "median_headroom", "excluded"},
             "notes": [str]}

        ``score`` and ``median_headroom`` in the summary are over the points the model claims (not
        oversubscribed; Zhu eq. 12 with equal weights); ``excluded`` counts the others. ``notes`` start
        with the workload's own (``source.notes``: what its statistics could not tell), then say which of the
        ceilings' ``Pc`` and ``Ps`` are lower bounds (:meth:`Platform.lower_bounds`: scores against them are
        too low).

    Raises:
        ValueError: the platform has no ``rpc_rate`` roofline, or ``bound`` is invalid.
    """
    rpc = platform.roofline("rpc_rate")
    bandwidth = platform.rooflines.get("bandwidth")
    notes = [str(n) for n in workload.source.get("notes") or []]
    if bandwidth is None and any(p.bytes_per_call for p in workload.points):
        notes.append("the platform model has no bandwidth roofline: points are placed on the RPC rate alone")
    used = ["rpc_rate"] + (["bandwidth"] if bandwidth is not None and any(p.bytes_per_call for p in workload.points)
                           else [])  # fmt: skip
    notes += platform.lower_bounds(used)
    rows: list[dict[str, Any]] = []
    for p in workload.points:
        applicable = {"rpc_rate": rpc}
        if bandwidth is not None and p.bytes_per_call > 0:
            applicable["bandwidth"] = bandwidth
        ceilings = {name: _ceiling(rl, p, bound) for name, rl in applicable.items()}
        limited_by = min(ceilings, key=lambda name: ceilings[name])
        limiting = applicable[limited_by]
        attainable = ceilings[limited_by]
        measured = p.rate_per_client_ops_per_second
        ridge = limiting.ridge(bound)
        rows.append(
            {
                "label": p.label,
                "servers": p.servers,
                "clients": p.clients,
                "service_ratio": p.service_ratio,
                "rate_per_client_ops_per_second": measured,
                "bytes_per_call": p.bytes_per_call,
                "attainable_ops_per_second": attainable,
                "limited_by": limited_by,
                "region": limiting.region(p.sample(), bound),
                "ridge": ridge,
                "servers_at_ridge": math.ceil(round(ridge * p.clients, 9)),
                "score": rate_score(attainable, measured),
                "headroom": attainable / measured if measured > 0 else None,
                "oversubscribed": p.sample().oversubscribed,
                "ceilings": ceilings,
            }
        )
    claimed = [r for r in rows if not r["oversubscribed"]]
    headrooms = [r["headroom"] for r in claimed if r["headroom"] is not None]
    return {
        "kind": PLACEMENT_KIND,
        "workload": workload.name,
        "rpc": workload.rpc,
        "platform": platform.label,
        "bound": bound,
        "points": rows,
        "summary": {
            "count": len(claimed),
            "score": weighted_geometric_mean([r["score"] for r in claimed], [1.0] * len(claimed)) if claimed else None,
            "median_headroom": statistics.median(headrooms) if headrooms else None,
            "excluded": len(rows) - len(claimed),
        },
        "notes": notes,
    }


def io_points(workload: Workload, side: Side = "server") -> list[IOPoint]:
    """The workload's points on the network I/O roofline (:func:`selftest.roofline.io.io_rooflines`).

    A call moving ``bytes_per_call`` bytes has I/O intensity ``λ = 1 / bytes_per_call`` (Zhu eq. 4, one
    operation); its operations per second are the calls of one server process (``rate per client x clients /
    servers``) for ``side="server"``, of one client process for ``side="client"``. Points that move no bytes
    have no finite intensity and are left out.
    """
    return [
        IOPoint(
            f"{workload.name} {p.servers}x{p.clients}" + (f" ({p.label})" if p.label else ""),
            1.0 / p.bytes_per_call,
            p.rate_per_client_ops_per_second * (p.clients / p.servers if side == "server" else 1.0),
        )
        for p in workload.points
        if p.bytes_per_call > 0
    ]
