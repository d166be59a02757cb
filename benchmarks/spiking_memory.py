"""Peak memory and step time of the spiking CNN: unplanned, memoplan, SpikingJelly 2.0 memopt.

    .venv/bin/python benchmarks/spiking_memory.py [--json results.json]

On one model (``memoplan.examples.spiking``: four conv blocks of LIF neurons, T = 8)
and one input, in one run:

* peak memory of one training step, measured with memoplan's deterministic CPU
  live-storage meter (``memoplan.measure``), for the unplanned model, for each
  plan (``plans/spiking.memplan`` is the chosen one) and for SpikingJelly 2.0's
  ``optimize_memory(model, targets=(SpikingBlock,), level=1, compress=True)``
  (per-block checkpointing with bit-packed binary inputs);
* equivalence: ``memoplan.verify`` compares outputs, gradients, buffers, RNG state
  and ``state_dict`` keys with the unplanned step, bit for bit — or, for plans with
  temporal chunks, within ``memoplan.verification.CHUNK_RTOL`` (sums taken chunk by chunk),
  and the table says which; SpikingJelly's outputs and gradients are compared bit
  for bit;
* step time (forward + loss + backward, median of ``--steps`` steps after
  ``--warmup``, the three configurations interleaved round by round);
* the ``bit`` codec's payload size against float32;
* what the live tensors at each peak are (``--breakdown``, on by default; CPU only).

``--device cuda`` runs the same comparison on a GPU: peaks are then
``torch.cuda.max_memory_allocated`` over each step (the caching allocator's live
bytes, not the CPU meter's), step times are taken after ``torch.cuda.synchronize``,
and the ``bit`` payloads come from the Triton kernels.

SpikingJelly restores neuron state through its own ``MemoryModule`` protocol only;
memoplan's ``LIF`` speaks memoplan's protocol.  So SpikingJelly runs on a *twin*
of the model whose neurons are ``MemoryModule``s executing the very same
``memoplan.neurons.LIF.forward`` code (same parameters, bit-identical unplanned
step, checked below).  On the unmodified model SpikingJelly's recompute would
start from the state the forward left behind (fangwei123456/spikingjelly#629);
the run reports that too.

Every figure is measured by this run; nothing is hard-coded.  Targets (issue:
"compression, temporal chunking, spatial split and stateful modules"):
memoplan peak <= 1/8 of unplanned with identical gradients; <= 0.6x
SpikingJelly's peak; step time <= 1.1x SpikingJelly's; bit payload / float32
<= 1/31.9 for tensors of at least 4 KiB.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import memoplan  # noqa: E402
from memoplan import measure  # noqa: E402
from memoplan.compare import compare as compare_results  # noqa: E402
from memoplan.examples import spiking  # noqa: E402
from memoplan.measure import LiveStorageMeter, measured_step  # noqa: E402
from memoplan.neurons import LIF  # noqa: E402
from memoplan.runtime import codecs  # noqa: E402
from memoplan.specs import Example  # noqa: E402
from memoplan.verification import verify  # noqa: E402

MIB = 2**20
DEFAULT_PLAN = "plans/spiking.memplan"
OTHER_PLANS = ("plans/spiking_lif_chunks.memplan", "plans/spiking_blocks.memplan", "plans/spiking_split.memplan")
TARGETS = {
    "memoplan / unplanned": 1 / 8,
    "memoplan / SpikingJelly (peak)": 0.6,
    "memoplan / SpikingJelly (step time)": 1.1,
    "bit payload / float32": 1 / 31.9,
}
WRAPPED = "_checkpoint_wrapped_module."


# ---------------------------------------------------------------- SpikingJelly


def spikingjelly_twin(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose LIF neurons are SpikingJelly ``MemoryModule``s running LIF's own code."""
    from spikingjelly.activation_based import base

    class SJLIF(base.MemoryModule):
        """memoplan.neurons.LIF's dynamics, its state ``v`` registered as a SpikingJelly memory."""

        def __init__(self, lif: LIF) -> None:
            super().__init__()
            self.tau, self.threshold, self.v_reset, self.alpha = lif.tau, lif.threshold, lif.v_reset, lif.alpha
            self.register_memory("v", lif.v_reset)
            self.step_mode = "m"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return LIF.forward(self, x)  # the same code, so the same floating-point operations

    twin = copy.deepcopy(model)
    for name, module in list(twin.named_modules()):
        if isinstance(module, LIF):
            twin.set_submodule(name, SJLIF(module))
    return twin


