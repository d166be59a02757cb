"""Estimated against measured: a GPT-2 built from a transformers config, profiled and planned
from fake tensors (docs/fit.md).

    PYTHONPATH=. .venv/bin/python benchmarks/fit.py --layers 8 --width 256 --batch 2 --seq 1024
    PYTHONPATH=. .venv/bin/python benchmarks/fit.py --layers 12 --width 384 --batch 4 --seq 256 --budgets 0.5 0.3
    PYTHONPATH=. .venv/bin/python benchmarks/fit.py --layers 12 --width 384 --batch 4 --seq 256 --budgets 0.5 0.3 --default-plan
    PYTHONPATH=. .venv/bin/python benchmarks/fit.py --layers 12 --width 384 --batch 4 --seq 256 --budgets 0.3 --limited 2

Prints, and writes as JSON with ``--json PATH``: the unplanned peak estimated on fake tensors and
measured (and the wall time of each), the estimated profile's wall time, and for each budget the
wall time of planning from the estimated profile (every trial estimated, one real planned step),
the planned peak the search estimated and the one measured, and the budget.  Every figure is a
measurement of this run on this machine; ``--no-real`` skips the real unplanned step (a model
that does not fit).

``--default-plan``: for each budget, what ``memoplan plan --budget`` does by default for a model
that fits, timed end to end: a measured profile of one timed step, every trial of the search
estimated on fake tensors, one real planned step (hard budgets).  ``--limited F``: ``memoplan
profile``, ``plan`` and ``verify`` of the model run by the CLI in a subprocess whose address space
is limited (``RLIMIT_AS``, tests/_limited.py) to what it uses before the model is built (transformers
imported) plus
(parameters + unplanned peak) / F: the unplanned step needs F times the room the limit leaves.  Wall times are
counted in unplanned steps: the median of ``--unit-steps`` plain training steps of the model (no
meter), timed here without the limit.  ``--rounds R`` runs each ``--default-plan`` budget R times
and keeps the run of median total time (every total in ``totals_seconds``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _gpt2(layers: int, width: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=vocab, n_positions=seq, n_embd=width, n_layer=layers, n_head=heads, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config)


def build() -> torch.nn.Module:
    """The model of ``FIT_MODEL`` (layers,width,heads,vocab,seq), for the CLI under ``--limited``."""
    layers, width, heads, vocab, seq = (int(v) for v in os.environ["FIT_MODEL"].split(","))
    return _gpt2(layers, width, heads, vocab, seq)


def example() -> tuple[torch.Tensor]:
    """The example of ``FIT_EXAMPLE`` (batch,seq,vocab), for the CLI under ``--limited``."""
    batch, seq, vocab = (int(v) for v in os.environ["FIT_EXAMPLE"].split(","))
    torch.manual_seed(1)
    return (torch.randint(0, vocab, (batch, seq)),)


def _portable(line: str, root: Path) -> str:
    """``line`` without this machine's paths: the interpreter's prefix and the checkout become placeholders."""
    for path, name in ((Path(sys.prefix).resolve(), "<prefix>"), (root.resolve(), "<checkout>")):
        line = line.replace(f"{path}/", f"{name}/")
    return line


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
    parser.add_argument("--default-plan", action="store_true", help="time what `memoplan plan` does by default")
    parser.add_argument(
        "--limited",
        type=float,
        metavar="F",
        help="profile, plan, verify under an address-space limit F times too small",
    )
    parser.add_argument("--unit-steps", type=int, default=3, help="plain steps whose median is the unit")
    parser.add_argument("--rounds", type=int, default=1, help="--default-plan: runs per budget (the median kept)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    from memoplan.measure import measure_step, training_step
    from memoplan.planner.profiling.estimate import estimate, fake_step
    from memoplan.specs import Example

    if args.limited:
        torch.set_num_threads(1)  # the limited commands run on one thread: so does the unit step
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
        model.zero_grad(set_to_none=True)
        plain = []
        for _ in range(args.unit_steps):
            start = time.perf_counter()
            training_step(model, example.args, {})
            plain.append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
        result["plain_steps_seconds"] = plain
        result["plain_step_seconds"] = statistics.median(plain)  # the unit of the multiples below
    unit = result.get("plain_step_seconds")
    if args.limited:
        result["limited"] = _limited_run(args, fake.peak_bytes, unit)
    elif args.default_plan:
        result["plans"] = [_rounds(model, example, share, unit, args.rounds) for share in args.budgets]
    else:
        start = time.perf_counter()
        prof = estimate(model, example, repeats=1, progress=False)
        result["estimated_profile_seconds"] = time.perf_counter() - start
        result["plans"] = [_estimated_plan(model, example, prof, share) for share in args.budgets]
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(text + "\n")
    return 0


def _planned_estimate(plan) -> int | None:
    """The planned peak the search estimated, from the plan's header (None: trials were real)."""
    return next(
        (
            int(line.split(": ")[1].split(" B")[0])
            for line in plan.header_comments.leading
            if line.lstrip("# ").startswith("planned peak on fake tensors")
        ),
        None,
    )


