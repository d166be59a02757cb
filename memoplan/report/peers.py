"""Report stage: torch.compile with ``activation_memory_budget`` as a peer, measured like memoplan.

On CUDA a compiled step is measured with the caching allocator.  On CPU a
``TorchDispatchMode`` that is active when a compiled function is called makes Dynamo
skip the frame and run it eagerly, so the live-storage meter cannot simply be put
around the call: :func:`compile_step` compiles with torch's ``aot_eager_decomp_partition``
backend (Inductor's decompositions and the min-cut partitioner that honours
``activation_memory_budget``; the partitioned graphs run op by op) with only its
no-op graph compiler wrapped, so the meter is switched on *inside* the forward and
backward graphs while :func:`compiled_peak` measures a step.  Used by ``memoplan report
--peers`` and by ``benchmarks/planner_vs_peers.py``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from memoplan.measure import LiveStorageMeter, LossFn, forward_context, step_loss, training_step
from memoplan.specs import Example
from memoplan.step import as_written

__all__ = [
    "aot_eager_decomp_partition_metered",
    "compile_step",
    "compiled_peak",
    "compiled_step",
    "eager_step",
    "sync",
]


class _GraphMeter(LiveStorageMeter):
    """The live-storage meter, switched on only while compiled graphs run (CPU).

    Dynamo skips frames while a dispatch mode is active, so the mode is pushed by the
    graph wrappers below, not around the call; the storages' finalizers stay attached
    between graphs, so bytes freed outside them (saved activations released after
    backward, ...) are still subtracted.
    """

    # A compiled checkpoint's recompute replays dropout through torch's RNG higher-order ops
    # (``run_and_save_rng_state``, ``run_with_rng_state``): each runs one op, whose outputs the
    # meter then counts as it counts any op's.
    supports_higher_order_operators = True

    def resume(self) -> None:
        TorchDispatchMode.__enter__(self)

    def pause(self) -> None:
        TorchDispatchMode.__exit__(self, None, None, None)

    def close(self) -> None:
        for _, finalizer in self._live.values():
            finalizer.detach()
        self._live.clear()


_ACTIVE_METER: list[_GraphMeter] = []


def _metered(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a compiled graph so that it runs under the active graph meter, if there is one."""
    if getattr(compiled, "_boxed_call", False):

        def run(args: list[Any]) -> Any:
            if not _ACTIVE_METER:
                return compiled(args)
            _ACTIVE_METER[-1].resume()
            try:
                return compiled(args)
            finally:
                _ACTIVE_METER[-1].pause()

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def run_unboxed(*args: Any) -> Any:
        if not _ACTIVE_METER:
            return compiled(*args)
        _ACTIVE_METER[-1].resume()
        try:
            return compiled(*args)
        finally:
            _ACTIVE_METER[-1].pause()

    return run_unboxed


def aot_eager_decomp_partition_metered(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """torch's own ``aot_eager_decomp_partition`` backend, its no-op graph compiler wrapped by :func:`_metered`."""
    from unittest import mock

    from torch._dynamo.backends import debugging

    nop = debugging.get_nop_func

    def metered_nop() -> Callable[..., Any]:
        inner = nop()
        return lambda fx_g, inputs: _metered(inner(fx_g, inputs))

    with mock.patch.object(debugging, "get_nop_func", metered_nop):
        return debugging.aot_eager_decomp_partition(gm, example_inputs, **kwargs)


def compile_step(model: nn.Module, device: str, tag: str, loss_fn: LossFn | None = None) -> Callable[..., torch.Tensor]:
    """torch.compile of ``loss(model(*args))``, with a code object of its own.

    The loss is ``loss_fn``, else the running step's (:mod:`memoplan.step`: the plan's `step`
    block, ``loss = auto`` when none runs), as every step memoplan measures takes it; a user's
    callable is compiled as written (:func:`memoplan.step.as_written`: one that fails makes the
    peer a point with its reason; the eager steps of the same report have checked it already).  Dynamo caches compiled code per code
    object and, inlining ``nn.Module``s, does not guard on which instance it traced: two
    compiled copies of one model class would share the graph partitioned for the first
    budget.  A function compiled from its own source text has its own code object, hence
    its own cache.
    """
    namespace: dict[str, Any] = {}
    source = "def step(*args, **kwargs):\n    return loss(model(*args, **kwargs))\n"
    loss = as_written(step_loss(loss_fn))
    exec(compile(source, f"<compiled step: {tag}>", "exec"), {"model": model, "loss": loss}, namespace)
    backend = "inductor" if device == "cuda" else aot_eager_decomp_partition_metered
    return torch.compile(namespace["step"], backend=backend, fullgraph=True)


# ---------------------------------------------------------------- steps


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def eager_step(model: nn.Module, example: Example) -> Callable[[], torch.Tensor]:
    """One eager training step: :func:`memoplan.measure.training_step`, the running step's loss and autocast."""

    def step() -> torch.Tensor:
        return training_step(model, example.args, example.kwargs)[1]

    return step


def compiled_step(
    model: nn.Module, fn: Callable[..., torch.Tensor], example: Example, budget: float
) -> Callable[[], torch.Tensor]:
    def step() -> torch.Tensor:
        # The budget is read when a graph is partitioned; patched around every call so that a
        # recompilation, should one happen, partitions for this configuration's budget too.
        # The forward and the loss run under the running step's autocast, the backward outside
        # it, as in every eager step (memoplan.measure.training_step).
        with torch._functorch.config.patch(activation_memory_budget=budget):
            model.zero_grad(set_to_none=True)
            with forward_context(model, example.args, example.kwargs):
                loss = fn(*example.args, **example.kwargs)
            loss.backward()
        return loss

    return step


def compiled_peak(
    step: Callable[[], torch.Tensor], model: nn.Module, device: str, seed: int
) -> tuple[int, torch.Tensor]:
    """Peak bytes of one compiled step above what was live at its start; and its loss."""
    model.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(seed)
        loss = step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start, loss.detach()
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    meter = _GraphMeter()
    _ACTIVE_METER.append(meter)
    try:
        torch.manual_seed(seed)
        loss = step()
    finally:
        _ACTIVE_METER.pop()
        meter.close()
        if was_enabled:
            gc.enable()
    return meter.peak_bytes, loss.detach()
