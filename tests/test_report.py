"""``svcframe report RUN``: one self-contained HTML page, checked as a browser renders it (headless Chromium)."""

from __future__ import annotations

import base64
import html
import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from selftest.collect import CollectOptions, collect
from selftest.report import write_report
from selftest.store import ResultsStore

PNG = b"\x89PNG\r\n\x1a\n"
CLI = [sys.executable, "-m", "svcframe"]
pytestmark = pytest.mark.one_interpreter  # plots and HTML: checked on CI's first interpreter only

# Injected first into <head>: records script errors, failed resource loads (capture phase) and
# console.error calls, then on load writes the images' state into the DOM for --dump-dom to show.
PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message || (e.target && e.target.tagName) || e.type)), true);
const __ce = console.error; console.error = (...a) => { window.__errors.push(a.join(" ")); __ce(...a); };
window.addEventListener("load", () => {
  const im = [...document.images];
  document.documentElement.setAttribute("data-probe", JSON.stringify({
    images: im.length, broken: im.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt),
    errors: window.__errors, h2: [...document.querySelectorAll("h2")].map(h => h.textContent),
    widest: Math.max(...[...document.querySelectorAll("table")].map(t => t.getBoundingClientRect().right)),
    page: document.documentElement.scrollWidth}));
});
</script>"""


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.imgs: list[dict[str, str | None]] = []
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a)
        for key in ("src", "href"):
            value = a.get(key) or ""
            if value and not value.startswith(("data:", "#")):
                self.external.append(value)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A results store holding two real tiny collections (the second has the first as history)."""
    tmp = tmp_path_factory.mktemp("report")
    db = tmp / "r.sqlite"
    for name, metrics, sweep in (("a", ["rpc_rate"], 0), ("b", ["rpc_rate", "bandwidth"], 2)):
        collect(CollectOptions(out=tmp / name, metrics=metrics, duration_seconds=0.2, repeats=1,
                               warmup_iterations=5, bulk_size=64 * 1024, grid_servers=[1], grid_clients=[1, 2],
                               saturation_depth=2, max_clients_per_core=2, sweep_max_servers=sweep, store=db))  # fmt: skip
    return tmp, db


