"""Estimated against measured: a GPT-2 built from a transformers config, profiled and planned
from fake tensors (docs/fit.md).

    PYTHONPATH=. .venv/bin/python benchmarks/fit.py --layers 8 --width 256 --batch 2 --seq 1024
    PYTHONPATH=. .venv/bin/python benchmarks/fit.py --layers 12 --width 384 --batch 4 --seq 256 --budgets 0.5 0.3

Prints, and writes as JSON with ``--json PATH``: the unplanned peak estimated on fake tensors and
measured (and the wall time of each), the estimated profile's wall time, and for each budget the
wall time of planning from the estimated profile (every trial estimated, one real planned step),
the planned peak the search estimated and the one measured, and the budget.  Every figure is a
measurement of this run on this machine; ``--no-real`` skips the real unplanned step (a model
that does not fit).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def _gpt2(layers: int, width: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=vocab, n_positions=seq, n_embd=width, n_layer=layers, n_head=heads, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--budgets", type=float, nargs="*", default=[0.5], help="shares of the unplanned peak")
    parser.add_argument("--no-real", action="store_true", help="do not run the unplanned step for real")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    from memoplan.measure import measure_step
    from memoplan.planner.estimate import estimate, fake_step
    from memoplan.planner.plan import make_plan
    from memoplan.planner.presets import parse_budget
    from memoplan.planner.refine import measure_plan
    from memoplan.specs import Example

    model = _gpt2(args.layers, args.width, args.heads, args.vocab, args.seq)
    torch.manual_seed(1)
    example = Example((torch.randint(0, args.vocab, (args.batch, args.seq)),))
    result: dict[str, object] = {"command": "benchmarks/fit.py " + " ".join(sys.argv[1:] if argv is None else argv)}

    start = time.perf_counter()
    fake = fake_step(model, example, torch.device("cpu"))
    result["fake_step"] = {"peak_bytes": fake.peak_bytes, "seconds": time.perf_counter() - start}
    if not args.no_real:
        start = time.perf_counter()
        real = measure_step(model, example.args).peak_bytes
        seconds = time.perf_counter() - start
        result["real_step"] = {"peak_bytes": real, "seconds": seconds, "error": (fake.peak_bytes - real) / real}
    start = time.perf_counter()
    prof = estimate(model, example, repeats=1, progress=False)
    result["estimated_profile_seconds"] = time.perf_counter() - start
    plans = []
    for share in args.budgets:
        budget, _ = parse_budget(f"{share * 100:g}%")
        start = time.perf_counter()
        planned = make_plan(model, example, budget, prof=prof, progress=False, hard=False)
        seconds = time.perf_counter() - start
        estimated_after = next(
            (int(line.split(": ")[1].split(" B")[0]) for line in planned.plan.header_comments.leading
             if line.lstrip("# ").startswith("planned peak on fake tensors")),
            None,
        )
        measured = measure_plan(model, example, planned.plan)
        plans.append(
            {
                "budget": share,
                "limit_bytes": planned.limit,
                "plan_seconds": seconds,
                "estimated_planned_peak": estimated_after,
                "measured_planned_peak": measured,
                "error": None if estimated_after is None else (estimated_after - measured) / measured,
                "checkpoints": planned.regions,
            }
        )
    result["plans"] = plans
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
