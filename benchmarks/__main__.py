"""All of memoplan's side-by-side benchmarks in one command, with plots.

    .venv/bin/python -m benchmarks                 # or: make bench
    .venv/bin/python -m benchmarks --quick --out build/bench   # the small version CI runs

Runs, one after another, the scripts in this folder (each still runs alone with its
own options):

* ``planner_vs_peers.py`` -- memoplan's planner at hard budgets against checkpointing
  every block, transformers' checkpointing (GPT-2) and ``torch.compile`` with
  ``activation_memory_budget``; plot: peak memory against step time, per model;
* ``spiking_memory.py`` -- the bundled spiking CNN: memoplan's plans against
  SpikingJelly 2.0; plot: peak memory per configuration;
* ``codec_bandwidth.py`` -- the ``bit`` codec: the Triton kernels' bandwidth on a GPU,
  the pure-torch pack and unpack times on the CPU; plot: per size;
* ``planner_speed.py`` -- the planners' search time on long synthetic chains; plot: the
  slowest search per chain and planner.

and writes to ``--out`` (default ``docs/benchmarks``): ``summary.md`` (every figure
with the command that measured it), ``results.json`` (the raw results of each
benchmark and its command), ``figures.json`` (every figure of the summary by name,
and the plot files) and one SVG per plot.  ``--render`` measures nothing and draws
the summary and the plots again from ``results.json``.
``--quick`` runs each script at small sizes (the CNN only, one budget, no compiled
peer, one timed step): a check that everything runs and every figure is a number, not
a measurement to quote (``tests/report/test_report.py`` checks the compiled peer).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import runpy
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MIB = 2**20


def progress(message: str) -> None:
    print(f"benchmarks: {message}", file=sys.stderr, flush=True)


def script(name: str) -> dict[str, Any]:
    """A benchmark script's globals (its functions), loaded without running its main."""
    return runpy.run_path(str(HERE / f"{name}.py"), run_name=f"benchmarks.{name}")


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------- suites


def _device_options() -> list[str]:
    """``--device cuda`` where there is a GPU: the scripts measure there (the allocator's peaks)."""
    import torch

    return ["--device", "cuda"] if torch.cuda.is_available() else []


def _run_script(name: str, out: Path, options: list[str]) -> dict[str, Any]:
    """Run ``benchmarks/NAME.py`` with ``options`` (on CUDA where there is a GPU), its results written
    as JSON under ``out`` and read back; the file is removed (results.json keeps them), and the
    command is returned without its ``--json`` option."""
    written = out / f"{name}.json"
    argv = [*options, *_device_options(), "--json", _relative(written)]
    command = f"python benchmarks/{name}.py " + shlex.join(argv)
    progress(f"{name}: {command}")
    if script(name)["main"](argv) != 0:
        raise RuntimeError(f"{name}.py exited with an error")
    results = json.loads(written.read_text(encoding="utf-8"))
    written.unlink()  # kept in results.json
    return {"command": command.replace(" --json " + _relative(written), ""), "results": results}


def planner_vs_peers(out: Path, quick: bool) -> dict[str, Any]:
    options = []
    if quick:
        options = [
            "--models",
            "cnn",
            "--batch",
            "8",
            "--budgets",
            "0.8",
            "--compile-budgets",
            "--memoplan",
            "blocks",
            "--refine",
            "--hf-every",
            "1",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--profile-repeats",
            "1",
        ]
    return _run_script("planner_vs_peers", out, options)


