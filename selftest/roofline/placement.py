"""A measured workload placed on the data-service rooflines of a platform: how far it is from what the
machine allows, what bounds it, and what to change (issue 16; Carns et al. 2025, section 7: "apply the
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

        Servers are the results' servers, clients ``parameters.clients``, the rate
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
            params, agg, servers = results["parameters"], results["aggregate"], results["servers"]
            clients = int(params["clients"])
            rpc = results.get("rpc")
            if rpc is not None:
                payload = int(rpc["bytes_per_call"])
            else:
                payload = int(params.get("req_buffer_size", 0)) + int(params.get("resp_buffer_size", 0))
                if params.get("workload") == "bulk":
                    payload += int(params["bulk_size"])
            server_share, client_share = _processes_per_core(results, len(servers), clients)
            point = WorkloadPoint(
                servers=len(servers),
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
        oversubscribed; Zhu eq. 12 with equal weights); ``excluded`` counts the others.

    Raises:
        ValueError: the platform has no ``rpc_rate`` roofline, or ``bound`` is invalid.
    """
    rpc = platform.roofline("rpc_rate")
    bandwidth = platform.rooflines.get("bandwidth")
    notes = []
    if bandwidth is None and any(p.bytes_per_call for p in workload.points):
        notes.append("the platform model has no bandwidth roofline: points are placed on the RPC rate alone")
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
            p.label or f"{workload.name} {p.servers}x{p.clients}",
            1.0 / p.bytes_per_call,
            p.rate_per_client_ops_per_second * (p.clients / p.servers if side == "server" else 1.0),
        )
        for p in workload.points
        if p.bytes_per_call > 0
    ]
