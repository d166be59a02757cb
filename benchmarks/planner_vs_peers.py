"""memoplan's planner against its peers: checkpointing every block and torch.compile's memory budget.

    .venv/bin/python benchmarks/planner_vs_peers.py [--models gpt2 cnn] [--json results.json]
    make bench-peers                        # installs transformers into .venv first

On two models, side by side in one run:

* a GPT-2-style transformer built from a ``transformers.GPT2Config`` (random
  weights, nothing downloaded; ``--gpt2-*`` and ``--seq`` choose its size) whose
  ``forward(input_ids, labels)`` returns the language-model loss;
* the bundled CNN (``memoplan.examples.cnn``) on its example input, with the sum of
  the logits as the loss (memoplan's default loss).

For each model it measures one training step (forward, loss, backward, gradients
included) of these configurations:

* **unplanned**: the model as it is;
* **checkpoint every block**: the memoplan plan ``module transformer.h.* { checkpoint }``
  (GPT-2) or ``module features.* { checkpoint }`` (CNN); for GPT-2 also transformers'
  own ``gradient_checkpointing_enable()`` (``torch.utils.checkpoint``, non-reentrant);
* **memoplan**: ``make_plan`` with the optimal planner and a *hard* budget, at each
  ``--budgets`` fraction of the unplanned peak, once with the blocks as candidates and
  once with the blocks and every part of them that saves memory (``memoplan plan
  --nested``: the exact MILP chooses, say, only the MLPs' activation functions);
  ``--memoplan`` picks either.  Then the measured refinement levels of ``--refine``
  (default ``narrow unwrap``, those of the ``balanced`` preset) run on the plan, and
  the refined plan is measured against the budget.  A budget that cannot be met is reported with the
  smallest reachable peak (estimated by the planner, and measured for the least-peak
  plan) instead of stopping the run;
* **torch.compile** of model + loss with
  ``torch._functorch.config.activation_memory_budget`` at the same fractions (and
  at 1.0, compile's default), ``fullgraph=True``, one compiled function per budget.

Every configuration gets: its peak, the ratio to the unplanned peak, the median
step time over ``--steps`` steps after ``--warmup`` (configurations interleaved
round by round, the order rotated every round), whether a memoplan hard budget was
met (measured peak <= limit), and whether its loss and gradients match the
unplanned step (memoplan: ``memoplan.verify``, bit for bit, on CUDA with deterministic
algorithms and TensorFloat-32 off; peers: every
gradient within ``--rtol`` of its largest unplanned magnitude).  Then, per memoplan
plan, the verdict: its step time against the fastest *correct* peer whose peak is
at most its peak.

Measuring on CPU (``--device cpu``).  Peaks come from memoplan's deterministic
live-storage meter (``memoplan.measure``).  A ``TorchDispatchMode`` that is active
when a compiled function is called makes Dynamo skip the frame and run it eagerly,
so metering a compiled step the usual way measures *eager* memory and no budget
can show.  This script therefore compiles with the backend
``aot_eager_decomp_partition`` (Inductor's decompositions and the min-cut
rematerialisation partitioner that honours ``activation_memory_budget``, the
partitioned graphs run op by op) with only its no-op graph compiler wrapped, so
that the meter is switched on *inside* the forward and backward graphs while a
step is measured.  It counts every storage those graphs allocate; the autograd
seed of the loss (one scalar) is the only allocation of the step it cannot see.
Compiled step times on CPU are therefore aot_eager times, not Inductor times.

On CUDA (``--device cuda``) every configuration is measured with the caching
allocator (``max_memory_allocated`` after ``reset_peak_memory_stats``, minus what
was allocated at the start of the step), compiled with ``backend="inductor"`` and
timed with CUDA events.

``torch._inductor.config.fallback_random`` is set so that compiled random ops
(the CNN's dropout) draw the same numbers as eager ones, which is what makes the
comparison with the unplanned step meaningful; the GPT-2 defaults to dropout 0
(``--gpt2-dropout``), as in most current language-model pretraining.  Every figure
is measured by this run; nothing is hard-coded.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import gc
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import memoplan  # noqa: E402
from benchmarks.clock import progress  # noqa: E402
from memoplan.compare import compare as compare_results  # noqa: E402
from memoplan.diagnostics import PlanError  # noqa: E402
from memoplan.examples import cnn  # noqa: E402
from memoplan.measure import LiveStorageMeter, measured_step, training_step  # noqa: E402
from memoplan.planner.budgets import FractionOfPeak  # noqa: E402
from memoplan.planner.config import Level, Planner, RefineOptions  # noqa: E402
from memoplan.planner.plan import make_plan  # noqa: E402
from memoplan.planner.profiling.profile import profile  # noqa: E402
from memoplan.planner.profiling.schema import chain, nested_candidates  # noqa: E402
from memoplan.planner.search.chain import Item, minimum_peak, unplanned_base  # noqa: E402
from memoplan.specs import Example  # noqa: E402
from memoplan.verification import verify  # noqa: E402

MIB = 2**20
MODELS = ("gpt2", "cnn")
DEFAULT_BUDGETS = (0.75, 0.5, 0.3)
GOAL = "at equal (or lower) peak, memoplan step time no worse than the best peer; every hard budget met"

# ---------------------------------------------------------------- models


@functools.cache
def _gpt2_class() -> type:
    import transformers

    class GPT2WithLoss(transformers.GPT2LMHeadModel):
        """GPT2LMHeadModel whose forward returns the causal-LM loss (labels shifted inside, as in transformers)."""

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return super().forward(input_ids=input_ids, labels=labels, use_cache=False).loss

    return GPT2WithLoss


def build_gpt2(args: argparse.Namespace) -> dict[str, Any]:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=args.gpt2_vocab,
        n_positions=args.seq,
        n_embd=args.gpt2_embd,
        n_layer=args.gpt2_layers,
        n_head=args.gpt2_heads,
        resid_pdrop=args.gpt2_dropout,
        embd_pdrop=args.gpt2_dropout,
        attn_pdrop=args.gpt2_dropout,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(args.seed)
    model = _gpt2_class()(config)
    # Named explicitly: transformers derives it from the class name and, not finding one, logs
    # a warning from inside forward (a graph break under torch.compile).
    model.loss_type = "ForCausalLM"
    model.train()
    batch = args.batch or 4
    gen = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(0, args.gpt2_vocab, (batch, args.seq), generator=gen)
    example = Example((input_ids, input_ids.clone()))
    return {
        "model": model,
        "example": example,
        "blocks": "transformer.h.*",
        "description": {
            "name": "GPT-2 (transformers.GPT2LMHeadModel from a GPT2Config, random weights)",
            "transformers": _version("transformers"),
            "n_layer": args.gpt2_layers,
            "n_embd": args.gpt2_embd,
            "n_head": args.gpt2_heads,
            "vocab_size": args.gpt2_vocab,
            "seq": args.seq,
            "batch": batch,
            "dropout": args.gpt2_dropout,
            "attention": model.config._attn_implementation,
            "loss": "causal-LM cross entropy (labels = input_ids, shifted inside the model)",
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    }


def build_cnn(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    model = cnn.build()
    batch = args.batch or 32
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(batch, 3, 32, 32, generator=gen)
    return {
        "model": model,
        "example": Example((x,)),
        "blocks": "features.*",
        "description": {
            "name": "memoplan.examples.cnn (5 ConvBlocks: conv, BatchNorm, ReLU/GELU; dropout 0.1)",
            "input_shape": list(x.shape),
            "batch": batch,
            "loss": "sum of the logits (memoplan's default loss)",
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    }


BUILDERS = {"gpt2": build_gpt2, "cnn": build_cnn}


# ---------------------------------------------------------------- torch.compile peers and steps

# Compiling with the CPU meter inside the graphs, and the steps, live in memoplan.report.peers
# (`memoplan report --peers` measures the same peers); re-exported here under their old names.
from memoplan.report.peers import (  # noqa: E402
    compile_step,
    compiled_peak,
    compiled_step,
    eager_step,
)
from memoplan.report.peers import sync as _sync  # noqa: E402


def compare(
    ref_loss: torch.Tensor, ref_grads: dict[str, torch.Tensor | None], loss: torch.Tensor, model: nn.Module, rtol: float
) -> dict[str, Any]:
    """Loss and every gradient against the unplanned step: max |diff| / max |unplanned| per tensor
    (memoplan.compare on each tensor alone, so each is its own scale)."""
    grads = {name: p.grad for name, p in model.named_parameters()}
    expected = {"loss": ref_loss, **{n: ref_grads.get(n) for n in sorted(set(ref_grads) | set(grads))}}
    actual = {"loss": loss, **{n: grads.get(n) for n in expected if n != "loss"}}
    checks = [compare_results(name, {name: expected[name]}, {name: actual[name]}, rtol) for name in expected]
    worst = max((c.largest for c in checks), default=0.0)
    return {
        "matches": all(c.equal for c in checks),
        "exact": all(c.exact for c in checks),
        "max_rel_diff": worst if math.isfinite(worst) else None,
        "compared": len(checks),
        "differing": [c.name for c in checks if not c.equal],
    }


def timed_rounds(
    steps: dict[str, Callable[[], Any]], n: int, warmup: int, device: str, seed: int
) -> dict[str, list[float]]:
    """Every configuration once per round, the order rotated every round; seconds per step."""
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(warmup + n):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            torch.manual_seed(seed)
            gc.collect()
            if device == "cuda":
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                steps[name]()
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end) / 1000.0
            else:
                t0 = time.perf_counter()
                steps[name]()
                elapsed = time.perf_counter() - t0
            if round_ >= warmup:
                times[name].append(elapsed)
        label = "warm-up round" if round_ < warmup else f"timed round {round_ - warmup + 1}/{n}"
        progress(f"  {label}: " + ", ".join(f"{k} {times[k][-1] * 1000:.0f} ms" for k in names if round_ >= warmup))
    return times


# ---------------------------------------------------------------- one model


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    device = args.device
    built = BUILDERS[name](args)
    model: nn.Module = built["model"].to(device)
    example: Example = built["example"].to(device)
    seed = args.seed
    progress(f"[{name}] {built['description']['name']}, {built['description']['parameters']:,} parameters")
    configs: list[dict[str, Any]] = []
    steps: dict[str, Callable[[], Any]] = {}

    # On CUDA, one throwaway step first: a process's first step allocates what then stays
    # (cuBLAS workspaces), which would otherwise count in the unplanned peak.
    if device == "cuda":
        with torch.random.fork_rng(devices=[torch.device(device)]):
            training_step(copy.deepcopy(model), example.args, example.kwargs)

    # Unplanned: the reference step (peak, loss, gradients).
    reference = copy.deepcopy(model)
    torch.manual_seed(seed)
    memory, _, ref_loss = measured_step(reference, example.args, example.kwargs)
    ref_loss = ref_loss.detach()
    ref_grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in reference.named_parameters()}
    unplanned = memory.peak_bytes
    meter = f"{memory.method} ({memory.device})"
    progress(f"[{name}] unplanned peak {unplanned / MIB:.2f} MiB")
    configs.append({"name": "unplanned", "kind": "unplanned", "peak_bytes": unplanned, "matches": True, "check": "-"})
    steps["unplanned"] = eager_step(copy.deepcopy(model), example)

    verify_rtol = None  # bit for bit (memoplan's default), on CUDA in verify's deterministic mode

    # Peer: memoplan's checkpoint of every block.
    plan_text = f"memplan 1\nmodule {built['blocks']} {{ checkpoint }}\n"
    report = verify(model, plan_text, example, seed=seed, rtol=verify_rtol)
    every = f"checkpoint every block ({built['blocks']}, memoplan plan)"
    configs.append(
        {
            "name": every,
            "kind": "peer",
            "plan": plan_text.splitlines()[1],
            "peak_bytes": report.planned.peak_bytes,
            "matches": report.equivalent,
            "exact": report.exact,
            "check": "memoplan.verify: " + ("EQUIVALENT" if report.equivalent else "DIFFERENT"),
            "differences": {c.name: list(c.differences) for c in report.checks if c.differences},
        }
    )
    steps[every] = eager_step(memoplan.apply(copy.deepcopy(model), plan_text), example)
    progress(
        f"[{name}] {every}: {report.planned.peak_bytes / MIB:.2f} MiB, verify {'EQUIVALENT' if report.equivalent else 'DIFFERENT'}"
    )

    # Peers (GPT-2): transformers' own activation checkpointing of every block, or of every n-th.
    if name == "gpt2":
        for every_n in args.hf_every:
            hf = copy.deepcopy(model)
            label = "transformers activation checkpointing, " + (
                "every block" if every_n == 1 else f"every {_ordinal(every_n)} block"
            )
            try:
                _hf_checkpointing(hf, every_n)
            except TypeError as error:  # an older transformers without every_n_layers
                progress(f"[{name}] {label}: skipped ({error})")
                continue
            torch.manual_seed(seed)
            hf_memory, _, hf_loss = measured_step(hf, example.args, example.kwargs)
            check = compare(ref_loss, ref_grads, hf_loss.detach(), hf, args.rtol)
            configs.append(
                {
                    "name": label,
                    "kind": "peer",
                    "peak_bytes": hf_memory.peak_bytes,
                    **check,
                    "check": _check_text(check, args.rtol),
                }
            )
            steps[label] = eager_step(hf, example)
            progress(f"[{name}] {label}: {hf_memory.peak_bytes / MIB:.2f} MiB, {_check_text(check, args.rtol)}")

    # memoplan's planner at each hard budget: blocks only, and blocks or their parts (--nested).
    progress(f"[{name}] profiling for the planner")
    prof = profile(model, example, repeats=args.profile_repeats, progress=False)
    candidates: dict[str, list[str]] = {}
    minimum_estimates: dict[str, int] = {}
    for mode in args.memoplan:
        nested = mode == "nested"
        links = chain(prof, nested_candidates(prof), nested=True) if nested else chain(prof)
        items = [
            Item(link.name, link.saved_bytes, link.input_bytes + link.kept_bytes, link.forward_seconds)
            for link in links
        ]
        base = unplanned_base(prof.peak_bytes, items)
        minimum_estimate = minimum_peak(items, base_bytes=base)[0]
        candidates[mode] = [link.name for link in links]
        minimum_estimates[mode] = minimum_estimate
        for fraction in args.budgets:
            configs.append(
                _memoplan_config(
                    name, model, example, prof, fraction, nested, minimum_estimate, seed, verify_rtol, steps, args
                )
            )

    # torch.compile with activation_memory_budget.
    compile_budgets = args.compile_budgets if args.compile_budgets is not None else [1.0, *args.budgets]
    for budget in dict.fromkeys(compile_budgets):
        label = f"torch.compile, activation_memory_budget {budget:g}"
        progress(f"[{name}] {label}: compiling")
        copy_ = copy.deepcopy(model)
        fn = compile_step(copy_, device, f"{name} budget {budget:g}")
        step = compiled_step(copy_, fn, example, budget)
        entry = {"name": label, "kind": "compile", "activation_memory_budget": budget}
        try:
            t0 = time.perf_counter()
            torch.manual_seed(seed)
            step()
            _sync(device)
            entry["compile_seconds"] = time.perf_counter() - t0
            peak, loss = compiled_peak(step, copy_, device, seed)
        except Exception as error:  # noqa: BLE001 - a peer that fails is reported, not fatal
            entry.update(status="failed", error=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
            configs.append(entry)
            progress(f"[{name}]   failed: {entry['error']}")
            continue
        check = compare(ref_loss, ref_grads, loss, copy_, args.rtol)
        entry.update(peak_bytes=peak, **check, check=_check_text(check, args.rtol))
        configs.append(entry)
        steps[label] = step
        progress(f"[{name}]   {peak / MIB:.2f} MiB, compiled in {entry['compile_seconds']:.1f} s, {entry['check']}")

    # Step times, interleaved.
    progress(f"[{name}] timing {len(steps)} configurations: {args.warmup} warm-up + {args.steps} timed rounds")
    load_before = _loadavg()
    times = timed_rounds(steps, args.steps, args.warmup, device, seed)
    load_after = _loadavg()
    for entry in configs:
        ts = times.get(entry["name"])
        if entry.get("peak_bytes") is not None:
            entry["ratio"] = entry["peak_bytes"] / unplanned
        if ts:
            entry["step_time_s"] = {"median": statistics.median(ts), "min": min(ts), "max": max(ts), "all": ts}

    return {
        "model": built["description"],
        "meter": meter,
        "unplanned_peak_bytes": unplanned,
        "planner_minimum_estimated_peak_bytes": minimum_estimates,
        "candidates": candidates,
        "configurations": configs,
        "verdicts": verdicts(configs, times),
        "load_average_1min": {"before_timing": load_before, "after_timing": load_after},
        "dynamo_stats_so_far": _dynamo_stats(),
    }


def _memoplan_config(
    name: str,
    model: nn.Module,
    example: Example,
    prof: Any,
    fraction: float,
    nested: bool,
    minimum_estimate: int,
    seed: int,
    verify_rtol: float | None,
    steps: dict[str, Callable[[], Any]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Plan for one hard budget, verify the plan and register its step; the configuration's entry."""
    refine = RefineOptions(levels=tuple(Level(level) for level in args.refine)) if args.refine else None
    budget = FractionOfPeak(Fraction(str(fraction)))
    limit = budget.limit(prof.peak_bytes)
    label = f"memoplan optimal{' --nested' if nested else ''}, hard budget {fraction:g}"
    entry: dict[str, Any] = {
        "name": label,
        "kind": "memoplan",
        "mode": "nested" if nested else "blocks",
        "budget_fraction": fraction,
        "limit_bytes": limit,
        "profile_peak_bytes": prof.peak_bytes,
        "refine": list(args.refine),
    }
    progress(f"[{name}] {label}: planning for {limit / MIB:.2f} MiB")
    t0 = time.perf_counter()
    try:
        result = make_plan(
            model,
            example,
            budget,
            planner=Planner.OPTIMAL,
            hard=True,
            prof=prof,
            progress=False,
            nested=nested,
            refine=refine,
        )
    except PlanError as error:
        entry.update(
            status="unreachable",
            error=str(error),
            planning_seconds=time.perf_counter() - t0,
            minimum_estimated_peak_bytes=minimum_estimate,
        )
        # The least-peak plan the planner can write (as a hint), measured.
        try:
            hint = make_plan(
                model, example, budget, planner=Planner.OPTIMAL, hard=False, prof=prof, progress=False, nested=nested
            )
            entry["least_peak_plan"] = {
                "checkpointed": list(hint.choice.names),
                "estimated_peak_bytes": hint.choice.estimated_peak,
                "measured_peak_bytes": hint.measured_after,
                "within_limit": hint.measured_after <= limit,
            }
        except PlanError as again:  # pragma: no cover - a hint does not raise
            entry["least_peak_plan"] = {"error": str(again)}
        progress(f"[{name}]   unreachable: {str(error).splitlines()[0]}")
        return entry
    planning = time.perf_counter() - t0
    report = verify(model, result.plan, example, seed=seed, rtol=verify_rtol)
    peak = report.planned.peak_bytes
    entry.update(
        status="met" if peak <= limit else "MISSED",
        hard_budget_met=peak <= limit,
        planning_seconds=planning,
        searched=list(result.choice.names),  # the search's set, before refinement
        checkpointed=list(result.region_modules),  # the region rules of the plan as written
        estimated_peak_bytes=result.choice.estimated_peak,
        planner_measured_peak_bytes=result.measured_after,
        proven_optimal=result.choice.proven_optimal,
        peak_bytes=peak,
        matches=report.equivalent,
        exact=report.exact,
        check="memoplan.verify: " + ("EQUIVALENT" if report.equivalent else "DIFFERENT"),
        differences={c.name: list(c.differences) for c in report.checks if c.differences},
    )
    steps[label] = eager_step(memoplan.apply(copy.deepcopy(model), result.plan), example)
    regions = entry["checkpointed"]
    progress(
        f"[{name}]   {len(regions)} regions ({', '.join(regions)}), {peak / MIB:.2f} MiB, budget {entry['status']}"
    )
    return entry


