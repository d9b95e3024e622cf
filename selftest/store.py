"""The results store: every roofline collection in one SQLite file, and "is that normal?" against history.

One file (default :func:`default_store_path`: ``$SVCFRAME_RESULTS``, else
``$XDG_DATA_HOME/svcframe/results.sqlite``, else ``~/.local/share/svcframe/results.sqlite``) holds every
run of ``svcframe roofline collect``: its parameters, environment, hardware, software versions, the plan
of measurements, every raw sample as it completes (so an interrupted run can be resumed), and the model
when it finishes. Structured documents are JSON text columns; ``sqlite3`` (stdlib) only.

Schema (``PRAGMA user_version`` = :data:`SCHEMA_VERSION`)::

    runs(id INTEGER PRIMARY KEY, kind, status, service, platform, host, created, updated,
         options JSON, environment JSON, hardware JSON, software JSON, plan JSON,
         model JSON NULL, summary JSON NULL, nodes JSON NULL)
    samples(id INTEGER PRIMARY KEY, run_id -> runs.id, key, stage, metric, servers, clients,
            value, row JSON, result JSON, created;  UNIQUE(run_id, key))
    placements(id INTEGER PRIMARY KEY, run_id -> runs.id, workload, created, document JSON)

``status`` is ``running``, ``interrupted``, ``failed`` or ``complete``. A sample's ``key`` names one
measurement of the plan (``"Pc/rpc_rate/s1/c1#0"``), so resuming skips exactly the stored ones. A
*placement* is a workload placed on a run's model (``svcframe roofline place``,
:func:`selftest.roofline.placement.place`), kept with that run so its report shows it.

History (the UMAMI view of Lockwood et al., ``papers/darshan-tokio-slides.txt``: "is that normal?"): the
complete runs of the same ``service`` and ``platform`` give, per quantity (each metric's ``Pc`` and
``Ps`` maxima, its validation score, the cross-metric score), a distribution drawn as a box plot with the
run under study as a marker, beside the history's values over time (:func:`plot_history`).

Errors: :class:`StoreError` (a :class:`svcframe.errors.SvcframeError`) for an unknown run, a file that is
not a results store, or a schema newer than this code.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from svcframe.errors import SvcframeError

SCHEMA_VERSION = 3
"""Version of the tables below, kept in ``PRAGMA user_version``; older files are migrated on open
(1 -> 2: ``runs.nodes``; 2 -> 3: the ``placements`` table)."""

STATUSES = ("running", "interrupted", "failed", "complete")

MIN_HISTORY = 3
"""Fewer earlier runs than this give no verdict (a box of one or two values has no spread to judge by)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL,
    service     TEXT NOT NULL,
    platform    TEXT NOT NULL,
    host        TEXT NOT NULL,
    created     REAL NOT NULL,
    updated     REAL NOT NULL,
    options     TEXT NOT NULL,
    environment TEXT NOT NULL,
    hardware    TEXT NOT NULL,
    software    TEXT NOT NULL,
    plan        TEXT NOT NULL,
    model       TEXT,
    summary     TEXT,
    nodes       TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_platform ON runs (service, platform, created);
