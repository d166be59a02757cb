"""Verification: one training step with and without a plan — peak memory of both and equivalence.

Both runs start from deep copies of the same model and the same RNG seed.  Lossless
plans must give bit-identical outputs, gradients, buffers, RNG state and
``state_dict`` keys; any difference is listed with its size.  Structured outputs
(tuples, dicts, dataclasses, transformers' ``ModelOutput`` and caches) are compared
by the tensors they hold, each named by its path
(``outputs.past_key_values.layers[1].keys``): :func:`memoplan.compare.compare`.

Temporal chunks sum in another order (a layer run on fewer rows, weight gradients
and BatchNorm statistics summed chunk by chunk), so a plan with ``temporal_chunk``
is held to a stated tolerance instead: every floating-point tensor within
``CHUNK_RTOL`` times the largest unplanned magnitude of its category (outputs,
gradients, buffers: a gradient that is zero in exact arithmetic, such as the bias
of a layer right before BatchNorm, is rounding noise in both runs); integer
tensors, RNG state and keys still exactly.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from memoplan import api
from memoplan.compare import Check, compare
from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.graphs import CountingBackend
from memoplan.ir import ResolvedPlan
from memoplan.measure import StepMemory, indexed_device, measured_step, step_device, training_step
from memoplan.memonger.measure import count_allocations
from memoplan.memonger.probe import allocated_inside
from memoplan.planner.profiling.copies import changed_parameters, parameter_versions, sharing_copy
from memoplan.planner.profiling.shrink import StepOutOfMemory, out_of_memory_as
from memoplan.planner.profiling.target import is_meta, not_runnable, parse_device
from memoplan.resolver import resolve
from memoplan.runtime.arena import arena_state
from memoplan.runtime.dtr import dtr_stats
from memoplan.specs import Example
from memoplan.syntax import ast

# What verify reports, its printed form and the budget and dtr verdicts live in
# memoplan.verify_report; they are imported from here by the command line, the report and users.
from memoplan.verify_report import (
    ArenaCheck,
    EstimatedVerify,
    VerifyReport,
    budget_check,
    dtr_check,
    estimated_budget_check,
    render_arena,
    render_report,
)

__all__ = [
    "CHUNK_RTOL",
    "ArenaCheck",
    "EstimatedVerify",
    "VerifyReport",
    "arena_check",
    "budget_check",
    "dtr_check",
    "estimated_budget_check",
    "estimated_verify",
    "render_arena",
    "render_report",
    "verify",
]

#: Tolerance for plans with temporal chunks: max |planned - unplanned| <= CHUNK_RTOL * max |unplanned|,
#: the maximum taken over the tensor's category (outputs, gradients or buffers).
CHUNK_RTOL = 5e-5


@dataclass
class _Run:
    memory: StepMemory
    output: Any
    grads: dict[str, torch.Tensor | None]
    buffers: dict[str, torch.Tensor]
    rng: dict[str, torch.Tensor]  # "cpu", and the CUDA device's when the step ran there
    keys: list[str]


def verify(
    model: nn.Module,
    plan: api.PlanLike,
    example: Example,
    *,
    seed: int = 0,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    rtol: float | None = None,
    device: torch.device | str | None = None,
    compare_example: Example | None = None,
    compile: str | None = None,
    step: Any = None,
) -> VerifyReport:
    """Run one step on a copy of ``model`` without and one with ``plan``; compare everything.

    ``step``: the training step to run, a :class:`memoplan.syntax.blocks.StepConfig` (its loss
    and autocast; default: the step :func:`memoplan.step.running` set, else the `step` block of
    ``plan`` when it is a plan's text or file, else the default step).

    When the unplanned step runs out of memory at full size (or ``compare_example`` is given),
    the planned step is measured at full size alone, the unplanned peak is estimated on fake
    tensors, and the equivalence is proven on a smaller example: ``compare_example``, else the
    example with its batch halved until both steps fit (:func:`_verify_smaller`).

    ``rtol`` (relative to each unplanned tensor's largest magnitude) defaults to 0,
    bit for bit, or to :data:`CHUNK_RTOL` when the plan has temporal chunks.
    ``device`` runs both steps on copies moved there (default: where the model is);
    on CUDA the peaks are the allocator's and the CUDA RNG state is compared too.
    ``compile`` (a ``torch.compile`` backend: ``inductor``, ``aot_eager``, ...) runs both steps
    compiled (after one compiling step of each, which both models take alike), reports what Dynamo
    captured of each (:class:`memoplan.graphs.Capture`) and times a compiled step of each; it
    resets Dynamo's caches first.  On the CPU the meter's dispatch mode keeps Dynamo out, so the
    peaks there are eager's (the report says so); on CUDA they are the compiled steps'.
    """
    if device is not None and not is_meta(model):
        parse_device(str(device))  # MP506, as `memoplan verify --device`: not a device, or not here
    why = not_runnable(model, device)
    if why is not None:  # a meta model, a GPU not here: estimated_verify says what can be said
        raise PlanError(
            (
                Diagnostic(
                    "MP413",
                    f"verify runs real training steps, and {why}",
                    help="`memoplan.estimated_verify` (what `memoplan verify` does for it) estimates the peaks on fake "
                    "tensors; prove the equivalence on a smaller real build (`memoplan docs meta`)",
                ),
            )
        )
    if step is None:
        step = _plan_step(plan)
    with _running(step):
        return _verify(model, plan, example, seed, loss_fn, rtol, device, compare_example, compile)


def _running(step) -> contextlib.AbstractContextManager[Any]:
    """Run the steps inside as ``step`` (a StepConfig); None: as the caller runs them."""
    from memoplan.step import make_step, running

    return contextlib.nullcontext() if step is None else running(make_step(step))


def _verify(model, plan, example, seed, loss_fn, rtol, device, compare_example, compile) -> VerifyReport:
    """:func:`verify` in its step."""
    if compile is not None:
        return _verify_compiled(model, plan, example, seed, loss_fn, rtol, device, compile)
    if compare_example is not None:
        resolved, rtol, example, where = _settings(model, plan, example, rtol, device)
        return _verify_smaller(model, device, resolved, example, compare_example, seed, loss_fn, rtol, where)
    resolved, rtol, reference, planned, example, where = _prepared(model, plan, example, rtol, device)
    too_large = False
    try:
        with _reproducible(where) as nondeterministic:
            with out_of_memory_as("unplanned"):
                _warm_up(reference, planned, example, loss_fn, where)
                before = _run(reference, example, seed, loss_fn)
            if resolved.dtr is not None:
                dtr_stats(planned, reset=True)  # count the measured step only
            with out_of_memory_as("planned"):
                after = _run(planned, example, seed, loss_fn)
    except StepOutOfMemory as oom:
        if oom.step != "unplanned":
            raise
        too_large = True
    if too_large:  # out of the except block: nothing keeps the failed step's frames alive
        del reference, planned
        gc.collect()
        return _verify_smaller(model, device, resolved, example, None, seed, loss_fn, rtol, where)
    evictions = dtr_stats(planned) if resolved.dtr is not None else None
    checks = _checks(before, after, rtol)
    memory = before.memory, after.memory
    del before, after
    arena = None if resolved.memonger is None else arena_check(reference, planned, example, where)
    del reference, planned  # compared: free them before timing fresh copies
    times = _step_times(model, resolved, example, loss_fn, device, where)
    return VerifyReport(resolved, *memory, checks, rtol, tuple(nondeterministic), *times, evictions, arena)


def _plan_step(plan: api.PlanLike):
    """The `step` block of ``plan`` (a plan, its file or text) when no step is running, else None."""
    from memoplan.step import current, step_block

    if current() is not None or isinstance(plan, ResolvedPlan):
        return None
    parsed = api.as_plan(plan)
    config = step_block(parsed)[0]
    if config is not None and ":" in config.loss and parsed.file and os.path.isfile(parsed.file):
        from dataclasses import replace

        from memoplan.planner.search.write import relative_spec

        config = replace(config, loss=relative_spec(config.loss, ".", os.path.dirname(parsed.file)))  # from its folder
    return config


def estimated_verify(model: nn.Module, plan: ast.Plan | Path | str, example: Example, device=None) -> EstimatedVerify:
    """What :func:`verify` can say of a model no real step of which runs here (a meta-device
    model, a GPU not on this machine): ``plan`` (a plan, its file or its text) resolved against
    ``model`` (``MP3xx`` when it does not) and the peaks of one step without and one with it, on
    fake tensors of the target device (:mod:`memoplan.planner.profiling.target`), in the plan's ``step``.
    No equivalence: prove it on a smaller real build with :func:`verify`."""
    from memoplan.planner.profiling.estimate import estimate_plan, fake_step
    from memoplan.planner.profiling.target import TARGET, not_runnable, target_for

    step = _plan_step(plan)
    plan = api.as_plan(plan)
    resolved = resolve(plan, model)
    aim = target_for(model, device)
    token = TARGET.set(aim)
    try:
        with _running(step):  # the plan's `step` block, as verify runs its steps
            unplanned = fake_step(model, example, aim.device, peak_only=True).peak_bytes
            planned = estimate_plan(model, example, plan)
    finally:
        TARGET.reset(token)
    why = not_runnable(model, device) or "estimated"
    return EstimatedVerify(why, unplanned, planned, len(resolved.modules))


def arena_check(reference: nn.Module, planned: nn.Module, example: Example, device: torch.device) -> ArenaCheck:
    """One inference call (eval, no grad) of ``reference`` and of ``planned``, whose ``memonger``
    arena runs it: outputs bit for bit, the peak of each call and what its ops allocate."""
    reference.eval()
    planned.eval()
    state = arena_state(planned)
    calls = state.arena_calls if state is not None else 0

    def call(model: nn.Module):
        def run():
            with torch.no_grad():
                return model(*example.args, **dict(example.kwargs))

        return run

    expected, got = call(reference)(), call(planned)()
    ran = state is not None and state.arena_calls == calls + 1
    outputs = compare("arena outputs", {"outputs": expected}, {"outputs": got}, 0.0)
    del expected, got
    eager_allocations, _ = count_allocations(call(reference))
    arena_allocations, _ = count_allocations(call(planned))
    eager_peak, _ = allocated_inside(call(reference), device)
    arena_peak, _ = allocated_inside(call(planned), device)
    held = state.arena.untyped_storage().nbytes() if state is not None and state.arena is not None else 0
    return ArenaCheck(outputs, ran, arena_peak, eager_peak, held, arena_allocations, eager_allocations)


def _checks(before: _Run, after: _Run, rtol: float) -> tuple[Check, ...]:
    return (
        compare("outputs", {"outputs": before.output}, {"outputs": after.output}, rtol),
        compare("gradients", before.grads, after.grads, rtol),
        compare("buffers", before.buffers, after.buffers, rtol),
        compare("rng state", before.rng, after.rng, 0.0),
        Check("state_dict keys", len(before.keys), () if before.keys == after.keys else ("keys differ",)),
    )


def _verify_smaller(
    model: nn.Module,
    device: torch.device | str | None,
    resolved: ResolvedPlan,
    example: Example,
    smaller: Example | None,
    seed: int,
    loss_fn,
    rtol: float,
    where: torch.device,
) -> VerifyReport:
    """Verify without the full-size unplanned step: the planned step measured at full size, the
    unplanned peak estimated on fake tensors, equivalence on ``smaller`` (default: the example's
    batch halved until both steps fit), each on a fresh copy from the same state, one at a time; the
    copies share the model's weights (:func:`sharing_copy`), so the weights are in memory once."""
    from memoplan.planner.profiling.estimate import fake_step
    from memoplan.planner.profiling.shrink import describe_example, shrinking

    pristine = sharing_copy(model)
    if device is not None:
        pristine.to(device)
    versions = parameter_versions(pristine)
    planned = api.apply(sharing_copy(pristine), resolved, warn=False)
    with _reproducible(where) as nondeterministic, out_of_memory_as("planned"):
        if resolved.dtr is not None:
            dtr_stats(planned, reset=True)
        full = _run(planned, example, seed, loss_fn)
    _weights_unchanged(pristine, versions, "planned")
    evictions = dtr_stats(planned) if resolved.dtr is not None else None
    memory = full.memory
    del full, planned
    estimate = fake_step(pristine, example, where, loss_fn, peak_only=True)
    unplanned = StepMemory(peak_bytes=estimate.peak_bytes, device=str(where), method="fake-tensor")

    def both(small: Example) -> tuple[_Run, _Run]:
        # One copy at a time: the unplanned step's copy is gone (its gradients kept) before the planned one's.
        with _reproducible(where):
            before = _run(sharing_copy(pristine), small, seed, loss_fn)
            _weights_unchanged(pristine, versions, "unplanned")
            after = _run(api.apply(sharing_copy(pristine), resolved, warn=False), small, seed, loss_fn)
            _weights_unchanged(pristine, versions, "planned")
        return before, after

    if smaller is None:
        smaller, (before, after) = shrinking(example, both)
    else:
        smaller = smaller.to(where)
        with out_of_memory_as("unplanned"), _compare_example_failures():
            before, after = both(smaller)
    checks = _checks(before, after, rtol)
    return VerifyReport(
        resolved,
        unplanned,
        memory,
        checks,
        rtol,
        tuple(nondeterministic),
        dtr=evictions,
        compared_on=describe_example(smaller),
        full_example=describe_example(example),
    )


def _weights_unchanged(model: nn.Module, versions: dict[str, int], step: str) -> None:
    """MP412 when the ``step`` wrote a parameter in place: copies that share weights cannot be compared."""
    changed = changed_parameters(model, versions)
    if changed:
        raise PlanError(
            (
                Diagnostic(
                    "MP412",
                    f"the {step} step wrote the parameter `{changed[0]}` in place"
                    + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""),
                    help="verify without the full-size unplanned step shares the model's weights between its "
                    "copies, so a step must not change them (an optimizer step belongs outside the model's forward)",
                ),
            )
        )


def _settings(model: nn.Module, plan, example: Example, rtol: float | None, device):
    """The resolved plan, the tolerance (``rtol``, else the plan's default), the example on
    ``device`` and the device the steps run on."""
    resolved = plan if isinstance(plan, ResolvedPlan) else resolve(api.as_plan(plan), model)
    if rtol is None:
        rtol = CHUNK_RTOL if any(m.temporal_chunk for m in resolved.modules) else 0.0
    if device is None:
        return resolved, rtol, example, step_device(model, example.args, example.kwargs)
    return resolved, rtol, example.to(device), indexed_device(device)


def _prepared(model: nn.Module, plan, example: Example, rtol: float | None, device):
    """What both steps start from: :func:`_settings`' figures, a copy of ``model`` on ``device``
    and a planned copy of it."""
    resolved, rtol, example, where = _settings(model, plan, example, rtol, device)
    reference = copy.deepcopy(model)
    if device is not None:
        reference.to(device)
    planned = api.apply(copy.deepcopy(reference), resolved, warn=False)
    return resolved, rtol, reference, planned, example, where


def _verify_compiled(model, plan, example, seed, loss_fn, rtol, device, backend: str) -> VerifyReport:
    """:func:`verify` with both steps under ``torch.compile(backend=backend)``."""
    resolved, rtol, reference, planned, example, where = _prepared(model, plan, example, rtol, device)
    torch._dynamo.reset()
    with _reproducible(where) as nondeterministic:
        runs, captures = [], []
        for copied in (reference, planned):
            counting = CountingBackend(backend)
            compiled = cast(nn.Module, torch.compile(copied, backend=counting))  # a module compiles to a module
            with torch.random.fork_rng(devices=[where] if where.type == "cuda" else []):
                with counting, _backend_failures(backend):
                    training_step(compiled, example.args, example.kwargs, loss_fn)  # compiles
                captures.append(copy.copy(counting.capture))
            runs.append(compiled)
        if resolved.dtr is not None:
            dtr_stats(planned, reset=True)
        before = _run(reference, example, seed, loss_fn, runs[0])
        after = _run(planned, example, seed, loss_fn, runs[1])
        evictions = dtr_stats(planned) if resolved.dtr is not None else None
        checks = _checks(before, after, rtol)
        times = [_timed(run, example, loss_fn, where) for run in runs]
    return VerifyReport(
        resolved,
        before.memory,
        after.memory,
        checks,
        rtol,
        tuple(nondeterministic),
        times[0],
        times[1],
        dtr=evictions,
        backend=backend,
        captures=(captures[0], captures[1]),
    )


@contextlib.contextmanager
def _compare_example_failures() -> Iterator[None]:
    """MP504 that names the compare example when the steps on it raise: the full-size example ran."""
    from memoplan.planner.profiling.shrink import is_out_of_memory
    from memoplan.specs import describe_exception

    try:
        yield
    except (PlanError, StepOutOfMemory, KeyboardInterrupt):
        raise
    except Exception as exc:
        if is_out_of_memory(exc):
            raise
        message = describe_exception(exc).split("\n", 1)[0]
        help_ = (
            "the planned step ran on the full example: check that the compare example fits the model as "
            "it does (`--compare-example`, `compare_example=`), or leave it out to halve the example's batch"
        )
        raise PlanError(
            (Diagnostic("MP504", f"one training step on the compare example raised {message}", help=help_),)
        ) from None


@contextlib.contextmanager
def _backend_failures(backend: str) -> Iterator[None]:
    """MP504 naming the backend and what it raised (torch's own message stops at ``raised:``)."""
    from torch._dynamo.exc import BackendCompilerFailed

    try:
        yield
    except BackendCompilerFailed as exc:
        inner = exc.inner_exception
        reason = (str(inner).strip().splitlines() or [""])[0]
        message = f"torch.compile's backend `{backend}` raised {type(inner).__name__}: {reason}".rstrip(": ")
        help_ = "the backend failed, not the plan: try `--compile aot_eager` (no C++ compiler needed), or leave out --compile"
        raise PlanError((Diagnostic("MP504", message, help=help_),)) from None


def _timed(run: nn.Module, example: Example, loss_fn, where: torch.device) -> float:
    """The wall time of a compiled step: the second of two (a guard the first fails recompiles there)."""
    with torch.random.fork_rng(devices=[where] if where.type == "cuda" else []):
        times = [_wall_time(run, example, loss_fn, where) for _ in range(2)]
    return times[-1]


def _wall_time(run: nn.Module, example: Example, loss_fn, where: torch.device) -> float:
    """Seconds of one training step of ``run`` (on CUDA, from idle to finished)."""
    if where.type == "cuda":
        torch.cuda.synchronize(where)
    start = time.perf_counter()
    training_step(run, example.args, example.kwargs, loss_fn)
    if where.type == "cuda":
        torch.cuda.synchronize(where)
    return time.perf_counter() - start


def _step_times(
    model: nn.Module, resolved: ResolvedPlan, example: Example, loss_fn, device, where: torch.device
) -> tuple[float, float]:
    """Wall time of one training step of a fresh copy of ``model`` without and one with the
    plan, unmetered.

    Taken after the measured steps, which paid the process's one-time costs (the first
    dispatch mode, the first backward), so the run that goes first carries none of them;
    fresh copies, so a model that keeps state between steps starts from the same state.
    Everything reported is compared already; the RNG is restored afterwards.
    """
    reference = copy.deepcopy(model)
    if device is not None:
        reference.to(device)
    planned = api.apply(copy.deepcopy(reference), resolved, warn=False)
    with torch.random.fork_rng(devices=[where] if where.type == "cuda" else []):
        return _wall_time(reference, example, loss_fn, where), _wall_time(planned, example, loss_fn, where)


@contextlib.contextmanager
def _reproducible(device: torch.device) -> Iterator[list[str]]:
    """On CUDA, run with deterministic algorithms in full float32; yield the ops that have no
    deterministic implementation.

    cuDNN and atomics make two identical CUDA steps differ in the last bits, so a
    bit-for-bit comparison needs ``torch.use_deterministic_algorithms`` (and cuBLAS's
    fixed workspace, ``CUBLAS_WORKSPACE_CONFIG``, set here unless the user set it).
    TensorFloat-32 is switched off: it rounds products to 10 bits of mantissa, so a
    time chunk's smaller convolution, summed in another order, would differ by far more
    than float32 reassociation and the chunk tolerance would judge TF32, not the plan.
    Ops without a deterministic implementation only warn; the report lists them,
    since their differences are not the plan's.  Everything is restored afterwards.
    """
    found: list[str] = []
    if device.type != "cuda":
        yield found
        return
    set_cublas = "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    if set_cublas:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.matmul.allow_tf32,
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
        for warning in caught:
            text = str(warning.message)
            if "deterministic implementation" in text:
                line = text.split(", but ")[0]
                if line not in found:
                    found.append(line)
            else:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved[4], saved[5]
        if set_cublas:
            del os.environ["CUBLAS_WORKSPACE_CONFIG"]


def _warm_up(reference: nn.Module, planned: nn.Module, example: Example, loss_fn, device: torch.device) -> None:
    """On CUDA, one throwaway step of a copy of each model before measuring.

    A process's first steps allocate what then stays: cuBLAS workspaces, Triton's
    compiled kernels and autotuning.  Measured cold, the step that runs first would
    carry them in its peak.  The copies are discarded and the RNG restored.
    """
    if device.type != "cuda":
        return
    with torch.random.fork_rng(devices=[device]):
        for model in (reference, planned):
            training_step(copy.deepcopy(model), example.args, example.kwargs, loss_fn)
    torch.cuda.synchronize(device)


def _run(model: nn.Module, example: Example, seed: int, loss_fn, run: nn.Module | None = None) -> _Run:
    """One measured step of ``run`` (``model`` compiled, or ``model``); grads and buffers read from ``model``."""
    torch.manual_seed(seed)
    memory, output, _ = measured_step(model if run is None else run, example.args, example.kwargs, loss_fn=loss_fn)
    return _Run(
        memory=memory,
        output=output,
        grads={name: p.grad for name, p in model.named_parameters()},
        buffers=dict(model.named_buffers()),
        rng=_rng_states(memory.device),
        keys=list(model.state_dict().keys()),
    )


def _rng_states(device: str) -> dict[str, torch.Tensor]:
    states = {"cpu": torch.get_rng_state()}
    if torch.device(device).type == "cuda":
        states[device] = torch.cuda.get_rng_state(device)
    return states