def _estimated_plan(model, example, prof, share: float) -> dict[str, object]:
    """A hint plan for ``share`` from the estimated profile ``prof``, timed; its peak measured after."""
    from memoplan.planner.budgets import read_budget
    from memoplan.planner.plan import make_plan
    from memoplan.planner.search.refine import measure_plan

    budget = read_budget(f"{share * 100:g}%").amount
    start = time.perf_counter()
    planned = make_plan(model, example, budget, prof=prof, progress=False, hard=False)
    seconds = time.perf_counter() - start
    estimated_after = _planned_estimate(planned.plan)
    measured = measure_plan(model, example, planned.plan)
    return {
        "budget": share,
        "limit_bytes": planned.limit,
        "plan_seconds": seconds,
        "estimated_planned_peak": estimated_after,
        "measured_planned_peak": measured,
        "error": None if estimated_after is None else (estimated_after - measured) / measured,
        "checkpoints": planned.regions,
    }


def _default_plan(model, example, share: float, unit: float | None) -> dict[str, object]:
    """What `memoplan plan --budget SHARE` does by default (memoplan.cli._plan), timed end to end."""
    from memoplan.planner.budgets import read_budget
    from memoplan.planner.presets import DEFAULT
    from memoplan.planner.profiling.estimate import take_profile

    budget = read_budget(f"{share * 100:g}%").amount
    start = time.perf_counter()
    prof = take_profile(model, example, method="auto", repeats=1, progress=False, fake_peak=True)
    profiled = time.perf_counter() - start
    preset = DEFAULT.with_overrides(budget=budget, hard=True)
    planned = preset.run(model, example, prof=prof, progress=False, named=False, trials="estimated")
    total = time.perf_counter() - start
    estimated_after = _planned_estimate(planned.plan)
    return {
        "budget": share,
        "profile_method": prof.method,
        "limit_bytes": planned.limit,
        "met": planned.met,
        "profile_seconds": profiled,
        "plan_seconds": total - profiled,
        "total_seconds": total,
        "total_in_unplanned_steps": None if not unit else total / unit,
        "estimated_planned_peak": estimated_after,
        "measured_planned_peak": planned.measured_after,
        "error": None
        if estimated_after is None
        else (estimated_after - planned.measured_after) / planned.measured_after,
        "checkpoints": planned.regions,
    }


def _rounds(model, example, share: float, unit: float | None, rounds: int) -> dict[str, object]:
    """:func:`_default_plan` ``rounds`` times: the run of median total time, with every total."""
    runs = sorted((_default_plan(model, example, share, unit) for _ in range(rounds)), key=lambda r: r["total_seconds"])
    kept = dict(runs[len(runs) // 2])
    kept["totals_seconds"] = [r["total_seconds"] for r in runs]
    return kept


def _limited_run(args, unplanned: int, unit: float | None) -> dict[str, object]:
    """``memoplan profile``, ``plan`` and ``verify`` by the CLI under an address-space limit (tests/_limited.py)."""
    root = Path(__file__).resolve().parent.parent
    # The room the unplanned step needs above the process's baseline: the model's parameters and the step's peak.
    params = sum(
        p.numel() * p.element_size()
        for p in _gpt2(args.layers, args.width, args.heads, args.vocab, args.seq).parameters()
    )
    margin_mib = (params + unplanned) / args.limited / 2**20
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "MALLOC_ARENA_MAX": "1",
        "OMP_NUM_THREADS": "1",  # as tests/planner/test_oom.py: no per-thread scratch of the BLAS in the room
        "MEMOPLAN_LIMITED_IMPORTS": "transformers.models.gpt2.modeling_gpt2",  # code, not the model's room
        "FIT_MODEL": f"{args.layers},{args.width},{args.heads},{args.vocab},{args.seq}",
        "FIT_EXAMPLE": f"{args.batch},{args.seq},{args.vocab}",
    }
    spec = ["--model", f"{Path(__file__).resolve()}:build", "--example", f"{Path(__file__).resolve()}:example"]
    share = f"{args.budgets[0] * 100:g}%"
    commands = {
        "profile_measured": ["profile", "--method", "measured", *spec, "--repeats", "1", "-o", "m.json"],
        "profile": ["profile", *spec, "--repeats", "1", "-o", "p.json"],
        "plan": ["plan", *spec, "--budget", share, "-o", "fit.memplan"],
        "verify": ["verify", "fit.memplan"],
    }
    out: dict[str, object] = {
        "margin_mib": margin_mib,
        "parameter_bytes": params,
        "unplanned_peak": unplanned,
        "budget": share,
    }
    with tempfile.TemporaryDirectory() as folder:
        for name, command in commands.items():
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, str(root / "tests" / "_limited.py"), f"{margin_mib:.1f}", *command],
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
            )
            seconds = time.perf_counter() - start
            tail = [_portable(line, root) for line in (done.stdout + done.stderr).strip().splitlines()[-3:]]
            out[name] = {
                "returncode": done.returncode,
                "seconds": seconds,
                "in_unplanned_steps": None if not unit else seconds / unit,
                "tail": tail,
                # verify's own lines: the peaks, the example each line used, the verdict
                "report": [
                    line.strip()
                    for line in done.stdout.splitlines()
                    if line.startswith(("peak memory", "equivalence", "verdict", "  tensors:"))
                ],
            }
        plan_text = (Path(folder) / "fit.memplan").read_text() if (Path(folder) / "fit.memplan").exists() else ""
    header = {
        line.split(": ", 1)[0].lstrip("# "): line.split(": ", 1)[1]
        for line in plan_text.splitlines()
        if ": " in line and line.startswith("# ")
    }
    out["plan_header"] = {k: v for k, v in header.items() if "peak" in k or "limit" in k}
    return out


if __name__ == "__main__":
    sys.exit(main())