CREATE TABLE IF NOT EXISTS samples (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id   INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    key      TEXT NOT NULL,
    stage    TEXT NOT NULL,
    metric   TEXT NOT NULL,
    servers  INTEGER NOT NULL,
    clients  INTEGER NOT NULL,
    value    REAL,
    row      TEXT NOT NULL,
    result   TEXT,
    created  REAL NOT NULL,
    UNIQUE (run_id, key)
);
CREATE TABLE IF NOT EXISTS placements (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id   INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    workload TEXT NOT NULL,
    created  REAL NOT NULL,
    document TEXT NOT NULL
);
"""

_JSON_COLUMNS = ("options", "environment", "hardware", "software", "plan", "model", "summary", "nodes")


class StoreError(SvcframeError):
    """The results store cannot do what was asked (unknown run, not a store, newer schema)."""


def default_store_path() -> Path:
    """``$SVCFRAME_RESULTS``, else ``$XDG_DATA_HOME/svcframe/results.sqlite``, else
    ``~/.local/share/svcframe/results.sqlite``."""
    env = os.environ.get("SVCFRAME_RESULTS")
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "svcframe" / "results.sqlite"


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, allow_nan=False, default=str)


class ResultsStore:
    """The SQLite results store.

    Args:
        path: the database file; its directory is created. ``":memory:"`` for a throwaway store.

    Raises:
        StoreError: the file is not an SQLite database, or its schema is newer than :data:`SCHEMA_VERSION`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path) if str(path) != ":memory:" else Path(":memory:")
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with ExitStack() as on_error:
                self._db = sqlite3.connect(str(path), timeout=30.0)
                on_error.callback(self._db.close)  # a store that fails to open leaves no connection behind
                self._db.row_factory = sqlite3.Row
                self._db.execute("PRAGMA foreign_keys = ON")
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise StoreError(
                        f"{path}: results store schema {version} is newer than this svcframe's "
                        f"({SCHEMA_VERSION}); upgrade svcframe or use another --store"
                    )
                with self._db:
                    self._db.executescript(_SCHEMA)
                    columns = {r[1] for r in self._db.execute("PRAGMA table_info(runs)")}
                    if "nodes" not in columns:  # a version 1 file
                        self._db.execute("ALTER TABLE runs ADD COLUMN nodes TEXT")
                    self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                on_error.pop_all()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path} is not a usable results store: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._db:
            yield self._db

    # -- runs ----------------------------------------------------------------------------------------------
    def create_run(
        self,
        *,
        kind: str,
        service: str,
        platform: str,
        host: str,
        options: Mapping[str, Any],
        environment: Mapping[str, Any],
        hardware: Mapping[str, Any],
        software: Mapping[str, Any],
        plan: Sequence[Any],
        nodes: Mapping[str, Any] | None = None,
    ) -> int:
        """Record a new run (status ``running``) and return its id (an integer >= 1).

        ``nodes`` is the node set (``selftest.nodes.NodeSet.to_dict()``: source, launcher, each node's
        name, host, slots and cores)."""
        now = time.time()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO runs (kind, status, service, platform, host, created, updated, options, environment,"
                " hardware, software, plan, nodes) VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (kind, service, platform, host, now, now, _dumps(options), _dumps(environment), _dumps(hardware),
                 _dumps(software), _dumps(list(plan)), _dumps(nodes)),
            )  # fmt: skip
            return int(cur.lastrowid or 0)

    def set_status(self, run_id: int, status: str) -> None:
        """Set a run's status (one of :data:`STATUSES`)."""
        if status not in STATUSES:
            raise StoreError(f"status must be one of {STATUSES}, got {status!r}")
        with self._tx() as db:
            db.execute("UPDATE runs SET status = ?, updated = ? WHERE id = ?", (status, time.time(), run_id))

    def finish_run(self, run_id: int, model: Mapping[str, Any], summary: Mapping[str, Any]) -> None:
        """Store the run's model and summary and mark it ``complete``."""
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET status = 'complete', updated = ?, model = ?, summary = ? WHERE id = ?",
                (time.time(), _dumps(model), _dumps(summary), run_id),
            )

    def resolve(self, ref: str | int) -> int:
        """A run id from a reference: an id (``"12"``), ``"latest"``, or ``"-N"`` (the N-th newest).

        Raises:
            StoreError: no such run.
        """
        text = str(ref).strip()
        if text in ("latest", "last"):
            text = "-1"
        try:
            n = int(text)
        except ValueError:
            raise StoreError(f"a run is an id, 'latest' or -N (N-th newest), got {ref!r}") from None
        if n < 0:
            row = self._db.execute("SELECT id FROM runs ORDER BY id DESC LIMIT 1 OFFSET ?", (-n - 1,)).fetchone()
        else:
            row = self._db.execute("SELECT id FROM runs WHERE id = ?", (n,)).fetchone()
        if row is None:
            raise StoreError(f"no run {ref!r} in {self.path} (see: svcframe history --store {self.path})")
        return int(row[0])

    def run(self, ref: str | int, *, with_samples: bool = True) -> dict[str, Any]:
        """One run as a dict: every column (JSON decoded) and, by default, ``samples`` (see :meth:`samples`)
        and ``placements`` (see :meth:`placements`).

        Raises:
            StoreError: no such run.
        """
        run_id = self.resolve(ref)
        row = self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        doc = self._decode_run(row)
        if with_samples:
            doc["samples"] = self.samples(run_id)
            doc["placements"] = self.placements(run_id)
        return doc

    @staticmethod
    def _decode_run(row: sqlite3.Row) -> dict[str, Any]:
        doc = dict(row)
        for col in _JSON_COLUMNS:
            if doc.get(col) is not None:
                doc[col] = json.loads(doc[col])
        return doc

    def runs(
        self, *, service: str | None = None, platform: str | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        """Runs, oldest first, without their samples; filtered by service, platform and status if given.
        Each has ``sample_count``."""
        where, args = [], []
        for col, value in (("service", service), ("platform", platform), ("status", status)):
            if value is not None:
                where.append(f"runs.{col} = ?")
                args.append(value)
        sql = (
            "SELECT runs.*, (SELECT COUNT(*) FROM samples WHERE samples.run_id = runs.id) AS sample_count FROM runs"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY runs.created, runs.id"
        )
        return [self._decode_run(r) for r in self._db.execute(sql, args)]

    def history(self, ref: str | int) -> list[dict[str, Any]]:
        """The complete runs of the same service and platform as ``ref``, oldest first (``ref`` included
        if complete), without samples."""
        run = self.run(ref, with_samples=False)
        return self.runs(service=run["service"], platform=run["platform"], status="complete")

    # -- samples -------------------------------------------------------------------------------------------
    def add_sample(
        self, run_id: int, key: str, row: Mapping[str, Any], result: Mapping[str, Any] | None = None
    ) -> None:
        """Store one measurement of a run as soon as it completes (committed at once).

        Args:
            key: the measurement's key in the plan (unique per run).
            row: the summary row: ``stage``, ``metric``, ``servers``, ``clients`` and ``value`` (optional,
                the number the model uses), plus anything else.
            result: the raw self-test results document.

        Raises:
            StoreError: ``key`` is already stored for this run.
        """
        try:
            with self._tx() as db:
                db.execute(
                    "INSERT INTO samples (run_id, key, stage, metric, servers, clients, value, row, result, created)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, key, row["stage"], row["metric"], int(row["servers"]), int(row["clients"]),
                     row.get("value"), _dumps(row), _dumps(result), time.time()),
                )  # fmt: skip
                db.execute("UPDATE runs SET updated = ? WHERE id = ?", (time.time(), run_id))
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"run {run_id} already has a sample {key!r} (or no such run): {exc}") from exc

    def samples(self, run_id: int, *, with_results: bool = False) -> list[dict[str, Any]]:
        """The stored samples of a run in the order they were measured: ``{"id", "key", "created", **row}``
        (plus ``result`` when ``with_results``)."""
        cols = "id, key, created, row" + (", result" if with_results else "")
        out = []
        for r in self._db.execute(f"SELECT {cols} FROM samples WHERE run_id = ? ORDER BY id", (run_id,)):
            doc = {"id": r["id"], "key": r["key"], "created": r["created"], **json.loads(r["row"])}
            if with_results:
                doc["result"] = json.loads(r["result"]) if r["result"] else None
            out.append(doc)
        return out

    def sample_keys(self, run_id: int) -> set[str]:
        """Keys of the measurements a run has stored."""
        return {r[0] for r in self._db.execute("SELECT key FROM samples WHERE run_id = ?", (run_id,))}

    # -- placements ----------------------------------------------------------------------------------------
    def add_placement(self, run_id: int, placement: Mapping[str, Any]) -> int:
        """Keep a workload placed on run ``run_id``'s model (``place()``'s document); returns its id.

        Raises:
            StoreError: no such run.
        """
        try:
            with self._tx() as db:
                cur = db.execute(
                    "INSERT INTO placements (run_id, workload, created, document) VALUES (?, ?, ?, ?)",
                    (run_id, str(placement.get("workload", "")), time.time(), _dumps(placement)),
                )
                return int(cur.lastrowid or 0)
        except sqlite3.IntegrityError:
            raise StoreError(f"no run {run_id} in {self.path} to keep the placement with") from None

    def placements(self, run_id: int) -> list[dict[str, Any]]:
        """The placements kept with a run, oldest first: ``{"id", "created", **document}``."""
        return [
            {"id": r["id"], "created": r["created"], **json.loads(r["document"])}
            for r in self._db.execute("SELECT * FROM placements WHERE run_id = ? ORDER BY id", (run_id,))
        ]