def spikingjelly_level1(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, list[str]]:
    """``optimize_memory(level=1)`` on ``model`` in place; returns it and the compressor of each region."""
    from spikingjelly.activation_based.memopt import optimize_memory
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    optimize_memory(
        model,
        targets=(spiking.SpikingBlock,),  # one checkpoint per conv block (the layer-wise level 1)
        example_forward=lambda m: m(x),  # probes which block inputs are binary -> BitSpikeCompressor
        level=1,
        checkpoint_budget="memory",  # every candidate block
        compress=True,
    )
    used = []
    for module in model.modules():
        if isinstance(module, CheckpointWrapper):
            compressor = module.checkpoint_fn.keywords.get("compressor")
            used.append(type(compressor).__name__ if compressor is not None else "none")
    return model, used


def reset_all(model: nn.Module) -> None:
    """Reset memoplan neurons and SpikingJelly memory modules alike."""
    for module in model.modules():
        if isinstance(module, LIF) or (hasattr(module, "_memories") and callable(getattr(module, "reset", None))):
            module.reset()


def grads_of(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {name.replace(WRAPPED, ""): p.grad for name, p in model.named_parameters()}


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x is None or y is None:
            if (x is None) != (y is None):
                out.append(key)
        elif not torch.equal(x, y):
            out.append(key)
    return out


def _same_outputs(a: Any, b: Any) -> bool:
    """Bit for bit, through memoplan.compare (the comparison `memoplan verify` uses)."""
    return compare_results("outputs", {"outputs": a}, {"outputs": b}).exact


def one_step(model: nn.Module, x: torch.Tensor, seed: int) -> tuple[measure.StepMemory, torch.Tensor]:
    reset_all(model)
    torch.manual_seed(seed)
    memory, output, _ = measured_step(model, (x,))
    return memory, output


# ---------------------------------------------------------------- breakdown of a peak


class PeakBreakdown(LiveStorageMeter):
    """The live-storage meter, also remembering which op made each live storage, at the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "forward"
        self.made_by: dict[int, tuple[str, ...]] = {}
        self.at_peak: list[tuple[int, tuple[str, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = set(self._live)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        for key in set(self._live) - before:
            shape = next(
                (
                    tuple(t.shape)
                    for t in torch.utils._pytree.tree_leaves(out)
                    if isinstance(t, torch.Tensor) and id(t.untyped_storage()) == key
                ),
                (),
            )
            self.made_by[key] = (self.phase, func.__name__.split(".")[0], "x".join(map(str, shape)), _site())
        if self.current_bytes == self.peak_bytes:
            self.at_peak = [(nbytes, self.made_by.get(key, ("?",) * 4)) for key, (nbytes, _) in self._live.items()]
        return out


def _site() -> str:
    """The innermost frame outside torch: where in memoplan, the model or SpikingJelly a tensor was made."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/torch/" not in name and not name.endswith("spiking_memory.py"):
            parts = Path(name).parts
            return f"{'/'.join(parts[-2:])}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def breakdown(model: nn.Module, x: torch.Tensor, seed: int, top: int) -> tuple[int, list[tuple[int, int, tuple]]]:
    reset_all(model)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with measure.gc_paused(), PeakBreakdown() as meter:
        loss = measure.default_loss(model(x))
        meter.phase = "backward"
        loss.backward()
    groups: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for nbytes, label in meter.at_peak:
        groups[label] += nbytes
        counts[label] += 1
    rows = [(nbytes, counts[label], label) for label, nbytes in groups.most_common(top)]
    return meter.peak_bytes, rows


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(model: nn.Module, x: torch.Tensor, seed: int) -> int:
    """The aten operations one training step dispatches (what a launch-bound GPU step pays for)."""
    reset_all(model)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with _OpCounter() as counter:
        measure.default_loss(model(x)).backward()
    return counter.count


# ---------------------------------------------------------------- timing


def timed_steps(configs: dict[str, nn.Module], x: torch.Tensor, steps: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per training step (forward, loss, backward), configurations interleaved round by round."""
    times: dict[str, list[float]] = {name: [] for name in configs}
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    for round_ in range(warmup + steps):
        for name, model in configs.items():
            reset_all(model)
            model.zero_grad(set_to_none=True)
            sync()
            start = time.perf_counter()
            measure.default_loss(model(x)).backward()
            sync()
            elapsed = time.perf_counter() - start
            if round_ >= warmup:
                times[name].append(elapsed)
    return times


# ---------------------------------------------------------------- bit codec


def bit_ratios(model: nn.Module, x: torch.Tensor) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """bit payload / float32 bytes for every block input of this run, and the worst case from 4 KiB up."""
    inputs: list[tuple[str, torch.Tensor]] = []
    hooks = [
        block.register_forward_pre_hook(lambda m, a, name=f"blocks.{i}": inputs.append((name, a[0].detach())))
        for i, block in enumerate(model.blocks)
    ]
    reset_all(model)
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
        reset_all(model)
    seen = []
    for name, tensor in inputs:
        payload = codecs.encode(tensor, "bit", validate="always", where=name)
        fp32 = tensor.numel() * 4
        assert torch.equal(codecs.decode(payload), tensor)
        seen.append({"input of": name, "numel": tensor.numel(), "float32_bytes": fp32, "bit_bytes": payload.nbytes})
    # Every size from 4 KiB of float32 (1,024 elements) to 4 x that: padding to whole bytes costs most here.
    worst = None
    for numel in range(1024, 4097):
        nbytes = codecs.encode(torch.zeros(numel), "bit").nbytes
        ratio = nbytes / (numel * 4)
        if worst is None or ratio > worst["ratio"]:
            worst = {"numel": numel, "float32_bytes": numel * 4, "bit_bytes": nbytes, "ratio": ratio}
    # The smallest size from which every size meets the target.
    limit = TARGETS["bit payload / float32"]
    numel = 4096
    while numel > 1024 and codecs.estimate_nbytes("bit", numel - 1, torch.float32) / ((numel - 1) * 4) <= limit:
        numel -= 1
    worst["all_sizes_meet_target_from_numel"] = numel
    return seen, worst


# ---------------------------------------------------------------- main


def warm_up_meter() -> None:
    """Enter the meter once before measuring anything.

    The first ``TorchDispatchMode`` of a process imports modules lazily; the
    exceptions those imports raise and catch leave reference cycles holding the
    caller's frames, and with the garbage collector paused (as ``measured_step``
    does) the tensors in those frames stay alive: the first step measured in a
    process reads up to 8 MiB too high on this model.  One op under the meter
    first makes every measurement agree.
    """
    with LiveStorageMeter():
        torch.zeros(8).add_(1).sum()


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    warm_up_meter()
    torch.manual_seed(args.seed)
    model = spiking.build().to(device)
    (x,) = spiking.example(batch=args.batch)
    x = x.to(device)
    example = Example((x,))
    n_params = sum(p.numel() for p in model.parameters())
    results: dict[str, Any] = {
        "command": command_line(args),
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        },
        "model": {
            "name": "memoplan.examples.spiking",
            "blocks": len(model.blocks),
            "channels": list(spiking.CHANNELS),
            "T": x.shape[0],
            "input_shape": list(x.shape),
            "input_density": float(x.mean()),
            "parameters": n_params,
        },
    }

    # memoplan: verify each plan (one unplanned and one planned step from deep copies, same seed).
    plans = [args.plan, *[p for p in args.also if p != args.plan]]
    results["plans"] = {}
    for plan in plans:
        report = verify(model, ROOT / plan, example, seed=args.seed)
        results["plans"][plan] = {
            "peak_bytes": report.planned.peak_bytes,
            "equivalent": report.equivalent,
            "exact": report.exact,
            "rtol": report.rtol,
            "checks": {
                c.name: {"compared": c.compared, "differences": list(c.differences), "within": list(c.within)}
                for c in report.checks
            },
        }
        results["unplanned_peak_bytes"] = report.unplanned.peak_bytes
        results["meter"] = f"{report.unplanned.method} ({report.unplanned.device})"
    chosen = results["plans"][args.plan]

    # The unplanned reference step, for comparing SpikingJelly against.
    reference = copy.deepcopy(model)
    unplanned_mem, ref_out = one_step(reference, x, args.seed)
    ref_grads = grads_of(reference)
    if device.type == "cpu":
        assert unplanned_mem.peak_bytes == results["unplanned_peak_bytes"], "the meter is deterministic"

    # SpikingJelly 2.0, level 1 with bit compression, on the MemoryModule twin.
    twin = spikingjelly_twin(model)
    twin_plain = copy.deepcopy(twin)
    twin_mem, twin_out = one_step(twin_plain, x, args.seed)
    twin_same = _same_outputs(twin_out, ref_out) and not differences(grads_of(twin_plain), ref_grads)
    sj_model, compressors = spikingjelly_level1(copy.deepcopy(twin), x)
    sj_mem, sj_out = one_step(sj_model, x, args.seed)
    sj_diff = differences(grads_of(sj_model), ref_grads)
    results["spikingjelly"] = {
        "version": _version("spikingjelly"),
        "call": "optimize_memory(model, targets=(SpikingBlock,), example_forward=lambda m: m(x), level=1, "
        "checkpoint_budget='memory', compress=True)",
        "regions": len(compressors),
        "compressors": compressors,
        "peak_bytes": sj_mem.peak_bytes,
        "twin_unplanned_peak_bytes": twin_mem.peak_bytes,
        "twin_equals_model": twin_same,
        "outputs_equal": _same_outputs(sj_out, ref_out),
        "gradient_differences": sj_diff,
        "gradients_compared": len(ref_grads),
    }
    # The same call on the unmodified model: its LIF state is invisible to SpikingJelly.
    plain_sj, _ = spikingjelly_level1(copy.deepcopy(model), x)
    _, plain_out = one_step(plain_sj, x, args.seed)
    results["spikingjelly"]["on_unmodified_model"] = {
        "outputs_equal": _same_outputs(plain_out, ref_out),
        "gradient_differences": len(differences(grads_of(plain_sj), ref_grads)),
    }

    # Step times.
    planned = memoplan.apply(copy.deepcopy(model), ROOT / args.plan)
    times = timed_steps(
        {"unplanned": copy.deepcopy(model), "memoplan": planned, "spikingjelly": sj_model}, x, args.steps, args.warmup
    )
    results["step_time_s"] = {
        name: {"median": statistics.median(ts), "min": min(ts), "max": max(ts), "all": ts} for name, ts in times.items()
    }
    # Steps of one round ran back to back, so their ratio cancels slow drifts in machine load.
    results["step_time_ratio_paired_median"] = statistics.median(
        a / b for a, b in zip(times["memoplan"], times["spikingjelly"])
    )

    configs = {"unplanned": copy.deepcopy(model), "memoplan": planned, "spikingjelly": sj_model}
    results["ops_per_step"] = {name: ops_per_step(m, x, args.seed) for name, m in configs.items()}

    # bit codec.
    seen, worst = bit_ratios(copy.deepcopy(model), x)
    results["bit"] = {"block_inputs": seen, "worst_from_4KiB": worst}

    # What the peaks are made of.
    if args.breakdown and device.type == "cpu":  # the breakdown is the CPU meter's
        results["breakdown"] = {}
        for name, m in (("memoplan", planned), ("spikingjelly", sj_model), ("unplanned", copy.deepcopy(model))):
            peak, rows = breakdown(m, x, args.seed, args.top)
            results["breakdown"][name] = {
                "peak_bytes": peak,
                "top": [
                    {"bytes": b, "tensors": n, "phase": where[0], "op": where[1], "shape": where[2], "site": where[3]}
                    for b, n, where in rows
                ],
            }

    u = results["unplanned_peak_bytes"]
    mp, sj = chosen["peak_bytes"], sj_mem.peak_bytes
    t_mp, t_sj = results["step_time_s"]["memoplan"]["median"], results["step_time_s"]["spikingjelly"]["median"]
    bit_run = max(s["bit_bytes"] / s["float32_bytes"] for s in seen)
    grads_equal = chosen["equivalent"]
    results["targets"] = [
        _target(
            "memoplan peak / unplanned peak (gradients "
            + ("identical" if chosen["exact"] else f"equal within {chosen['rtol']:g} x max")
            + ")",
            mp / u,
            TARGETS["memoplan / unplanned"],
            grads_equal,
        ),
        _target("memoplan peak / SpikingJelly peak", mp / sj, TARGETS["memoplan / SpikingJelly (peak)"]),
        _target(
            "memoplan step time / SpikingJelly step time", t_mp / t_sj, TARGETS["memoplan / SpikingJelly (step time)"]
        ),
        _target("bit payload / float32, this run's block inputs", bit_run, TARGETS["bit payload / float32"]),
        _target(
            f"bit payload / float32, worst size >= 4 KiB (numel {worst['numel']})",
            worst["ratio"],
            TARGETS["bit payload / float32"],
        ),
    ]
    return results


def _target(what: str, value: float, limit: float, also: bool = True) -> dict[str, Any]:
    return {"what": what, "value": value, "limit": limit, "met": bool(value <= limit and also)}


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def command_line(args: argparse.Namespace) -> str:
    parts = [".venv/bin/python", "benchmarks/spiking_memory.py"]
    defaults = build_parser().parse_args([])
    for key, value in sorted(vars(args).items()):
        if key == "json" or value == getattr(defaults, key):
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, list):
            parts += [flag, *value]
        else:
            parts += [flag, str(value)]
    if args.json:
        parts += ["--json", str(args.json)]
    return " ".join(parts)


# ---------------------------------------------------------------- report


def render(results: dict[str, Any]) -> str:
    def mib(n: int) -> str:
        return f"{n / MIB:.2f} MiB"

    def ms(s: float) -> str:
        return f"{s * 1000:.0f} ms"

    u = results["unplanned_peak_bytes"]
    m, sj = results["model"], results["spikingjelly"]
    times = results["step_time_s"]
    lines = [
        f"$ {results['command']}",
        f"model: {m['name']}, {m['blocks']} blocks (conv, bn, LIF), channels {m['channels']}, T = {m['T']}, "
        f"input {tuple(m['input_shape'])} binary ({m['input_density']:.1%} ones), {m['parameters']:,} parameters",
        f"meter: {results['meter']}; torch {results['machine']['torch']}, {results['machine']['threads']} threads"
        + (f", {results['machine']['device']}" if results["machine"].get("device", "cpu") != "cpu" else ""),
        "",
        "| configuration | peak | x unplanned | step time (median) | equal to unplanned |",
        "| --- | --- | --- | --- | --- |",
        f"| unplanned | {mib(u)} | 1.000 | {ms(times['unplanned']['median'])} | - |",
    ]
    for plan, r in results["plans"].items():
        chosen = plan == next(iter(results["plans"]))
        t = ms(times["memoplan"]["median"]) if chosen else "-"
        within = sum(len(v["within"]) for v in r["checks"].values())
        tolerance = f", within {r['rtol']:g} x max: {within} tensors not bit for bit" if within else ""
        eq = (
            f"yes (verify: EQUIVALENT{tolerance})"
            if r["equivalent"]
            else "NO: " + "; ".join(f"{k}: {len(v['differences'])}" for k, v in r["checks"].items() if v["differences"])
        )
        name = f"memoplan `{plan}`" + (" (chosen)" if chosen else "")
        lines.append(f"| {name} | {mib(r['peak_bytes'])} | {r['peak_bytes'] / u:.3f} | {t} | {eq} |")
    sj_eq = (
        "yes (outputs, gradients)"
        if sj["outputs_equal"] and not sj["gradient_differences"]
        else f"NO: {len(sj['gradient_differences'])} of {sj['gradients_compared']} gradients differ"
    )
    lines.append(
        f"| SpikingJelly {sj['version']} level 1, {sj['regions']} regions ({', '.join(sorted(set(sj['compressors'])))}) "
        f"| {mib(sj['peak_bytes'])} | {sj['peak_bytes'] / u:.3f} | {ms(times['spikingjelly']['median'])} | {sj_eq} |"
    )
    plain = sj["on_unmodified_model"]
    lines += [
        "",
        f"SpikingJelly ran on a twin whose neurons are MemoryModules running LIF.forward "
        f"(twin's unplanned step identical to the model's: {'yes' if sj['twin_equals_model'] else 'NO'}); "
        f"on the unmodified model it gives outputs equal: {'yes' if plain['outputs_equal'] else 'no'}, "
        f"gradients differing: {plain['gradient_differences']} (its recompute does not see memoplan's LIF state).",
        f"memoplan / SpikingJelly step time: {times['memoplan']['median'] / times['spikingjelly']['median']:.3f} "
        f"(ratio of medians), {results['step_time_ratio_paired_median']:.3f} (median of the per-round ratios)",
        "step times (ms, every timed step): "
        + "; ".join(f"{k} {' '.join(f'{t * 1000:.0f}' for t in v['all'])}" for k, v in times.items()),
        "aten operations per training step: " + "; ".join(f"{k} {n:,}" for k, n in results["ops_per_step"].items()),
        "",
        "bit codec (payload bytes / float32 bytes):",
    ]
    for s in results["bit"]["block_inputs"]:
        lines.append(
            f"  input of {s['input of']}: {s['numel']:,} elements, {s['float32_bytes']:,} B -> {s['bit_bytes']:,} B "
            f"= 1/{s['float32_bytes'] / s['bit_bytes']:.3f}"
        )
    w = results["bit"]["worst_from_4KiB"]
    lines.append(
        f"  worst size from 4 KiB: {w['numel']:,} elements, {w['float32_bytes']:,} B -> {w['bit_bytes']:,} B "
        f"= 1/{1 / w['ratio']:.3f} (padding to a whole byte); every size from {w['all_sizes_meet_target_from_numel']:,} "
        f"elements (and every multiple of 8) reaches 1/31.9"
    )
    for name, b in results.get("breakdown", {}).items():
        lines += ["", f"live at the {name} peak ({mib(b['peak_bytes'])}), largest groups:"]
        for row in b["top"]:
            lines.append(
                f"  {mib(row['bytes']):>10}  {row['tensors']:>3} x {row['op']:<28} {row['shape']:<16} "
                f"{row['phase']:<8} {row['site']}"
            )
    lines += ["", "| target | measured | limit | verdict |", "| --- | --- | --- | --- |"]
    for t in results["targets"]:
        value = f"1/{1 / t['value']:.2f}" if t["value"] < 0.1 else f"{t['value']:.3f}"
        limit = f"1/{1 / t['limit']:.1f}" if t["limit"] < 0.1 else f"{t['limit']:.3g}"
        lines.append(f"| {t['what']} | {value} | {limit} | {'met' if t['met'] else 'MISSED'} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default=DEFAULT_PLAN, help="the chosen plan (timed)")
    parser.add_argument("--also", nargs="*", default=list(OTHER_PLANS), help="more plans to measure and verify")
    parser.add_argument("--batch", type=int, default=spiking.BATCH)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=15, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--top", type=int, default=12, help="rows of each peak breakdown")
    parser.add_argument("--breakdown", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--device", default="cpu", help="cpu (the live-storage meter) or cuda (the allocator's peak)")
    parser.add_argument("--json", type=Path, help="write the results here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    results = run(args)
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"\nresults written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