@pytest.fixture(scope="module")
def page(stored) -> Path:
    tmp, db = stored
    out = tmp / "page.html"
    proc = subprocess.run([*CLI, "report", "latest", "--store", str(db), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    return out


def test_page_is_self_contained_with_every_plot_and_table(page) -> None:
    text = page.read_text()
    refs = _Refs()
    refs.feed(text)
    assert refs.external == []  # nothing to fetch: no http(s), no relative files
    # two rooflines, the sweep, the history box plots
    assert len(refs.imgs) == 4
    for img in refs.imgs:
        src = img["src"] or ""
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG
    for section in (
        "Summary",
        "Rooflines",
        "Server-process sweep",
        "Validation samples",
        "Is that normal?",
        "Where the wall time went",
        "Every measurement",
        "Parameters",
        "Hardware",
        "Software",
    ):
        assert f"<h2>{html.escape(section)}</h2>" in text, section
    assert "Combined score over metrics" in text


def test_incomplete_run_still_reports(stored, tmp_path) -> None:
    _, db = stored
    with ResultsStore(db) as store:
        rid = store.create_run(kind="svcframe-roofline", service="selftest", platform="p", host="h", options={},
                               environment={}, hardware={}, software={}, plan=["x#0"])  # fmt: skip
        store.set_status(rid, "interrupted")
        out = write_report(store.run(rid), [], tmp_path / "partial.html")
    text = out.read_text()
    assert "did not complete" in text and f"--resume {rid}" in text


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0"]  # fmt: skip


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_page_renders_in_headless_chromium(page, tmp_path) -> None:
    probed = tmp_path / "probed.html"
    text = page.read_text()
    probed.write_text(text.replace("<head>", "<head>" + PROBE, 1))
    browser = _chromium()
    assert browser is not None
    dom = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
         "--window-size=1280,1600", "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    start = dom.stdout.index('data-probe="') + len('data-probe="')
    probe = json.loads(html.unescape(dom.stdout[start : dom.stdout.index('"', start)]))
    assert probe["images"] == 4
    assert probe["broken"] == [], f"images that did not decode: {probe['broken']}"
    assert probe["errors"] == [], f"errors in the page: {probe['errors']}"
    assert "Rooflines" in probe["h2"]
    # every table, "every measurement" among them, fits a 1280 px window: nothing to scroll sideways
    assert probe["widest"] <= 1280 and probe["page"] <= 1280, probe
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], f"console messages: {console}"

    shot = tmp_path / "shot.png"
    snap = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", "--window-size=1200,1600",
         f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert snap.returncode == 0, snap.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size == (1200, 1600)
        colors = im.convert("L").getcolors(maxcolors=1 << 16)
        assert colors is None or len(colors) > 50  # text and plots, not a blank page


def test_summary_says_which_samples_the_model_claims_and_why_others_are_excluded(capsys, tmp_path) -> None:
    from selftest.report import print_collect_summary
    from selftest.roofline import METRICS, Range, Roofline, Sample

    # a 2-core machine as local:2 splits it: 1 server core, 1 client core (grid 1-2 servers x 1-8 clients)
    grid = [Sample(s, c, 20.0 * min(1.0, s / c), float(s), float(c)) for s in (1, 2) for c in (1, 2, 4, 8)]
    nodes = {"nodes": [{"name": "local0", "slots": 1}, {"name": "local1", "slots": 1}]}
    doc = {
        "metrics": {
            "rpc_rate": Roofline(METRICS["rpc_rate"], Range(19.0, 21.0), Range(30.0, 31.0), grid).to_dict(),
            "bandwidth": Roofline(METRICS["bandwidth"], Range(2.0, 2.0), Range(1.0, 1.0), grid[1:4]).to_dict(),
        },
        "nodes": nodes, "wall_seconds": 1.0, "measurement_seconds": 0.5,
        "environment": {"usable_cores": 2}, "load_average": 7.0,
    }  # fmt: skip
    print_collect_summary(doc, tmp_path)
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "rpc_rate: the model claims 1 of 8 validation samples (one process per core or fewer): median error 5%" in text
    )
    assert "median error 5%; 7 share cores (up to 2 server and 8 client processes per core" in text
    assert "rpc_rate: repeats spread Pc 11% and Ps 3% (max / min - 1)." in text
    assert "bandwidth: no validation sample fits the cores, so this machine cannot validate the model" in text
    assert "server node 1 core(s) and the client nodes 1" in text
    assert "one process per core (Carns et al. 2025, section 4.3" in text
    assert "varied by up to 11% (rpc_rate Pc)" in text
    assert ("Verdict: this machine cannot validate the model: at most one validation sample per metric fits its "
            "cores (1 server, 1 client), and one sample cannot test the model's shape; other processes held the "
            "load average at 7.0 on 2 usable cores as the run began") in text  # fmt: skip


def test_verdict_gives_the_claimed_error_when_the_machine_can_validate_the_model() -> None:
    from selftest.report import validity_lines
    from selftest.roofline import METRICS, Range, Roofline, Sample

    # 4 server cores, 8 client cores: the 1-2 x 1-8 grid fits; measured 10% and 30% below the roof
    grid = [Sample(1, 4, 4.5, 0.25, 0.5), Sample(2, 2, 14.0, 0.5, 0.25)]
    model = Roofline(METRICS["rpc_rate"], Range(20.0, 20.0), Range(20.0, 20.0), grid).to_dict()
    lines = validity_lines({"rpc_rate": model}, {"nodes": [{"slots": 4}, {"slots": 8}]}, 1.0, 12)
    assert lines[0] == ("rpc_rate: the model claims 2 of 2 validation samples (one process per core or fewer): "
                        "median error 20%.")  # fmt: skip
    assert lines[1] == "rpc_rate: repeats spread Pc 0% and Ps 0% (max / min - 1)."
    assert (
        lines[-1]
        == "Verdict: the model predicts the samples it claims with a median error of at most 20% (rpc_rate 20%)."
    )
    assert not any(line.startswith("Why excluded") for line in lines)


