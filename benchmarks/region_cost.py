"""What a checkpoint region costs beyond its recompute, and what charging it changes in the plan.

    .venv/bin/python benchmarks/region_cost.py [--rounds 20] [--json out.json]

On the Llama of ``benchmarks/frontier.py`` (8 layers, hidden 256, batch 4 x 256, one thread), at
the peak of transformers' checkpointing of every second layer, one profile and then, timed
side by side (CPU time per step, configurations interleaved round by round with the order
rotated, medians of ``--rounds`` rounds after a warm-up round):

* the unplanned step; transformers' ``activation_checkpointing_enable(every_n_layers=2)``; the
  hand plan ``module model.layers[0:8:2] { checkpoint }`` (the same four regions);
* the hand plan ``module model.layers[0:8:2].* { checkpoint }``: the same recompute as the line
  above cut into 16 regions (its extra time over the 4-region plan, per extra region, is the
  fixed cost of a region in place);
* ``norms``: the 16 RMSNorms each its own region (tiny recompute: the time over the unplanned
  step less the profile's forward time of the norms, per region, is that cost again);
* memoplan's default plan at that peak (``make_plan`` as ``memoplan plan --budget B`` runs it)
  from the same profile twice: with the profile's measured fixed cost of a region
  (``Profile.region_seconds``, :mod:`memoplan.planner.profiling.regioncost`) and with it set to 0 (the
  search before that cost was charged).

For each configuration: its regions, the cost model's estimate of its time (the profile's
forward time of its regions, plus the regions' fixed cost where the search charged it) and the
measured extra time over the unplanned step.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import memoplan  # noqa: E402
from benchmarks.frontier import build  # noqa: E402
from memoplan.measure import LiveStorageMeter, measured_step  # noqa: E402
from memoplan.planner.budgets import Bytes  # noqa: E402
from memoplan.planner.plan import make_plan  # noqa: E402
from memoplan.planner.profiling.profile import profile  # noqa: E402
from memoplan.report.peers import eager_step  # noqa: E402

HEAD = "memplan 1\n"
EVEN = (0, 2, 4, 6)
NORMS = ("input_layernorm", "post_attention_layernorm")
PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
#: Hand plans: (text, the regions it makes).
HAND = {
    "hand plan `model.layers[0:8:2] { checkpoint }` (4 regions)": (
        "module model.layers[0:8:2] { checkpoint }\n",
        [f"model.layers.{i}" for i in EVEN],
    ),
    "hand plan `model.layers[0:8:2].* { checkpoint }` (16 regions)": (
        "module model.layers[0:8:2].* { checkpoint }\n",
        [f"model.layers.{i}.{part}" for i in EVEN for part in PARTS],
    ),
    "norms: `model.layers.*.*_layernorm { checkpoint }` (16 regions)": (
        "module model.layers.*.input_layernorm { checkpoint }\nmodule model.layers.*.post_attention_layernorm { checkpoint }\n",
        [f"model.layers.{i}.{norm}" for i in range(8) for norm in NORMS],
    ),
}


def regions_of(plan: str) -> list[str]:
    """The module paths a plan the planner wrote checkpoints (one plain path per rule)."""
    return [line.split()[1] for line in plan.splitlines() if line.startswith("module ")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with LiveStorageMeter():  # the first dispatch mode of a process imports lazily: before measuring
        torch.zeros(8).add_(1).sum()
    model, example, _, _ = build("llama", argparse.Namespace(seq=256, seed=0))
    hf = copy.deepcopy(model)
    hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=2)
    torch.manual_seed(0)
    peak = measured_step(hf, example.args, example.kwargs)[0].peak_bytes
    prof = profile(model, example, repeats=1, progress=False)
    forward = {m.name: m.forward_seconds for m in prof.modules}
    rows = {"transformers, every 2 layers": {"plan": None, "regions": [f"model.layers.{i}" for i in (0, 2, 4, 6)]}}
    for name, (text, regions) in HAND.items():
        rows[name] = {"plan": HEAD + text, "regions": regions}
    for label, cost in (("measured", prof.region_seconds), ("0, as before", 0.0)):
        result = make_plan(model, example, Bytes(peak), prof=dataclasses.replace(prof, region_seconds=cost),
                           progress=False, trials="estimated")  # fmt: skip
        rows[f"memoplan at that peak, region cost {label}"] = {
            "plan": memoplan.format_plan(result.plan), "search_seconds": result.choice.recompute_seconds,
            "charged": cost, "peak": result.measured_after, "regions": regions_of(memoplan.format_plan(result.plan)),
        }  # fmt: skip
    steps = {
        "unplanned": eager_step(copy.deepcopy(model), example),
        "transformers, every 2 layers": eager_step(hf, example),
    }
    for name, row in rows.items():
        if row["plan"] is not None:
            steps[name] = eager_step(memoplan.apply(copy.deepcopy(model), row["plan"]), example)
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds + 1):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            torch.manual_seed(0)
            gc.collect()
            start = time.process_time()
            steps[name]()
            if r:
                times[name].append(time.process_time() - start)
    base = statistics.median(times["unplanned"])
    q = statistics.quantiles(times["unplanned"], n=4)
    print(f"Llama at HF every-2's peak {peak} B; region cost measured with the profile: "
          f"{prof.region_seconds * 1e3:.3f} ms; unplanned step {base * 1e3:.1f} ms CPU, "
          f"interquartile range {(q[2] - q[0]) * 1e3:.1f} ms; {args.rounds} rounds")  # fmt: skip
    print(
        "| configuration | regions | estimated recompute (ms) | charged with regions (ms) | measured extra (ms) | time x unplanned |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name in names[1:]:
        row = rows[name]
        charged = row.get("search_seconds")
        # The search's own recompute figure (save variants recompute less than the module's
        # forward); a hand plan's: the profile's forward time of its regions.
        recompute = (
            sum(forward[n] for n in row["regions"])
            if charged is None
            else charged - len(row["regions"]) * row["charged"]
        )
        extra = statistics.median(times[name]) - base
        row.update(recompute=recompute, extra=extra, ratio=statistics.median(times[name]) / base, times=times[name])
        print(f"| {name} | {len(row['regions'])} | {recompute * 1e3:.1f} | "
              f"{'' if charged is None else f'{charged * 1e3:.1f}'} | {extra * 1e3:.1f} | {row['ratio']:.3f} |")  # fmt: skip
    for name, row in rows.items():
        if name.startswith("memoplan"):
            print(f"\n{name}:\n" + "\n".join(line for line in row["plan"].splitlines() if line.startswith("module ")))
    if args.json:
        out = {"peak": peak, "region_seconds": prof.region_seconds, "unplanned": times["unplanned"], "rows": rows}
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
