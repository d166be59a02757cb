"""Benchmark: parse + resolve a 1,000-rule plan over a 1,000-module model.

Target (issue 2): under one second.  Run: `.venv/bin/python benchmarks/resolve_scale.py`
(or `make bench`).  Prints the best of several repeats for parse, resolve and both.
"""

from __future__ import annotations

import argparse
import time

from torch import nn

import memoplan


class Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4)
        self.proj = nn.Linear(4, 4)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.proj(self.norm(x)))


def build_model(stages: int = 11, cells: int = 24) -> nn.Module:
    """``stages`` ModuleLists of ``cells`` Cells (each with 3 leaves): 11 * (1 + 24 * 4) = 1,067 modules."""
    return nn.ModuleDict({f"stage{s}": nn.ModuleList(Cell() for _ in range(cells)) for s in range(stages)})


def build_plan(model: nn.Module, rules: int = 1000) -> str:
    """Slices, globs and class filters per stage, then exact paths until ``rules`` rules."""
    paths = [p for p, _ in model.named_modules() if p.count(".") >= 1]
    stages = sorted({p.split(".")[0] for p in paths})
    lines = ["memplan 1", ""]
    for stage in stages:
        lines.append(f"module {stage}[0:12] : Cell {{ checkpoint }}")
        lines.append(f"module {stage}.** : GELU {{ buffers = commit_once }}")
    for path in paths:
        if len(lines) - 2 >= rules:
            break
        policy = "checkpoint" if path.count(".") == 1 else "buffers = commit_once"
        lines.append(f"module {path} {{ {policy} }}")
    return "\n".join(lines) + "\n"


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model = build_model()
    text = build_plan(model)
    modules = sum(1 for p, _ in model.named_modules() if p)
    rules = sum(1 for line in text.splitlines() if line.startswith("module "))
    memoplan.parse(text)  # warm the grammar cache (built once per process)
    t_parse = best(lambda: memoplan.parse(text), args.repeats)
    plan = memoplan.parse(text)
    t_resolve = best(lambda: memoplan.resolve(plan, model), args.repeats)
    t_both = best(lambda: memoplan.resolve(memoplan.parse(text), model), args.repeats)
    print(f"{rules} rules over {modules} modules")
    print(f"parse    {t_parse * 1000:8.1f} ms")
    print(f"resolve  {t_resolve * 1000:8.1f} ms")
    print(f"both     {t_both * 1000:8.1f} ms  (target < 1000 ms)")


if __name__ == "__main__":
    main()