# ----------------------------------------------------------------------------------------------------------
# History: "is that normal?"
# ----------------------------------------------------------------------------------------------------------


def quantities(run: Mapping[str, Any]) -> dict[str, tuple[float, str]]:
    """The numbers of a complete run that history compares, by label: ``{label: (value, unit)}``.

    Per metric of the model: ``Pc`` and ``Ps`` maxima (Carns 2025, section 4.3; in the metric's unit) and
    the validation score (Zhu, Neuwirth et al. eq. 12, geometric mean of the sample scores); for the
    run: the cross-metric combined score and the share of wall time outside measurement intervals.
    A run without a model gives ``{}``.
    """
    model = run.get("model") or {}
    out: dict[str, tuple[float, str]] = {}
    for name, m in (model.get("metrics") or {}).items():
        unit = m["metric"]["unit"]
        out[f"{name} Pc"] = (float(m["pc"]["max"]), unit)
        out[f"{name} Ps"] = (float(m["ps"]["max"]), unit)
        score = (m.get("scores") or {}).get("overall", {}).get("score")
        if score is not None:
            out[f"{name} score"] = (float(score), "")
    summary = run.get("summary") or {}
    if summary.get("combined_score") is not None:
        out["combined score"] = (float(summary["combined_score"]), "")
    split = summary.get("overhead") or {}
    if split.get("outside_fraction") is not None:
        out["time outside measurement"] = (100.0 * float(split["outside_fraction"]), "%")
    return out


