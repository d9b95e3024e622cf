"""The workflow roofline of Ding et al. 2024 (``papers/ding2024-workflow-roofline.txt``, section III), for
workflows whose tasks work through a data service.

The model (eq. 1, Fig. 1): a workflow's throughput in tasks per second (TPS) against its number of parallel
tasks ``n`` is bounded by

* node ceilings (diagonals), ``TPS <= n / (work per task / peak per task)``: what one task can do with its
  own resources (the paper's node FLOPs and node bytes); each is a *makespan ceiling*, the least time a
  task takes (section IV-C3: "diagonal PCIe makespan ceiling of 0.8 s");
* system ceilings (horizontals), ``TPS <= n / (n * work per task / peak of the system)`` = ``peak / work per
  task``: what every task shares (the file system, the network);
* the system parallelism wall (vertical), ``floor(available resources / resources per task)`` parallel
  tasks (section III-A: ``floor(1792 / 64) = 28`` on Perlmutter).

A target makespan (a diagonal, ``TPS = n / makespan``: the time a task may take, which is the workflow's
makespan when its tasks run at once) and a target throughput (a horizontal) divide the attainable area into
four zones (Fig. 2a): good makespan and good throughput, good makespan and poor throughput, poor makespan and
good throughput, poor makespan and poor throughput. Without targets, a run is node-bound or system-bound by
the ceiling lowest at its parallel tasks (Fig. 3).

For a workflow against a service (:class:`WorkflowSpec`, a small JSON document validated with pydantic:
stages of tasks, each making RPCs and moving bytes through the service, ``n`` tasks at a time), the
ceilings come from the measured data-service parameters (:func:`from_platform`):

* node ceilings: a task's client processes, each at ``R(1) = min(Pc, Ps)``, the rate of a client process
  with a server to itself (Carns et al. 2025, section 4.2: ``Pc``, capped by one server's ``Ps``), for the
  RPC rate (RPCs per task) and the bandwidth (bytes per task);
* system ceilings: the servers' aggregate, ``Ps * servers``, for the RPC rate and for the bandwidth;
* the wall: the available client processes (one per usable core, the platform's client cores by default)
  over the client processes per task.

Work per task is the average over the stages, weighted by their tasks (the stages run one after the other:
the workflow's time is at least the sum of theirs, eq. 1 over the whole workflow).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .dataservice import Bound, Platform, Roofline, bytes_per_second
from .scores import rate_score

ZONE_GOOD_GOOD = "good makespan, good throughput"
ZONE_GOOD_POOR = "good makespan, poor throughput"
ZONE_POOR_GOOD = "poor makespan, good throughput"
ZONE_POOR_POOR = "poor makespan, poor throughput"
ZONES = (ZONE_GOOD_GOOD, ZONE_GOOD_POOR, ZONE_POOR_GOOD, ZONE_POOR_POOR)
"""The four zones of Ding et al. Fig. 2a (green, yellow, orange, red)."""


# ----------------------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------------------


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Ceiling:
    """One ceiling of the workflow roofline.

    Attributes:
        name: what bounds (``"node: RPC rate"``), with its figures for legends.
        kind: ``"node"`` (a diagonal: ``tasks_per_second`` per parallel task) or ``"system"`` (a horizontal).
        tasks_per_second: the slope of a node ceiling (tasks/s per parallel task, the inverse of the least
            time a task takes) or the height of a system ceiling (tasks/s), finite and > 0.
    """

    name: str
    kind: Literal["node", "system"]
    tasks_per_second: float

    def __post_init__(self) -> None:
        if self.kind not in ("node", "system"):
            raise ValueError(f"a ceiling is of kind 'node' or 'system', got {self.kind!r}")
        object.__setattr__(self, "tasks_per_second", _positive(f"ceiling {self.name!r}", self.tasks_per_second))

    @property
    def seconds_per_task(self) -> float:
        """A node ceiling's makespan: the least time one task takes (Ding section IV-C3); for a system
        ceiling, the time per task when every task shares the system."""
        return 1.0 / self.tasks_per_second

    def at(self, parallel_tasks: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Tasks per second this ceiling allows at ``parallel_tasks`` (eq. 1)."""
        n = np.asarray(parallel_tasks, dtype=np.float64)
        return n * self.tasks_per_second if self.kind == "node" else np.full_like(n, self.tasks_per_second)


