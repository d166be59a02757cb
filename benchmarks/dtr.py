"""Dynamic eviction (the `dtr` block) against memoplan's static plans and peers, side by side in one run.

    .venv/bin/python benchmarks/dtr.py [--models transformer cnn gpt2] [--shares 0.7 0.5 0.3] [--json out.json]

For each model (the bundled transformer and CNN, and a GPT-2 built from a ``transformers``
config as in ``benchmarks/planner_vs_peers.py``), at each share of the unplanned peak:

* **dtr**: ``memoplan plan --budget SHARE --dtr`` (``make_dtr_plan``, as a hint so a miss
  is reported): the threshold it chose, the simulator's predicted peak, the measured peak,
  and what the tracker did in a step (evictions, recomputes, whether the threshold was
  ever missed);
* **static**: memoplan's optimal checkpoint plan for a budget of the peak dtr measured
  (``make_plan``, blocks as candidates): the plan a profile buys at the same memory;
* **torch.compile** with ``activation_memory_budget = SHARE`` (CPU: the
  ``aot_eager_decomp_partition`` backend, metered inside the graphs, as in
  ``planner_vs_peers.py``);

and once per model: the unplanned step, checkpointing every block, and dtr with a threshold
above everything (nothing is evicted: the tracker's own cost).  ``--overhead ROUNDS`` times
only those two, over many interleaved rounds (the tracker's cost is a few percent at most,
below the noise of a short run).  Every memoplan plan is
checked with ``memoplan.verify`` (bit for bit).  Step times are medians of ``--steps``
rounds, the configurations interleaved and rotated each round.

Verdicts: dtr's step time over the static plan's at the same peak (goal: at most 1.10);
the threshold never missed; the no-eviction overhead against unplanned (goal: under 3%).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for path in (str(HERE.parent), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

import planner_vs_peers as peers  # noqa: E402
import torch  # noqa: E402

import memoplan  # noqa: E402
from memoplan.measure import measured_step, training_step  # noqa: E402
from memoplan.planner.budgets import Bytes, FractionOfPeak  # noqa: E402
from memoplan.planner.config import Planner  # noqa: E402
from memoplan.planner.dtr.plan import make_dtr_plan  # noqa: E402
from memoplan.planner.plan import make_plan  # noqa: E402
from memoplan.planner.profiling.profile import profile  # noqa: E402
from memoplan.specs import Example  # noqa: E402
from memoplan.verification import verify  # noqa: E402

MIB = 2**20
MODELS = ("transformer", "cnn", "gpt2")
SHARES = (0.7, 0.5, 0.3)
EVERYTHING = "memplan 1\ndtr { eviction_threshold = 1 TiB }\n"


def build_transformer(args: argparse.Namespace) -> dict[str, Any]:
    from memoplan.examples import transformer

    torch.manual_seed(args.seed)
    return {
        "model": transformer.build(),
        "example": transformer.example(),
        "blocks": "blocks.*",
        "description": {"name": "memoplan.examples.transformer (4 pre-norm blocks, d=64)"},
    }


BUILDERS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "transformer": build_transformer,
    "cnn": peers.build_cnn,
    "gpt2": peers.build_gpt2,
}


def _as_example(example: Any) -> Example:
    if isinstance(example, Example):
        return example
    return Example((example,) if isinstance(example, torch.Tensor) else tuple(example))


def _stats_of(model: torch.nn.Module, plan: Any, example: Example, seed: int) -> dict[str, Any]:
    """What the tracker did in one training step of a fresh copy with ``plan``."""
    planned = memoplan.apply(copy.deepcopy(model), plan)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a missed threshold is counted below
        training_step(planned, example.args, example.kwargs)
    stats = memoplan.dtr_stats(planned)
    return {
        "threshold": stats.threshold,
        "evictions": stats.evictions,
        "recomputes": stats.recomputes,
        "recompute_seconds": stats.recompute_seconds,
        "tracked_peak": stats.tracked_peak,
        "working_peak": stats.working_peak,
        "over_threshold": stats.over_threshold,
    }


def _verified(model, plan, example: Example, seed: int) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return verify(model, plan, example, seed=seed).exact


def overhead(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Unplanned against dtr evicting nothing only, over ``--overhead`` interleaved rounds."""
    built = BUILDERS[name](args)
    model, example = built["model"], _as_example(built["example"])
    steps = {
        "unplanned": peers.eager_step(copy.deepcopy(model), example),
        "dtr, nothing evicted": peers.eager_step(memoplan.apply(copy.deepcopy(model), EVERYTHING), example),
    }
    cpu: dict[str, list[float]] = {k: [] for k in steps}

    def on_cpu(label: str, step: Callable[[], Any]) -> Callable[[], Any]:
        def timed() -> Any:
            start = time.process_time()
            result = step()
            cpu[label].append(time.process_time() - start)
            return result

        return timed

    times = peers.timed_rounds(
        {k: on_cpu(k, f) for k, f in steps.items()}, args.overhead, args.warmup, "cpu", args.seed
    )
    cpu = {k: v[args.warmup :] for k, v in cpu.items()}
    medians = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in cpu.items()}
    return {
        "model": name,
        "rounds": args.overhead,
        "median_seconds": medians,
        "min_seconds": {k: min(v) for k, v in times.items()},
        "overhead": medians["dtr, nothing evicted"] / medians["unplanned"] - 1,
        # CPU time of the process (all its threads): what waiting for a core on a shared machine does not inflate
        "min_cpu_seconds": low,
        "cpu_overhead": low["dtr, nothing evicted"] / low["unplanned"] - 1,
    }


