"""Models that fit only sharded (FSDP2): what one rank holds, for ``--shards N`` and ``--optimizer``.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) over ``N`` ranks each rank keeps ``1/N`` of
every parameter, of every gradient (reduce-scattered as backward produces it) and of the
optimizer's state, and runs the whole model on its own batch.  memoplan estimates a rank's step
on fake tensors (:mod:`memoplan.planner.profiling.estimate`) with the gradients counted at ``1/N`` from the
moment each is accumulated, and the parameters of the largest block (an FSDP2 unit, gathered
whole while it runs) added to the peak; the example is the rank's own batch.  What a rank holds
between steps — its parameter shards and optimizer state — is :func:`resident_bytes`.
"""

from __future__ import annotations

import contextvars
import os

from torch import nn

from memoplan.syntax.blocks import OPTIMIZER_STATES

__all__ = ["OPTIMIZERS", "SHARDS", "default_shards", "gathered_bytes", "optimizer_state_bytes", "resident_bytes"]

#: States an optimizer keeps per parameter element, in the parameter's dtype: SGD none (with
#: momentum one, the momentum buffer), Adam and AdamW two (the first and second moments).
OPTIMIZERS = OPTIMIZER_STATES

#: The ranks a step is sharded over while it is estimated (1: not sharded).
SHARDS: contextvars.ContextVar[int] = contextvars.ContextVar("memoplan_shards", default=1)


def default_shards() -> int:
    """``WORLD_SIZE`` when launched by ``torchrun`` (a positive integer), else 1."""
    text = os.environ.get("WORLD_SIZE", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else 1


def _per_rank(nbytes: int, shards: int) -> int:
    return -(-nbytes // shards)  # FSDP2 pads each parameter's shard up: ceil


def optimizer_state_bytes(model: nn.Module, optimizer: str, shards: int = 1) -> int:
    """The optimizer's state one rank keeps (``OPTIMIZERS``, in each parameter's dtype; fp32 and
    an fp32 copy of the parameters with the running step's ``master_weights``), sharded ``1/shards``
    (:func:`memoplan.step.optimizer_state_bytes`)."""
    from memoplan.step import current
    from memoplan.step import optimizer_state_bytes as kept

    step = current()
    return kept(model, optimizer, shards, master_weights=step is not None and step.master_weights)


def resident_bytes(model: nn.Module, optimizer: str, shards: int = 1) -> int:
    """What one rank holds between steps: its share of the parameters and of the optimizer state."""
    params = sum(p.numel() * p.element_size() for p in _unique(model))
    return _per_rank(params, shards) + optimizer_state_bytes(model, optimizer, shards)


def gathered_bytes(model: nn.Module, shards: int) -> int:
    """The parameters one rank gathers whole at once during a sharded step, above its own shards.

    memoplan assumes FSDP2's usual wrapping: ``fully_shard`` on each block (each child of an
    ``nn.ModuleList`` or ``nn.Sequential``) and on the root.  The root's own parameters (those in
    no block: embeddings, a head) stay gathered from its forward through backward (FSDP2 does
    not reshard the root after forward), and two blocks are gathered at once (the one running
    and the next, prefetched in backward).  Each gathered parameter adds its whole size: FSDP2
    all-gathers into a new buffer of the unsharded size while the rank's own shard stays where it
    was (on 2 gloo ranks the meter's peak is the estimate's plus exactly those own shards when
    they were left out).
    """
    if shards <= 1:
        return 0
    blocks = [
        child
        for module in model.modules()
        if isinstance(module, (nn.ModuleList, nn.Sequential))
        for child in module.children()
        if any(True for _ in child.parameters())
    ]
    in_blocks = {id(p) for block in blocks for p in block.parameters()}
    root_own = sum(_bytes(p) for p in _unique(model) if id(p) not in in_blocks)
    largest = sorted((sum(_bytes(p) for p in _unique(b)) for b in blocks), reverse=True)[:2]
    return root_own + sum(largest)


def _bytes(p) -> int:
    return p.numel() * p.element_size()


def _unique(module: nn.Module):
    seen: set[int] = set()
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            yield p