def node_ceiling(name: str, work_per_task: float, peak_per_task: float) -> Ceiling:
    """A node ceiling (diagonal): ``TPS <= n / (work per task / peak per task)`` (Ding eq. 1, rows 2-3).

    Args:
        name: for legends.
        work_per_task: bytes, FLOPs, RPCs... one task does on its node(s), > 0.
        peak_per_task: the peak rate of the same unit per second over the task's node(s), > 0.

    Raises:
        ValueError: an argument is not finite and > 0.
    """
    return Ceiling(name, "node", _positive("peak_per_task", peak_per_task) / _positive("work_per_task", work_per_task))


def system_ceiling(name: str, work_per_task: float, peak_of_system: float) -> Ceiling:
    """A system ceiling (horizontal): ``TPS <= n / (n * work per task / system peak)`` (Ding eq. 1, row 1).

    Args:
        name: for legends.
        work_per_task: bytes (or RPCs) one task moves through the shared system, > 0.
        peak_of_system: the shared system's peak rate in the same unit per second, > 0.

    Raises:
        ValueError: an argument is not finite and > 0.
    """
    return Ceiling(
        name, "system", _positive("peak_of_system", peak_of_system) / _positive("work_per_task", work_per_task)
    )


def parallelism_wall(available: int, required_per_task: int) -> int:
    """``floor(available / required per task)``: the most tasks that can run at once (Ding section III-A,
    ``floor(1792 / 64) = 28``; section IV-C2, ``floor(1792 / 1024) = 1``).

    Raises:
        ValueError: ``available`` < 1 or ``required_per_task`` < 1.
    """
    if available < 1 or required_per_task < 1:
        raise ValueError(
            f"the wall needs available >= 1 and required per task >= 1, got {available}, {required_per_task}"
        )
    return available // required_per_task