def _names(names: list[str], shown: int = 8) -> str:
    """Module paths for a report line: the first ``shown``, then how many more."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _hf_checkpointing(model: nn.Module, every_n: int) -> None:
    """transformers' checkpointing (``torch.utils.checkpoint``, non-reentrant) of every ``every_n``-th block."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, every_n_layers=every_n)
    elif every_n == 1:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise TypeError("this transformers has no every_n_layers")


def _check_text(check: dict[str, Any], rtol: float) -> str:
    if check["exact"]:
        return "loss and gradients bit-equal"
    if check["matches"]:
        return f"loss and gradients within {rtol:g} (max {check['max_rel_diff']:.1e})"
    worst = "a tensor missing" if check["max_rel_diff"] is None else f"max rel. {check['max_rel_diff']:.2g}"
    return f"DIFFERENT: {len(check['differing'])} of {check['compared']} tensors ({worst})"


def verdicts(configs: list[dict[str, Any]], times: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Per memoplan budget: memoplan's step time against the fastest correct peer at or below its peak."""
    peers = [
        c
        for c in configs
        if c["kind"] in ("peer", "compile") and c.get("peak_bytes") is not None and c["name"] in times
    ]
    out = []
    for mp in (c for c in configs if c["kind"] == "memoplan"):
        v: dict[str, Any] = {
            "memoplan": mp["name"],
            "mode": mp["mode"],
            "budget_fraction": mp["budget_fraction"],
            "limit_bytes": mp["limit_bytes"],
        }
        if mp["status"] == "unreachable":
            least = mp.get("least_peak_plan", {})
            below = [p for p in peers if p["matches"] and p["peak_bytes"] <= mp["limit_bytes"]]
            v.update(
                hard_budget="unreachable",
                verdict="unreachable",
                minimum_estimated_peak_bytes=mp["minimum_estimated_peak_bytes"],
                least_peak_plan_measured_bytes=least.get("measured_peak_bytes"),
                least_peak_plan_within_limit=least.get("within_limit"),
                correct_peers_within_limit=[p["name"] for p in below],
            )
            out.append(v)
            continue
        t_mp = times[mp["name"]]
        eligible = [p for p in peers if p["peak_bytes"] <= mp["peak_bytes"]]
        correct = [p for p in eligible if p["matches"]]
        v.update(
            hard_budget="met" if mp["hard_budget_met"] else "MISSED",
            memoplan_peak_bytes=mp["peak_bytes"],
            memoplan_step_s=statistics.median(t_mp),
            excluded_wrong_gradients=[p["name"] for p in eligible if not p["matches"]],
        )
        if not correct:
            v.update(verdict="no correct peer at or below memoplan's peak", best_peer=None)
        else:
            best = min(correct, key=lambda p: statistics.median(times[p["name"]]))
            t_best = times[best["name"]]
            ratio = statistics.median(t_mp) / statistics.median(t_best)
            paired = statistics.median(a / b for a, b in zip(t_mp, t_best))
            fastest = min(t_mp) / min(t_best)
            v.update(
                best_peer=best["name"],
                best_peer_peak_bytes=best["peak_bytes"],
                best_peer_step_s=statistics.median(t_best),
                time_ratio=ratio,
                time_ratio_paired_median=paired,
                time_ratio_fastest_steps=fastest,
                verdict="no worse" if ratio <= 1.0 else "slower",
            )
        out.append(v)
    return out


# ---------------------------------------------------------------- report


def render(results: dict[str, Any]) -> str:
    def mib(n: int | None) -> str:
        return "-" if n is None else f"{n / MIB:.2f} MiB"

    def ms(entry: dict[str, Any]) -> str:
        t = entry.get("step_time_s")
        return "-" if not t else f"{t['median'] * 1000:.0f} ms"

    lines = [
        f"$ {results['command']}",
        f"torch {results['machine']['torch']}, device {results['device']}, {results['machine']['threads']} threads; "
        f"compile backend: {results['compile_backend']}",
        *[f"note: {n}" for n in results["notes"]],
        f"goal: {GOAL}",
    ]
    for name, r in results["models"].items():
        d = r["model"]
        desc = ", ".join(f"{k} {v}" for k, v in d.items() if k not in ("name",))
        lines += [
            "",
            f"## {name}: {d['name']}",
            desc,
            f"meter: {r['meter']}",
            *[f"planner candidates ({mode}): {len(names)}: {_names(names)}" for mode, names in r["candidates"].items()],
            "",
            "| configuration | peak | x unplanned | step time (median) | hard budget | same as unplanned |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        u = r["unplanned_peak_bytes"]
        for c in r["configurations"]:
            if c["kind"] == "memoplan":
                limit = f"{c['budget_fraction']:g} x = {mib(c['limit_bytes'])}"
                if c["status"] == "unreachable":
                    least = c.get("least_peak_plan", {})
                    budget = (
                        f"{limit}: **unreachable** (planner's least estimate {mib(c['minimum_estimated_peak_bytes'])}; "
                        f"its least-peak plan measures {mib(least.get('measured_peak_bytes'))}"
                        + (", within the limit" if least.get("within_limit") else "")
                        + ")"
                    )
                    lines.append(f"| {c['name']} | - | - | - | {budget} | - |")
                    continue
                budget = f"{limit}: {'met' if c['hard_budget_met'] else '**MISSED**'} ({len(c['checkpointed'])} regions: {_names(c['checkpointed'])})"
            elif c["kind"] == "compile":
                if c.get("status") == "failed":
                    lines.append(f"| {c['name']} | - | - | - | - | failed: {c['error']} |")
                    continue
                frac = c["activation_memory_budget"]
                budget = f"(fraction of saved activations; peak <= {frac:g} x unplanned: {'yes' if c['peak_bytes'] <= math.floor(u * Fraction(str(frac))) else 'no'})"
            else:
                budget = "-"
            lines.append(
                f"| {c['name']} | {mib(c['peak_bytes'])} | {c['peak_bytes'] / u:.3f} | {ms(c)} | {budget} | {c['check']} |"
            )
        lines += ["", "verdicts (" + GOAL.split(";")[0] + "):"]
        for v in r["verdicts"]:
            head = f"  {v['memoplan']} ({mib(v['limit_bytes'])}):"
            if v["verdict"] == "unreachable":
                peers = ", ".join(v["correct_peers_within_limit"]) or "none"
                lines.append(
                    f"{head} hard budget unreachable for memoplan (least estimate {mib(v['minimum_estimated_peak_bytes'])}, "
                    f"least-peak plan measured {mib(v['least_peak_plan_measured_bytes'])}"
                    + (" -- within the limit: refused on the estimate" if v["least_peak_plan_within_limit"] else "")
                    + f"); correct peers within the limit: {peers}"
                )
                continue
            text = f"{head} hard budget {v['hard_budget']}; memoplan {mib(v['memoplan_peak_bytes'])} at {v['memoplan_step_s'] * 1000:.0f} ms"
            if v["best_peer"] is None:
                text += f"; {v['verdict']}"
            else:
                text += (
                    f" vs best peer with peak <= memoplan's: {v['best_peer']} {mib(v['best_peer_peak_bytes'])} at "
                    f"{v['best_peer_step_s'] * 1000:.0f} ms -> time ratio {v['time_ratio']:.3f} "
                    f"(paired per-round median {v['time_ratio_paired_median']:.3f}, fastest steps {v['time_ratio_fastest_steps']:.3f}): "
                    f"**{v['verdict']}**"
                )
            if v["excluded_wrong_gradients"]:
                text += f" [excluded, gradients differ: {', '.join(v['excluded_wrong_gradients'])}]"
            lines.append(text)
        load = r["load_average_1min"]
        lines.append(f"  1-minute load average while timing: {load['before_timing']} -> {load['after_timing']}")
        comp = [c for c in r["configurations"] if c["kind"] == "compile" and "compile_seconds" in c]
        if comp:
            lines.append(
                "  compile times: "
                + ", ".join(f"{c['activation_memory_budget']:g}: {c['compile_seconds']:.1f} s" for c in comp)
            )
        lines.append(
            "  step times (ms, every timed step): "
            + "; ".join(
                f"{c['name']}: {' '.join(f'{t * 1000:.0f}' for t in c['step_time_s']['all'])}"
                for c in r["configurations"]
                if c.get("step_time_s")
            )
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def _dynamo_stats() -> dict[str, int]:
    """Dynamo's counters (frames compiled, unique graphs) for the whole process so far."""
    from torch._dynamo.utils import counters

    return dict(counters["stats"])


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument(
        "--budgets", nargs="+", type=float, default=list(DEFAULT_BUDGETS), help="fractions of the unplanned peak"
    )
    parser.add_argument(
        "--compile-budgets",
        nargs="*",
        type=float,
        default=None,
        help="activation_memory_budget values for torch.compile (default: 1.0 and the --budgets; none: no compile peers)",
    )
    parser.add_argument(
        "--memoplan",
        nargs="+",
        choices=["blocks", "nested"],
        default=["blocks", "nested"],
        help="memoplan's candidates: the blocks only, and/or blocks or any part of them (memoplan plan --nested)",
    )
    parser.add_argument(
        "--refine",
        nargs="*",
        choices=[level.value for level in Level],
        default=["narrow", "unwrap"],
        help="measured refinement levels after memoplan's search (default: those of the balanced preset; none: no refinement)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=None, help="batch size of every model (default: GPT-2 4, CNN 32)")
    parser.add_argument("--seq", type=int, default=256, help="GPT-2 sequence length (and n_positions)")
    parser.add_argument("--gpt2-layers", type=int, default=6)
    parser.add_argument("--gpt2-embd", type=int, default=256)
    parser.add_argument("--gpt2-heads", type=int, default=4)
    parser.add_argument("--gpt2-vocab", type=int, default=2048)
    parser.add_argument("--gpt2-dropout", type=float, default=0.0)
    parser.add_argument(
        "--hf-every",
        nargs="*",
        type=int,
        default=[1, 2],
        help="GPT-2 peers: transformers' checkpointing of every n-th block",
    )
    parser.add_argument(
        "--rtol", type=float, default=1e-3, help="peers' gradients: max |diff| <= rtol * max |unplanned|"
    )
    parser.add_argument("--profile-repeats", type=int, default=3, help="timed steps of memoplan's profile")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--json", type=Path, help="write the results here")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("planner_vs_peers: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    for b in args.budgets:
        if not 0 < b <= 1:
            raise SystemExit(f"--budgets: {b} is not in (0, 1]")
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    # Compiled random ops draw what eager ones draw, so compiled steps can be compared with eager ones;
    # every budget compiles and partitions afresh (no graph from a cache).  Restored on return.
    with (
        inductor_config.patch(fallback_random=True, fx_graph_cache=False),
        functorch_config.patch(enable_autograd_cache=False),
    ):
        return _main(args, argv)


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    python = sys.executable
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(python)
        python = relative if not relative.startswith("..") else python
    script = os.path.relpath(__file__) if not os.path.relpath(__file__).startswith("..") else __file__
    command = shlex.join([python, script, *argv])
    print(f"$ {command}", flush=True)
    progress(f"start: {command}")
    with LiveStorageMeter():  # the first dispatch mode of a process imports lazily; do it before measuring
        torch.zeros(8).add_(1).sum()
    gc.collect()
    results: dict[str, Any] = {
        "command": command,
        "device": args.device + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""),
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(),
        },
        "compile_backend": "inductor"
        if args.device == "cuda"
        else "aot_eager_decomp_partition (no-op graph compiler wrapped to switch the CPU meter on inside the graphs)",
        "notes": _notes(args),
        "goal": GOAL,
        "models": {},
    }
    for name in args.models:
        results["models"][name] = run_model(name, args)
        gc.collect()
    progress("done")
    print(render(results).split("\n", 1)[1])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"\nresults written to {args.json}")
    return 0


def _notes(args: argparse.Namespace) -> list[str]:
    notes = [
        "memoplan budgets are fractions of the unplanned step's peak; activation_memory_budget is a fraction of the "
        "activation bytes compile's default partition saves (0 = recompute the whole compiled region), so equal numbers "
        "are not equal memory: compare peaks",
        "peers count in a verdict only if their loss and gradients match the unplanned step",
    ]
    if args.device == "cpu":
        notes.insert(
            0,
            "CPU: compiled step times are aot_eager times (partitioned graphs run op by op), not Inductor times; "
            "compiled peaks are metered inside the compiled forward and backward graphs",
        )
    return notes


if __name__ == "__main__":
    raise SystemExit(main())