class _Tiny(torch.nn.Module):
    """12 blocks of two 16-wide Linears on a 4 x 16 batch: a step of almost nothing but calls."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16)) for _ in range(12)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def per_call(rounds: int, steps: int = 50) -> dict[str, float]:
    """The tracker's own cost per candidate call, evicting nothing: (dtr step - unplanned step) / 12,
    each the best of ``rounds`` rounds of ``steps`` steps in CPU time of the process (one torch
    thread: time spent waiting for a core on a loaded machine is not counted; the minimum is what
    such a machine disturbs least)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, x = _Tiny(), torch.randn(4, 16)
    planned = memoplan.apply(
        copy.deepcopy(model), 'memplan 1\ndtr { eviction_threshold = 1 TiB; modules = "blocks.*" }\n'
    )
    best = {"unplanned": float("inf"), "dtr": float("inf")}
    try:
        for _ in range(rounds + 1):  # the first round warms up
            for name, m in (("unplanned", model), ("dtr", planned)):
                start = time.process_time()
                for _ in range(steps):
                    m.zero_grad(set_to_none=True)
                    m(x).sum().backward()
                best[name] = min(best[name], (time.process_time() - start) / steps)
    finally:
        torch.set_num_threads(threads)
    return {**best, "per_call": (best["dtr"] - best["unplanned"]) / len(model.blocks)}


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    built = BUILDERS[name](args)
    model, example = built["model"], _as_example(built["example"])
    seed = args.seed
    peers.progress(f"[{name}] {built['description']['name']}")
    reference = copy.deepcopy(model)
    torch.manual_seed(seed)
    unplanned = measured_step(reference, example.args, example.kwargs)[0].peak_bytes
    configs: list[dict[str, Any]] = [{"name": "unplanned", "peak_bytes": unplanned, "exact": True}]
    steps: dict[str, Callable[[], Any]] = {"unplanned": peers.eager_step(copy.deepcopy(model), example)}

    def planned(label: str, plan: Any, peak: int, **extra: Any) -> dict[str, Any]:
        entry = {"name": label, "peak_bytes": peak, "exact": _verified(model, plan, example, seed), **extra}
        configs.append(entry)
        steps[label] = peers.eager_step(memoplan.apply(copy.deepcopy(model), plan), example)
        peers.progress(
            f"[{name}] {label}: {peak / MIB:.2f} MiB, verify {'bit for bit' if entry['exact'] else 'DIFFERENT'}"
        )
        return entry

    # dtr evicting nothing: the tracker's own cost.
    everything = memoplan.parse(EVERYTHING)
    peak = measured_step(memoplan.apply(copy.deepcopy(model), everything), example.args, example.kwargs)[0].peak_bytes
    planned("dtr, nothing evicted", everything, peak, dtr=_stats_of(model, everything, example, seed))

    every = f"memplan 1\nmodule {built['blocks']} {{ checkpoint }}\n"
    peak = measured_step(memoplan.apply(copy.deepcopy(model), every), example.args, example.kwargs)[0].peak_bytes
    planned("checkpoint every block", every, peak)

    peers.progress(f"[{name}] profiling")
    prof = profile(model, example, progress=False)
    for share in args.shares:
        result = make_dtr_plan(
            model, example, FractionOfPeak.percent(share * 100), hard=False, prof=prof, progress=False
        )
        stats = _stats_of(model, result.plan, example, seed)
        dtr = planned(
            f"dtr {share:g}",
            result.plan,
            result.measured_after,
            share=share,
            kind="dtr",
            limit=result.limit,
            predicted_peak=result.predicted_after,
            prediction_error=(result.predicted_after - result.measured_after) / result.measured_after,
            dtr=stats,
        )
        static = make_plan(
            model, example, Bytes(dtr["peak_bytes"]), planner=Planner.OPTIMAL, hard=False, prof=prof, progress=False
        )
        planned(
            f"static at dtr {share:g}'s peak",
            static.plan,
            static.measured_after,
            share=share,
            kind="static",
            rules=static.regions,
        )
        label = f"torch.compile {share:g}"
        copy_ = copy.deepcopy(model)
        fn = peers.compile_step(copy_, "cpu", f"dtr bench {name} {share:g}")
        step = peers.compiled_step(copy_, fn, example, share)
        try:
            torch.manual_seed(seed)
            step()
            compiled_peak, _ = peers.compiled_peak(step, copy_, "cpu", seed)
        except Exception as error:  # noqa: BLE001 - a peer that fails is reported, not fatal
            configs.append({"name": label, "status": f"failed: {type(error).__name__}: {str(error)[:200]}"})
            continue
        configs.append({"name": label, "peak_bytes": compiled_peak, "share": share, "kind": "compile"})
        steps[label] = step
        peers.progress(f"[{name}] {label}: {compiled_peak / MIB:.2f} MiB")

    peers.progress(f"[{name}] timing {len(steps)} configurations, {args.warmup} warm-up + {args.steps} rounds")
    times = peers.timed_rounds(steps, args.steps, args.warmup, "cpu", seed)
    for entry in configs:
        if entry["name"] in times:
            entry["step_seconds"] = statistics.median(times[entry["name"]])
        if "peak_bytes" in entry:
            entry["ratio"] = entry["peak_bytes"] / unplanned
    return {"model": name, "description": built["description"], "unplanned_peak_bytes": unplanned, "configs": configs}