@dataclass(frozen=True)
class WorkflowRoofline:
    """The ceilings and the parallelism wall of one workflow (Ding eq. 1, Fig. 1).

    Attributes:
        name: the workflow, for titles.
        ceilings: node and system ceilings, at least one.
        wall: the system parallelism wall in parallel tasks, >= 1.
        target_makespan_seconds: the time a task may take (a diagonal, Fig. 2a), or ``None``.
        target_throughput_tasks_per_second: the tasks per second wanted (a horizontal, Fig. 2a), or ``None``.

    Raises:
        ValueError: no ceilings, a wall below 1, or a target that is not finite and > 0.
    """

    name: str
    ceilings: tuple[Ceiling, ...]
    wall: int
    target_makespan_seconds: float | None = None
    target_throughput_tasks_per_second: float | None = None

    def __post_init__(self) -> None:
        if not self.ceilings:
            raise ValueError("a workflow roofline needs at least one ceiling")
        if self.wall < 1:
            raise ValueError(f"the parallelism wall is at least 1 parallel task, got {self.wall}")
        for attr in ("target_makespan_seconds", "target_throughput_tasks_per_second"):
            if getattr(self, attr) is not None:
                object.__setattr__(self, attr, _positive(attr, getattr(self, attr)))

    @overload
    def attainable(self, parallel_tasks: float) -> float: ...
    @overload
    def attainable(self, parallel_tasks: npt.ArrayLike) -> npt.NDArray[np.float64]: ...

    def attainable(self, parallel_tasks: float | npt.ArrayLike) -> float | npt.NDArray[np.float64]:
        """Attainable tasks per second at ``n`` parallel tasks: the lowest ceiling (Ding eq. 1).

        The wall is not applied here (:meth:`place` marks runs beyond it).

        Args:
            parallel_tasks: ``n``, finite and > 0; a scalar or an array.

        Returns:
            A float for a scalar, else a float64 array of the shape of ``parallel_tasks``; tasks/s.

        Raises:
            ValueError: an ``n`` is not finite or <= 0.
        """
        n = np.asarray(parallel_tasks, dtype=np.float64)
        if not np.all(np.isfinite(n)) or np.any(n <= 0):
            raise ValueError(f"parallel tasks must be finite and > 0, got {parallel_tasks!r}")
        tps = np.min([c.at(n) for c in self.ceilings], axis=0)
        return float(tps) if n.ndim == 0 and not isinstance(parallel_tasks, np.ndarray) else tps

    def bound(self, parallel_tasks: float) -> Ceiling:
        """The ceiling lowest at ``parallel_tasks`` (the first of equals): what bounds a run there (Fig. 3)."""
        values = [float(c.at(parallel_tasks)) for c in self.ceilings]
        return self.ceilings[values.index(min(values))]

    def zone(self, parallel_tasks: float, tasks_per_second: float) -> str | None:
        """The zone of Fig. 2a a run falls in, or ``None`` without both targets.

        Good makespan: ``parallel_tasks / tasks_per_second <= target_makespan_seconds`` (on or above the
        makespan diagonal); good throughput: ``tasks_per_second >= target_throughput_tasks_per_second``.
        """
        if self.target_makespan_seconds is None or self.target_throughput_tasks_per_second is None:
            return None
        good_makespan = tasks_per_second * self.target_makespan_seconds >= parallel_tasks
        good_throughput = tasks_per_second >= self.target_throughput_tasks_per_second
        return {
            (True, True): ZONE_GOOD_GOOD,
            (True, False): ZONE_GOOD_POOR,
            (False, True): ZONE_POOR_GOOD,
            (False, False): ZONE_POOR_POOR,
        }[(good_makespan, good_throughput)]

    def place(self, label: str, parallel_tasks: int, tasks: int, makespan_seconds: float) -> dict[str, Any]:
        """A measured run on the roofline, JSON-ready.

        Its throughput is ``tasks / makespan`` (Ding section III-B); its task makespan ``parallel tasks /
        throughput``.

        Returns:
            ``{"label", "parallel_tasks", "tasks", "makespan_seconds", "tasks_per_second",
            "task_makespan_seconds", "attainable_tasks_per_second", "bound", "bound_kind", "beyond_wall",
            "headroom", "score" (Zhu eqs. 10-11), "zone"}``.

        Raises:
            ValueError: ``parallel_tasks`` or ``tasks`` < 1, or ``makespan_seconds`` not finite and > 0.
        """
        if parallel_tasks < 1 or tasks < 1:
            raise ValueError(f"a run has >= 1 task and >= 1 parallel task, got {tasks} and {parallel_tasks}")
        tps = tasks / _positive("makespan_seconds", makespan_seconds)
        attainable = self.attainable(float(parallel_tasks))
        bound = self.bound(float(parallel_tasks))
        return {
            "label": label,
            "parallel_tasks": parallel_tasks,
            "tasks": tasks,
            "makespan_seconds": makespan_seconds,
            "tasks_per_second": tps,
            "task_makespan_seconds": parallel_tasks / tps,
            "attainable_tasks_per_second": attainable,
            "bound": bound.name,
            "bound_kind": bound.kind,
            "beyond_wall": parallel_tasks > self.wall,
            "headroom": attainable / tps,
            "score": rate_score(attainable, tps),
            "zone": self.zone(parallel_tasks, tps),
        }

    def to_dict(self) -> dict[str, Any]:
        """``{"name", "ceilings": [{"name", "kind", "tasks_per_second", "seconds_per_task"}], "wall",
        "target_makespan_seconds", "target_throughput_tasks_per_second"}``."""
        return {
            "name": self.name,
            "ceilings": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    "tasks_per_second": c.tasks_per_second,
                    "seconds_per_task": c.seconds_per_task,
                }
                for c in self.ceilings
            ],
            "wall": self.wall,
            "target_makespan_seconds": self.target_makespan_seconds,
            "target_throughput_tasks_per_second": self.target_throughput_tasks_per_second,
        }


# ----------------------------------------------------------------------------------------------------------
# A workflow against a service
# ----------------------------------------------------------------------------------------------------------


class StageSpec(BaseModel):
    """One stage of the workflow: tasks alike, each making RPCs and moving bytes through the service."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str = Field(min_length=1)
    tasks: int = Field(ge=1, description="tasks of this stage")
    rpcs_per_task: int = Field(ge=0, description="RPCs one task makes to the service")
    bytes_per_task: int = Field(ge=0, description="bytes one task moves through the service (both directions)")

    @model_validator(mode="after")
    def _does_something(self) -> StageSpec:
        if self.rpcs_per_task == 0 and self.bytes_per_task == 0:
            raise ValueError(f"stage {self.name!r} makes no RPC and moves no byte: the service bounds nothing")
        return self


class WorkflowRunSpec(BaseModel):
    """A measured run of the whole workflow."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    label: str = ""
    parallel_tasks: int = Field(ge=1, description="tasks that ran at once")
    makespan_seconds: float = Field(gt=0, allow_inf_nan=False, description="first task's start to last task's end")
    tasks: int | None = Field(default=None, ge=1, description="tasks completed (default: every task of every stage)")


