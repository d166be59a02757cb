"""Planner stage: the save variants of candidate regions -- what ``checkpoint save = [...]`` keeps and costs.

A checkpoint region keeps its input and recomputes everything in backward.  With ``save = [matmul]``
(:mod:`memoplan.runtime.saving`) it also keeps the outputs of the named op families from the
forward and recomputes only the rest: more bytes kept, less recompute, and a smaller transient
(what backward brings back while it replays the region).  Each such variant is a candidate of its
own for the planners (:class:`memoplan.planner.chain.Item` with ``save``), beside the plain
checkpoint of the same module, with figures found here by one forward of the example (gradients
enabled, no backward) watched op by op:

* ``kept``: the bytes of every storage the family's ops create inside the module (its subtree):
  torch's selective checkpointing keeps every one of them, whether backward needs it or not;
* ``overlap``: of those, the storages autograd saves for backward inside the module: a
  recompute need not bring them back, so the variant's transient is the module's saved bytes
  less this;
* ``seconds``: the family's share of the module's op time (each op timed where it runs; on CUDA
  with a synchronisation on each side), so a variant's recompute is the module's forward time
  times the share of everything else.

The forward runs on the model itself inside a :class:`~memoplan.planner.profile.Snapshot`, so
parameters, buffers, module state and the RNG are as they were after it.  Variants of every
non-empty subset of the families a module runs are offered (``matmul``, ``attention``,
``matmul + attention``, ...), less those that cannot pay: keeping at least what the module saves,
or costing no less recompute than the plain checkpoint.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from memoplan.measure import step_device
from memoplan.planner.chain import Item
from memoplan.planner.profile import Snapshot
from memoplan.runtime.saving import saved_ops
from memoplan.specs import Example

__all__ = ["FAMILIES", "OpUse", "op_uses", "variants"]

#: The families a variant may keep, in the order a plan names them (``save = [matmul, attention]``).
FAMILIES: tuple[str, ...] = ("matmul", "attention", "conv")


@dataclass
class OpUse:
    """What one module's forward showed, per op family: output bytes, saved overlap and op time."""

    kept: dict[str, int] = field(default_factory=dict)
    overlap: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    op_seconds: float = 0.0  # every op's time inside the module


def variants(item: Item, use: OpUse | None) -> list[Item]:
    """The save variants of the plain candidate ``item`` worth offering (see the module docstring)."""
    if use is None or item.save or use.op_seconds <= 0:
        return []
    present = [f for f in FAMILIES if use.kept.get(f, 0) > 0]
    found = []
    for k in range(1, len(present) + 1):
        for families in itertools.combinations(present, k):
            kept = item.input_bytes + sum(use.kept[f] for f in families)
            share = min(1.0, sum(use.seconds.get(f, 0.0) for f in families) / use.op_seconds)
            seconds = item.forward_seconds * (1.0 - share)
            if kept >= item.saved_bytes or seconds >= item.forward_seconds:
                continue  # keeps everything it would free, or recomputes no less
            transient = max(0, item.saved_bytes - sum(use.overlap.get(f, 0) for f in families))
            found.append(Item(item.name, item.saved_bytes, kept, seconds, transient, tuple(families)))
    return found


def op_uses(model: nn.Module, example: Example, names: Iterable[str]) -> dict[str, OpUse]:
    """Per module at ``names``: its :class:`OpUse` over one forward of ``example`` (gradients on)."""
    wanted = [n for n in dict.fromkeys(names) if n]
    modules = dict(model.named_modules())
    device = step_device(model, example.args, example.kwargs)
    watch = _Watch({n: modules[n] for n in wanted if n in modules}, device)
    with Snapshot(model, example, device), watch, torch.enable_grad():
        output = model(*example.args, **dict(example.kwargs))
        del output
    return watch.uses


class _Watch(TorchDispatchMode):
    """Module hooks keep the stack of watched modules running; each op is timed and its outputs
    charged to every module on the stack; a saved-tensor hook charges what autograd saves."""

    def __init__(self, modules: Mapping[str, nn.Module], device: torch.device) -> None:
        super().__init__()
        self.modules = modules
        self.sync = device.type == "cuda"
        self.stack: list[str] = []
        self.uses = {name: OpUse() for name in modules}
        self.made: dict[str, dict[int, tuple[str, int]]] = {name: {} for name in modules}  # storage -> (family, bytes)
        self.saved: dict[str, set[int]] = {name: set() for name in modules}
        self.keep: list[Any] = []  # storages seen, alive for the pass so their ids stay theirs
        self.families = {f: saved_ops((f,)) for f in FAMILIES}
        self.handles: list[Any] = []
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def __enter__(self) -> _Watch:
        for name, module in self.modules.items():
            self.handles.append(module.register_forward_pre_hook(lambda m, a, n=name: self.stack.append(n)))
            self.handles.append(module.register_forward_hook(lambda m, a, o, n=name: self._pop(n), always_call=True))
        self.hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc_info: Any) -> None:
        super().__exit__(*exc_info)
        self.hooks.__exit__(*exc_info)
        for handle in self.handles:
            handle.remove()
        for name, use in self.uses.items():
            for key, (family, nbytes) in self.made[name].items():
                use.kept[family] = use.kept.get(family, 0) + nbytes
                if key in self.saved[name]:
                    use.overlap[family] = use.overlap.get(family, 0) + nbytes
        self.keep.clear()

    def _pop(self, name: str) -> None:
        if self.stack and self.stack[-1] == name:
            self.stack.pop()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.stack and tensor.layout is torch.strided:
            storage = tensor.untyped_storage()
            self.keep.append(storage)
            for name in set(self.stack):
                self.saved[name].add(id(storage))
        return tensor

    def __torch_dispatch__(self, func, types, args: Sequence[Any] = (), kwargs=None):
        if not self.stack:
            return func(*args, **(kwargs or {}))
        if self.sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        if self.sync:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        packet = getattr(func, "overloadpacket", func)
        family = next((f for f, ops in self.families.items() if packet in ops), None)
        for name in set(self.stack):
            use = self.uses[name]
            use.op_seconds += seconds
            if family is None:
                continue
            use.seconds[family] = use.seconds.get(family, 0.0) + seconds
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.layout is torch.strided:
                    storage = t.untyped_storage()
                    self.keep.append(storage)
                    self.made[name].setdefault(id(storage), (family, storage.nbytes()))
        return out
