"""Planner stage: the save variants of candidate regions -- what ``checkpoint save = [...]`` keeps and costs.

A checkpoint region keeps its input and recomputes everything in backward.  With ``save = [matmul]``
(:mod:`memoplan.runtime.saving`) it also keeps the outputs of the named op families from the
forward and recomputes only the rest: more bytes kept, less recompute, and a smaller transient
(what backward brings back while it replays the region).  Each such variant is a candidate of its
own for the planners (:class:`memoplan.planner.search.chain.Item` with ``save``), beside the plain
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

The forward runs on the model itself inside a :class:`~memoplan.planner.profiling.profile.Snapshot`, so
parameters, buffers, module state and the RNG are as they were after it.  Variants of every
non-empty subset of the families a module runs are offered (``matmul``, ``attention``,
``matmul + attention``, ...), less those that cannot pay: keeping at least what the module saves,
or costing no less recompute than the plain checkpoint.

Finer variants choose op by op (:func:`cut_variants`).  The same forward records each op of a
family by its place in the module's forward (``matmul_3``, the selector ``save`` accepts, see
:mod:`memoplan.runtime.saving`): its output bytes, saved overlap and time.  A region that keeps some
ops' outputs replays every other op in backward (eager recompute reruns the forward's code, so no
op is spared because its consumers are kept): the recompute of a save set is the module's op time
less the kept ops' time, additive over ops.  The cut that keeps at most ``cap`` bytes and
recomputes least is then a 0/1 knapsack (bytes against op time), solved exactly as its Pareto
frontier (every set no other beats in both bytes and time) and read at a few byte caps, a quarter,
a half and three quarters of what keeping every such op would take.  Each distinct set there,
other than a whole family's, is offered like the family variants.
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
from torch.utils.flop_counter import flop_registry

from memoplan.measure import step_device
from memoplan.planner.profiling.profile import Snapshot
from memoplan.planner.search.chain import Item
from memoplan.runtime.saving import saved_ops
from memoplan.specs import Example

__all__ = ["FAMILIES", "OpUse", "cut_variants", "op_uses", "pareto", "variants"]

#: The families a variant may keep, in the order a plan names them (``save = [matmul, attention]``).
FAMILIES: tuple[str, ...] = ("matmul", "attention", "conv")

#: The byte caps the cut variants are read at, as shares of keeping every recorded op's output.
CUT_CAPS: tuple[float, ...] = (0.25, 0.5, 0.75)

#: Over this many recorded ops the frontier is read off the ops by time per byte (a greedy order).
EXACT_OPS = 20


@dataclass
class OpUse:
    """What one module's forward showed, per op family: output bytes, saved overlap and op time."""

    kept: dict[str, int] = field(default_factory=dict)
    overlap: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    op_seconds: float = 0.0  # every op's time inside the module
    op_count: int = 0  # the ops run inside the module (each pays a save variant's decision: regioncost)
    # Per op by its place (``matmul_3``), in the order the forward ran them: bytes, overlap, time
    # (the family's measured time shared by FLOPs where every op of it has a FLOP count), FLOPs.
    ops: dict[str, list[float]] = field(default_factory=dict)
    # Ops whose output a later op of the forward wrote in place (an in-place activation, say):
    # torch's selective checkpointing refuses to replay a region that kept such an output, so no
    # variant keeps them.
    mutated: set[str] = field(default_factory=set)


def variants(item: Item, use: OpUse | None, per_op: float = 0.0) -> list[Item]:
    """The save variants of the plain candidate ``item`` worth offering (see the module docstring).

    ``per_op``: what each op of a region that saves costs beyond a plain region's (torch's selective
    checkpointing decides every op, in forward and in the replay:
    :func:`memoplan.planner.profiling.regioncost.save_op_seconds`), charged to every variant."""
    if use is None or item.save or use.op_seconds <= 0:
        return []
    deciding = use.op_count * per_op
    spoilt = {op.rpartition("_")[0] for op in use.mutated}
    present = [f for f in FAMILIES if use.kept.get(f, 0) > 0 and f not in spoilt]
    found = []
    for k in range(1, len(present) + 1):
        for families in itertools.combinations(present, k):
            kept = item.input_bytes + sum(use.kept[f] for f in families)
            share = min(1.0, sum(use.seconds.get(f, 0.0) for f in families) / use.op_seconds)
            seconds = item.forward_seconds * (1.0 - share) + deciding
            if kept >= item.saved_bytes or seconds >= item.forward_seconds:
                continue  # keeps everything it would free, or recomputes no less
            transient = max(0, item.saved_bytes - sum(use.overlap.get(f, 0) for f in families))
            found.append(Item(item.name, item.saved_bytes, kept, seconds, transient, tuple(families)))
    return found + cut_variants(item, use, per_op)


