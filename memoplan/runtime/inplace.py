"""Runtime stage: what a region may not do to its inputs, reported as diagnostics naming the plan.

* A region that overwrites one of its own inputs in place (``ReLU(inplace=True)``
  as the region's first module, ``x.mul_(2)`` in its forward) would recompute in
  backward from the overwritten values; torch only notices then, with a version
  error that names neither the module nor the op.  The resolver refuses the cases
  it can see (``MP323``); :func:`unchanged` catches the rest as the region's forward
  returns (``MP407``).
* ``temporal_chunk ... dim d`` past the input's dimensions (``MP408``): the rule's
  ``file:line``, the module and the input's shape, instead of an ``IndexError``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from torch import nn

from memoplan.diagnostics import Diagnostic, PlanError

__all__ = ["check_chunk_dim", "rules_of", "unchanged", "versions"]


def versions(tensors: Sequence[object]) -> list[int | None]:
    """Each tensor's version counter (None for anything else), to compare after the forward."""
    return [t._version if isinstance(t, torch.Tensor) else None for t in tensors]


def unchanged(tensors: Sequence[object], before: Sequence[int | None], roots: Sequence[nn.Module], where: str) -> None:
    """Raise ``MP407`` if the region's forward changed one of its input tensors in place."""
    changed = [t for t, v in zip(tensors, before) if v is not None and isinstance(t, torch.Tensor) and t._version != v]
    if not changed:
        return
    modules = [
        f"`{'.'.join(p for p in (where, name) if p)}` ({type(sub).__qualname__}, inplace=True)"
        for root in roots
        for name, sub in root.named_modules()
        if getattr(sub, "inplace", None) is True
    ]
    node = changed[0].grad_fn
    if modules:
        op = "in-place module " + ", ".join(modules[:3])
    elif node is not None:
        op = f"in-place op `{_op_name(type(node).__name__)}`"
    else:
        op = "an in-place op in its forward"
    raise PlanError(
        (
            Diagnostic(
                "MP407",
                f"`{where or type(roots[0]).__qualname__}` overwrote its input in place ({op}); "
                f"its recompute in backward would read the overwritten values (input of shape "
                f"{tuple(changed[0].shape)})",
                help="checkpoint the module that calls it instead, or make the op out of place (e.g. `inplace=False`)",
            ),
        )
    )


def _op_name(node: str) -> str:
    """``ReluBackward0`` -> ``relu_``: the in-place op an autograd node was recorded for."""
    base = re.sub(r"Backward\d*$", "", node)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower() + "_" if base != node else node


def rules_of(module: nn.Module) -> str | None:
    """The plan rules (``file:line``) behind ``module``'s installed forward, or None.

    A generated policy function's docstring ends with the locations of its rules in
    parentheses (memoplan/codegen/emit.py), e.g. ``temporal_chunk 2 dim 0  (p.memplan:3)``.
    """
    forward = module.__dict__.get("forward")
    doc = getattr(getattr(forward, "__func__", None), "__doc__", None) or ""
    found = re.search(r"\(([^()]*:\d+(?:, [^()]*:\d+)*)\)\s*$", doc)
    return found.group(1) if found else None


def check_chunk_dim(module: nn.Module, tensor: torch.Tensor, chunks: int, dim: int, key: int | str, where: str) -> None:
    """Raise ``MP408`` unless ``tensor`` (chunked argument ``key``) has a dimension ``dim``."""
    if not isinstance(tensor, torch.Tensor) or -tensor.dim() <= dim < tensor.dim():
        return
    rules = rules_of(module)
    argument = f"argument {key}" if isinstance(key, int) else f"argument `{key}`"
    raise PlanError(
        (
            Diagnostic(
                "MP408",
                f"`temporal_chunk {chunks} dim {dim}`{f' ({rules})' if rules else ''} on `{where}`: its {argument} "
                f"has shape {tuple(tensor.shape)}, {tensor.dim()} dimension{'s' if tensor.dim() != 1 else ''}, "
                f"so there is no dim {dim}",
                help=f"write the time axis as `dim` (0 to {tensor.dim() - 1} for this input)"
                if tensor.dim()
                else "chunk an argument that has a time axis (`args = [...]`)",
            ),
        )
    )