def render_planner_vs_peers(raw: dict[str, Any], out: Path) -> dict[str, Any]:
    from memoplan.report import data, draw

    command, results = raw["command"], raw["results"]
    figures: dict[str, float] = {}
    plots = []
    rows = []
    kinds = {"unplanned": "unplanned", "peer": "every block", "memoplan": "memoplan", "compile": "torch.compile"}
    for model, r in results["models"].items():
        points = []
        for c in r["configurations"]:
            if c.get("peak_bytes") is None or not c.get("step_time_s"):
                rows.append((model, c["name"], "-", "-", "-", c.get("status") or c.get("error", "")))
                continue
            seconds = c["step_time_s"]["median"]
            budget = c.get("budget_fraction", c.get("activation_memory_budget"))
            kind = kinds[c["kind"]]
            if c["kind"] == "peer" and not c["name"].startswith("checkpoint every block"):
                kind = "transformers checkpointing"
            if c["kind"] == "memoplan" and c.get("mode") == "nested":
                kind = "memoplan --nested"
            points.append(
                {
                    "label": c["name"],
                    "kind": kind,
                    "peak_bytes": c["peak_bytes"],
                    "step_seconds": seconds,
                    "budget": budget,
                    "equivalent": c.get("matches"),
                }
            )
            figures[f"planner_vs_peers.{model}.{c['name']}.peak_bytes"] = c["peak_bytes"]
            figures[f"planner_vs_peers.{model}.{c['name']}.step_ms"] = seconds * 1e3
            rows.append(
                (
                    model,
                    c["name"],
                    f"{c['peak_bytes'] / MIB:.2f}",
                    f"{c['peak_bytes'] / r['unplanned_peak_bytes']:.3f}",
                    f"{seconds * 1e3:.0f}",
                    c.get("check", "-"),
                )
            )
        plot = out / f"planner_vs_peers_{model}.svg"
        title = f"{model}: peak memory against step time"
        load = r.get("load_average_1min", {}).get("before_timing")
        if load is not None and load > results["machine"]["threads"]:
            title += f"\n(timed at load {load:.1f} on {results['machine']['threads']} threads: the times say little)"
        plot.write_text(draw.sweep_svg(data.sweep_plot(points, r["unplanned_peak_bytes"]), title), encoding="utf-8")
        plots.append(plot)
    table = _table(
        ("model", "configuration", "peak (MiB)", "x unplanned", "step (ms, median)", "same as unplanned"), rows
    )
    loads = [
        f"{model} {r['load_average_1min']['before_timing']:.1f} -> {r['load_average_1min']['after_timing']:.1f}"
        for model, r in results["models"].items()
        if None not in r.get("load_average_1min", {None: None}).values()
    ]
    if loads:
        table += (
            "\n\n1-minute load average while the steps were timed: "
            + ", ".join(loads)
            + (
                f" (on {results['machine']['threads']} threads: above that, other work shared the cores and the step times say little)"
            )
        )
    return {
        "title": "memoplan's planner against its peers",
        "command": command,
        "figures": figures,
        "plots": plots,
        "markdown": table,
    }


def spiking_memory(out: Path, quick: bool) -> dict[str, Any]:
    options = []
    if quick:
        options = [
            "--plan",
            "plans/spiking_blocks.memplan",
            "--also",
            "--batch",
            "1",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--no-breakdown",
        ]
    return _run_script("spiking_memory", out, options)


def render_spiking_memory(raw: dict[str, Any], out: Path) -> dict[str, Any]:
    from memoplan.report import draw

    command, results = raw["command"], raw["results"]
    u = results["unplanned_peak_bytes"]
    sj = results["spikingjelly"]
    configs = [("unplanned", u)] + [(f"memoplan {p}", r["peak_bytes"]) for p, r in results["plans"].items()]
    configs.append((f"SpikingJelly {sj['version']} level 1", sj["peak_bytes"]))
    figures = {f"spiking_memory.{name}.peak_bytes": peak for name, peak in configs}
    figures.update({f"spiking_memory.{k}.step_ms": v["median"] * 1e3 for k, v in results["step_time_s"].items()})
    plot = out / "spiking_memory.svg"
    plot.write_text(
        draw.bars_svg(
            "Spiking CNN: peak memory of one training step",
            [n for n, _ in configs],
            [p / MIB for _, p in configs],
            "peak (MiB)",
        ),
        encoding="utf-8",
    )
    rows = [(name, f"{peak / MIB:.2f}", f"{peak / u:.3f}") for name, peak in configs]
    chosen = next(iter(results["plans"]))  # the plan the script timed (its --plan)
    timed = {"memoplan": f"memoplan {chosen}", "spikingjelly": f"SpikingJelly {sj['version']} level 1"}
    rows_t = [(timed.get(k, k), f"{v['median'] * 1e3:.0f}") for k, v in results["step_time_s"].items()]
    markdown = (
        _table(("configuration", "peak (MiB)", "x unplanned"), rows)
        + "\n\n"
        + _table(("run", "step (ms, median)"), rows_t)
    )
    return {
        "title": "Spiking CNN: memoplan against SpikingJelly",
        "command": command,
        "figures": figures,
        "plots": [plot],
        "markdown": markdown,
    }


def codec_bandwidth(out: Path, quick: bool) -> dict[str, Any]:
    import torch

    bench = script("codec_bandwidth")
    if torch.cuda.is_available():
        sizes = [64] if quick else [64, 256, 1024, 4096]
        repeats = 5 if quick else 30
        command = f"python benchmarks/codec_bandwidth.py --sizes-mib {' '.join(map(str, sizes))} --repeats {repeats}"
        progress(f"codec_bandwidth: {command}")
        return {"command": command, "device": "cuda", "results": bench["run_gpu"](sizes, repeats, 5, 10)}
    numels = [262_144] if quick else [262_144, 2_097_152, 16_777_216]
    repeats = 5 if quick else 100
    warmup = 2 if quick else 10
    command = f"python benchmarks/codec_bandwidth.py --cpu --numel {' '.join(map(str, numels))} --repeats {repeats} --warmup {warmup}"
    progress(f"codec_bandwidth: {command}")
    return {"command": command, "device": "cpu", "results": bench["run_cpu"](numels, repeats, warmup)}


