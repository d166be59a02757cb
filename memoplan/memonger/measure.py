"""Memonger stage: what a call allocates — the count and bytes of fresh storages its ops return.

An op that writes through ``out=`` returns a storage it was given, which is not an
allocation; any other result with a storage no input has is one.  Memory a kernel
allocates and frees inside itself (a workspace) is not seen, as with
:class:`memoplan.measure.LiveStorageMeter`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class Allocations:
    count: int
    bytes: int


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {_key(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        seen = set()
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                key = _key(tensor)
                if key not in given and key not in seen and tensor.untyped_storage().nbytes():
                    seen.add(key)
                    self.count += 1
                    self.bytes += tensor.untyped_storage().nbytes()
        return out


def _key(tensor: torch.Tensor) -> tuple:
    return (tensor.device.type, tensor.untyped_storage().data_ptr())


def count_allocations(fn: Callable[[], Any]) -> tuple[Allocations, Any]:
    """Run ``fn()`` and count the fresh storages its ops return."""
    with _Counter() as counter:
        result = fn()
    return Allocations(counter.count, counter.bytes), result