def verdicts(result: dict[str, Any]) -> list[str]:
    by_name = {c["name"]: c for c in result["configs"]}
    lines = []
    base = by_name["unplanned"].get("step_seconds")
    idle = by_name["dtr, nothing evicted"]
    if base and idle.get("step_seconds"):
        overhead = idle["step_seconds"] / base - 1
        lines.append(
            f"dtr evicting nothing: {idle['dtr']['evictions']} evictions, step time {overhead:+.1%} against unplanned "
            f"(goal under 3%: {'met' if overhead < 0.03 else 'MISSED'})"
        )
    for entry in result["configs"]:
        if entry.get("kind") != "dtr":
            continue
        static = by_name.get(f"static at dtr {entry['share']:g}'s peak", {})
        ratio = entry["step_seconds"] / static["step_seconds"] if static.get("step_seconds") else float("nan")
        never = entry["dtr"]["over_threshold"] == 0
        within = entry["peak_bytes"] <= entry["limit"]
        lines.append(
            f"share {entry['share']:g}: dtr {entry['peak_bytes'] / MIB:.2f} MiB (limit {entry['limit'] / MIB:.2f}: "
            f"{'met' if within else 'missed, below what eviction reaches'}), "
            f"static {static.get('peak_bytes', 0) / MIB:.2f} MiB; dtr/static step time {ratio:.2f} "
            f"(goal <= 1.10: {'met' if ratio <= 1.10 else 'MISSED'}); threshold {'never missed' if never else 'MISSED'}"
        )
    return lines