def render_codec_bandwidth(raw: dict[str, Any], out: Path) -> dict[str, Any]:
    from memoplan.report import draw

    command, rows = raw["command"], raw["results"]
    if raw["device"] == "cuda":
        labels = [f"{r['dtype']} {r['input_mib']} MiB" for r in rows]
        values = [r["ratio_to_copy"] for r in rows]
        figures = {f"codec_bandwidth.{label}.ratio_to_copy": value for label, value in zip(labels, values)}
        figures.update(
            {
                f"codec_bandwidth.{r['dtype']} {r['input_mib']} MiB.pack_unpack_gb_per_s": r["pack_unpack_gb_per_s"]
                for r in rows
            }
        )
        plot_title, unit = "bit pack+unpack bandwidth / device copy", "ratio to copy"
    else:
        figures = {f"codec_bandwidth.cpu.{r['numel']}.{k}": r[k] for r in rows for k in ("pack_ms", "unpack_ms")}
        labels = [f"{what} {r['numel']:,}" for r in rows for what in ("pack", "unpack")]
        values = [r[f"{what}_ms"] for r in rows for what in ("pack", "unpack")]
        plot_title, unit = "bit codec on the CPU (float32 elements)", "ms (median)"
    plot = out / "codec_bandwidth.svg"
    plot.write_text(draw.bars_svg(plot_title, labels, values, unit), encoding="utf-8")
    markdown = _table(("what", unit), [(label, f"{value:.3g}") for label, value in zip(labels, values)])
    return {"title": "The bit codec", "command": command, "figures": figures, "plots": [plot], "markdown": markdown}


def planner_speed(out: Path, quick: bool) -> dict[str, Any]:
    bench = script("planner_speed")
    sizes = [200] if quick else [1000, 5000]
    chains = ["transformer", "resnet"] if quick else ["transformer", "resnet", "uniform", "random"]
    command = "python -m benchmarks --only planner_speed" + (" --quick" if quick else "")
    progress(
        "planner_speed: the slowest search over five budgets per chain and planner "
        f"(python benchmarks/planner_speed.py --sizes {' '.join(map(str, sizes))} --only {' '.join(chains)} prints the full table)"
    )
    Bytes, minimum_peak, levels = bench["Bytes"], bench["minimum_peak"], bench["LEVELS"]
    planners: dict[str, Callable[..., Any]] = {
        "optimal": lambda items, budget, base: bench["optimal"](items, budget, base_bytes=base),
        "greedy": lambda items, budget, base: bench["greedy_bytes"](items, budget, base_bytes=base),
    }
    rows = []
    for chain in chains:
        for n in sizes:
            items, base = bench["CHAINS"][chain](n)
            floor = minimum_peak(items, base_bytes=base)[0]
            top = base + sum(i.saved_bytes for i in items)
            for planner, run in planners.items():
                worst = 0.0
                for level in levels:
                    budget = Bytes(floor + int((top - floor) * level))
                    start = time.perf_counter()
                    run(items, budget, base)
                    worst = max(worst, time.perf_counter() - start)
                rows.append({"chain": chain, "items": n, "planner": planner, "seconds": worst})
    return {"command": command, "results": rows}


def render_planner_speed(raw: dict[str, Any], out: Path) -> dict[str, Any]:
    from memoplan.report import draw

    command = raw["command"]
    figures = {f"planner_speed.{r['chain']}.{r['items']}.{r['planner']}.seconds": r["seconds"] for r in raw["results"]}
    labels = [f"{r['chain']} {r['items']} {r['planner']}" for r in raw["results"]]
    values = [r["seconds"] for r in raw["results"]]
    rows = [(r["chain"], r["items"], r["planner"], f"{r['seconds']:.3f}") for r in raw["results"]]
    plot = out / "planner_speed.svg"
    plot.write_text(
        draw.bars_svg("Planner search time (slowest of five budgets)", labels, values, "seconds"), encoding="utf-8"
    )
    markdown = _table(("chain", "items", "planner", "slowest search (s)"), rows)
    return {"title": "Planner speed", "command": command, "figures": figures, "plots": [plot], "markdown": markdown}


