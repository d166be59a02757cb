"""Resolve stage, with an example input: checks that need the shapes the modules really see.

``temporal_chunk N dim D`` cannot be checked against a model alone: the chunked
module's input shape is known only when the model runs.  With an example (``memoplan
check`` given one), :func:`check_example` runs the unplanned model once without grad,
looks at each chunked module's chunked arguments as it is called, and reports a
``dim`` past their dimensions at the rule (``MP324``) instead of at run time
(``MP408``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from memoplan.diagnostics import Diagnostic
from memoplan.resolver.bind import analyse
from memoplan.syntax import ast

__all__ = ["check_example"]


class _Stop(Exception):
    """Ends the example's forward at the first problem found."""


def check_example(plan: ast.Plan, model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Diagnostic]:
    """Diagnostics for ``plan``'s chunked modules given ``model(*args, **kwargs)``; empty if none.

    Runs one forward without grad only when the plan chunks something, so module state
    (running statistics, neuron potentials) advances as in one forward: pass a model
    that is not trained afterwards.  A forward that fails for another reason finds nothing
    here (``verify`` reports it).
    """
    res = analyse(plan, model)
    chunks: dict[str, ast.TemporalChunk] = {}
    for path, decisions in res.decisions.items():
        if "temporal_chunk" in decisions:
            policy = decisions["temporal_chunk"].winner.policy
            assert isinstance(policy, ast.TemporalChunk), "the temporal_chunk aspect's winner is one"
            chunks[path] = policy
    if not chunks:
        return []
    found: list[Diagnostic] = []

    def look(path: str, policy: ast.TemporalChunk):
        def hook(module, call_args, call_kwargs):
            for key in policy.args or (0,):
                value = call_args[key] if isinstance(key, int) and key < len(call_args) else call_kwargs.get(key)
                if isinstance(value, torch.Tensor) and not -value.dim() <= policy.dim < value.dim():
                    found.append(_past_dims(path, policy, key, value))
                    raise _Stop

        return hook

    handles = [
        res.index.module(path).register_forward_pre_hook(look(path, policy), with_kwargs=True)
        for path, policy in chunks.items()
    ]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    except _Stop:
        pass
    except Exception:  # the model or example failed: not this check's finding
        pass
    finally:
        for handle in handles:
            handle.remove()
    return found


def _past_dims(path: str, policy: ast.TemporalChunk, key: int | str, value: torch.Tensor) -> Diagnostic:
    argument = f"argument {key}" if isinstance(key, int) else f"argument `{key}`"
    return Diagnostic(
        "MP324",
        f"`temporal_chunk {policy.chunks} dim {policy.dim}` on `{path}`: with the example, its {argument} has "
        f"shape {tuple(value.shape)}, {value.dim()} dimension{'s' if value.dim() != 1 else ''}, so there is "
        f"no dim {policy.dim}",
        policy.span,
        f"write the time axis as `dim` (0 to {value.dim() - 1} for this input)"
        if value.dim()
        else "chunk an argument that has a time axis (`args = [...]`)",
    )