class WorkflowSpec(BaseModel):
    """A workflow against a service. JSON shape::

    {"kind": "svcframe-workflow", "name": "write then read", "servers": 2, "parallel_tasks": 4,
     "client_processes_per_task": 1, "available_client_processes": null,
     "target_makespan_seconds": 2.0, "target_throughput_tasks_per_second": 10.0,
     "stages": [{"name": "write", "tasks": 16, "rpcs_per_task": 1000, "bytes_per_task": 1048576},
                {"name": "read", "tasks": 16, "rpcs_per_task": 1000, "bytes_per_task": 1048576}],
     "runs": [{"label": "run 1", "parallel_tasks": 4, "makespan_seconds": 3.5}]}
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    kind: Literal["svcframe-workflow"] = "svcframe-workflow"
    name: str = Field(min_length=1)
    servers: int = Field(ge=1, description="server processes of the service")
    parallel_tasks: int = Field(ge=1, description="tasks the workflow runs at once (Ding's x)")
    client_processes_per_task: int = Field(
        default=1, ge=1, description="client processes one task runs (its intra-task parallelism)"
    )
    available_client_processes: int | None = Field(
        default=None, ge=1, description="client processes that can run at once (default: the platform's client cores)"
    )
    target_makespan_seconds: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="the time a task may take"
    )
    target_throughput_tasks_per_second: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    stages: list[StageSpec] = Field(min_length=1, description="run one after the other")
    runs: list[WorkflowRunSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_stage_names(self) -> WorkflowSpec:
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        return self

    @property
    def tasks(self) -> int:
        """Every task of every stage."""
        return sum(s.tasks for s in self.stages)

    @classmethod
    def from_document(cls, doc: Any, source: str = "workflow") -> WorkflowSpec:
        """Validate a decoded JSON document.

        Raises:
            ValueError: one line per problem, naming ``source``, the JSON path, the value and what was expected.
        """
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            from svcframe.config import format_validation_error  # on the error path only

            raise ValueError(format_validation_error(exc, source)) from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WorkflowSpec:
        """Read and validate a workflow JSON file.

        Raises:
            ValueError: the file cannot be read, is not JSON, or is not a valid workflow.
        """
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read a workflow: {exc}") from None
        return cls.from_document(doc, str(path))


def _lower_bound_marks(rl: Roofline, bound: Bound) -> tuple[str, str]:
    """``"≥ "`` (or ``""``) for a node ceiling ``min(Pc, Ps)`` and for a system ceiling ``Ps``: a ceiling drawn
    from a parameter that is a lower bound (:class:`~selftest.roofline.Saturation`) lies too low."""
    pc, ps = getattr(rl.pc, bound), getattr(rl.ps, bound)
    node_low = (rl.pc_lower_bound and pc <= ps) or (rl.ps_lower_bound and ps <= pc)
    return ("≥ " if node_low else ""), ("≥ " if rl.ps_lower_bound else "")


def _service_ceilings(
    platform: Platform, servers: int, processes_per_task: int, rpcs: float, nbytes: float, bound: Bound
) -> tuple[Ceiling, ...]:
    """Node and system ceilings of a task making ``rpcs`` RPCs and moving ``nbytes`` bytes (see module doc)."""
    ceilings: list[Ceiling] = []
    per_process = "per client process" if processes_per_task == 1 else f"x {processes_per_task} client processes"
    if rpcs > 0:
        rl = platform.roofline("rpc_rate")
        node, ps = rl.attainable(1.0, bound), getattr(rl.ps, bound)
        at_least, ps_at_least = _lower_bound_marks(rl, bound)
        ceilings.append(
            node_ceiling(f"node: RPC rate {at_least}{node:,.0f} ops/s {per_process}", rpcs, node * processes_per_task)
        )
        ceilings.append(
            system_ceiling(f"system: RPC rate Ps {ps_at_least}{ps:,.0f} ops/s x {servers} servers", rpcs, ps * servers)
        )
    if nbytes > 0:
        rl = platform.roofline("bandwidth")
        node, ps = rl.attainable(1.0, bound), getattr(rl.ps, bound)
        unit = rl.metric.unit
        at_least, ps_at_least = _lower_bound_marks(rl, bound)
        ceilings.append(
            node_ceiling(
                f"node: bandwidth {at_least}{node:.3g} {unit} {per_process}",
                nbytes,
                bytes_per_second(rl.metric, node) * processes_per_task,
            )
        )
        ceilings.append(
            system_ceiling(
                f"system: bandwidth Ps {ps_at_least}{ps:.3g} {unit} x {servers} servers",
                nbytes,
                bytes_per_second(rl.metric, ps) * servers,
            )
        )
    return tuple(ceilings)


def from_platform(platform: Platform, spec: WorkflowSpec, bound: Bound = "max") -> WorkflowRoofline:
    """The workflow roofline of ``spec`` against the service measured as ``platform`` (see module doc).

    Args:
        platform: needs ``rpc_rate`` when a stage makes RPCs and ``bandwidth`` when one moves bytes.
        spec: the workflow.
        bound: ``"max"`` or ``"min"`` of the measured parameter ranges.

    Raises:
        ValueError: the platform lacks a metric the workflow needs, or neither the spec nor the platform
            says how many client processes are available.
    """
    available = spec.available_client_processes or platform.client_cores
    if available is None:
        raise ValueError(
            "the platform model does not record its client cores: give available_client_processes in the workflow"
        )
    tasks = spec.tasks
    rpcs = sum(s.tasks * s.rpcs_per_task for s in spec.stages) / tasks
    nbytes = sum(s.tasks * s.bytes_per_task for s in spec.stages) / tasks
    return WorkflowRoofline(
        name=spec.name,
        ceilings=_service_ceilings(platform, spec.servers, spec.client_processes_per_task, rpcs, nbytes, bound),
        wall=parallelism_wall(available, spec.client_processes_per_task),
        target_makespan_seconds=spec.target_makespan_seconds,
        target_throughput_tasks_per_second=spec.target_throughput_tasks_per_second,
    )


def analyse(platform: Platform, spec: WorkflowSpec, bound: Bound = "max") -> dict[str, Any]:
    """The workflow roofline of ``spec`` with its runs placed, and each stage's bound (Ding Fig. 7c's task
    view), JSON-ready.

    Returns:
        ``{"kind": "svcframe-workflow-roofline", "workflow", "platform", "bound", "roofline":
        WorkflowRoofline.to_dict(), "parallel_tasks", "beyond_wall", "attainable_tasks_per_second" (at the
        spec's parallel tasks), "attainable_zone" (the zone of Fig. 2a the roof reaches there, None without
        both targets), "stages": [{"name", "tasks", "attainable_tasks_per_second", "bound",
        "makespan_lower_bound_seconds"}],
        "makespan_lower_bound_seconds" (the stages' sum: they run one after the other), "runs": [place()],
        "notes": the platform's ``Pc`` and ``Ps`` the ceilings use that are lower bounds
        (:meth:`Platform.lower_bounds`)}``.

    Raises:
        ValueError: as :func:`from_platform`.
    """
    roofline = from_platform(platform, spec, bound)
    n = float(spec.parallel_tasks)
    stages: list[dict[str, Any]] = []
    for s in spec.stages:
        stage = WorkflowRoofline(
            s.name,
            _service_ceilings(
                platform, spec.servers, spec.client_processes_per_task, s.rpcs_per_task, s.bytes_per_task, bound
            ),
            roofline.wall,
        )
        tps = stage.attainable(n)
        stages.append(
            {
                "name": s.name,
                "tasks": s.tasks,
                "attainable_tasks_per_second": tps,
                "bound": stage.bound(n).name,
                "makespan_lower_bound_seconds": s.tasks / tps,
            }
        )
    return {
        "kind": "svcframe-workflow-roofline",
        "workflow": spec.name,
        "platform": platform.label,
        "bound": bound,
        "roofline": roofline.to_dict(),
        "parallel_tasks": spec.parallel_tasks,
        "beyond_wall": spec.parallel_tasks > roofline.wall,
        "attainable_tasks_per_second": roofline.attainable(n),
        "attainable_zone": roofline.zone(n, roofline.attainable(n)),
        "stages": stages,
        "makespan_lower_bound_seconds": math.fsum(s["makespan_lower_bound_seconds"] for s in stages),
        "runs": [
            roofline.place(r.label, r.parallel_tasks, r.tasks or spec.tasks, r.makespan_seconds) for r in spec.runs
        ],
        "notes": platform.lower_bounds(
            (["rpc_rate"] if any(s.rpcs_per_task for s in spec.stages) else [])
            + (["bandwidth"] if any(s.bytes_per_task for s in spec.stages) else [])
        ),
    }
