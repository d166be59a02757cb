"""Zeroing all gradients: per parameter (PyTorch) against one fill of memoplan's flat buffer.

`memory { atomic_clean_policy = 0 }` keeps every trainable gradient as a view of one
buffer per device and dtype, so `model.zero_grad(set_to_none=False)` is one fill.  This
times it against `nn.Module.zero_grad` (one `zero_` per parameter) and
`Optimizer.zero_grad` (PyTorch's `foreach` zeroing, grouped by device and dtype), on a
model of many small parameters, and checks that every gradient is zero afterwards.

    .venv/bin/python benchmarks/zero_grad.py [--params 2000] [--size 64] [--repeats 200]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
from torch import nn

import memoplan

PLAN = "memplan 1\nmemory { atomic_clean_policy = 0 }\n"


class ManySmall(nn.Module):
    def __init__(self, count: int, size: int) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(size)) for _ in range(count))

    def forward(self, x):
        return sum((w * x).sum() for w in self.weights)


def _time(fn, repeats: int) -> float:
    """Median seconds of one call, over ``repeats`` calls."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64, help="elements per parameter")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.size)
    rows = []
    for name, planned, zero in (
        ("nn.Module.zero_grad (per parameter)", False, lambda m, o: m.zero_grad(set_to_none=False)),
        ("Optimizer.zero_grad (foreach)", False, lambda m, o: o.zero_grad(set_to_none=False)),
        ("memoplan flat buffer (one fill)", True, lambda m, o: m.zero_grad(set_to_none=False)),
    ):
        model = ManySmall(args.params, args.size)
        if planned:
            memoplan.apply(model, PLAN)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
        model(x).backward()
        seconds = _time(functools.partial(zero, model, opt), args.repeats)
        assert all(not p.grad.any() for p in model.parameters())
        rows.append((name, seconds))
    base = rows[0][1]
    print(f"{args.params} parameters of {args.size} float32 elements, median of {args.repeats} calls, 1 thread")
    print("| zeroing | time | x per-parameter |")
    print("| --- | --- | --- |")
    for name, seconds in rows:
        print(f"| {name} | {seconds * 1e6:.1f} us | {seconds / base:.3f} |")


if __name__ == "__main__":
    main()
