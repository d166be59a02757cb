"""Resolve stage, with an example input: a training model that returns a cache its regions write.

A transformers model with ``use_cache=True`` (GPT-2's and Llama's default configuration)
passes a ``DynamicCache`` to every layer and returns it: in training, every layer's keys
and values stay alive as long as the output does, for nothing (Hugging Face's own gradient
checkpointing turns ``use_cache`` off for that reason).  A plan's regions recompute those
layers; the cache they write is memory the plan cannot save.

:func:`returned_cache` runs the unplanned model once (a copy, without grad, the RNG state
kept) with the example and warns (``MP327``) at the first region rule whose module was
given a cache the model returned: the bytes the cache holds, and that ``use_cache=False``
frees them.  ``check`` (with an example), ``verify`` and ``plan`` call it; ``apply`` warns
at run time (``MP416``, :mod:`memoplan.runtime.checkpoint`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from memoplan.diagnostics import Diagnostic, Severity, Span
from memoplan.ir import ModulePlan, ResolvedPlan
from memoplan.runtime.argstate import cache_bytes, is_cache, reachable
from memoplan.syntax import ast

__all__ = ["returned_cache"]


def returned_cache(
    resolved: ResolvedPlan,
    model: nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    plan: ast.Plan | None = None,
) -> list[Diagnostic]:
    """``[MP327]`` when ``model``, in training, returns a cache that a region of ``resolved`` writes."""
    regions = [m for m in resolved.modules if m.changes_forward]
    if not model.training or not regions:
        return []
    copied = copy.deepcopy(model)
    modules = dict(copied.named_modules())
    given: dict[int, list[ModulePlan]] = {}

    def look(region: ModulePlan):
        def hook(module, call_args, call_kwargs):
            for value in (*call_args, *call_kwargs.values()):
                if is_cache(value):
                    given.setdefault(id(value), []).append(region)

        return hook

    handles = [
        modules[m.path].register_forward_pre_hook(look(m), with_kwargs=True) for m in regions if m.path in modules
    ]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            output = copied(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException:  # the model or example failed (SystemExit too): the step reports it (MP504, MP411)
        return []
    finally:
        for handle in handles:
            handle.remove()
    caches = [c for c in reachable(output) if is_cache(c) and id(c) in given]
    if not caches:
        return []
    held = sum(cache_bytes(c) for c in caches)
    first = min((r for c in caches for r in given[id(c)]), key=lambda m: (_origin(m).line, m.path))
    writers = {r.path for c in caches for r in given[id(c)]}
    return [_diagnostic(first, len(writers), held, type(caches[0]).__name__, plan)]


def _diagnostic(first: ModulePlan, writers: int, held: int, kind: str, plan: ast.Plan | None) -> Diagnostic:
    others = f" and {writers - 1} more region{'s' if writers > 2 else ''}" if writers > 1 else ""
    return Diagnostic(
        "MP327",
        f"in training, the model returns a {kind} that the plan's regions write (`{first.path}`{others}): "
        f"it holds {_size(held)} of keys and values with the example, alive as long as the "
        "output, which no plan can save",
        _span(first, plan),
        "train with `use_cache=False` (`model.config.use_cache = False`, or pass `use_cache=False` to the "
        "forward), as Hugging Face's own gradient checkpointing does: that frees them",
        Severity.WARNING,
    )


def _size(n: int) -> str:
    return f"{n} B ({n / 2**20:.1f} MiB)" if n >= 2**20 else f"{n} B ({n / 2**10:.1f} KiB)"


def _span(region: ModulePlan, plan: ast.Plan | None) -> Span | None:
    origin = _origin(region)
    if origin is None:
        return None
    if plan is not None:
        for rule in plan.rules:
            if rule.span.line == origin.line and rule.span.file == origin.file:
                return rule.span
    return Span(origin.file, origin.line, 1, origin.line, 2)


def _origin(region: ModulePlan):
    action = region.checkpoint or region.compress or region.temporal_chunk
    return action.origin if action is not None else None
