"""Runtime stage: op-level saving inside a checkpoint region (``checkpoint save = [matmul, attention]``).

A checkpoint region normally keeps only its input and recomputes everything in backward.  With
``save``, the outputs of the named op families are kept from the forward (torch's selective
activation checkpointing, :func:`torch.utils.checkpoint.create_selective_checkpoint_contexts`)
and every other op is recomputed: the expensive ops (matrix products, attention kernels,
convolutions) run once, the cheap ones between them (activations, norms, dropout masks from the
replayed RNG) twice.  The kept outputs are the very tensors the forward computed, so gradients
are bit-identical to the unplanned step's, as with every checkpoint.

The families (``memoplan.syntax.ast.SAVEABLE_OPS``), as the aten ops autograd sees:

=============== ================================================================================
``matmul``      ``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_int_mm`` (``nn.Linear``, ``@``, ``matmul``)
``attention``   the fused ``scaled_dot_product_attention`` kernels (flash, efficient, cuDNN, CPU flash)
``conv``        ``convolution`` (every ``nn.ConvNd``, ``F.conv*``)
=============== ================================================================================

A selector may also name one op of a family by its place in the region's forward, counted from 1
in the order the ops run: ``matmul_3`` is the third matrix product the region computes,
``attention_1`` its first attention kernel (each family counted on its own, afresh in every run of
the region).  The planner writes such selectors for the save sets it chooses op by op
(:mod:`memoplan.planner.search.opsave`): ``save = [attention, matmul_4]`` keeps every attention output
and the fourth matmul's.  The recompute replays the same forward, so it meets the same ops in the
same order and reuses exactly the outputs the forward kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ["OP_FAMILIES", "family_of", "parse_selector", "saved_ops", "saving_contexts", "selectors"]

aten = torch.ops.aten

#: Family name -> aten overload packets (an op missing from this torch build is left out).
OP_FAMILIES: dict[str, tuple[str, ...]] = {
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "_int_mm"),
    "attention": (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    ),
    "conv": ("convolution", "cudnn_convolution", "mkldnn_convolution", "_convolution"),
}


@cache
def saved_ops(families: tuple[str, ...]) -> frozenset:
    """The aten overload packets of ``families`` (``ValueError`` for a name not in :data:`OP_FAMILIES`)."""
    found = set()
    for family in families:
        if family not in OP_FAMILIES:
            raise ValueError(f"unknown op family {family!r}; known: {', '.join(sorted(OP_FAMILIES))}")
        for name in OP_FAMILIES[family]:
            packet = getattr(aten, name, None)
            if packet is not None:
                found.add(packet)
    return frozenset(found)


def parse_selector(name: str) -> tuple[str, int | None] | None:
    """``matmul`` -> ``("matmul", None)``, ``matmul_3`` -> ``("matmul", 3)``; None for a name
    that is neither a family nor a family's op by its place (``_1`` and up)."""
    if name in OP_FAMILIES:
        return name, None
    family, _, place = name.rpartition("_")
    if family in OP_FAMILIES and place.isdigit() and place[0] != "0":
        return family, int(place)
    return None


def selectors(save: Sequence[str]) -> tuple[frozenset[str], dict[str, frozenset[int]]]:
    """The whole families ``save`` names and, per other family, the places of the ops it names
    (``ValueError`` for a selector :func:`parse_selector` refuses)."""
    whole: set[str] = set()
    places: dict[str, set[int]] = {}
    for name in save:
        parsed = parse_selector(name)
        if parsed is None:
            raise ValueError(f"unknown op selector {name!r}; the families are: {', '.join(sorted(OP_FAMILIES))}")
        family, place = parsed
        if place is None:
            whole.add(family)
        else:
            places.setdefault(family, set()).add(place)
    return frozenset(whole), {f: frozenset(p) for f, p in places.items() if f not in whole}


@cache
def _family_by_packet() -> dict:
    return {packet: family for family in OP_FAMILIES for packet in saved_ops((family,))}


def family_of(op) -> str | None:
    """The family of the aten op (or overload packet) ``op``, None if it is in none."""
    return _family_by_packet().get(getattr(op, "overloadpacket", op))


def saving_contexts(save: Sequence[str]):
    """A fresh (forward, recompute) context pair keeping the outputs of the ops ``save`` selects:
    whole families and single ops by their place in the region's forward (:func:`selectors`)."""
    whole, places = selectors(save)
    counts: dict[tuple[bool, str], int] = {}  # (recomputing?, family) -> ops of it met so far

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        family = family_of(op)
        if family is None:
            return CheckpointPolicy.PREFER_RECOMPUTE
        if family in whole:
            return CheckpointPolicy.MUST_SAVE
        key = (bool(getattr(ctx, "is_recompute", False)), family)
        counts[key] = place = counts.get(key, 0) + 1
        if place in places.get(family, ()):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
