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
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ["OP_FAMILIES", "saved_ops", "saving_contexts"]

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


def saving_contexts(families: Sequence[str]):
    """A fresh (forward, recompute) context pair keeping the outputs of ``families``' ops."""
    ops = saved_ops(tuple(families))

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        packet = getattr(op, "overloadpacket", op)
        return CheckpointPolicy.MUST_SAVE if packet in ops else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
