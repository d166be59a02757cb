"""The default ``memoplan plan`` against its peers, point by point: is every peer point covered?

    .venv/bin/python benchmarks/frontier.py [--models gpt2 llama] [--rounds 9] [--settle-rounds 15] [--json out.json]

For each model (a ``transformers.GPT2LMHeadModel`` -- 8 layers, 256 wide, 4 heads, vocabulary
2048, dropout 0 -- and a small ``LlamaForCausalLM``, both with random weights, batch 4 x 256,
the causal-LM loss, ``use_cache=False``), one run measures, side by side:

* the **peers**: torch.compile's min-cut partitioner at each ``--compile-budgets``
  ``activation_memory_budget`` (CPU: ``aot_eager_decomp_partition``, metered inside the
  compiled graphs, as in ``benchmarks/planner_vs_peers.py``); PyTorch's selective activation
  checkpointing of every decoder layer keeping matmul outputs (transformers'
  ``gradient_checkpointing_enable`` with a ``create_selective_checkpoint_contexts`` context);
  transformers' checkpointing of every k-th layer (``--hf-every``); and the hand plans
  ``module <layers>.* { checkpoint save = [matmul] }`` and ``save = [matmul, attention]``;
* **memoplan**, planned as ``memoplan plan --budget B`` plans with no other option (the optimal
  planner, a hard budget, estimated trials checked by one real step), from one profile: once
  at each correct peer's own measured peak (``B`` = that peak in bytes), and at each
  ``--budgets`` share, the frontier.

Peaks come from memoplan's live-storage meter (CPU); step times are CPU time
(``time.process_time``) per step, configurations interleaved round by round with the order
rotated, medians of ``--rounds`` rounds after one warm-up round.  Peers count only when their
loss and gradients match the unplanned step (within ``--rtol`` of each tensor's largest
unplanned magnitude); memoplan's plans are checked by ``memoplan.verify`` (bit for bit).

The verdict per peer point: memoplan's plan at that peak **covers** the peer when its peak is
no higher and its median step time is no slower than the peer's, within the run's noise (the
larger of 1% and the unplanned step's interquartile range over its median).  A first pass of a few
rounds cannot tell a tie from a loss, so each point whose plan was not faster than its peer there
by more than the noise is
**settled**: the pair alone (the peer, then memoplan's plan, the order alternating round by round)
is re-timed over ``--settle-rounds`` paired rounds (0: none), and the time half of the verdict
comes from the per-round ratio plan/peer, which cancels the load drift both steps share: its
median, and a 95% interval of that median from the order statistics (``settle_verdict``): "no
slower" (median <= 1, interval top at most 1.01), "slower" (interval bottom above 1.01) or "tie
within noise" (covered too); the pairs cancel the drift the run's noise measures, so only a 1%
allowance is left.  Planning time is
given in unplanned steps (the profile's own steps apart).  Every figure is measured by the run.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import math
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
from memoplan.diagnostics import PlanError  # noqa: E402
from memoplan.measure import LiveStorageMeter, measured_step  # noqa: E402
from memoplan.planner.budgets import Bytes, FractionOfPeak  # noqa: E402
from memoplan.planner.plan import make_plan  # noqa: E402
from memoplan.planner.profiling.profile import profile  # noqa: E402
from memoplan.report.peers import compile_step, compiled_peak, compiled_step, eager_step  # noqa: E402
from memoplan.specs import Example  # noqa: E402
from memoplan.verification import verify  # noqa: E402

MIB = 2**20
# ---------------------------------------------------------------- models


@functools.cache
def _with_loss(base: type) -> type:
    class WithLoss(base):  # type: ignore[misc, valid-type]
        """The model whose forward returns the causal-LM loss (labels shifted inside, as in transformers)."""

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return super().forward(input_ids=input_ids, labels=labels, use_cache=False).loss

    WithLoss.__name__ = f"{base.__name__}WithLoss"
    return WithLoss


def build(name: str, args: argparse.Namespace) -> tuple[nn.Module, Example, str, dict[str, Any]]:
    """(model, example, the plan selector of its decoder layers, a description)."""
    import transformers

    transformers.logging.set_verbosity_error()
    if name == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=2048, n_positions=args.seq, n_embd=256, n_layer=8, n_head=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        base, layers = transformers.GPT2LMHeadModel, "transformer.h.*"
    else:
        config = transformers.LlamaConfig(
            vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=8, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=args.seq, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        base, layers = transformers.LlamaForCausalLM, "model.layers.*"
    torch.manual_seed(args.seed)
    model = _with_loss(base)(config)
    model.loss_type = "ForCausalLM"  # named: transformers otherwise warns from inside forward
    model.config.use_cache = False
    model.train()
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, 2048, (4, args.seq), generator=gen)
    about = {
        "name": f"transformers.{base.__name__} (random weights)",
        "config": {k: v for k, v in config.to_dict().items() if isinstance(v, (int, float, str)) and "id" not in k},
        "batch": [4, args.seq],
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    return model, Example((ids, ids.clone())), layers, about


# ---------------------------------------------------------------- peers


def grads_of(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}


def matches(ref: dict[str, Any], loss: torch.Tensor, model: nn.Module, rtol: float) -> tuple[bool, bool]:
    """(within rtol of each tensor's largest unplanned magnitude, bit for bit) for the loss and every gradient."""
    pairs = [(ref["loss"], loss.detach())] + [(ref["grads"][n], g) for n, g in grads_of(model).items()]
    exact = close = True
    for want, got in pairs:
        if (want is None) != (got is None):
            return False, False
        if want is None:
            continue
        exact = exact and torch.equal(want, got)
        scale = want.abs().max().item() or 1.0
        close = close and (want - got).abs().max().item() <= rtol * scale
    return close, exact


def peers(model: nn.Module, example: Example, layers: str, ref: dict[str, Any], args) -> list[dict[str, Any]]:
    """Every peer's entry: name, peak, correctness, and its step (``run``)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    found = []

    def eager(name: str, prepared: nn.Module) -> None:
        torch.manual_seed(args.seed)
        memory, _, loss = measured_step(prepared, example.args, example.kwargs)
        close, exact = matches(ref, loss, prepared, args.rtol)
        found.append({"name": name, "peak": memory.peak_bytes, "correct": close, "exact": exact,
                      "run": eager_step(prepared, example)})  # fmt: skip
        progress(
            f"  {name}: {memory.peak_bytes / MIB:.2f} MiB, {'bit for bit' if exact else 'close' if close else 'WRONG'}"
        )

    mm = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

    def policy(ctx, op, *a, **k):
        return CheckpointPolicy.MUST_SAVE if op in mm else CheckpointPolicy.PREFER_RECOMPUTE

    sac = copy.deepcopy(model)
    sac.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={
            "use_reentrant": False,
            "context_fn": lambda: create_selective_checkpoint_contexts(policy),
        }
    )
    eager("PyTorch selective checkpointing, save matmuls", sac)
    for k in args.hf_every:
        hf = copy.deepcopy(model)
        kwargs = {"use_reentrant": False}
        if k == 1:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        else:
            try:
                hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, every_n_layers=k)
            except (AttributeError, TypeError) as error:
                progress(f"  HF every {k}: skipped ({error})")
                continue
        eager(f"HF checkpointing, every {k} layer{'s' if k > 1 else ''}", hf)
    for save in ("matmul", "matmul, attention"):
        text = f"memplan 1\nmodule {layers} {{ checkpoint save = [{save}] }}\n"
        eager(f"hand plan `{layers} {{ checkpoint save = [{save}] }}`", memoplan.apply(copy.deepcopy(model), text))
    for budget in args.compile_budgets:
        name = f"torch.compile min-cut, activation_memory_budget {budget:g}"
        compiled = copy.deepcopy(model)
        step = compiled_step(compiled, compile_step(compiled, "cpu", name), example, budget)
        try:
            torch.manual_seed(args.seed)
            step()
            peak, loss = compiled_peak(step, compiled, "cpu", args.seed)
        except Exception as error:  # noqa: BLE001  a peer that fails is reported, not fatal
            progress(f"  {name}: failed ({type(error).__name__})")
            continue
        close, exact = matches(ref, loss, compiled, args.rtol)
        found.append({"name": name, "peak": peak, "correct": close, "exact": exact, "run": step})
        progress(f"  {name}: {peak / MIB:.2f} MiB, {'bit for bit' if exact else 'close' if close else 'WRONG'}")
    return found


# ---------------------------------------------------------------- memoplan


def planned(model: nn.Module, example: Example, prof, budget, label: str, args) -> dict[str, Any]:
    """``memoplan plan --budget B`` with no other option, verified; its entry with its step."""
    start = time.process_time()
    try:
        result = make_plan(model, example, budget, prof=prof, progress=False, trials="estimated")
    except PlanError as error:
        progress(f"  {label}: refused ({str(error).splitlines()[0]})")
        return {"name": label, "refused": str(error), "planning_cpu_s": time.process_time() - start}
    seconds = time.process_time() - start
    report = verify(model, result.plan, example, seed=args.seed)
    rules = [line for line in memoplan.format_plan(result.plan).splitlines() if line.startswith("module ")]
    progress(f"  {label}: {report.planned.peak_bytes / MIB:.2f} MiB, {len(rules)} rules, planned in {seconds:.1f} s")
    return {
        "name": label,
        "peak": report.planned.peak_bytes,
        "correct": report.equivalent,
        "exact": report.exact,
        "planning_cpu_s": seconds,
        "rules": rules,
        "run": eager_step(memoplan.apply(copy.deepcopy(model), result.plan), example),
    }


def timed(steps: dict[str, Callable[[], Any]], rounds: int, seed: int) -> dict[str, list[float]]:
    """CPU seconds per step, every configuration once a round, the order rotated; one warm-up round first."""
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds + 1):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            took = _timed(steps[name], seed)
            if r:
                times[name].append(took)
        if r:
            progress(f"  timed round {r}/{rounds}")
    return times


def settle_verdict(peer_times: list[float], plan_times: list[float], noise: float = 0.01) -> dict[str, Any]:
    """The time verdict of paired rounds (round i: the peer's step and the plan's, back to back).

    The ratio plan/peer of each round cancels the load drift both share; from the ratios, their
    median and a 95% interval of that median from the order statistics (the binomial rule, no
    resampling: deterministic).  ``"no slower"`` when the median is at most 1 and the interval's
    top at most ``1 + noise``; ``"slower"`` when the interval's bottom is above ``1 + noise``
    (slower beyond doubt and beyond the allowance); otherwise ``"tie within noise"``.
    """
    if len(peer_times) != len(plan_times) or not peer_times:
        raise ValueError("settle_verdict needs as many plan rounds as peer rounds, at least one")
    ratios = sorted(b / a for a, b in zip(peer_times, plan_times, strict=True))
    n = len(ratios)
    median = statistics.median(ratios)
    # the largest k with P(Binomial(n, 1/2) < k) <= 2.5%: [ratios[k-1], ratios[n-k]] covers the median at >= 95%
    k, below = 0, 0.0
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if below > 0.025:
            break
        k += 1
    low, high = (ratios[k - 1], ratios[n - k]) if k else (ratios[0], ratios[-1])
    q = statistics.quantiles(ratios, n=4) if n > 1 else [median, median, median]
    if median <= 1 and high <= 1 + noise:
        word = "no slower"
    elif low > 1 + noise:
        word = "slower"
    else:
        word = "tie within noise"
    return {"rounds": n, "median": median, "low": low, "high": high, "iqr": q[2] - q[0], "verdict": word}


def _timed(step: Callable[[], Any], seed: int) -> float:
    """CPU seconds of one step, from the same seed and after a collection."""
    torch.manual_seed(seed)
    gc.collect()
    start = time.process_time()
    step()
    return time.process_time() - start


def settle(peer_step: Callable[[], Any], plan_step: Callable[[], Any], rounds: int, seed: int) -> list[list[float]]:
    """CPU seconds per step of a peer and a plan over ``rounds`` paired rounds (after one warm-up
    pair), the order within a round alternating: [peer times, plan times]."""
    pair: list[list[float]] = [[], []]
    steps = (peer_step, plan_step)
    for r in range(rounds + 1):
        for i in (0, 1) if r % 2 else (1, 0):
            took = _timed(steps[i], seed)
            if r:
                pair[i].append(took)
    return pair


def settle_points(found, mine, steps, noise: float, args) -> None:
    """Re-time each peer point whose first-pass time verdict is not clearly "no slower": the
    plan slower, or faster by less than the run's noise."""
    for entry in mine:
        peer = next((p for p in found if p["name"] == entry.get("peer")), None)
        if peer is None or "time" not in entry or "time" not in peer or entry["time"] < peer["time"] * (1 - noise):
            continue
        progress(f"  settling {peer['name']}: {args.settle_rounds} paired rounds")
        peer_times, plan_times = settle(steps[peer["name"]], steps[entry["name"]], args.settle_rounds, args.seed)
        # the pairs cancel the load drift the run's noise measures: only the 1% floor is allowed
        entry["settled"] = settle_verdict(peer_times, plan_times)


def run_model(name: str, args) -> dict[str, Any]:
    model, example, layers, about = build(name, args)
    progress(f"[{name}] {about['name']}, {about['parameters']:,} parameters")
    reference = copy.deepcopy(model)
    torch.manual_seed(args.seed)
    memory, _, loss = measured_step(reference, example.args, example.kwargs)
    ref = {"loss": loss.detach(), "grads": grads_of(reference)}
    unplanned = memory.peak_bytes
    progress(f"[{name}] unplanned peak {unplanned / MIB:.2f} MiB; peers")
    found = peers(model, example, layers, ref, args)
    start = time.process_time()
    prof = profile(model, example, repeats=1, progress=False)
    profile_s = time.process_time() - start
    progress(f"[{name}] memoplan at each correct peer's peak, then at --budgets")
    mine = []
    for peer in found:
        if peer["correct"]:
            entry = planned(model, example, prof, Bytes(peer["peak"]), f"memoplan at {peer['name']}'s peak", args)
            entry["peer"] = peer["name"]
            mine.append(entry)
    for share in args.budgets:
        budget = FractionOfPeak(Fraction(str(share)))
        mine.append(planned(model, example, prof, budget, f"memoplan --budget {share:.0%}", args))
    steps = {"unplanned": eager_step(copy.deepcopy(model), example)}
    steps.update({c["name"]: c["run"] for c in (*found, *mine) if "run" in c})
    progress(f"[{name}] timing {len(steps)} configurations, {args.rounds} rounds")
    times = timed(steps, args.rounds, args.seed)
    base = statistics.median(times["unplanned"])
    q = statistics.quantiles(times["unplanned"], n=4) if len(times["unplanned"]) > 1 else [base, base, base]
    noise = max(0.01, (q[2] - q[0]) / base)
    for entry in (*found, *mine):
        if entry["name"] in times:
            entry["time"] = statistics.median(times[entry["name"]]) / base
        if "peak" in entry:
            entry["ratio"] = entry["peak"] / unplanned
        if "planning_cpu_s" in entry:
            entry["planning_steps"] = entry["planning_cpu_s"] / base
    if args.settle_rounds:
        settle_points(found, mine, steps, noise, args)
    for entry in (*found, *mine):
        entry.pop("run", None)
    verdicts = []
    for entry in mine:
        peer = next((p for p in found if p["name"] == entry.get("peer")), None)
        if peer is None:
            continue
        covered = (
            "peak" in entry
            and entry["peak"] <= peer["peak"]
            and entry.get("time", float("inf")) <= peer["time"] * (1 + noise)
        )
        strict = covered and entry["time"] <= peer["time"]
        verdict = {"peer": peer["name"], "covered": covered, "strictly": strict}
        if "settled" in entry:  # the paired re-timing decides the time half of the verdict
            settled = entry["settled"]
            verdict["settled"] = settled
            verdict["covered"] = "peak" in entry and entry["peak"] <= peer["peak"] and settled["verdict"] != "slower"
            verdict["strictly"] = verdict["covered"] and settled["verdict"] == "no slower"
        verdicts.append(verdict)
    return {"model": about, "unplanned_peak": unplanned, "unplanned_step_cpu_s": base, "noise": noise,
            "profile_cpu_s": profile_s, "peers": found, "memoplan": mine, "verdicts": verdicts}  # fmt: skip


def render(name: str, r: dict[str, Any]) -> str:
    lines = [f"\n## {name}: {r['model']['name']}, unplanned peak {r['unplanned_peak']} B, "
             f"unplanned step {r['unplanned_step_cpu_s'] * 1000:.0f} ms CPU, noise {r['noise']:.1%}",  # fmt: skip
             "", "| configuration | peak × unplanned | time × unplanned | gradients | planning (unplanned steps) |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for c in (*r["peers"], *r["memoplan"]):
        if "peak" not in c:
            lines.append(f"| {c['name']} | refused | | | {c.get('planning_steps', 0):.1f} |")
            continue
        grads = "bit for bit" if c["exact"] else "close" if c["correct"] else "DIFFERENT"
        plan = f"{c['planning_steps']:.1f}" if "planning_steps" in c else ""
        lines.append(f"| {c['name']} | {c['ratio']:.3f} | {c.get('time', float('nan')):.3f} | {grads} | {plan} |")
    lines.append("")
    for v in r["verdicts"]:
        strictly = " (and strictly: no slower at all)" if v.get("strictly") else ""
        settled = ""
        if "settled" in v:
            st = v["settled"]
            settled = (f"; settled over {st['rounds']} paired rounds: memoplan/peer median {st['median']:.3f}, "
                       f"95% interval [{st['low']:.3f}, {st['high']:.3f}], IQR {st['iqr']:.3f}: {st['verdict']}")  # fmt: skip
        lines.append(f"- {v['peer']}: {'covered' + strictly if v['covered'] else 'NOT covered'}{settled}")
    lines.append(f"- profile: {r['profile_cpu_s'] / r['unplanned_step_cpu_s']:.1f} unplanned steps (one timed step)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=["gpt2", "llama"], default=["gpt2", "llama"])
    parser.add_argument("--budgets", nargs="*", type=float, default=[0.7, 0.6, 0.5, 0.45, 0.4, 0.35])
    parser.add_argument("--compile-budgets", nargs="*", type=float, default=[0.7, 0.5, 0.3])
    parser.add_argument("--hf-every", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--settle-rounds", type=int, default=15)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rtol", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("$ " + shlex.join([sys.executable, *sys.argv]), flush=True)
    with LiveStorageMeter():  # the first dispatch mode of a process imports lazily: before measuring
        torch.zeros(8).add_(1).sum()
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    results = {}
    with (
        inductor_config.patch(fallback_random=True, fx_graph_cache=False),
        functorch_config.patch(enable_autograd_cache=False),
    ):
        for name in args.models:
            results[name] = run_model(name, args)
            print(render(name, results[name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
