"""Runtime stage: ``MP322`` when a model's own (Hugging Face) gradient checkpointing is turned on
*after* a plan that checkpoints was applied.

The resolver warns when it is on already.  The Hugging Face ``Trainer`` turns it on later, in
``train()`` (``gradient_checkpointing=True`` in its arguments), after the user applied the plan:
each planned layer would then be recomputed twice a step (three times with
``use_reentrant=True``).  :func:`watch` puts a forward pre-hook on the model that looks once,
at the first forward that trains (``model.training`` and grad enabled), and warns with a
:class:`memoplan.diagnostics.MemoplanWarning`; :func:`unwatch` (called by
``memoplan.runtime.uninstall``) takes it away.  Only models with a module that has a
``gradient_checkpointing`` attribute (Hugging Face's switch) are watched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memoplan.diagnostics import Diagnostic, MemoplanWarning, Severity, Span, warn

__all__ = ["WATCH_ATTR", "own_checkpointing", "unwatch", "watch"]

#: The key in the root module's ``__dict__`` holding the watch.
WATCH_ATTR = "_memoplan_hf_watch"


@dataclass
class _Watch:
    hook: Any  # the pre-hook's RemovableHandle
    regions: tuple[str, ...]  # the plan's checkpointed modules
    span: Span | None  # the first of their rules
    done: bool = False


def own_checkpointing(model: nn.Module) -> list[str]:
    """The paths of the modules whose own gradient checkpointing switch is on."""
    return [name or "<root>" for name, m in model.named_modules() if getattr(m, "gradient_checkpointing", None) is True]


def watch(model: nn.Module, regions: tuple[str, ...], span: Span | None) -> None:
    """Warn (``MP322``) at the first training forward if the model's own checkpointing is on by then."""
    if not regions or WATCH_ATTR in model.__dict__:
        return
    if not any(hasattr(m, "gradient_checkpointing") for m in model.modules()):
        return  # not a model with Hugging Face's switch
    hook = model.register_forward_pre_hook(_before_forward)
    try:
        model.__dict__[WATCH_ATTR] = _Watch(hook, tuple(regions), span)
    except BaseException:
        hook.remove()
        raise


def unwatch(model: nn.Module) -> None:
    record = model.__dict__.pop(WATCH_ATTR, None)
    if isinstance(record, _Watch):
        record.hook.remove()


def _before_forward(model: nn.Module, args: Any) -> None:
    # A plain function looking the record up, so that a deep copy or a loaded pickle runs its own.
    record = model.__dict__.get(WATCH_ATTR)
    if not isinstance(record, _Watch) or not (model.training and torch.is_grad_enabled()):
        return
    if torch.compiler.is_compiling():
        # Traced: the switches are read (and guarded), `done` is not: a guard on it would
        # recompile the model at its second call.  Only a model whose switch is on calls out.
        if own_checkpointing(model):
            _look_once(model, record)
        return
    _look_once(model, record)


@torch._disable_dynamo  # torch.compiler.disable that imports Dynamo at the first call, not now (runtime/compiled.py)
def _look_once(model: nn.Module, record: _Watch) -> None:
    """Warn at the first look that finds the model's own checkpointing on; run eagerly even
    under ``torch.compile``, so that ``done`` is a plain flag."""
    if record.done:
        return
    record.done = True
    own = own_checkpointing(model)
    if own:
        warn(MemoplanWarning(_diagnostic(own, record)))  # at the user's line (trainer.train()), not torch's


def _diagnostic(own: list[str], record: _Watch) -> Diagnostic:
    first = record.regions[0]
    return Diagnostic(
        "MP322",
        f"the model's own activation checkpointing (Hugging Face's `gradient_checkpointing` switch) was turned on after the plan was applied (`{own[0]}`"
        + (f" and {len(own) - 1} more" if len(own) > 1 else "")
        + f"), and the plan checkpoints `{first}`"
        + (f" and {len(record.regions) - 1} more" if len(record.regions) > 1 else "")
        + ": layers are recomputed twice",
        record.span,
        "keep one: leave it off (Hugging Face Trainer: `activation_checkpointing=False`, the default, in "
        "its TrainingArguments; before transformers 5 `gradient_checkpointing=False`), so that the plan decides "
        "what is recomputed, or drop the plan's `checkpoint` and `temporal_chunk` rules",
        severity=Severity.WARNING,
    )