#: name -> (run: measure and return the raw results with their command, render: raw -> the summary's section).
SUITES: dict[str, tuple[Callable[[Path, bool], dict[str, Any]], Callable[[dict[str, Any], Path], dict[str, Any]]]] = {
    "planner_vs_peers": (planner_vs_peers, render_planner_vs_peers),
    "spiking_memory": (spiking_memory, render_spiking_memory),
    "codec_bandwidth": (codec_bandwidth, render_codec_bandwidth),
    "planner_speed": (planner_speed, render_planner_speed),
}


# ---------------------------------------------------------------- summary


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def not_numbers(figures: dict[str, Any]) -> list[str]:
    """Names of figures that are not finite numbers (a bool is not a figure)."""
    return [
        name
        for name, value in figures.items()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    ]


def summary(sections: list[dict[str, Any]], out: Path, command: str, machine: dict[str, Any]) -> str:
    lines = [
        "# memoplan benchmarks: summary",
        "",
        "Written by "
        + ", then ".join(f"`{c}`" for c in command.split("; "))
        + f"; rerun to check every figure. Machine: {machine['torch']} on {machine['device']}, "
        f"{machine['threads']} threads, Python {machine['python']}.",
    ]
    if machine.get("quick"):
        lines += [
            "",
            "**Quick run** (`--quick`): small sizes and one timed step; a check that everything runs, not figures to quote.",
        ]
    for s in sections:
        lines += ["", f"## {s['title']}", "", f"    {s['command']}", ""]
        lines += [f"![{p.stem}]({p.name})" for p in s["plots"]]
        lines += ["", s["markdown"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one timed step: a check that runs in CI")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs" / "benchmarks", help="where to write (default docs/benchmarks)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(SUITES),
        help="run only these; the others keep their results from OUT/results.json, if it holds a run of the same kind",
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="measure nothing: draw the plots and the summary again from OUT/results.json",
    )
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("benchmarks: the plots need matplotlib: pip install 'memoplan[report]'", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.render:
        saved = json.loads((args.out / "results.json").read_text(encoding="utf-8"))
        command, machine, raws = saved["command"], saved["machine"], saved["suites"]
        failed = [name for name, raw in raws.items() if raw.get("failed")]
    else:
        import torch

        command = shlex.join(["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)])
        machine = {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.machine()})",
            "quick": args.quick,
        }
        raws, failed = {}, []
        previous = args.out / "results.json"
        if args.only and previous.exists():
            # Refresh some benchmarks: the others keep their saved results and the commands that made them.
            saved = json.loads(previous.read_text(encoding="utf-8"))
            if saved.get("machine", {}).get("quick") == args.quick:
                raws = {name: raw for name, raw in saved["suites"].items() if name not in args.only}
                command = "; ".join(dict.fromkeys([*saved["command"].split("; "), command]))
        for name in args.only or list(SUITES):
            start = time.perf_counter()
            try:
                raws[name] = SUITES[name][0](args.out, args.quick)
            except Exception as error:  # noqa: BLE001 - one benchmark that fails does not stop the others
                import traceback

                traceback.print_exc()
                failed.append(name)
                progress(f"{name}: FAILED ({type(error).__name__}: {error})")
                raws[name] = {"command": f"python benchmarks/{name}.py", "failed": f"{type(error).__name__}: {error}"}
            else:
                progress(f"{name}: done in {time.perf_counter() - start:.1f} s")
    sections = []
    for name, raw in sorted(raws.items(), key=lambda item: list(SUITES).index(item[0])):
        if raw.get("failed"):
            sections.append(
                {
                    "title": name,
                    "command": raw["command"],
                    "figures": {},
                    "plots": [],
                    "markdown": f"**Failed** in this run: `{raw['failed']}`",
                }
            )
        else:
            sections.append(SUITES[name][1](raw, args.out))
    figures = {k: v for s in sections for k, v in s["figures"].items()}
    bad = not_numbers(figures)
    (args.out / "summary.md").write_text(summary(sections, args.out, command, machine), encoding="utf-8")
    if not args.render:
        (args.out / "results.json").write_text(
            json.dumps({"command": command, "machine": machine, "suites": raws}, indent=1, default=str) + "\n",
            encoding="utf-8",
        )
    (args.out / "figures.json").write_text(
        json.dumps({"figures": figures, "plots": [p.name for s in sections for p in s["plots"]]}, indent=1) + "\n",
        encoding="utf-8",
    )
    print(
        f"wrote {_relative(args.out / 'summary.md')}, {_relative(args.out / 'figures.json')} and "
        f"{sum(len(s['plots']) for s in sections)} plots"
    )
    if bad:
        print(f"benchmarks: figures that are not numbers: {', '.join(bad)}", file=sys.stderr)
    if failed:
        print(f"benchmarks: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if bad or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
