"""The model zoo: every architecture of ``benchmarks/zoo_models.py`` through memoplan (docs/zoo.md).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/zoo.py --json docs/benchmarks/zoo.json --markdown docs/benchmarks/zoo.md
    PYTHONPATH=. .venv/bin/python benchmarks/zoo.py --render docs/benchmarks/zoo.json --markdown docs/benchmarks/zoo.md  # again, measuring nothing
    PYTHONPATH=. .venv/bin/python benchmarks/zoo.py --only gpt2 mixtral --budgets 50   # a few, one budget

For each architecture (random weights from a small configuration; nothing downloaded):

* **estimate against measurement**: the profile estimated on fake tensors
  (:func:`memoplan.planner.profiling.estimate.estimate`) and the measured one
  (:func:`memoplan.planner.profiling.profile.profile`): the unplanned peaks, and how many modules' byte
  figures (saved, inputs, outputs, kept) differ; an operator that ran for real on zeros because its
  fake kernel refused the inputs is named;
* **plan** at each budget (default 50% and 30%), as a user runs it: ``memoplan plan --model M
  --example E --budget B -o PLAN``: met (the planned peak measured), or the diagnostic it refused
  with (MP601 with its explanation), and its CPU time in unplanned steps (the median CPU time of
  ``--unit-steps`` plain training steps of the model); when every budget is refused, ``--budget
  30% --hint`` writes the least-peak plan so that it is verified too;
* **verify** of every plan written: ``memoplan verify PLAN``, its verdict (EQUIVALENT is bit for bit).

Times are CPU times of this process (one thread: ``OMP_NUM_THREADS=1``), so other jobs on the
machine change them less than wall times.  Prints a table; ``--json`` writes every figure,
``--markdown`` the table and every refusal's text, with the command that measured them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

from benchmarks.zoo_models import ZOO, Entry, missing  # noqa: E402

BYTES = ("saved_bytes", "input_bytes", "output_bytes", "kept_bytes")


def _quiet(fn, *args: Any, **kwargs: Any) -> tuple[Any, str]:
    """``fn(*args, **kwargs)`` with its standard output and error captured: (result, what it printed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        result = fn(*args, **kwargs)
    return result, out.getvalue()


def _load(entry: Entry):
    from memoplan import specs
    from memoplan.syntax import parse_example_spec

    torch.manual_seed(0)
    model = specs.load_model(entry.model_spec)
    example = specs.make_example(parse_example_spec(entry.example))
    return model, example


def unit_step(model, example, steps: int) -> float:
    """The median CPU time of ``steps`` plain training steps (after one to warm up)."""
    from memoplan.measure import training_step
    from memoplan.planner.profiling.snapshot import Restored

    times = []
    for _ in range(steps + 1):
        with Restored(model, example, None):
            start = time.process_time()
            training_step(model, example.args, dict(example.kwargs))
            times.append(time.process_time() - start)
    model.zero_grad(set_to_none=True)
    return statistics.median(times[1:])


def estimate_against_measurement(model, example) -> dict[str, Any]:
    from memoplan.planner.profiling.estimate import estimate
    from memoplan.planner.profiling.profile import profile

    notes: list[str] = []
    measured = profile(model, example, repeats=1, progress=False)
    estimated = estimate(model, example, repeats=1, progress=False, note=notes.append)
    differ = [
        m.name
        for m, e in zip(measured.modules, estimated.modules, strict=True)
        if any(getattr(m, f) != getattr(e, f) for f in BYTES)
    ]
    return {
        "measured_peak_bytes": measured.peak_bytes,
        "estimated_peak_bytes": estimated.peak_bytes,
        "parameter_bytes": measured.parameter_bytes,
        "modules": len(measured.modules),
        "modules_differing": differ,
        "fallbacks": [n for n in notes if "no fake kernel" in n],
    }


def plan_at(entry: Entry, budget: str, output: Path, unit: float, hint: bool = False) -> dict[str, Any]:
    """``memoplan plan`` at ``budget`` (``30%``), in this process, as the command line runs it."""
    from memoplan.cli import main

    argv = ["plan", "--model", entry.model_spec, "--example", entry.example, "--budget", budget]
    argv += ["--hint"] if hint else []
    start = time.process_time()
    code, text = _quiet(main, [*argv, "-o", str(output)])
    seconds = time.process_time() - start
    result: dict[str, Any] = {"budget": budget + (" hint" if hint else ""), "exit": code, "seconds": seconds}
    result["unplanned_steps"] = seconds / unit if unit > 0 else None
    wrote = re.search(r"^wrote .*$", text, re.MULTILINE)
    if code == 0 and wrote:
        result["met"] = "budget met" in wrote.group(0)
        result["line"] = wrote.group(0)
        peaks = re.findall(r"(\d+) B", wrote.group(0))
        result["planned_peak_bytes"] = int(peaks[1]) if len(peaks) > 1 else None
    else:
        result["met"] = False
        diagnostics = re.findall(r"^(?:error|warning)\[MP\d+\]:.*(?:\n  .*)*", text, re.MULTILINE)
        result["refusal"] = "\n".join(d for d in diagnostics if d.startswith("error")) or text.strip()[-2000:]
    return result


def verify(plan: Path) -> dict[str, Any]:
    from memoplan.cli import main

    code, text = _quiet(main, ["verify", str(plan)])
    verdict = re.search(r"verdict: (\w+)", text)
    return {"exit": code, "verdict": verdict.group(1) if verdict else None, "tail": "" if verdict else text[-2000:]}


def run_entry(entry: Entry, budgets: list[int], unit_steps: int, folder: Path) -> dict[str, Any]:
    model, example = _load(entry)
    # the example's spec relative to the checkout: the recorded results hold no path of this machine
    example_spec = entry.example.replace(f"{HERE.parent.as_posix()}/", "")
    result: dict[str, Any] = {"name": entry.name, "library": entry.library, "example": example_spec}
    result["unit_step_seconds"] = unit = unit_step(model, example, unit_steps)
    result["estimate"], _ = _quiet(estimate_against_measurement, model, example)
    del model
    plans = []
    for budget in budgets:
        path = folder / f"{entry.name}_{budget}.memplan"
        planned = plan_at(entry, f"{budget}%", path, unit)
        if path.exists():
            planned["verify"] = verify(path)
        plans.append(planned)
    if not any(p["exit"] == 0 for p in plans):
        path = folder / f"{entry.name}_hint.memplan"
        planned = plan_at(entry, f"{min(budgets)}%", path, unit, hint=True)
        if path.exists():
            planned["verify"] = verify(path)
        plans.append(planned)
    result["plans"] = plans
    return result


# ---------------------------------------------------------------- reporting


def _share(part: int | None, whole: int) -> str:
    return "-" if part is None else f"{part:,} ({part / whole:.2f})"


def _plan_cell(plan: dict[str, Any], peak: int) -> str:
    steps = plan.get("unplanned_steps")
    took = f"{steps:.0f} steps" if steps is not None else "-"
    verdict = (plan.get("verify") or {}).get("verdict") or "-"
    if plan["exit"] == 0:
        state = "met" if plan["met"] else "hint"
        return f"{state} {_share(plan.get('planned_peak_bytes'), peak)}, {verdict}, {took}"
    code = re.match(r"error\[(MP\d+)\]", plan.get("refusal", ""))
    return f"{code.group(1) if code else 'failed'}, {took}"


def table(results: list[dict[str, Any]], budgets: list[int]) -> str:
    head = ["architecture", "library", "peak measured (B)", "estimated", "modules differing", "grads share"]
    head += [f"plan {b}%" for b in budgets] + ["hint (when all refused)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['name']} | {r['library']} | skipped: {r['skipped']} |" + " |" * (len(head) - 3))
            continue
        if "error" in r:
            lines.append(f"| {r['name']} | {r['library']} | error: {r['error']} |" + " |" * (len(head) - 3))
            continue
        e = r["estimate"]
        peak = e["measured_peak_bytes"]
        same = "exact" if e["estimated_peak_bytes"] == peak else f"{e['estimated_peak_bytes']:,}"
        fell = " (fallback)" if e["fallbacks"] else ""
        cells = [r["name"], r["library"], f"{peak:,}", same + fell, f"{len(e['modules_differing'])} of {e['modules']}"]
        cells.append(f"{e['parameter_bytes'] / peak:.2f}")
        by_budget = {p["budget"]: p for p in r["plans"]}
        cells += [_plan_cell(by_budget[f"{b}%"], peak) for b in budgets]
        hints = [p for p in r["plans"] if p["budget"].endswith("hint")]
        cells.append(_plan_cell(hints[0], peak) if hints else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def refusals(results: list[dict[str, Any]]) -> str:
    out = []
    for r in results:
        for p in r.get("plans", ()):
            if p["exit"] != 0:
                out.append(f"**{r['name']}, `--budget {p['budget']}`**\n\n```\n{p['refusal']}\n```\n")
    return "\n".join(out)


def markdown(results: list[dict[str, Any]], budgets: list[int], command: str, meta: dict[str, Any]) -> str:
    return (
        "# The model zoo: measured\n\n"
        "Written by `benchmarks/zoo.py` (docs/zoo.md says what each column means):\n\n"
        f"```\n{command}\n```\n\n"
        f"{meta['machine']}; {meta['seconds'] / 60:.0f} minutes; taken {meta['taken']}.\n\n"
        "Peaks in bytes, with their share of the unplanned peak measured; *grads share*: the "
        "parameters' bytes (their gradients) over the unplanned peak; a plan cell: met or hint, the "
        "planned peak measured, `verify`'s verdict, and the CPU time of `memoplan plan` in unplanned "
        "steps.\n\n"
        + table(results, budgets)
        + "\n\n## Refusals, as `memoplan plan` printed them\n\n"
        + refusals(results)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these architectures only")
    parser.add_argument("--budgets", nargs="+", type=int, default=[50, 30], metavar="PERCENT")
    parser.add_argument("--unit-steps", type=int, default=5, help="plain steps timed for the unit")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--markdown", type=Path, help="write the table and the refusals here")
    parser.add_argument("--render", type=Path, metavar="JSON", help="measure nothing: write --markdown from this file")
    args = parser.parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text(encoding="utf-8"))
        print(table(saved["results"], saved["meta"]["budgets"]))
        if args.markdown:
            args.markdown.write_text(
                markdown(saved["results"], saved["meta"]["budgets"], saved["meta"]["command"], saved["meta"]),
                encoding="utf-8",
            )
        return 0
    entries = [e for e in ZOO if args.only is None or e.name in args.only]
    unknown = set(args.only or ()) - {e.name for e in ZOO}
    if unknown:
        parser.error(f"no such architecture: {', '.join(sorted(unknown))} (known: {', '.join(e.name for e in ZOO)})")
    threads = os.environ.get("OMP_NUM_THREADS")
    command = " ".join(
        ["PYTHONPATH=.", *([f"OMP_NUM_THREADS={threads}"] if threads else []), ".venv/bin/python"]
        + [shlex.join(["benchmarks/zoo.py", *(argv if argv is not None else sys.argv[1:])])]
    )
    started = time.time()
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for entry in entries:
            print(f"zoo: {entry.name} ({entry.library})", file=sys.stderr, flush=True)
            absent = missing(entry)
            if absent is not None:
                results.append({"name": entry.name, "library": entry.library, "skipped": f"{absent} not installed"})
                continue
            try:
                results.append(run_entry(entry, args.budgets, args.unit_steps, Path(folder)))
            except Exception as exc:  # noqa: BLE001  one architecture's failure is a result, not the end
                results.append({"name": entry.name, "library": entry.library, "error": f"{type(exc).__name__}: {exc}"})
    meta = {
        "machine": f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s)",
        "seconds": time.time() - started,
        "command": command,
        "budgets": args.budgets,
        "taken": time.strftime("%Y-%m-%d, %H:%M UTC", time.gmtime(started)),
    }
    print(table(results, args.budgets))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(results, args.budgets, command, meta), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