def compare(run: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each quantity of ``run`` against the same quantity over ``history`` (runs other than ``run``).

    Returns:
        One row per quantity: ``{"quantity", "unit", "value", "count", "min", "q1", "median", "q3", "max",
        "percentile", "verdict"}``. ``percentile`` is the share of history values below ``value`` (0-100);
        ``verdict`` is ``"low"`` / ``"high"`` outside the whiskers (1.5 IQR beyond the quartiles, Tukey's
        rule, as matplotlib draws them), else ``"normal"``; ``"no history"`` without history values and
        ``"too little history"`` with fewer than :data:`MIN_HISTORY` of them.
    """
    import numpy as np

    others = [quantities(h) for h in history if h.get("id") != run.get("id")]
    rows = []
    for label, (value, unit) in quantities(run).items():
        values = np.array([q[label][0] for q in others if label in q], dtype=float)
        row: dict[str, Any] = {"quantity": label, "unit": unit, "value": value, "count": int(values.size)}
        if values.size == 0:
            row.update(dict.fromkeys(("min", "q1", "median", "q3", "max", "percentile"), None), verdict="no history")
        else:
            q1, med, q3 = (float(v) for v in np.percentile(values, [25, 50, 75]))
            iqr = q3 - q1
            lo, hi = q1 - 1.5 * iqr, q3 + 1.5 * iqr
            verdict = "low" if value < lo else "high" if value > hi else "normal"
            if values.size < MIN_HISTORY:
                verdict = "too little history"
            row.update(
                min=float(values.min()), q1=q1, median=med, q3=q3, max=float(values.max()),
                percentile=100.0 * float(np.mean(values < value)), verdict=verdict,
            )  # fmt: skip
        rows.append(row)
    return rows


def history_png(run: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> bytes:
    """:func:`history_figure` as PNG bytes.

    Raises:
        StoreError: ``run`` has no model (it did not complete).
    """
    import io

    buffer = io.BytesIO()
    history_figure(run, history).savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def plot_history(run: Mapping[str, Any], history: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """UMAMI-style "is that normal?" figure (``papers/darshan-tokio-slides.txt``, :func:`history_figure`),
    written as an image.

    Args:
        run: the run under study (a complete run from :meth:`ResultsStore.run`).
        history: complete runs of the same service and platform (``run`` itself may be among them).
        path: output image; the suffix picks the format (``.png``).

    Returns:
        ``path`` as a :class:`Path`.

    Raises:
        StoreError: ``run`` has no model (it did not complete).
    """
    out = Path(path)
    history_figure(run, history).savefig(out, dpi=100)
    return out


#: The shortest time axis of a history figure: a run alone (or runs minutes apart) is centred in an hour,
#: not drawn on the years matplotlib's date locator picks for a single date.
MIN_HISTORY_AXIS = timedelta(hours=1)


def history_figure(run: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> Any:
    """UMAMI-style "is that normal?" Figure: one row per quantity of :func:`quantities`; left, the history's
    values over time with the run under study highlighted; right, the history's distribution as a box plot
    (whiskers at 1.5 IQR) with the run as a red diamond. The time axis spans the runs shown, at least
    :data:`MIN_HISTORY_AXIS`; with no earlier run the title says so.

    Raises:
        StoreError: ``run`` has no model (it did not complete).
        PlottingUnavailable: matplotlib is not installed.
    """
    from .plotting import require_matplotlib

    require_matplotlib()
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
    from matplotlib.figure import Figure

    mine = quantities(run)
    if not mine:
        raise StoreError(f"run {run.get('id')} has no model (status {run.get('status')}); nothing to compare")
    others = [h for h in history if h.get("id") != run.get("id")]
    labels = list(mine)
    fig = Figure(figsize=(10, 1.7 * len(labels) + 0.8), layout="constrained")
    axes = fig.subplots(len(labels), 2, squeeze=False, gridspec_kw={"width_ratios": [3, 1]})
    against = f"against {len(others)} earlier run(s)" if others else "no earlier run of this service and platform yet"
    fig.suptitle(f"Is that normal? run {run.get('id')} ({run.get('service')} on {run.get('platform')}) {against}")
    when = datetime.fromtimestamp(float(run.get("created", 0.0)))
    times = [when, *(datetime.fromtimestamp(float(h["created"])) for h in others)]
    first, last = min(times), max(times)
    pad = max((last - first) * 0.05, (MIN_HISTORY_AXIS - (last - first)) / 2)
    for (ax_t, ax_b), label in zip(axes, labels, strict=True):
        value, unit = mine[label]
        found = [(datetime.fromtimestamp(float(h["created"])), quantities(h).get(label)) for h in others]
        pts = [(t, q[0]) for t, q in found if q is not None]
        ylabel = f"{label}\n({unit})" if unit else label
        if pts:
            ax_t.plot([t for t, _ in pts], [v for _, v in pts], "o-", color="tab:gray", alpha=0.7, label="history")
        ax_t.plot([when], [value], "D", color="tab:red", markersize=8, label=f"run {run.get('id')}")
        ax_t.set_ylabel(ylabel, fontsize="small")
        ax_t.grid(True, alpha=0.3)
        ax_t.set_xlim(first - pad, last + pad)
        locator = AutoDateLocator()
        ax_t.xaxis.set_major_locator(locator)
        ax_t.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        ax_t.tick_params(axis="x", labelsize="x-small")
        values = [v for _, v in pts]
        if values:
            ax_b.boxplot(values, widths=0.5, whis=1.5)
        ax_b.plot([1], [value], "D", color="tab:red", markersize=8)
        ax_b.set_xticks([1], [f"n={len(values)}"])
        ax_b.grid(True, axis="y", alpha=0.3)
        lo = min([value, *values])
        hi = max([value, *values])
        pad_y = 0.1 * (hi - lo) if hi > lo else (0.1 * abs(hi) or 1.0)
        for ax in (ax_t, ax_b):
            ax.set_ylim(lo - pad_y, hi + pad_y)
            if not math.isfinite(lo):
                ax.autoscale()
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize="small")
    axes[0][1].set_title("history (box) vs this run", fontsize="small")
    axes[-1][0].set_xlabel("run start time")
    return fig