def render(results: list[dict[str, Any]], command: str) -> str:
    out = [f"Command: `{command}`", ""]
    out.append(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU live-storage meter")
    for result in results:
        out += ["", f"### {result['model']}: {result['description']['name']}", ""]
        out.append(f"Unplanned peak {result['unplanned_peak_bytes'] / MIB:.2f} MiB.")
        out += [
            "",
            "| configuration | peak MiB | x unplanned | step ms | bit for bit | dtr: threshold / evictions / recomputes / missed | predicted peak (error) |",
        ]
        out.append("| --- | ---: | ---: | ---: | --- | --- | --- |")
        for c in result["configs"]:
            if "peak_bytes" not in c:
                out.append(f"| {c['name']} | - | - | - | - | {c.get('status', '')} | |")
                continue
            dtr = c.get("dtr")
            tracker = (
                f"{dtr['threshold'] / MIB:.2f} MiB / {dtr['evictions']} / {dtr['recomputes']} / {dtr['over_threshold']}"
                if dtr
                else ""
            )
            predicted = (
                f"{c['predicted_peak'] / MIB:.2f} MiB ({c['prediction_error']:+.1%})" if "predicted_peak" in c else ""
            )
            exact = "yes" if c.get("exact") else ("-" if "exact" not in c else "NO")
            step = f"{c['step_seconds'] * 1000:.1f}" if "step_seconds" in c else "-"
            out.append(
                f"| {c['name']} | {c['peak_bytes'] / MIB:.2f} | {c['ratio']:.3f} | {step} | {exact} | {tracker} | {predicted} |"
            )
        out += [""] + [f"- {line}" for line in verdicts(result)]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    parser = peers.build_parser()
    parser.description = __doc__.split("\n\n")[0]
    for action in parser._actions:
        if action.dest == "models":
            action.choices, action.default = MODELS, list(MODELS)
    parser.add_argument("--shares", nargs="+", type=float, default=list(SHARES), help="shares of the unplanned peak")
    parser.add_argument(
        "--per-call",
        type=int,
        metavar="ROUNDS",
        help="only the tracker's cost per candidate call on a tiny model (best of ROUNDS)",
    )
    parser.add_argument(
        "--overhead",
        type=int,
        metavar="ROUNDS",
        help="only time unplanned against dtr evicting nothing, over ROUNDS rounds",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    command = " ".join([".venv/bin/python benchmarks/dtr.py", *argv])
    if args.per_call:
        got = per_call(args.per_call)
        print(
            f"Command: `{command}`\n\nunplanned step {got['unplanned'] * 1e6:.0f} us, dtr evicting nothing "
            f"{got['dtr'] * 1e6:.0f} us (CPU time, best of {args.per_call} rounds): {got['per_call'] * 1e6:.1f} us per candidate call"
        )
        return 0
    if args.overhead:
        rows = [overhead(name, args) for name in args.models]
        print(
            f"Command: `{command}`\n\n| model | unplanned ms | dtr, nothing evicted ms | overhead (medians) | minimums "
            "| CPU ms, best: unplanned / dtr | overhead (CPU time, best) |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for row in rows:
            med, low = row["median_seconds"], row["min_seconds"]
            print(
                f"| {row['model']} | {med['unplanned'] * 1000:.1f} | {med['dtr, nothing evicted'] * 1000:.1f} | "
                f"{row['overhead']:+.1%} | {low['dtr, nothing evicted'] / low['unplanned'] - 1:+.1%} | "
                f"{row['min_cpu_seconds']['unplanned'] * 1000:.1f} / {row['min_cpu_seconds']['dtr, nothing evicted'] * 1000:.1f} | "
                f"{row['cpu_overhead']:+.1%} |"
            )
        return 0
    results = [run_model(name, args) for name in args.models]
    text = render(results, command)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"command": command, "results": results}, indent=1, default=str))
    peers.progress(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
