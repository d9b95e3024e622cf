"""Reports of roofline runs: terminal summaries (rich) and one self-contained HTML page per run.

``write_report(run, history, path)`` renders a run of the results store (``selftest/store.py``) as a single
HTML file with no external resource: every plot is a PNG embedded as a base64 ``data:`` URI, every table
plain HTML. It holds the rooflines of each metric (Carns et al. 2025, Figures 13 and 14), the
server-process sweep (Figures 9 and 10), the validation scores per sample and per region (Zhu, Neuwirth
et al. eqs. 10-12), the cross-metric combined score, the "is that normal?" comparison against the
history of the same service and platform (UMAMI, ``papers/darshan-tokio-slides.txt``), the workloads placed
on the run's model (``svcframe roofline place``: each point's score, region, headroom and limit), the split of
wall time between measurement and everything else, every raw measurement, and the parameters, environment,
hardware and software versions of the run.

:func:`placement_table` gives ``svcframe roofline place`` its table (printed by ``svcframe.cli.common``'s
``print_table``) and the page its placements, figures in one notation (``svcframe.units``).
"""

from __future__ import annotations

import base64
import html
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from svcframe.units import quantity, quantity_range

from .roofline import REGION_CLIENT_BOUND, REGION_SERVER_BOUND, Platform, Roofline, plot, plot_placement
from .roofline.dataservice import BYTE_RATE_UNITS, CONTENDED_WAITING
from .store import compare, plot_history
from .sweep import plot_sweep

