"""Generated and hand-written memoplan plans against SpikingJelly 2.0's ``optimize_memory`` level 1
on the issue's SpikingJelly CNN (:mod:`benchmarks.sj_cnn`: 4 x ``layer.Conv2d`` -> ``neuron.LIFNode``
-> ``layer.MaxPool2d``, multi-step, T = 8, binary input), on one meter, in one run.

    .venv/bin/python benchmarks/sj_compare.py [--size 64] [--batch 4] [--steps 3] [--budget 40] [--quick]

Rows: the unplanned step; the hand plan (time chunks, bit inputs, functional state); the plan
``memoplan plan --budget 40%`` writes (made by this run, through the same ``make_plan``); and
SpikingJelly's ``optimize_memory(model, targets=(Block,), example_forward=..., level=1,
checkpoint_budget="memory", compress=True)`` (one checkpoint per block, binary inputs
bit-compressed).  ``Block`` is a subclass of ``nn.Sequential`` with its forward, given to the
four blocks of a copy so that level 1 picks them and nothing else.  Peaks: memoplan's CPU
live-storage meter over one training step (gradients included), the same for every row.  Step
time: forward + loss + backward, median of ``--steps`` after one warm-up, neurons reset before
each step.  Gradients are compared with the unplanned step's (max abs difference).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import memoplan  # noqa: E402
from memoplan.measure import measure_step, training_step  # noqa: E402
from memoplan.planner import search  # noqa: E402
from memoplan.planner.plan import make_plan  # noqa: E402
from memoplan.specs import Example  # noqa: E402
from memoplan.syntax import format_plan  # noqa: E402

HAND = """memplan 1
module blocks.* { temporal_chunk 4 dim 0
compress input = bit }
module blocks.*.1 { state = functional }
"""


class Block(nn.Sequential):
    """nn.Sequential under another name: SpikingJelly's level 1 takes targets by type."""


def _inputs(size: int, batch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return (torch.rand(8, batch, 2, size, size, generator=g) < 0.2).float()


def _model(size: int):
    import sj_cnn
    from spikingjelly.activation_based import layer

    torch.manual_seed(0)
    model = sj_cnn.SJCNN()
    if size != 64:
        model.head[1] = layer.Linear(64 * (size // 16) ** 2, 10)
        model.head[1].step_mode = "m"
    return model


def _spikingjelly(model: nn.Module, x: torch.Tensor) -> nn.Module:
    from spikingjelly.activation_based import functional
    from spikingjelly.activation_based.memopt import optimize_memory

    model = copy.deepcopy(model)
    for block in model.blocks:
        block.__class__ = Block
    optimize_memory(
        model, targets=(Block,), example_forward=lambda m: m(x), level=1, checkpoint_budget="memory", compress=True
    )
    functional.reset_net(model)
    return model


def _row(name: str, model: nn.Module, x: torch.Tensor, steps: int, reference):
    from spikingjelly.activation_based import functional

    functional.reset_net(model)
    peak = measure_step(model, (x,)).peak_bytes
    # SpikingJelly's checkpoint wrappers add a segment to the names: the same parameters otherwise.
    grads = {
        n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }
    times = []
    for _ in range(steps + 1):
        functional.reset_net(model)
        start = time.perf_counter()
        training_step(model, (x,))
        times.append(time.perf_counter() - start)
    diff = 0.0 if reference is None else max((grads[k] - reference[k]).abs().max().item() for k in reference)
    print(f"measured {name}", file=sys.stderr, flush=True)
    return name, peak, statistics.median(times[1:]), diff, grads


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--budget", type=int, default=40, help="percent of the unplanned peak, hard")
    parser.add_argument("--quick", action="store_true", help="32 x 32 inputs, batch 2, 1 step")
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.batch, args.steps = 32, 2, 1
    base, x = _model(args.size), _inputs(args.size, args.batch)
    generated = make_plan(base, Example((x,)), search.FractionOfPeak(Fraction(args.budget, 100)), progress=False)
    print(format_plan(generated.plan), file=sys.stderr)
    variants = [
        ("unplanned", lambda: copy.deepcopy(base)),
        (
            "memoplan, hand plan (temporal_chunk 4, bit inputs, functional state)",
            lambda: memoplan.apply(copy.deepcopy(base), HAND),
        ),
        (f"memoplan, `plan --budget {args.budget}%`", lambda: memoplan.apply(copy.deepcopy(base), generated.plan)),
        ("SpikingJelly 2.0 optimize_memory level 1 (checkpoint + bit per block)", lambda: _spikingjelly(base, x)),
    ]
    rows, reference = [], None
    for name, make in variants:
        row = _row(name, make(), x, args.steps, reference)
        reference = row[4] if reference is None else reference
        rows.append(row)
    peak0, time0, sj = rows[0][1], rows[0][2], rows[-1]
    print(f"SpikingJelly CNN, input (8, {args.batch}, 2, {args.size}, {args.size}), torch {torch.__version__}")
    print(
        f"| configuration | peak (B) | / unplanned | / SpikingJelly | step (ms, median of {args.steps}) | / unplanned | max abs gradient difference |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, peak, seconds, diff, _ in rows:
        print(
            f"| {name} | {peak:,} | {peak / peak0:.3f} | {peak / sj[1]:.3f} | {seconds * 1e3:.0f} | {seconds / time0:.2f} | {diff:.2e} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
