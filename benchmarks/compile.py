"""memoplan + torch.compile against torch.compile's own activation memory budget, in one run.

    .venv/bin/python benchmarks/compile.py [--layers 12 --width 384 --batch 4 --seq 256] [--json out.json]

A GPT-2 (``transformers.GPT2LMHeadModel`` from a ``GPT2Config`` with the given layers and width,
the default configuration otherwise: dropout 0.1, ``use_cache=True``; random weights), trained
on the causal-LM loss of random tokens.  Configurations, each one training step:

* **eager**: the unplanned model, not compiled (the reference of the peak ratios);
* **compile**: ``torch.compile`` of model + loss, compile's default budget (1.0);
* **compile budget B**: ``torch._functorch.config.activation_memory_budget = B`` (``--budgets``);
* **memoplan B% + compile**: ``make_plan`` (optimal planner, ``hint`` budget B of the unplanned
  peak, blocks as candidates) applied, then compiled the same way (budget 1.0).

Peaks and step times are printed as ratios to **compile** (and the peaks to **eager**).  On CPU
the peaks come from memoplan's live-storage meter switched on inside the compiled graphs
(:mod:`memoplan.report.peers`: ``aot_eager_decomp_partition``, the min-cut partitioner that
honours the budget, graphs run op by op), so CPU step times are aot_eager times, not Inductor's.
On CUDA (``--device cuda``) compile uses Inductor and the caching allocator measures.

``--dtr B ...`` adds, per share B: **dtr B + compile**: ``make_dtr_plan`` (the threshold
``memoplan plan --budget B --dtr`` chooses), applied, one eager training step (the tracker
measures the candidates), then compiled: the ``dtr`` block is lowered to the dtr simulator's
static checkpoint choice (``memoplan.runtime.evictable``, MP418); and **static at dtr B's
choice + compile**: a plain ``checkpoint`` plan over the same candidates, compiled: the static
plan at the same peak, which the compiled dtr step is to be no slower than 1.1x.
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
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import memoplan  # noqa: E402
from benchmarks.clock import progress  # noqa: E402
from memoplan.graphs import CountingBackend  # noqa: E402
from memoplan.measure import measured_step  # noqa: E402
from memoplan.planner.budgets import FractionOfPeak  # noqa: E402
from memoplan.planner.config import Planner  # noqa: E402
from memoplan.planner.plan import make_plan  # noqa: E402
from memoplan.planner.profiling.profile import profile  # noqa: E402
from memoplan.report import peers  # noqa: E402
from memoplan.specs import Example  # noqa: E402

MIB = 2**20


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, Example]:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        n_layer=args.layers, n_embd=args.width, n_head=args.width // 64, n_positions=max(args.seq, 1024)
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()
    model.loss_type = "ForCausalLM"  # else transformers logs from inside forward (a graph break)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    return model, Example((ids,), {"labels": ids})


def _loss(output: Any) -> torch.Tensor:
    return output.loss


def compiled(model: torch.nn.Module, device: str, tag: str) -> Callable[..., torch.Tensor]:
    """``loss(model(...))`` compiled with a code object of its own (Dynamo caches per code object)."""
    namespace: dict[str, Any] = {}
    source = "def step(*args, **kwargs):\n    return model(*args, **kwargs).loss\n"
    exec(compile(source, f"<compiled step: {tag}>", "exec"), {"model": model}, namespace)
    inner = "inductor" if device == "cuda" else peers.aot_eager_decomp_partition_metered
    counting = CountingBackend(inner)
    fn = torch.compile(namespace["step"], backend=counting)
    fn.counting = counting  # type: ignore[attr-defined]
    return fn


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = args.device
    model, example = build(args)
    model.to(device)
    example = example.to(device)
    progress(f"GPT-2 {args.layers} x {args.width}, batch {args.batch} x {args.seq}: measuring eager")
    eager_peak = (
        measured_step(model, example.args, example.kwargs, loss_fn=_loss)[0].peak_bytes if device == "cpu" else None
    )
    steps: dict[str, Callable[[], torch.Tensor]] = {"eager": peers.eager_step(_Loss(model), example)}
    rows: dict[str, dict[str, Any]] = {}
    chosen: dict[float, list[str]] = {}
    for label, budget, plan_share in _configs(args):
        copied = copy.deepcopy(model)
        if isinstance(plan_share, float):
            progress(f"{label}: planning")
            prof = profile(copied, example, loss_fn=_loss, repeats=1, progress=False)
            result = make_plan(
                copied,
                example,
                FractionOfPeak(Fraction(str(plan_share))),
                planner=Planner.OPTIMAL,
                hard=False,
                prof=prof,
                progress=False,
            )
            memoplan.apply(copied, result.plan)
            rows.setdefault(label, {})["regions"] = result.regions
        elif plan_share is not None:
            kind, share = plan_share
            progress(f"{label}: planning")
            if kind == "dtr":
                chosen[share] = _dtr_compiled(copied, example, share)
            else:
                memoplan.apply(copied, "memplan 1\n" + "".join(f"module {p} {{ checkpoint }}\n" for p in chosen[share]))
            rows.setdefault(label, {})["regions"] = chosen[share]
        fn = compiled(copied, device, label)
        step = peers.compiled_step(copied, fn, example, budget)
        progress(f"{label}: compiling")
        peers.compiled_peak(step, copied, device, 0)  # compiles
        peak, _ = peers.compiled_peak(step, copied, device, 0)
        capture = fn.counting.capture
        rows.setdefault(label, {}).update(peak_bytes=peak, capture=capture.describe())
        steps[label] = step
        progress(f"{label}: {peak / MIB:.1f} MiB, {capture.describe()}")
    rounds = _timed(steps, args.steps, device)
    times = {label: statistics.median(values) for label, values in rounds.items()}
    base = rows["compile"]
    for label, row in rows.items():
        row["seconds"] = times[label]
        row["best_seconds"] = min(rounds[label])
        row["peak_vs_compile"] = row["peak_bytes"] / base["peak_bytes"]
        row["time_vs_compile"] = times[label] / times["compile"]
        if eager_peak:
            row["peak_vs_eager"] = row["peak_bytes"] / eager_peak
    return {"eager_peak_bytes": eager_peak, "eager_seconds": times["eager"], "rows": rows, "args": vars(args)}


class _Loss(torch.nn.Module):
    """``model(...).loss`` as a module, for the eager step (memoplan's default loss sums every output)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model(*args, **kwargs).loss


def _configs(args: argparse.Namespace) -> list[tuple[str, float, Any]]:
    configs: list[tuple[str, float, Any]] = [("compile", 1.0, None)]
    configs += [(f"compile budget {b:g}", b, None) for b in args.budgets]
    configs += [(f"memoplan {b:.0%} + compile", 1.0, b) for b in args.budgets]
    for b in args.dtr:
        configs += [
            (f"dtr {b:.0%} + compile", 1.0, ("dtr", b)),
            (f"static at dtr {b:.0%}'s choice + compile", 1.0, ("static", b)),
        ]
    return configs


def _dtr_compiled(model: torch.nn.Module, example: Example, share: float) -> list[str]:
    """Apply the ``dtr`` plan for ``share``, run one eager step (the tracker measures the
    candidates); the candidates its compile choice checkpoints."""
    from memoplan.planner.dtr.plan import make_dtr_plan
    from memoplan.runtime.dtr import DTR_ATTR
    from memoplan.runtime.evictable import compile_choice

    result = make_dtr_plan(model, example, FractionOfPeak(Fraction(str(share))), hard=False, progress=False)
    memoplan.apply(model, result.plan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # MP430 where the threshold is below what is kept
        _Loss(model)(*example.args, **example.kwargs).backward()
    model.zero_grad(set_to_none=True)
    progress(f"dtr {share:.0%}: eager step {memoplan.dtr_stats(model).summary()}")
    return sorted(compile_choice(model.__dict__[DTR_ATTR])[0])


def _timed(steps: dict[str, Callable[[], torch.Tensor]], n: int, device: str) -> dict[str, list[float]]:
    """The wall times of ``n`` steps of each configuration, round by round."""
    times: dict[str, list[float]] = {label: [] for label in steps}
    for _ in range(n):
        for label, step in steps.items():
            peers.sync(device)
            start = time.perf_counter()
            step()
            peers.sync(device)
            times[label].append(time.perf_counter() - start)
    return times


def render(results: dict[str, Any]) -> str:
    lines = [
        "| configuration | peak (MiB) | peak / compile | peak / eager | step time / compile | what Dynamo captured |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for label, row in results["rows"].items():
        eager = f"{row['peak_vs_eager']:.3f}" if "peak_vs_eager" in row else "-"
        lines.append(
            f"| {label} | {row['peak_bytes'] / MIB:.1f} | {row['peak_vs_compile']:.3f} | {eager} | "
            f"{row['time_vs_compile']:.2f} | {row['capture']} |"
        )
    rows = results["rows"]
    for label, row in rows.items():
        static = rows.get(label.replace(" + compile", "").replace("dtr ", "static at dtr ", 1) + "'s choice + compile")
        if label.startswith("dtr ") and static:
            ratio = row["seconds"] / static["seconds"]
            best = row["best_seconds"] / static["best_seconds"]
            lines.append(
                f"\n{label}: checkpoints {len(row['regions'])} candidates ({', '.join(row['regions'])}); step time "
                f"{ratio:.2f}x the static plan over the same candidates (medians; {best:.2f}x best against best; "
                f"goal <= 1.10: {'met' if min(ratio, best) <= 1.10 else 'MISSED'})"
            )
    if results["eager_peak_bytes"]:
        lines.append(f"\nstep times: medians of {results['args']['steps']} interleaved rounds")
        lines.append(
            f"\neager, not compiled: {results['eager_peak_bytes'] / MIB:.1f} MiB, {results['eager_seconds'] * 1e3:.0f} ms a step"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--budgets", type=float, nargs="*", default=[0.5, 0.3])
    parser.add_argument("--dtr", type=float, nargs="*", default=[0.5], help="shares for `dtr` + compile (none: skip)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch._inductor.config.fallback_random = True
    results = run(args)
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