def pareto(ops: Sequence[tuple[str, int, float]]) -> list[tuple[int, float, tuple[str, ...]]]:
    """Every save set of ``ops`` (name, bytes, seconds) that no other beats, as (bytes, seconds
    spared, names), fewest bytes first: exact up to :data:`EXACT_OPS` ops (each set extends a
    frontier set, and only frontier sets are kept), else the prefixes of the ops by time per byte."""
    points: list[tuple[int, float, tuple[str, ...]]] = [(0, 0.0, ())]
    if len(ops) > EXACT_OPS:
        order = sorted(ops, key=lambda op: (-op[2] / max(op[1], 1), op[0]))
        total, spared = 0, 0.0
        for name, nbytes, seconds in order:
            total, spared = total + nbytes, spared + seconds
            points.append((total, spared, points[-1][2] + (name,)))
        return points
    for name, nbytes, seconds in ops:
        grown = points + [(b + nbytes, t + seconds, names + (name,)) for b, t, names in points]
        grown.sort(key=lambda p: (p[0], -p[1], p[2]))
        points = []
        for point in grown:
            if not points or point[1] > points[-1][1]:
                points.append(point)
    return points


def cut_variants(item: Item, use: OpUse, per_op: float = 0.0) -> list[Item]:
    """The op-by-op save variants of ``item`` (see the module docstring): the least-recompute set
    within each of :data:`CUT_CAPS`, but sets that keep whole families (offered already);
    ``per_op`` as :func:`variants` charges it."""
    ops = [
        (name, int(entry[0]), entry[2])
        for name, entry in use.ops.items()
        if entry[0] > 0 and entry[2] > 0 and name not in use.mutated
    ]
    if len(ops) < 2 or use.op_seconds <= 0:
        return []
    frontier, total = pareto(ops), sum(op[1] for op in ops)
    chosen: list[tuple[str, ...]] = []
    for cap in CUT_CAPS:
        names = max((p for p in frontier if p[0] <= cap * total), key=lambda p: (p[1], -p[0]))[2]
        if names and names not in chosen:
            chosen.append(names)
    found = []
    for names in chosen:
        save = _selectors(names, use)
        if all(s in FAMILIES for s in save):
            continue
        kept = item.input_bytes + sum(int(use.ops[n][0]) for n in names)
        share = min(1.0, sum(use.ops[n][2] for n in names) / use.op_seconds)
        seconds = item.forward_seconds * (1.0 - share) + use.op_count * per_op
        if kept >= item.saved_bytes or seconds >= item.forward_seconds:
            continue
        transient = max(0, item.saved_bytes - sum(int(use.ops[n][1]) for n in names))
        found.append(Item(item.name, item.saved_bytes, kept, seconds, transient, save))
    return found


def _selectors(names: Sequence[str], use: OpUse) -> tuple[str, ...]:
    """``names`` as ``save`` writes them: a family whose every recorded op is in, else its ops by
    place, families in :data:`FAMILIES` order and ops in their forward's order."""
    chosen, found = set(names), []
    for family in FAMILIES:
        mine = [n for n in use.ops if n.rpartition("_")[0] == family]
        if mine and all(n in chosen for n in mine):
            found.append(family)
        else:
            found += [n for n in mine if n in chosen]
    return tuple(found)


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


