"""`memoplan report`: structure of the page, peaks equal to `verify`'s, the sweep, bad input,
the plot data (pure functions), and the page in a real headless browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from _paths import ROOT

pytest.importorskip("matplotlib")

from _cli import run, write  # noqa: E402
from _clients import require  # noqa: E402

from memoplan.report import data, draw  # noqa: E402

CNN_PLAN = ROOT / "plans" / "cnn_bn_dropout.memplan"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def cnn_report(tmp_path_factory):
    """The report of the bundled CNN plan (no sweep: the plan has no budget), with --json;
    and what `memoplan verify` prints for the same plan."""
    from memoplan import cli

    folder = tmp_path_factory.mktemp("report")
    out = folder / "cnn.html"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MEMOPLAN_CACHE_DIR", str(folder / "cache"))
        assert cli.main(["report", str(CNN_PLAN), "-o", str(out), "--json"]) == 0
    return out


def _verify_peaks(capsys) -> tuple[int, int]:
    code, out, _ = run(capsys, "verify", CNN_PLAN)
    assert code == 0
    found = re.search(r"unplanned [\d.]+ MiB \((\d+) B\), planned [\d.]+ MiB \((\d+) B\)", out)
    assert found, out
    return int(found[1]), int(found[2])


@pytest.mark.slow
def test_report_sections_plots_and_peaks_equal_verify(cnn_report, capsys):
    text = cnn_report.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    sections = re.findall(r'<section id="([a-z]+)">', text)
    assert sections == ["plan", "memory", "saved"]  # no budget, not from `memoplan plan`: no sweep
    figures = re.findall(r'<figure class="plot" id="plot-([a-z]+)">(.*?)</figure>', text, re.S)
    assert [name for name, _ in figures] == ["memory", "saved"]
    for _, body in figures:
        assert body.count("<svg") == 1 and "<path" in body
    # Self-contained: nothing fetched at view time.
    assert not re.search(r'(src|href)="(https?:)?//', text) and "<script" not in text
    # The resolved plan with each rule's file:line, and the verdict.
    assert "plans/cnn_bn_dropout.memplan:13" in text and "plans/cnn_bn_dropout.memplan:10" in text
    assert "EQUIVALENT" in text

    unplanned, planned = _verify_peaks(capsys)
    memory = json.loads(cnn_report.with_name("cnn.memory.json").read_text(encoding="utf-8"))
    assert memory["runs"]["unplanned"]["peak"]["bytes"] == unplanned
    assert memory["runs"]["planned"]["peak"]["bytes"] == planned
    assert max(memory["runs"]["unplanned"]["bytes"]) == unplanned  # the thinned curve keeps the peak
    assert f"{unplanned:,} B" in text and f"{planned:,} B" in text
    # The peaks are held by real modules, in backward (where a CNN step peaks).
    for run_ in memory["runs"].values():
        assert run_["peak"]["module"].startswith("features.") and run_["peak"]["phase"] == "backward"
        assert {r["phase"] for r in run_["regions"]} == {"forward", "backward"}
        assert run_["backward_x"] < run_["end_x"]

    saved = json.loads(cnn_report.with_name("cnn.saved.json").read_text(encoding="utf-8"))
    rows = saved["rows"]
    assert [r["before"] for r in rows] == sorted((r["before"] for r in rows), reverse=True)
    by_module = {r["module"]: r for r in rows}
    # features.1..4 are checkpointed: they keep less; features.0 is `keep`: the same.
    assert by_module["features.0"]["before"] == by_module["features.0"]["after"]
    assert all(by_module[f"features.{i}"]["after"] < by_module[f"features.{i}"]["before"] for i in (1, 2, 3, 4))


@pytest.mark.slow
def test_sweep_for_a_plan_with_a_budget(tmp_path, capsys):
    plan = write(
        tmp_path,
        "budget.memplan",
        CNN_PLAN.read_text(encoding="utf-8").replace(
            'model "memoplan.examples.cnn:build"', 'model "memoplan.examples.cnn:build"\nbudget 90% hint'
        ),
    )
    out = tmp_path / "r.html"
    code, stdout, err = run(
        capsys,
        "report",
        plan,
        "--model",
        "memoplan.examples.cnn:build",
        "--example",
        "randn(2, 3, 32, 32)",
        "-o",
        out,
        "--json",
        "--budgets",
        "0.8",
    )
    assert code == 0, err
    assert "sweep 4/4" in err  # progress on stderr, as `memoplan plan` shows it
    text = out.read_text(encoding="utf-8")
    assert re.findall(r'<section id="([a-z]+)">', text) == ["plan", "memory", "saved", "sweep"]
    assert text.count('<figure class="plot"') == 3
    sweep = json.loads((tmp_path / "r.sweep.json").read_text(encoding="utf-8"))
    assert set(sweep["series"]) == {"unplanned", "chosen", "memoplan", "every block"}
    assert sweep["chosen"]["label"].startswith("this plan") and not sweep["failed"]
    for points in sweep["series"].values():
        for p in points:
            assert isinstance(p["peak_bytes"], int) and p["peak_bytes"] > 0 and p["step_seconds"] > 0
    (optimal,) = sweep["series"]["memoplan"]
    assert optimal["budget"] == 0.8
    if optimal["budget_met"]:
        assert optimal["peak_bytes"] <= 0.8 * sweep["unplanned_bytes"]


def test_a_plan_that_does_not_resolve_gives_checks_diagnostics_and_no_file(tmp_path, capsys):
    plan = write(
        tmp_path,
        "bad.memplan",
        'memplan 1\nmodel "memoplan.examples.cnn:build"\nexample randn(2, 3, 32, 32)\nmodule featurez.* { checkpoint }\n',
    )
    out = tmp_path / "r.html"
    code, _, err_check = run(capsys, "check", plan)
    assert code == 1
    code, _, err_report = run(capsys, "report", plan, "-o", out, "--json")
    assert code == 1
    diagnostics = [line for line in err_check.splitlines() if not line.startswith("memoplan: ")]
    assert diagnostics and diagnostics == [
        line for line in err_report.splitlines() if not line.startswith("memoplan: ")
    ]
    assert "MP3" in err_report or "MP2" in err_report
    assert list(tmp_path.iterdir()) == [plan] or sorted(p.name for p in tmp_path.iterdir()) == ["bad.memplan", "cache"]


@pytest.mark.slow
def test_a_dtr_block_gets_its_section(tmp_path, capsys):
    plan = write(
        tmp_path,
        "dtr.memplan",
        'memplan 1\nmodel "memoplan.examples.cnn:build"\nexample randn(2, 3, 32, 32)\n'
        "dtr { eviction_threshold = 256 KiB; evictee_minimum_size = 1 KiB }\n",
    )
    out = tmp_path / "r.html"
    code, _, err = run(capsys, "report", plan, "-o", out, "--no-sweep", "--json")
    assert code == 0, err
    text = out.read_text(encoding="utf-8")
    assert re.findall(r'<section id="([a-z]+)">', text) == ["plan", "memory", "saved", "dtr"]
    section = text[text.index('<section id="dtr">') :]
    assert section.count('<figure class="plot" id="plot-dtr">') == 1
    evictions = re.search(r"<td>evictions</td><td class=num>([\d,]+)</td>", section)
    assert evictions and int(evictions[1].replace(",", "")) > 0
    # Over the step: counts that only grow, ending at the totals of the table.
    over = json.loads((tmp_path / "r.memory.json").read_text(encoding="utf-8"))["runs"]["planned"]["dtr"]
    assert over["evictions"] == sorted(over["evictions"]) and over["recomputes"] == sorted(over["recomputes"])
    assert over["evictions"][-1] == int(evictions[1].replace(",", "")) and over["evictions"][0] < over["evictions"][-1]
    assert over["x"] == sorted(over["x"]) and len(over["x"]) == len(over["tracked_bytes"])


def test_bad_budgets_and_missing_matplotlib_write_nothing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.html"
    code, _, err = run(capsys, "report", CNN_PLAN, "-o", out, "--budgets", "1.5")
    assert code == 1 and "MP512" in err and not out.exists()
    monkeypatch.setattr(draw, "available", lambda: False)
    code, _, err = run(capsys, "report", CNN_PLAN, "-o", out)
    assert code == 1 and "MP510" in err and not out.exists()


# ---------------------------------------------------------------- the data, as pure functions


def test_frontier_expands_containers_that_hold_planned_modules():
    names = ["", "features", "features.0", "features.0.conv", "features.1", "pool", "head", "head.fc"]
    assert data.frontier(names, ["features.1"]) == ["features.0", "features.1", "pool", "head"]
    assert data.frontier(names, ["features.0.conv"]) == ["features.0.conv", "features.1", "pool", "head"]
    assert data.frontier(names, []) == ["features", "pool", "head"]
    # A planned module stays whole, whatever rules name its parts.
    assert data.frontier(names, ["features.0", "features.0.conv"]) == ["features.0", "features.1", "pool", "head"]


def test_regions_and_alignment():
    fs, fe, bs = data.FWD_START, data.FWD_END, data.BWD_START
    a = {"samples": [0, 5, 9, 4, 6, 0], "backward": 2, "marks": [(0, f"{fs} m"), (2, f"{fe} m"), (3, f"{bs} m")]}
    b = {
        "samples": [0, 5, 9, 4, 7, 8, 7, 1, 0],
        "backward": 2,
        "marks": [(0, f"{fs} m"), (2, f"{fe} m"), (3, f"{bs} m")],
    }
    spans = data.regions(len(a["samples"]), a["backward"], a["marks"])
    assert spans == [
        {"module": "m", "phase": "forward", "start": 0, "end": 2},
        {"module": "m", "phase": "backward", "start": 3, "end": 5},
    ]
    xa, xb = data.aligned_axes([a, b])
    assert xa[0] == xb[0] == 0 and xa[2] == xb[2] and xa[3] == xb[3]  # every mark at one x
    assert xa[-1] == xb[-1] == 3 + 5  # the backward piece is as wide as the longer run's
    assert xa == sorted(xa) and xb == sorted(xb)
    # Different marks: aligned at start, backward and end only.
    c = dict(b, marks=[])
    xa2, xc = data.aligned_axes([a, c])
    assert xa2[2] == xc[2] and xa2[-1] == xc[-1]
    holder = data.peak_holder(b["samples"], data.regions(len(b["samples"]), 2, b["marks"]))
    assert holder == {"index": 2, "bytes": 9, "module": "m", "phase": "forward"}


def test_envelope_keeps_peaks_and_dips():
    ys = [(i * 7919) % 1000 for i in range(10_000)]
    ys[4321] = 5000
    xs, kept = data.envelope(list(range(len(ys))), ys, limit=200)
    assert len(kept) <= 200 and max(kept) == 5000 and min(kept) == min(ys)
    assert xs == sorted(xs)


def test_saved_rows_and_sweep_plot():
    rows = data.saved_rows(["a", "b", "c"], {"a": 1, "b": 5, "c": 0}, {"a": 1, "b": 2, "c": 0}, {"a": "A", "b": "B"})
    assert [r["module"] for r in rows["rows"]] == ["b", "a"] and rows["total_before"] == 6 and rows["total_after"] == 3
    many = data.saved_rows([str(i) for i in range(30)], {str(i): i for i in range(30)}, {}, {}, limit=5)
    assert len(many["rows"]) == 5 and many["rows"][-1]["module"] == "(25 others)"  # "0" saves nothing: not a row
    assert sum(r["before"] for r in many["rows"]) == sum(range(30))
    plot = data.sweep_plot(
        [
            {"label": "u", "kind": "unplanned", "peak_bytes": 100, "step_seconds": 0.1},
            {"label": "p", "kind": "chosen", "peak_bytes": 60, "step_seconds": 0.2, "chosen": True},
            {"label": "x", "kind": "torch.compile", "error": "boom"},
        ],
        100,
    )
    assert plot["chosen"]["label"] == "p" and plot["chosen"]["ratio"] == 0.6
    assert plot["failed"] == [{"label": "x", "kind": "torch.compile", "error": "boom"}]


def test_drawing_is_deterministic():
    plot = data.sweep_plot([{"label": "u", "kind": "unplanned", "peak_bytes": 2**20, "step_seconds": 0.01}], 2**20)
    first, second = draw.sweep_svg(plot), draw.sweep_svg(plot)
    assert first == second and first.startswith("<svg")


# ---------------------------------------------------------------- in a real browser


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.mark.slow
def test_report_renders_in_a_headless_browser(cnn_report, tmp_path):
    from matplotlib.image import imread

    require(_browser() is not None, "Chromium", "apt-get install chromium (Debian), or any Chrome on PATH")

    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            _browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1200,2400",
            f"--screenshot={shot}",
            cnn_report.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pixels = imread(str(shot))[:, :, :3]
    assert pixels.shape[0] == 2400 and pixels.shape[1] == 1200
    not_white = (pixels < 0.95).any(axis=2)
    # Text, tables and two plots: a real share of the page is drawn, and it has colour (the curves).
    assert not_white.mean() > 0.03, "the page rendered blank"
    blue = (pixels[:, :, 2] > 0.5) & (pixels[:, :, 0] < 0.3)
    assert blue.sum() > 500, "no planned curve or bars visible"


# ---------------------------------------------------------------- the recording meter


def test_timeline_step_peaks_as_measure_step_and_marks_where_asked():
    import contextlib

    import torch
    from torch import nn

    from memoplan.measure import measure_step, timeline_step

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8))
    x = torch.randn(32, 64)
    expected = measure_step(model, (x,)).peak_bytes

    @contextlib.contextmanager
    def marks(mark):
        handle = model[1].register_forward_hook(lambda *_: mark("after gelu"))
        try:
            yield
        finally:
            handle.remove()

    memory, timeline = timeline_step(model, (x,), marks=marks)
    assert memory.peak_bytes == timeline.peak_bytes == expected == max(timeline.samples)
    assert timeline.samples[0] == 0 and 0 < timeline.backward < len(timeline.samples) - 1
    ((index, label),) = timeline.marks
    assert label == "after gelu" and 0 < index < timeline.backward
    # GELU's output (32 x 256 floats) is live at the mark: the step holds at least that much there.
    assert timeline.samples[index] >= 32 * 256 * 4
    with pytest.raises(ValueError):
        timeline_step(model.to("meta"), (x.to("meta"),))


def test_spikingjelly_is_a_peer_where_it_applies():
    neuron = pytest.importorskip("spikingjelly.activation_based.neuron")
    import torch
    from torch import nn

    from memoplan.planner.profiling.profile import profile
    from memoplan.report import collect
    from memoplan.specs import Example

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.fc = nn.Linear(cin, cout)
            self.node = neuron.LIFNode(tau=2.0, v_threshold=0.3, step_mode="m")

        def forward(self, x):
            return self.node(self.fc(x))

    torch.manual_seed(0)
    model = nn.Sequential(Block(16, 64), Block(64, 64), Block(64, 64))
    example = Example(((torch.rand(8, 4, 16) < 0.4).float(),))
    assert collect.uses_spikingjelly(model) and not collect.uses_spikingjelly(nn.Linear(2, 2))
    prof = profile(model, example, repeats=1, progress=False)
    point = collect.spikingjelly_point(model, example, prof, seed=0, repeats=1)
    assert "error" not in point, point
    assert point["targets"] == ["test_spikingjelly_is_a_peer_where_it_applies.<locals>.Block"]
    assert 0 < point["peak_bytes"] < prof.peak_bytes and point["step_seconds"] > 0


@pytest.mark.slow
def test_torch_compile_is_a_peer_with_its_own_metered_peak():
    import torch
    from torch import nn

    from memoplan.measure import measure_step
    from memoplan.report import collect
    from memoplan.specs import Example

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 4))
    example = Example((torch.randn(512, 32),))  # activations well above the weights and their gradients
    eager = measure_step(model, example.args).peak_bytes
    points = {f: collect.compile_point(model, example, f, seed=0, repeats=1) for f in (1.0, 0.0)}
    for point in points.values():
        assert "error" not in point, point
        assert point["peak_bytes"] > 0 and point["step_seconds"] > 0
    # Budget 0 recomputes every activation in backward: another partition, another peak (on this
    # MLP a higher one: the recomputed values are live together).
    assert points[0.0]["peak_bytes"] != points[1.0]["peak_bytes"]
    # Compiled at budget 1.0 it keeps about what eager keeps (not the same: other ops, fused decompositions).
    assert 0.5 * eager < points[1.0]["peak_bytes"] < 2 * eager


@pytest.mark.slow
def test_hostile_module_names_are_escaped_in_the_page_and_the_plots(tmp_path, capsys):
    write(
        tmp_path,
        "weird.py",
        "import torch\nfrom torch import nn\n\n"
        "NAMES = ['a$b$', '\\x1b[31mred', '<script>alert(1)</script>', 'sur\\udc80']\n\n"
        "class Weird(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        for name in NAMES:\n"
        "            self.add_module(name, nn.Sequential(nn.Linear(8, 8), nn.GELU()))\n\n"
        "    def forward(self, x):\n"
        "        for module in self.children():\n"
        "            x = module(x)\n"
        "        return x\n\n"
        "def build():\n"
        "    return Weird()\n",
    )
    plan = write(
        tmp_path, "weird.memplan", 'memplan 1\nmodel "weird.py:build"\nexample randn(4, 8)\nmodule * { checkpoint }\n'
    )
    out = tmp_path / "r.html"
    code, _, err = run(capsys, "report", plan, "-o", out, "--json")
    assert code == 0, err
    text = out.read_text(encoding="utf-8")
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "\x1b" not in text and "\\x1b[31mred" in text and "sur\\udc80" in text
    saved = json.loads((tmp_path / "r.saved.json").read_text(encoding="utf-8"))
    assert {r["module"] for r in saved["rows"]} == {"a$b$", "\x1b[31mred", "<script>alert(1)</script>", "sur\udc80"}


def test_a_plan_written_by_the_planner_gets_a_sweep_by_default():
    from memoplan.report.command import came_from_planner
    from memoplan.syntax import parse

    written = "# generated by: memoplan 0.1.0 `memoplan plan`\n# budget: 85% of the unplanned peak\nmemplan 1\n"
    assert came_from_planner(parse(written))
    assert not came_from_planner(parse("# my own plan\nmemplan 1\n"))


def test_a_device_that_cannot_run_here_writes_nothing(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "r.html"
    code, _, err = run(capsys, "report", CNN_PLAN, "--device", "cuda", "-o", out)
    assert code == 1 and "MP506" in err and not out.exists()


def _memory_plot(peaks_x: tuple[float, float], top: int) -> dict:
    """Two runs whose peaks sit under the widest region's name, as in a real step."""
    regions = [{"x0": 10.0 * i, "x1": 10.0 * i + 9, "module": f"features.{i}"} for i in range(10)]

    def run(peak_x: float, peak: int) -> dict:
        xs = [float(x) for x in range(101)]
        ys = [peak if x == peak_x else peak // 2 for x in xs]
        where = {"x": peak_x, "bytes": peak, "phase": "backward", "module": "features.4"}
        return {"x": xs, "bytes": ys, "end_x": 100.0, "regions": regions, "backward_x": 50.0, "peak": where}

    return {
        "runs": {"planned": run(peaks_x[0], top * 3 // 4), "unplanned": run(peaks_x[1], top)},
        "x_unit": "events",
    }


@pytest.mark.parametrize("peaks_x", [(45.0, 45.0), (44.0, 46.0), (2.0, 97.0), (97.0, 3.0)])
def test_memory_plot_labels_do_not_overlap(peaks_x):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = draw.memory_figure(_memory_plot(peaks_x, 600_000))
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    strip, ax = fig.axes
    names = [t for t in strip.texts if t.get_text()]
    peaks = [t for t in ax.texts if t.get_gid() == "peak-label"]
    assert len(names) == 10 and len(peaks) == 2
    from matplotlib.text import Text

    boxes = [Text.get_window_extent(t, renderer) for t in (*names, *peaks)]  # the text, not a peak's line
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)
    # the peaks' labels are in the band above every curve
    curve_top = ax.transData.transform((0, 600_000))[1]
    assert all(box.y0 > curve_top for box in boxes[len(names) :])


def test_byte_axes_tick_at_round_values():
    assert [draw.nice_step(t) for t in (0.57, 0.83, 2.3, 870, 1.0)] == [0.2, 0.2, 0.5, 200, 0.2]
    fig = draw.memory_figure(_memory_plot((30.0, 60.0), 600_000))  # 0.57 MiB: the axis
    ax = fig.axes[1]
    shown = [v for v in ax.get_yticks() if 0 <= v <= ax.get_ylim()[1]]
    assert [ax.yaxis.get_major_formatter()(v) for v in shown] == ["0", "0.2", "0.4", "0.6", "0.8"]