def test_a_lower_bound_is_marked_in_the_tables_and_kept_out_of_the_verdict(capsys, tmp_path) -> None:
    """A Ps from a server that was not saturated (the clients set the rate) is a lower bound: the tables mark it
    (and the ridge it moves), say how Pc and Ps were measured, and the verdict does not claim its errors test the
    model; the other metric's still does."""
    from selftest.report import collect_summary_json, print_collect_summary, validity_lines
    from selftest.roofline import METRICS, Range, Roofline, Sample, Saturation

    grid = [Sample(1, 4, 4.5, 0.25, 0.5), Sample(2, 2, 14.0, 0.5, 0.25)]
    ramp = ({"clients": 2, "depth": 1, "rate": 50.0}, {"clients": 2, "depth": 4, "rate": 60.0},
            {"clients": 2, "depth": 16, "rate": 60.5})  # fmt: skip
    low = Saturation(True, "the server used 31% of its core, the clients used 98% of their cores: the clients, not "
                     "the server, set the rate", 0.31, 0.98, ramp=ramp)  # fmt: skip
    pc = Saturation(False, "the client used 60% of its core, the server used 40% of its core", 0.4, 0.6)
    metrics = {
        "rpc_rate": Roofline(METRICS["rpc_rate"], Range(20.0, 20.0), Range(20.0, 20.0), grid, pc, low).to_dict(),
        "bandwidth": Roofline(
            METRICS["bandwidth"],
            Range(0.5, 0.55),
            Range(0.44, 0.45),
            [Sample(1, 4, 0.1, 0.25, 0.5), Sample(2, 2, 0.4, 0.5, 0.25)],
        ).to_dict(),
    }
    nodes = {"nodes": [{"name": "local0", "slots": 4}, {"name": "local1", "slots": 8}]}
    lines = validity_lines(metrics, nodes, 1.0, 12)
    assert (
        "rpc_rate: Ps 20 ops/s is a lower bound: the server used 31% of its core, the clients used 98% of their "
        "cores: the clients, not the server, set the rate." in lines
    )
    assert lines[-1] == ("Verdict: the model predicts the samples it claims with a median error of at most 11% "
                         "(bandwidth 11%); rpc_rate's Ps is a lower bound (measured short of saturation, see above): "
                         "the ceiling drawn from it lies too low, so the errors against it do not test the model.")  # fmt: skip
    print_collect_summary({"metrics": metrics, "nodes": nodes, "wall_seconds": 1.0, "measurement_seconds": 0.5},
                          tmp_path)  # fmt: skip
    text = capsys.readouterr().out
    (row,) = [ln for ln in text.splitlines() if ln.startswith("rpc_rate ") and "ops/s" in ln]
    assert row.split() == ["rpc_rate", "20", "ops/s", "≥", "20", "ops/s", "≤", "1"]
    (bw,) = [ln for ln in text.splitlines() if ln.startswith("bandwidth ") and "GiB/s" in ln]
    assert "0.500-0.550 GiB/s" in bw and "0.440-0.450 GiB/s" in bw and "MiB/s" not in text  # one unit: the plot's
    (ps_row,) = [ln for ln in text.splitlines() if ln.startswith("rpc_rate ") and " Ps " in ln]
    assert ps_row.split() == ["rpc_rate", "Ps", "2", "clients", "x", "16", "calls", "(of", "3", "loads)", "31%",
                              "98%", "lower", "bound"]  # fmt: skip
    summary = collect_summary_json({"metrics": metrics, "nodes": nodes}, tmp_path)["metrics"]
    assert summary["rpc_rate"]["ps"]["lower_bound"] is True and summary["rpc_rate"]["pc"]["lower_bound"] is False
    assert summary["rpc_rate"]["ps_saturation"]["reason"].startswith("the server used 31%")
    assert summary["bandwidth"]["ps"]["lower_bound"] is False and summary["bandwidth"]["ps_saturation"] is None


def test_summary_of_a_slurm_run_speaks_of_its_nodes_not_this_machine(capsys, tmp_path) -> None:
    """Nodes from a Slurm allocation: the summary names them and suggests a larger allocation, not the local
    options (--nodes, --hostfile) nor "this machine"."""
    from selftest.report import print_collect_summary
    from selftest.roofline import METRICS, Range, Roofline, Sample

    grid = [Sample(s, c, 20.0 * min(1.0, s / c), float(s), float(c)) for s in (1, 2) for c in (1, 2, 4, 8)]
    nodes = {"source": "slurm", "launcher": "srun",
             "nodes": [{"name": "svcf-node1", "slots": 1}, {"name": "svcf-node2", "slots": 1}]}  # fmt: skip
    doc = {
        "metrics": {"rpc_rate": Roofline(METRICS["rpc_rate"], Range(19.0, 21.0), Range(30.0, 31.0), grid).to_dict()},
        "nodes": nodes, "wall_seconds": 1.0, "measurement_seconds": 0.5, "environment": {"usable_cores": 2},
    }  # fmt: skip
    print_collect_summary(doc, tmp_path)
    text = " ".join(capsys.readouterr().out.split())
    assert "data-service roofline of the 2 nodes of the Slurm allocation" in text
    assert "the 2 nodes of the Slurm allocation give the server node 1 core(s)" in text
    assert "use more nodes (a larger allocation: salloc -N or sbatch -N)" in text
    assert "this machine" not in text and "--hostfile" not in text