def _flops(func, args: Sequence[Any], kwargs, out) -> int:
    """The FLOPs of one op by torch's counter's formulas, 0 where it has none."""
    formula = flop_registry.get(getattr(func, "overloadpacket", func))
    if formula is None:
        return 0
    try:
        return int(formula(*args, **(kwargs or {}), out_val=out))
    except Exception:  # noqa: BLE001  a count only steadies the times; without one the time stands
        return 0


def _share_by_flops(use: OpUse) -> None:
    """One op's time, measured once on a busy machine, is noisy; a family's total much less so.
    Where every op of a family has a FLOP count, its ops share the family's time by FLOPs."""
    for family in FAMILIES:
        mine = [entry for name, entry in use.ops.items() if name.rpartition("_")[0] == family]
        flops = sum(entry[3] for entry in mine)
        if mine and flops > 0 and all(entry[3] > 0 for entry in mine):
            total = sum(entry[2] for entry in mine)
            for entry in mine:
                entry[2] = total * entry[3] / flops


def _written(func, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    """The tensors ``func`` writes in place (its schema's mutable arguments, ``out=`` included)."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    found = []
    for index, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[index] if index < len(args) else kwargs.get(argument.name)
        if isinstance(value, torch.Tensor) and value.layout is torch.strided:
            found.append(value)
    return found


class _Watch(TorchDispatchMode):
    """Module hooks keep the stack of watched modules running; each op is timed and its outputs
    charged to every module on the stack; a saved-tensor hook charges what autograd saves."""

    def __init__(self, modules: Mapping[str, nn.Module], device: torch.device) -> None:
        super().__init__()
        self.modules = modules
        self.sync = device.type == "cuda"
        self.stack: list[str] = []
        self.uses = {name: OpUse() for name in modules}
        # storage -> (family, op by its place, bytes)
        self.made: dict[str, dict[int, tuple[str, str, int]]] = {name: {} for name in modules}
        self.places: dict[str, dict[str, int]] = {name: {} for name in modules}  # family -> ops met in this run
        self.saved: dict[str, set[int]] = {name: set() for name in modules}
        self.producers: dict[int, list[tuple[str, str]]] = {}  # storage -> (module, op) that made it
        self.keep: list[Any] = []  # storages seen, alive for the pass so their ids stay theirs
        self.families = {f: saved_ops((f,)) for f in FAMILIES}
        self.handles: list[Any] = []
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def __enter__(self) -> _Watch:
        for name, module in self.modules.items():
            self.handles.append(module.register_forward_pre_hook(lambda m, a, n=name: self._push(n)))
            self.handles.append(module.register_forward_hook(lambda m, a, o, n=name: self._pop(n), always_call=True))
        self.hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc_info: Any) -> None:
        super().__exit__(*exc_info)
        self.hooks.__exit__(*exc_info)
        for handle in self.handles:
            handle.remove()
        for name, use in self.uses.items():
            for key, (family, op, nbytes) in self.made[name].items():
                use.kept[family] = use.kept.get(family, 0) + nbytes
                use.ops[op][0] += nbytes
                if key in self.saved[name]:
                    use.overlap[family] = use.overlap.get(family, 0) + nbytes
                    use.ops[op][1] += nbytes
            _share_by_flops(use)
        self.keep.clear()

    def _push(self, name: str) -> None:
        self.stack.append(name)
        self.places[name].clear()  # a region counts its ops afresh in every run

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
        for written in _written(func, args, kwargs or {}):  # inside a watched module or after it
            for name, op in self.producers.get(id(written.untyped_storage()), ()):
                self.uses[name].mutated.add(op)
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
            use.op_count += 1
            if family is None:
                continue
            use.seconds[family] = use.seconds.get(family, 0.0) + seconds
            place = self.places[name][family] = self.places[name].get(family, 0) + 1
            op = f"{family}_{place}"
            entry = use.ops.setdefault(op, [0, 0, 0.0, 0])
            entry[2] += seconds
            entry[3] += _flops(func, args, kwargs, out)
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.layout is torch.strided:
                    storage = t.untyped_storage()
                    self.keep.append(storage)
                    if id(storage) not in self.made[name]:
                        self.made[name][id(storage)] = (family, op, storage.nbytes())
                        self.producers.setdefault(id(storage), []).append((name, op))
        return out