OVERHEAD_PARTS = (
    ("measurement_seconds", "measurement intervals"),
    ("launch_seconds", "server launch + readiness"),
    ("client_start_seconds", "client processes start"),
    ("coordination_seconds", "per-measurement warm-up, barriers, CPU samples"),
    ("store_seconds", "saving results"),
    ("analysis_seconds", "model + plots"),
    ("teardown_seconds", "teardown"),
    ("other_seconds", "other"),
)
"""Parts of the overhead split, in print order: (key in ``doc["overhead"]``, label)."""


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    return str(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _ratio(x: float) -> str:
    # 0.25 -> "1/4", 2.0 -> "2", 0.4 -> "0.4"
    if x < 1 and abs(1 / x - round(1 / x)) < 1e-9:
        return f"1/{round(1 / x)}"
    return f"{x:.3g}"


PLACEMENT_COLUMNS = ("SxC", "X", "calls/s", "roof", "headroom", "limit", "region", "score")
"""The columns of a placement table: servers x clients, service ratio, measured and attainable calls per second
per client process, attainable / measured, the limiting metric, the region, the score."""
PLACEMENT_FIGURES = ("X", "calls/s", "roof", "headroom", "score")
"""The columns of :data:`PLACEMENT_COLUMNS` that hold figures (aligned right)."""


def placement_table(placement: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The rows of a placement (``place()``'s document) under :data:`PLACEMENT_COLUMNS`; a point with more
    than one process per core has its score marked ``*`` (not claimed by the model)."""
    rows: list[tuple[str, ...]] = []
    for r in placement["points"]:
        headroom = "-" if r["headroom"] is None else f"{r['headroom']:.3g}x"
        limit = {"rpc_rate": "RPC rate", "bandwidth": "bandwidth"}.get(r["limited_by"], r["limited_by"])
        score = f"{r['score']:.2f}" + ("*" if r["oversubscribed"] else "")
        rows.append((f"{r['servers']}x{r['clients']}", _ratio(r["service_ratio"]),
                     quantity(r["rate_per_client_ops_per_second"]), quantity(r["attainable_ops_per_second"]), headroom,
                     limit, r["region"], score))  # fmt: skip
    return rows


# ----------------------------------------------------------------------------------------------------------
# Terminal
# ----------------------------------------------------------------------------------------------------------


def overhead_rows(overhead: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """``(label, seconds, percent of wall)`` for each part of the split, measurement first."""
    wall = float(overhead.get("wall_seconds") or 0.0)
    return [
        (label, float(overhead.get(key) or 0.0), 100.0 * float(overhead.get(key) or 0.0) / wall if wall else 0.0)
        for key, label in OVERHEAD_PARTS
    ]


def node_words(nodes: Mapping[str, Any] | None) -> tuple[str, str]:
    """What a run's nodes are called in sentences, and how to get more of them, by where they came from:
    ``("this machine", "--nodes local:K, --hostfile")``, ``("the 2 nodes of the Slurm allocation", "a larger
    allocation: salloc -N")``, ``("the 3 hosts of hostfile h", "more hosts in the hostfile")``."""
    source = str((nodes or {}).get("source") or "local")
    count = len((nodes or {}).get("nodes") or [])
    if source == "slurm":
        return f"the {count} nodes of the Slurm allocation", "a larger allocation: salloc -N or sbatch -N"
    if source.startswith("hostfile:"):
        return f"the {count} hosts of hostfile {source.split(':', 1)[1]}", "more hosts in the hostfile"
    if source == "pbs":
        return f"the {count} nodes of the PBS allocation", "a larger allocation: qsub -l select=N"
    return "this machine", "--nodes local:K on a larger machine, --hostfile, or a Slurm allocation"


def validity_lines(
    models: Mapping[str, Mapping[str, Any]],
    nodes: Mapping[str, Any] | None,
    load_average: float | None = None,
    usable_cores: int | None = None,
) -> list[str]:
    """Plain sentences on what the model can claim on these nodes (this machine, the allocation's...: from
    ``nodes["source"]``, :func:`node_words`), for the terminal and the page, each computed from the run's own
    data (nothing is guessed).

    Per metric: how many validation samples the model claims (one process per core or fewer: Carns et al.
    2025, section 4.3 and Figures 11-12) and their median error, and the samples whose processes share cores
    (``scores["excluded"]``), left out of the scores and errors; then what the metric's own numbers show about
    its ceilings (:meth:`~selftest.roofline.Roofline.findings`: a ``Pc`` or ``Ps`` that is a lower bound and
    what was measured, contention, the spread of repeats, a sample that repeats ``Pc``'s configuration, the
    samples above the ceiling). Then why samples were excluded, the repeatability, and a verdict: the largest
    median error of the claimed samples of the metrics whose ceilings were measured at their definitions; the
    metrics whose ceilings are lower bounds, which their errors cannot validate; or that the nodes cannot
    validate the model and why (no more than one claimed sample per metric; other processes loading the cores).

    Args:
        models: ``Roofline.to_dict()`` per metric name.
        nodes: the run's ``NodeSet.to_dict()`` (the slots of the server node and the client nodes).
        load_average: the 1-minute load average as the run began (other processes' load), if recorded.
        usable_cores: the machine's usable cores (``environment["usable_cores"]``), if recorded.

    Returns:
        Lines of text.
    """
    node_list = list((nodes or {}).get("nodes") or [])
    where, more_nodes = node_words(nodes)
    server_cores = int(node_list[0]["slots"]) if node_list else None
    client_cores = sum(int(n["slots"]) for n in node_list[1:]) if len(node_list) > 1 else None
    lines: list[str] = []
    any_excluded = False
    worst_spread: tuple[float, str] = (0.0, "")
    worst_same: tuple[float, str] = (0.0, "")
    bounded: dict[str, list[str]] = {}
    contended: list[str] = []
    for name, m in models.items():
        rl = Roofline.from_dict(m)
        scores = m["scores"]
        claimed = scores["overall"]
        excluded = scores.get("excluded") or {"count": 0}
        total = claimed["count"] + excluded["count"]
        spreads = {p: m[p]["max"] / m[p]["min"] - 1.0 for p in ("pc", "ps")}
        worst_spread = max(worst_spread, *((v, f"{name} {p.capitalize()}") for p, v in spreads.items()))
        for sample in rl.samples:
            diff = sample.pc_difference
            if diff is not None:
                worst_same = max(worst_same, (abs(diff), f"{name} {sample.servers}x{sample.clients}"))
        bounded[name] = [p for p, low in (("Pc", rl.pc_lower_bound), ("Ps", rl.ps_lower_bound)) if low]
        for p_name, saturation in (("Pc", rl.pc_saturation), ("Ps", rl.ps_saturation)):
            if saturation is not None and (saturation.contention or 0.0) >= CONTENDED_WAITING:
                contended.append(f"{name} {p_name} {_pct(saturation.contention)}")
        if total:
            if claimed["count"]:
                text = (f"{name}: the model claims {claimed['count']} of {total} validation samples (one process per "
                        f"core or fewer): median error {_pct(claimed['median_relative_error'])}")  # fmt: skip
            else:
                text = f"{name}: no validation sample fits the cores, so {where} cannot validate the model"
            if excluded["count"]:
                any_excluded = True
                rows = [r for r in scores["samples"] if r.get("oversubscribed")]
                most_s = max((r.get("server_processes_per_core") or 0 for r in rows), default=0)
                most_c = max((r.get("client_processes_per_core") or 0 for r in rows), default=0)
                text += (f"; {excluded['count']} share cores (up to {most_s:g} server and {most_c:g} client processes "
                         f"per core; median error {_pct(excluded['median_relative_error'])}, excluded)")  # fmt: skip
            lines.append(text + ".")
        lines += [f"{name}: {finding}." for finding in rl.findings()]
    if any_excluded:
        cores = (f"{where} give the server node {server_cores} core(s) and the client nodes {client_cores}; "
                 if server_cores is not None and client_cores is not None else "")  # fmt: skip
        lines.append(f"Why excluded: {cores}the model assumes one process per core (Carns et al. 2025, section "
                     "4.3, Figures 11-12: parameters and validation with one process per physical core), so "
                     "samples whose processes share cores are circled in red in the plots and left out of the "
                     "scores and errors above. To validate more of the model, keep --grid-servers within the "
                     f"server node's cores and --grid-clients within the client nodes' cores, or use more nodes "
                     f"({more_nodes}).")  # fmt: skip
    if worst_spread[1]:
        same = (f"; a sample repeating Pc's configuration differed from Pc by up to {_pct(worst_same[0])} "
                f"({worst_same[1]})" if worst_same[1] else "")  # fmt: skip
        lines.append(f"Repeatability: the same parameter measured again varied by up to {_pct(worst_spread[0])} "
                     f"({worst_spread[1]}){same}; model errors of that size cannot be told from the "
                     f"variation of {where}.")  # fmt: skip
    claimed = {name: m["scores"]["overall"] for name, m in models.items()}
    reasons = []
    if claimed and max(c["count"] for c in claimed.values()) <= 1:
        reasons.append(f"at most one validation sample per metric fits its cores ({server_cores} server, "
                       f"{client_cores} client), and one sample cannot test the model's shape")  # fmt: skip
    if load_average is not None and usable_cores and load_average > usable_cores:
        reasons.append(f"other processes held the load average at {load_average:.1f} on {usable_cores} usable "
                       "cores as the run began, so its rates are not repeatable; rerun on an idle machine")  # fmt: skip
    if contended:
        reasons.append(f"its processes waited for their cores ({', '.join(contended)} of the time they were ready "
                       "to run): other processes took them, so its rates are lower than the machine's")  # fmt: skip
    lower = {name: p for name, p in bounded.items() if p}
    lower_text = "; ".join(f"{name}'s {' and '.join(p)}" for name, p in lower.items())
    if reasons:
        lines.append(f"Verdict: {where} cannot validate the model: " + "; ".join(reasons) + "."
                     + (f" Lower bounds, besides: {lower_text}." if lower else ""))  # fmt: skip
        return lines
    errors = {n: c["median_relative_error"] for n, c in claimed.items() if c["count"] and n not in lower}
    verdict = []
    if errors:
        worst = max(errors, key=lambda n: errors[n])
        each = ", ".join(f"{n} {_pct(e)}" for n, e in errors.items())
        verdict.append(f"the model predicts the samples it claims with a median error of at most "
                       f"{_pct(errors[worst])} ({each})")  # fmt: skip
    if lower:
        one = sum(len(p) for p in lower.values()) == 1
        verdict.append(f"{lower_text} {'is a lower bound' if one else 'are lower bounds'} (measured short of "
                       "saturation, see above): "
                       + ("the ceiling drawn from it lies too low, so the errors against it do not test the model"
                          if one else "the ceilings drawn from them lie too low, so the errors against them do not "
                          "test the model"))  # fmt: skip
    if verdict:
        lines.append("Verdict: " + "; ".join(verdict) + ".")
    return lines


SATURATION_COLUMNS = ("metric", "param", "load", "server CPU", "client CPU", "reading")
"""The columns of :func:`saturation_rows`: the parameter (Pc, Ps), the load it was measured under, the CPU its
server and its clients used / wanted (ran or waited for; fractions of their cores), and what that makes it."""


def _cpu_cell(used: float | None, wanted: float | None) -> str:
    # "15% / 85%": used / wanted; "15%" when the kernel told nothing more
    return _pct(used) + (f" / {_pct(wanted)}" if wanted is not None else "")


def saturation_rows(models: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """Per metric, one row for ``Pc`` and one for ``Ps`` under :data:`SATURATION_COLUMNS`: how each was measured
    and whether it is a lower bound (:class:`~selftest.roofline.Saturation`); metrics that recorded none are left
    out."""
    rows: list[tuple[str, ...]] = []
    for name, m in models.items():
        rl = Roofline.from_dict(m)
        for param, saturation in (("Pc", rl.pc_saturation), ("Ps", rl.ps_saturation)):
            if saturation is None:
                continue
            if param == "Pc":
                load = "1 client x 1 call"
                reading = "lower bound" if saturation.lower_bound else "client-bound"
            else:
                rates = [step["rate"] for step in saturation.ramp]
                best = saturation.ramp[rates.index(max(rates))] if rates else None
                load = (f"{best['clients']:g} clients x {best['depth']:g} calls (of {len(rates)} loads)"
                        if best is not None else "-")  # fmt: skip
                reading = "lower bound" if saturation.lower_bound else "saturated"
            rows.append((name, param, load, _cpu_cell(saturation.server_utilization, saturation.server_demand),
                         _cpu_cell(saturation.client_utilization, saturation.client_demand), reading))  # fmt: skip
    return rows


def ceiling_cells(m: Mapping[str, Any]) -> tuple[str, str, str]:
    """The ``Pc``, ``Ps`` and ridge of a metric (``Roofline.to_dict()``) as the tables show them, in the metric's
    unit (``Metric.format_range``); a lower bound is marked ``≥`` (and the ridge ``≤`` or ``≥``: which way a
    larger parameter moves it)."""
    rl = Roofline.from_dict(m)
    pc = ("≥ " if rl.pc_lower_bound else "") + rl.metric.format_range(rl.pc.min, rl.pc.max)
    ps = ("≥ " if rl.ps_lower_bound else "") + rl.metric.format_range(rl.ps.min, rl.ps.max)
    relation = {"=": "", "<=": "≤ ", ">=": "≥ ", "?": "? "}[rl.ridge_relation]
    return pc, ps, relation + _ratio_text(rl.ridge("max"))


MEASUREMENT_COLUMNS = (
    "#",
    "stage",
    "metric",
    "load",
    "per client",
    "aggregate",
    "p50 latency",
    "server CPU/op",
    "CPU server, clients",
    "at",
)
"""The columns of :func:`measurement_rows`."""


def measurement_rows(samples: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """Every stored measurement of a run under :data:`MEASUREMENT_COLUMNS`, each figure with its unit (rates in
    the metric's, as in the tables and plots; ``Metric.format``)."""
    from .roofline import METRICS

    rows: list[tuple[Any, ...]] = []
    for i, row in enumerate(samples):
        metric = METRICS.get(row["metric"])

        def rate(value: Any, metric: Any = metric) -> str:
            return "-" if value is None else metric.format(value) if metric is not None else _fmt(value)

        load = f"{row['servers']}x{row['clients']}" + (f"x{row['depth']}" if row.get("depth") else "")
        cpu = f"{_pct(row.get('server_utilization'))}, {_pct(row.get('client_core_utilization'))}"
        when = time.strftime("%H:%M:%S", time.localtime(row["created"])) if row.get("created") else "-"
        rows.append((i + 1, row["stage"], row["metric"], load, rate(row.get("per_client")), rate(row.get("aggregate")),
                     quantity(row.get("latency_p50_usec"), "usec"), quantity(row.get("server_cpu_usec_per_op"), "usec"),
                     cpu, when))  # fmt: skip
    return rows


def _errors_cell(s: Mapping[str, Any]) -> str:
    # "29% / 41% (n=3)": median / worst |relative error| of a summary's samples
    if not s["count"]:
        return "-"
    return f"{_pct(s['median_relative_error'])} / {_pct(s['worst_relative_error'])} (n={s['count']})"


def collect_summary_json(doc: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """The machine-readable summary of ``collect`` (``--json``): per metric its ceilings (each with
    ``lower_bound``) and how they were measured (``pc_saturation``, ``ps_saturation``), parameters, scores, the
    samples above its ceiling and its findings; the validity sentences; the wall-time split; the files. Rates
    are in the metric's ``unit``, as in the tables and plots."""
    from .collect import metric_parameters

    options = doc.get("options") or {}
    env = doc.get("environment") or {}
    metrics = {}
    for name, m in doc["metrics"].items():
        rl = Roofline.from_dict(m)
        above = rl.above_ceiling()
        metrics[name] = {
            "unit": m["metric"]["unit"], "parameters": metric_parameters(name, options),
            "pc": {**m["pc"], "lower_bound": rl.pc_lower_bound}, "ps": {**m["ps"], "lower_bound": rl.ps_lower_bound},
            "pc_saturation": m.get("pc_saturation"), "ps_saturation": m.get("ps_saturation"),
            "ridge": m["ridge"], "scores": {k: m["scores"][k] for k in ("overall", "regions", "excluded")},
            "above_ceiling": [{**s.to_dict(), "excess": excess} for s, excess in above],
            "findings": rl.findings(), "plot": str(out / f"{name}.png"),
        }  # fmt: skip
    return {
        "kind": "svcframe-roofline-summary", "run_id": doc.get("run_id"), "store": doc.get("store"),
        "metrics": metrics, "combined_score": doc.get("combined_score"), "weights": doc.get("weights"),
        "validity": validity_lines(doc["metrics"], doc.get("nodes"), doc.get("load_average"), env.get("usable_cores")),
        "overhead": doc.get("overhead"), "model": str(out / "roofline.json"),
        "sweep_plot": str(out / "sweep.png") if doc.get("sweep") else None,
    }  # fmt: skip


def print_collect_summary(doc: Mapping[str, Any], out: Path) -> None:
    """The terminal summary of ``collect``: per metric its ceilings and what they were measured with, scores
    and errors per region and the samples above the ceiling, what the model can claim here, the combined
    score, the wall-time split, and where plots, model and store are. Fits 80 columns; nothing is cut."""
    from svcframe.cli.common import output_console, print_lines, print_table

    from .collect import metric_parameters

    console = output_console()
    options = doc.get("options") or {}
    ceilings, checks = [], []
    for name, m in doc["metrics"].items():
        ceilings.append((name, *ceiling_cells(m)))
        scores = m["scores"]
        above = Roofline.from_dict(m).above_ceiling()
        checks.append((
            name, "-" if scores["overall"]["score"] is None else f"{scores['overall']['score']:.3f}",
            _errors_cell(scores["regions"][REGION_SERVER_BOUND]), _errors_cell(scores["regions"][REGION_CLIENT_BOUND]),
            f"{len(above)} (+{_pct(max(e for _, e in above))})" if above else "0",
        ))  # fmt: skip
    title = f"data-service roofline of {node_words(doc.get('nodes'))[0]}: ceilings (min-max of the repeats; ≥: a lower bound)"
    print_table(("metric", "Pc per client", "Ps per server", "ridge X*"), ceilings, numeric=("ridge X*",),
                title=title, console=console)  # fmt: skip
    print_lines(*(f"  {name}: {metric_parameters(name, options)}" for name in doc["metrics"]), console=console)
    saturation = saturation_rows(doc["metrics"])
    if saturation:
        print_table(SATURATION_COLUMNS, saturation, title="how Pc and Ps were measured (CPU: used / wanted, of "
                    "their cores; Ps under the load of the highest rate the ramp found)", console=console)  # fmt: skip
    print_table(("metric", "score", "server-bound error", "client-bound error", "above roof"), checks,
                title="validation: median / worst |relative error| of the samples the model claims (n); samples "
                "above the upper ceiling (largest excess)", console=console)  # fmt: skip
    env = doc.get("environment") or {}
    print_lines(*validity_lines(doc["metrics"], doc.get("nodes"), doc.get("load_average"), env.get("usable_cores")),
                console=console)  # fmt: skip
    combined = doc.get("combined_score")
    if combined is not None:
        weights = ", ".join(f"{k}={v:g}" for k, v in (doc.get("weights") or {}).items())
        print_lines(
            f"combined score (weighted geometric mean over metrics; {weights}): {combined:.3f}", console=console
        )
    overhead = doc.get("overhead") or {}
    if overhead:
        print_table(("part", "time", "share"),
                    [(label, quantity(seconds, "s"), f"{pct:.1f}%") for label, seconds, pct in overhead_rows(overhead)],
                    numeric=("time", "share"), title=f"wall time {quantity(overhead['wall_seconds'], 's')}",
                    console=console)  # fmt: skip
        resumed = overhead.get("resumed_measurements")
        resumed_text = f" (resumed: {resumed} measurements from the store)" if resumed else ""
        print_lines(f"outside measurement intervals: {100 * overhead['outside_fraction']:.1f}%{resumed_text}",
                    console=console)  # fmt: skip
    else:
        print_lines(f"wall time {quantity(doc['wall_seconds'], 's')}, of which measuring "
                    f"{quantity(doc['measurement_seconds'], 's')}", console=console)  # fmt: skip
    files = [f"plot: {out / (name + '.png')}" for name in doc["metrics"]]
    files += [f"plot: {out / 'sweep.png'}"] if doc.get("sweep") else []
    files.append(f"model: {out / 'roofline.json'}")
    if doc.get("run_id") is not None:
        files.append(f"stored as run {doc['run_id']} in {doc['store']}: svcframe report {doc['run_id']}, "
                     f"svcframe history show {doc['run_id']}")  # fmt: skip
    print_lines(*files, console=console)


def _ratio_text(x: float) -> str:
    # 0.25 -> "0.25 (1/4)", 1 -> "1": a service ratio as servers per client
    return f"{x:.3g} (1/{1 / x:.3g})" if x < 1 else f"{x:.3g}"


def history_rows(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The runs of :func:`print_history` as JSON-ready dicts (``history --json``)."""
    out = []
    for r in runs:
        summary = r.get("summary") or {}
        overhead = summary.get("overhead") or {}
        out.append({
            "id": r["id"], "created": r["created"], "status": r["status"], "service": r["service"],
            "platform": r["platform"], "measurements": r.get("sample_count", 0), "planned": len(r.get("plan") or []),
            "metrics": (r.get("options") or {}).get("metrics") or [], "wall_seconds": summary.get("wall_seconds"),
            "outside_fraction": overhead.get("outside_fraction"), "combined_score": summary.get("combined_score"),
        })  # fmt: skip
    return out


def print_history(runs: Sequence[Mapping[str, Any]], path: Path) -> None:
    """The runs of a results store, one table per service and platform (the history they are compared in):
    id, start, status, measurements stored of planned, metrics (``all`` for the four), wall time, the share
    of it outside measurement intervals, combined score. Fits 80 columns."""
    from svcframe.cli.common import output_console, print_lines, print_table

    from .collect import ALL_METRICS

    console = output_console()
    print_lines(f"runs in {path}", console=console)
    rows = history_rows(runs)
    for service, platform in dict.fromkeys((r["service"], r["platform"]) for r in rows):
        cells = [
            (r["id"], time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])), r["status"],
             f"{r['measurements']}/{r['planned']}",
             "all" if sorted(r["metrics"]) == sorted(ALL_METRICS) else ", ".join(r["metrics"]) or "-",
             quantity(r["wall_seconds"], "s"), _pct(r["outside_fraction"]),
             "-" if r["combined_score"] is None else f"{r['combined_score']:.3f}")
            for r in rows if (r["service"], r["platform"]) == (service, platform)
        ]  # fmt: skip
        print_table(("run", "started", "status", "measured", "metrics", "wall", "overhead", "score"), cells,
                    numeric=("run", "wall", "overhead", "score"), title=f"{service} on {platform}:",
                    console=console)  # fmt: skip
    if not runs:
        print_lines("no runs yet: svcframe roofline collect", console=console)


def print_comparison(run: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
    """:func:`selftest.store.compare` rows as a table: value, history count, median and range, percentile,
    verdict (coloured on a terminal). Fits 80 columns."""
    from rich.text import Text

    from svcframe.cli.common import output_console, print_table

    colors = {"normal": "green", "low": "red", "high": "yellow", "no history": "dim", "too little history": "dim"}
    cells = []
    for r in rows:
        unit = r["unit"] or ""
        if unit == "%":  # already a percentage
            value, median = f"{r['value']:.1f}%", "-" if r["median"] is None else f"{r['median']:.1f}%"
            spread = "-" if r["min"] is None else "-".join(dict.fromkeys(f"{r[k]:.1f}" for k in ("min", "max"))) + "%"
        else:  # a bandwidth in its own unit, as the tables and plots of the run show it
            keep = unit in BYTE_RATE_UNITS
            value, median = quantity(r["value"], unit, keep_unit=keep), quantity(r["median"], unit, keep_unit=keep)
            spread = quantity_range(r["min"], r["max"], unit, keep_unit=keep)
        cells.append((r["quantity"], value, r["count"], median, spread,
                      "-" if r["percentile"] is None else f"{r['percentile']:.0f}",
                      Text(r["verdict"], style=colors[r["verdict"]])))  # fmt: skip
    print_table(("quantity", "this run", "n", "median", "range", "pct", "is that normal?"), cells,
                numeric=("this run", "n", "median", "range", "pct"), console=output_console(),
                title=f"run {run['id']} against the history of {run['service']} on {run['platform']} (n earlier "
                "runs: median, range; pct: this run's percentile)")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------
# HTML
# ----------------------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: right; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
img { max-width: 100%; display: block; margin: .5em 0; border: 1px solid #eee; }
.low { color: #b00; } .high { color: #a60; } .normal { color: #070; }
.note { color: #666; font-size: .9em; }
"""


def _img(png: Path, alt: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{html.escape(h)}</th>' for i, h in enumerate(headers))
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"l" if i < left else ""}">{html.escape(_fmt(c))}</td>' for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _kv(d: Mapping[str, Any]) -> str:
    return _table(["key", "value"], [(k, v if not isinstance(v, dict | list) else str(v)) for k, v in d.items()])


def render_report(run: Mapping[str, Any], history: Sequence[Mapping[str, Any]], workdir: Path) -> str:
    """The HTML text of :func:`write_report`; plots are drawn into ``workdir`` then embedded."""
    from .collect import metric_parameters, plot_title

    model = run.get("model") or {}
    summary = run.get("summary") or {}
    rid = run["id"]
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>svcframe roofline run {rid}</title>"
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Data-service roofline: run {rid} ({html.escape(run['service'])} on {html.escape(run['platform'])})</h1>",
        f"<p>status <b>{html.escape(run['status'])}</b>, started {_when(run['created'])}, last update "
        f"{_when(run['updated'])}, host {html.escape(run['host'])}; {len(run.get('samples') or [])} of "
        f"{len(run.get('plan') or [])} planned measurements stored.</p>",
    ]
    metrics = model.get("metrics") or {}
    if not metrics:
        parts.append("<p class='note'>This run did not complete: no model. Resume it with "
                     f"<code>svcframe roofline collect --resume {rid}</code>.</p>")  # fmt: skip
    if metrics:
        parts.append("<h2>Summary</h2>")
        rows = []
        for name, m in metrics.items():
            sc = m["scores"]
            reg = sc["regions"]
            rows.append((
                name, *ceiling_cells(m), sc["overall"]["score"],
                *(_pct(reg[r][k]) for r in (REGION_SERVER_BOUND, REGION_CLIENT_BOUND)
                  for k in ("median_relative_error", "worst_relative_error")),
            ))  # fmt: skip
        parts.append(_table(["metric", "Pc (per client process)", "Ps (per server process)", "ridge X*", "score",
                             "server-bound median |rel. err|", "worst", "client-bound median |rel. err|", "worst"],
                            rows))  # fmt: skip
        parts.append("<p class='note'>≥: a lower bound, measured short of its definition (Carns et al. 2025, "
                     "section 4.3: Ps from a saturated server, Pc from a client whose server had capacity to spare); "
                     "the ridge moves the way a larger parameter moves it.</p>")  # fmt: skip
        saturation = saturation_rows(metrics)
        if saturation:
            parts.append("<h3>How Pc and Ps were measured</h3><p class='note'>CPU: used / wanted (ran, or waited "
                         "for a core), as fractions of their cores; Ps under the load of the highest rate the "
                         "saturation ramp found.</p>" + _table(SATURATION_COLUMNS, saturation, left=3))  # fmt: skip
        lines = validity_lines(metrics, run.get("nodes"), summary.get("load_average"),
                               (run.get("environment") or {}).get("usable_cores"))  # fmt: skip
        parts += [f"<p>{html.escape(line)}</p>" for line in lines]
        if summary.get("combined_score") is not None:
            weights = ", ".join(f"{k}={v:g}" for k, v in (summary.get("weights") or {}).items())
            parts.append(f"<p>Combined score over metrics (weighted geometric mean, Zhu, Neuwirth et al. eq. 12; "
                         f"weights {html.escape(weights)}): <b>{summary['combined_score']:.3f}</b>. A sample's score "
                         f"is 1/(1+|log10(R(X)/measured)|) (eqs. 10-11); R(X) = min(Pc, Ps·min(X, 1)).</p>")  # fmt: skip
        parts.append("<h2>Rooflines</h2><p class='note'>x: service ratio X = server processes / client processes "
                     "(log); y: rate per client process; lines: ceilings from the Pc and Ps ranges; points: "
                     "validation samples (Carns et al. 2025, Figures 13-14).</p>")  # fmt: skip
        for name, m in metrics.items():
            png = plot(Roofline.from_dict(m), workdir / f"{name}.png", title=plot_title(name, run.get("options") or {}))
            parts.append(f"<h3>{html.escape(name)}</h3>" + _img(png, f"{name} roofline"))
        sweep = model.get("sweep") or {}
        if any(sweep.values()):
            png = plot_sweep(sweep, workdir / "sweep.png",
                             parameters={m: metric_parameters(m, run.get("options") or {}) for m in sweep})  # fmt: skip
            parts.append("<h2>Server-process sweep</h2><p class='note'>Aggregate rate of one server node against its "
                         "server processes, saturated by client processes (Carns et al. 2025, Figures 9-10).</p>"
                         + _img(png, "server-process sweep"))  # fmt: skip
            parts.append(_table(["metric", "server processes", "client processes", "samples", "min", "median", "max"],
                                [(m, p["servers"], p["clients"], p["samples"], p["min"], p["median"], p["max"])
                                 for m, pts in sweep.items() for p in pts]))  # fmt: skip
        parts.append("<h2>Validation samples</h2>")
        vrows = []
        for name, m in metrics.items():
            for s in m["scores"]["samples"]:
                vrows.append((name, s["servers"], s["clients"], s["service_ratio"], s["rate_per_client"],
                              s["attainable"], s["efficiency"], s["relative_error"], s["score"], s["region"],
                              s.get("server_processes_per_core"), s.get("client_processes_per_core"),
                              "yes (excluded)" if s.get("oversubscribed") else "no"))  # fmt: skip
        parts.append(_table(["metric", "servers", "clients", "X", "measured per client", "R(X)", "efficiency",
                             "rel. error", "score", "region", "server procs/core", "client procs/core",
                             ">1 process/core"], vrows))  # fmt: skip
        placements = run.get("placements") or []
        if placements:
            parts.append(_placements_html(Platform.from_document(run), placements, workdir))
        if history:
            rows_c = compare(run, history)
            png = plot_history(run, history, workdir / "history.png")
            parts.append(f"<h2>Is that normal?</h2><p class='note'>This run against {len(history)} earlier complete "
                         "run(s) of the same service and platform (box: history, whiskers 1.5 IQR; red: this run), "
                         "as UMAMI shows a job against its history.</p>" + _img(png, "history box plots"))  # fmt: skip
            trs = []
            for r in rows_c:
                pct = "-" if r["percentile"] is None else f"{r['percentile']:.0f}"
                trs.append(
                    f"<tr><td class='l'>{html.escape(r['quantity'])}</td><td>{_fmt(r['value'])} "
                    f"{html.escape(r['unit'])}</td><td>{r['count']}</td><td>{_fmt(r['median'])}</td><td>{pct}</td>"
                    f"<td class='{r['verdict'].replace(' ', '-')}'>{html.escape(r['verdict'])}</td></tr>"
                )
            parts.append("<table><thead><tr><th class='l'>quantity</th><th>this run</th><th>history n</th>"
                         f"<th>history median</th><th>percentile</th><th>verdict</th></tr></thead><tbody>{''.join(trs)}"
                         "</tbody></table>")  # fmt: skip
        else:
            parts.append("<h2>Is that normal?</h2><p class='note'>No earlier complete run of this service on this "
                         "platform yet.</p>")  # fmt: skip
    overhead = summary.get("overhead") or {}
    if overhead:
        parts.append("<h2>Where the wall time went</h2>")
        parts.append(_table(["part", "seconds", "% of wall"],
                            [(label, round(sec, 3), round(pct, 1)) for label, sec, pct in overhead_rows(overhead)]))  # fmt: skip
        parts.append(f"<p>{100 * overhead['outside_fraction']:.1f}% of {overhead['wall_seconds']:.1f} s outside "
                     "measurement intervals.</p>")  # fmt: skip
    samples = run.get("samples") or []
    parts.append("<h2>Every measurement</h2><p class='note'>Load: server processes x client processes x calls "
                 "in flight per client. CPU: the fraction of a core each server used, and of their cores the "
                 "clients used. Rates in the metric's unit, as in the tables and plots above.</p>")  # fmt: skip
    parts.append(_table(MEASUREMENT_COLUMNS, measurement_rows(samples), left=3))
    parts.append("<h2>Parameters</h2>" + _kv(run.get("options") or {}))
    parts.append("<h2>Hardware</h2>" + _kv(run.get("hardware") or {}))
    parts.append("<h2>Software</h2>" + _kv(run.get("software") or {}))
    parts.append("<h2>Environment</h2>" + _kv(run.get("environment") or {}))
    parts.append(f"<p class='note'>Generated by svcframe report at {_when(time.time())}.</p></body></html>")
    return "\n".join(parts)


def _placements_html(platform: Platform, placements: Sequence[Mapping[str, Any]], workdir: Path) -> str:
    """The report's section of workloads placed on this run's model: per placement, its plot and table."""
    parts = ["<h2>Workloads placed on this platform</h2><p class='note'>Each workload's points over the RPC rate "
             "ceiling R(X) and the bandwidth ceiling per call (svcframe roofline place): calls/s per client process "
             "measured and attainable (roof), headroom = roof / measured, the metric that limits it, the region "
             "(server-bound below the ridge: more servers help; client-bound: each client is at its peak) and "
             "the score 1/(1+|log10(roof/measured)|) (Zhu, Neuwirth et al. eqs. 10-11). * : more than one "
             "process per core, not claimed by the model.</p>"]  # fmt: skip
    for i, placement in enumerate(placements):
        png = plot_placement(platform, placement, workdir / f"placement-{i}.png")
        summary = placement["summary"]
        score = "-" if summary["score"] is None else f"{summary['score']:.3f}"
        parts.append(
            f"<h3>{html.escape(placement['workload'])} ({html.escape(str(placement.get('rpc') or '-'))}), placed "
            f"{_when(placement.get('created'))}</h3>" + _img(png, f"{placement['workload']} placement")
            + _table(PLACEMENT_COLUMNS, placement_table(placement))
            + f"<p>score (points claimed, eq. 12): {score}; excluded (shared cores): {summary['excluded']}; "
            f"{placement['bound']} ceilings.</p>"
            + "".join(f"<p class='note'>{html.escape(n)}</p>" for n in placement.get("notes") or [])
        )  # fmt: skip
    return "\n".join(parts)


def report_html(run: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
    """The self-contained HTML page of a run, as text (:func:`render_report`, its plots drawn in a temporary
    directory and embedded)."""
    with tempfile.TemporaryDirectory(prefix="svcframe-report-") as tmp:
        return render_report(run, history, Path(tmp))


def write_report(run: Mapping[str, Any], history: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write the self-contained HTML page of a run.

    Args:
        run: a run from :meth:`selftest.store.ResultsStore.run` (with samples); an incomplete run gives a
            page of its stored samples and parameters.
        history: earlier complete runs of the same service and platform (may be empty).
        path: the HTML file to write (its directory must exist).

    Returns:
        ``path`` as a :class:`Path`.
    """
    out = Path(path)
    out.write_text(report_html(run, history), encoding="utf-8")
    return out
