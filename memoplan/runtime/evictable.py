"""Runtime stage: a ``dtr`` candidate's forward, eagerly and under ``torch.compile``.

Eagerly, :func:`run_evictable` hands the call to the model's :class:`~memoplan.runtime.dtr.Tracker`
(saved-tensor hooks, eviction at run time, recompute in backward).

Under ``torch.compile`` a traced graph saves its activations itself and calls no saved-tensor
hook (pytorch/pytorch#148222), so nothing can be evicted at run time.  Instead of leaving every
candidate out of the graph, the ``dtr`` block is *lowered to a static checkpoint choice* when
Dynamo traces the model:

* a candidate the choice names runs as a plain ``checkpoint`` region
  (:func:`memoplan.runtime.checkpoint.run_checkpointed`): one ``torch.utils.checkpoint``
  higher-order op in the model's graph, its activations recomputed in backward, as an evicted
  candidate's are in eager mode;
* any other candidate's forward is traced as it is: its activations stay until its backward,
  as a resident candidate's do.

The choice is the dtr simulator's (:func:`memoplan.runtime.dtr_sim.simulate`, the tracker's own
eviction rules replayed on one step): from what the tracker measured on the last eager step
(each candidate's evictable bytes, the bytes it keeps and its forward time, in call order,
:attr:`Tracker.measured`) and the plan's settings, the candidates it evicts at least once are
checkpointed.  A static plan never holds what it recomputes, so the compiled step's activations
stay within what the eager tracker holds.  Before any eager step has measured the candidates,
every candidate is checkpointed (the strictest choice).

The choice is made when Dynamo traces (``torch._dynamo.assume_constant_result``: it is part of
the graph, not a guard) and said once per choice (MP418, a warning naming what is checkpointed
and why).  A new choice needs a new trace (``torch._dynamo.reset()``, or a recompile for new
shapes).  :func:`memoplan.dtr_stats` counts eager steps only.  docs/compile.md has the figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from memoplan.diagnostics import warn
from memoplan.runtime.checkpoint import run_checkpointed
from memoplan.runtime.dtr import DTR_ATTR, Tracker

__all__ = ["compile_choice", "run_evictable"]

#: Names shown in MP418 before "and N more".
_SHOWN = 6


def run_evictable(
    module: nn.Module, forward_fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """``forward_fn(module, *args, **kwargs)`` as a candidate of the model's ``dtr`` tracker (what generated code calls).

    Under ``torch.compile``: a checkpoint region or the plain forward, as the compile choice says."""
    if not torch.is_grad_enabled():
        return forward_fn(module, *args, **kwargs)
    if torch.compiler.is_compiling():
        if _checkpointed(module):
            return run_checkpointed(module, forward_fn, args, kwargs)
        return forward_fn(module, *args, **kwargs)
    return _eager(module, forward_fn, args, kwargs)


def _tracker(module: nn.Module) -> Tracker:
    tracker = module.__dict__.get(DTR_ATTR)
    if not isinstance(tracker, Tracker):
        raise RuntimeError(f"memoplan: a {type(module).__qualname__} has a dtr forward but no tracker")
    return tracker


@torch._disable_dynamo  # torch.compiler.disable that imports Dynamo at the first call, not now (runtime/compiled.py)
def _eager(module: nn.Module, forward_fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    # Saved-tensor hooks and the tracker's bookkeeping: never traced.
    return _tracker(module).run(module, lambda *a, **k: forward_fn(module, *a, **k), args, kwargs)


def _checkpointed(module: nn.Module) -> bool:
    """Whether the compile choice checkpoints this candidate (run, not traced, when Dynamo traces)."""
    tracker = _tracker(module)
    where = tracker.paths.get(module, "")
    chosen, reason = compile_choice(tracker)
    said = tracker.__dict__.setdefault("_compile_said", set())
    if (chosen, reason) not in said:
        said.add((chosen, reason))
        everyone = sorted(set(tracker.paths.values()))
        names = [n for n in everyone if n in chosen]
        shown = ", ".join(f"`{n}`" for n in names[:_SHOWN]) + (
            f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
        )
        warn(
            f"memoplan: MP418: `dtr` under torch.compile: a compiled graph cannot evict at run time, so the "
            f"candidates run as a static checkpoint choice made now, while Dynamo traces: {len(names)} of "
            f"{len(everyone)} checkpointed{' (' + shown + ')' if names else ''}, {reason}; the others keep their "
            "activations until backward. Gradients are those of the unplanned model; `dtr_stats` counts eager "
            "steps only (`memoplan docs compile`)",
            RuntimeWarning,
        )
    return where in chosen


# What torch._dynamo.assume_constant_result does (a mark Dynamo reads when it traces a call),
# without importing Dynamo with this module: it costs a second of CPU, which a command or script
# that never compiles should not pay.  tests/runtime/test_lazy_dynamo.py checks the decorator still
# sets exactly this mark.
_checkpointed._dynamo_marked_constant = True  # type: ignore[attr-defined]


def compile_choice(tracker: Tracker) -> tuple[frozenset[str], str]:
    """The candidates (paths) checkpointed under ``torch.compile``, and why (see the module's docstring)."""
    everyone = frozenset(tracker.paths.values())
    measured = dict(tracker.measured)
    if not measured:
        return everyone, (
            "every candidate, since no eager training step has measured them yet (run one eager step "
            "before compiling for the dtr simulator's choice)"
        )
    from memoplan.runtime.dtr_sim import Candidate, simulate  # pure Python

    settings = tracker.settings
    calls = [Candidate(where, evictable, kept, seconds) for where, (evictable, kept, seconds) in measured.items()]
    sim = simulate(
        calls,
        settings.eviction_threshold,
        minimum=settings.evictee_minimum_size,
        memory_factor=settings.recomp_memory_factor,
        time_factor=settings.recomp_time_factor,
    )
    unmeasured = everyone - measured.keys()  # not called in eager steps so far: the strictest choice
    return frozenset(sim.evicted) | unmeasured, (
        f"those the dtr simulator evicts at eviction_threshold = {settings.eviction_threshold} B from the "
        "sizes the last eager step measured" + (f", and {len(unmeasured)} it did not measure" if unmeasured else "")
    )
