"""What the sublinear search's genetic refinement gains over its best threshold.

For 200-module chains (`benchmarks/planner_speed.py`'s generators) and for the profiles of
the bundled models, runs the sublinear search at the middle of each chain's feasible budget
range (half way from the least reachable peak to the unplanned one) with `genetic_nr_iter`
0 and 20 (`genetic_pool_size` 20, `thresh_nr_try` 10, one worker, seed 0) and prints the
estimated peak and recompute time of both, and what the generations changed.

    .venv/bin/python benchmarks/genetic_gain.py [--size 200] [--generations 20]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner_speed import CHAINS  # noqa: E402

from memoplan.planner.budgets import Bytes  # noqa: E402
from memoplan.planner.search.chain import Item, minimum_peak, unplanned_base  # noqa: E402
from memoplan.planner.search.sublinear import sublinear  # noqa: E402
from memoplan.syntax.blocks import SublinearConfig  # noqa: E402

BUNDLED = {
    "cnn": ("memoplan.examples.cnn:build", "randn(8, 3, 32, 32)"),
    "transformer": ("memoplan.examples.transformer:build", "randint(4, 32, high=100)"),
    "spiking": ("memoplan.examples.spiking:build", "memoplan.examples.spiking:example"),
}


def bundled(name: str) -> tuple[list[Item], int]:
    """The chain and base of a bundled model's measured profile (the planner's own items)."""
    import torch

    from memoplan import specs
    from memoplan.planner.profiling.profile import chain, profile
    from memoplan.syntax import parse_example_spec

    model_spec, example_spec = BUNDLED[name]
    torch.manual_seed(0)
    model = specs.load_model(model_spec)
    example = specs.make_example(parse_example_spec(example_spec))
    prof = profile(model, example, progress=False)
    items = [
        Item(link.name, link.saved_bytes, link.input_bytes + link.kept_bytes, link.forward_seconds)
        for link in chain(prof)
    ]
    return items, unplanned_base(prof.peak_bytes, items)


def row(name: str, items: list[Item], base: int, generations: int) -> str:
    unplanned = base + sum(i.saved_bytes for i in items)
    least, _ = minimum_peak(items, base_bytes=base)
    budget = Bytes(least + (unplanned - least) // 2)
    plain = sublinear(items, budget, SublinearConfig(num_worker=1), base_bytes=base, seed=0)
    config = SublinearConfig(genetic_nr_iter=generations, num_worker=1)
    bred = sublinear(items, budget, config, base_bytes=base, seed=0)
    a, b = plain.choice, bred.choice
    return (
        f"| {name} | {len(items)} | {budget.amount} B | {a.estimated_peak} B, {a.recompute_seconds * 1e3:.3f} ms | "
        f"{b.estimated_peak} B, {b.recompute_seconds * 1e3:.3f} ms | "
        f"{a.estimated_peak - b.estimated_peak} B, {(a.recompute_seconds - b.recompute_seconds) * 1e3:.3f} ms | "
        f"{bred.report.evaluations} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=200, help="modules in each synthetic chain")
    parser.add_argument("--generations", type=int, default=20)
    args = parser.parse_args()
    print(
        f"sublinear, budget half way between the least reachable and the unplanned peak; {args.generations} generations"
    )
    print(
        "| chain | modules | budget | thresholds only: peak, recompute | with generations | saved (peak, recompute) | evaluations |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, make in CHAINS.items():
        items, base = make(args.size)
        print(row(name, items, base, args.generations), flush=True)
    for name in BUNDLED:
        items, base = bundled(name)
        print(row(f"bundled {name}", items, base, args.generations), flush=True)


if __name__ == "__main__":
    main()
