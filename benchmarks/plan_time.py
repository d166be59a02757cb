"""Where `memoplan plan --budget B` spends its time, in unplanned steps.

    .venv/bin/python benchmarks/plan_time.py [--model gpt2|llama] [--budgets 0.7 0.5 0.45 0.4 0.35] [--json out.json]

The model is ``benchmarks/frontier.py``'s (a ``GPT2LMHeadModel``, 8 layers, 256 wide, 4 heads,
vocabulary 2048, dropout 0, batch 4 x 256, the causal-LM loss; or its Llama).  One thread.  The
unit is one plain unplanned training step (forward, loss, backward), CPU time
(``time.process_time``), the median of ``--steps`` steps after one warm-up.  Then, as the
frontier benchmark does: the profile (``profile(repeats=1)``), and at each ``--budgets`` share
``make_plan`` as ``memoplan plan --budget B`` runs with no other option (optimal planner, hard
budget, estimated trials checked by one real step), each timed in CPU seconds and in units.
With ``--profile PATH`` every run plans from
the same profile (saved by the first run; each run still takes and times its own), so the plans of
two versions of memoplan can be compared.  For each plan: the limit, the measured peak of the plan written (the real step that checks it),
its estimated recompute, how many estimated trials and real steps it took, and the set's peak as
predicted from the profile's bytes between module boundaries (the header's note; "-" where the
set was not predicted) beside the cost model's estimate, and what the planning time is made of
(the trials, the real step, the save variants' watched forward, the searches).  Every figure is measured by the run;
nothing is compared with a stored figure.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.frontier import build  # noqa: E402
from memoplan.planner import chainruns, levels, onelevel, trial  # noqa: E402
from memoplan.planner.budgets import FractionOfPeak  # noqa: E402
from memoplan.planner.plan import make_plan  # noqa: E402
from memoplan.planner.profiling.profile import profile  # noqa: E402
from memoplan.planner.profiling.schema import Profile  # noqa: E402
from memoplan.planner.search import held  # noqa: E402
from memoplan.report.peers import eager_step  # noqa: E402


class _Counted:
    """Counts the planner's estimated trials and its real checking steps while a plan is made, and
    the CPU seconds of each part: the trials, the real step, the watched forward that prices the
    save variants (``levels.op_uses_of``) and the searches (the cost model's and the prediction's)."""

    def __init__(self) -> None:
        self.trials = self.real = 0
        self.seconds = dict.fromkeys(("estimated trials", "real step", "save variants' forward", "searches"), 0.0)

    def _timed(self, part: str, fn):
        def run(*args, **kwargs):
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.process_time() - start

        return run

    def __enter__(self) -> _Counted:
        # ``measure``, ``op_uses_of`` and the searches are looked up on their modules at each call;
        # ``checked`` is imported by name into the modules that take the real step, so it is
        # replaced in each of them.
        self._measure = trial.measure
        self._checked = {mod: mod.checked for mod in (trial, onelevel, chainruns)}
        self._uses = levels.op_uses_of
        self._searches = (trial.Search.__call__, held.Predictor.search)
        real = trial.checked

        def measure(*args):
            self.trials += 1
            return self._measure(*args)

        def checked(*args):
            self.real += 1
            return real(*args)

        trial.measure = self._timed("estimated trials", measure)
        for mod in self._checked:
            mod.checked = self._timed("real step", checked)
        levels.op_uses_of = self._timed("save variants' forward", self._uses)
        trial.Search.__call__ = self._timed("searches", self._searches[0])  # type: ignore[method-assign]
        held.Predictor.search = self._timed("searches", self._searches[1])  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc) -> None:
        trial.measure = self._measure
        for mod, fn in self._checked.items():
            mod.checked = fn
        levels.op_uses_of = self._uses
        trial.Search.__call__, held.Predictor.search = self._searches  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.7, 0.5, 0.45, 0.4, 0.35])
    parser.add_argument("--steps", type=int, default=5, help="plain steps for the unit (median)")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--profile",
        type=Path,
        help="a profile to plan from (written by the first run that names it): the same plans' inputs",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, example, _, about = build(args.model, args)
    step = eager_step(copy.deepcopy(model), example)
    step()
    times = []
    for _ in range(args.steps):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    unit = statistics.median(times)
    start = time.process_time()
    prof = profile(model, example, repeats=1, progress=False)
    profile_s = time.process_time() - start
    if args.profile is not None and args.profile.exists():
        prof = Profile.load(args.profile)  # the profile step above is still timed: its cost is the figure
    elif args.profile is not None:
        prof.save(args.profile)
    print(
        f"{about['name']}: unplanned step {unit * 1e3:.0f} ms CPU (median of {args.steps}); profile {profile_s / unit:.2f} steps"
    )
    rows = []
    for share in args.budgets:
        budget = FractionOfPeak(Fraction(str(share)))
        with _Counted() as counted:
            start = time.process_time()
            result = make_plan(model, example, budget, prof=prof, progress=False, trials="estimated")
            seconds = time.process_time() - start
        predicted = re.search(r"predict a peak of (\d+) B", result.choice.reason)
        row = {
            "budget": share,
            "limit": result.limit,
            "measured_after": result.measured_after,
            # the set's peak as predicted from the step's bytes between module boundaries (None:
            # not predicted) and as the cost model estimates it
            "predicted_peak": int(predicted.group(1)) if predicted else None,
            "cost_model_peak": result.choice.estimated_peak,
            "met": result.met,
            "recompute_s": result.choice.recompute_seconds,
            "estimated_trials": counted.trials,
            "real_steps": counted.real,
            "planning_cpu_s": seconds,
            "planning_steps": seconds / unit,
            # the parts, in unplanned steps (the rest: candidates, plans written and resolved, headers)
            "parts_steps": {part: spent / unit for part, spent in counted.seconds.items()},
        }
        rows.append(row)
        print(
            f"  --budget {share:.0%}: {seconds / unit:.2f} steps ({seconds:.2f} s), {counted.trials} estimated trials, "
            f"{counted.real} real; peak {result.measured_after} B of limit {result.limit} B, "
            f"recompute {result.choice.recompute_seconds * 1e3:.1f} ms; "
            f"predicted {row['predicted_peak'] or '-'} B, cost model {row['cost_model_peak']} B\n    parts (steps): "
            + ", ".join(f"{part} {spent:.2f}" for part, spent in row["parts_steps"].items()),
            flush=True,
        )
    if args.json:
        report = {"model": about, "unit_cpu_s": unit, "unit_steps": times, "profile_cpu_s": profile_s,
                  "profile_steps": profile_s / unit, "plans": rows}  # fmt: skip
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
