"""What a profile's probe and timer see of one step, through hooks on every module: saved bytes
(by the innermost running module, each storage once), input and output bytes, binary inputs,
call order and forward time; and one module's row of a profile from it
(:mod:`memoplan.planner.profiling.profile` runs the steps)."""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from memoplan.planner.profiling.schema import ModuleProfile
from memoplan.runtime import codecs
from memoplan.runtime.install import qualified_type_name


@dataclass
class Record:
    calls: int = 0
    order: int | None = None
    saved_bytes: int = 0
    input_bytes: int = 0
    input_numel: int = 0
    packed_bytes: int = 0
    output_bytes: int = 0
    binary: bool = False  # a module that never ran has nothing to compress
    kept_bytes: int = 0


class _Hooks:
    """Forward pre/post hooks on every module of a model, removed on exit."""

    def __init__(self, model: nn.Module) -> None:
        self.modules = [m for _, m in model.named_modules()]
        self._handles: list[Any] = []

    def __enter__(self) -> _Hooks:
        try:
            for module in self.modules:
                self._handles.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._post, with_kwargs=True, always_call=True))
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._remove()

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        raise NotImplementedError

    def _post(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        raise NotImplementedError


class Probe(_Hooks):
    """Saved bytes (by innermost running module), input/output bytes, binary inputs, order."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        super().__init__(model)
        self.records: dict[int, Record] = {}
        self.unattributed = 0
        self._stack: list[int] = []
        self._calls = 0
        # Storages already counted this step: id -> weak reference (the id alone may be reused).
        self._seen: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._saver: dict[int, int] = {}  # storage id -> the module that saved it
        self._state_ptrs = {
            self._storage_key(s)
            for t in (*model.parameters(), *model.buffers())
            if t.layout is torch.strided and self._storage_key(s := t.untyped_storage())
        }
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def __enter__(self) -> Probe:
        super().__enter__()
        self._saved_hooks.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._saved_hooks.__exit__(*exc_info)
        finally:
            super().__exit__(*exc_info)
            self._seen.clear()

    # Overridden by the estimate's probe (memoplan.planner.profiling.estimate), whose tensors hold no data.
    def _storage_key(self, storage: torch.UntypedStorage) -> int:
        return storage.data_ptr()

    def _is_binary(self, tensor: torch.Tensor) -> bool:
        return codecs.is_binary(tensor)

    def kept_by(self, output: Any) -> None:
        """Count, per module, the saved storages ``output`` still holds (a cache, a saved output)."""
        for storage in _held_storages(output):
            key, ref = self._saver.get(id(storage)), self._seen.get(id(storage))
            if key is not None and ref is not None and ref() is storage:
                self.records[key].kept_bytes += storage.nbytes()

    def _pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        record = self.records.get(id(module))
        if record is None:
            record = self.records[id(module)] = Record(calls=1, order=self._calls, binary=True)
        else:
            record.calls += 1
        self._calls += 1
        tensors = tensors_in((args, kwargs))
        for t in tensors:
            record.input_bytes += tensor_bytes(t)
            record.input_numel += t.numel()
            record.packed_bytes += codecs.estimate_nbytes("bit", t.numel(), t.dtype)
        # Every call's tensor inputs must be binary; a call with none makes it not compressible.
        binary = bool(tensors) and all(t.layout is torch.strided and self._is_binary(t) for t in tensors)
        record.binary = record.binary and binary
        self._stack.append(id(module))

    def _post(self, module: nn.Module, args: Any, kwargs: Any, output: Any = None) -> None:
        if self._stack and self._stack[-1] == id(module):
            self._stack.pop()
        record = self.records.get(id(module))
        if record is not None:
            record.output_bytes += sum(tensor_bytes(t) for t in tensors_in(output))

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.layout is torch.strided:
            storage = tensor.untyped_storage()
            ptr = self._storage_key(storage)
            if ptr and ptr in self._state_ptrs:
                return tensor  # a parameter or buffer (or a view of one)
            ref = self._seen.get(id(storage))
            if ref is not None and ref() is storage:
                return tensor
            self._seen[id(storage)] = weakref.ref(storage)
            nbytes = storage.nbytes()
        else:
            nbytes = tensor_bytes(tensor)
        if self._stack:
            self.records[self._stack[-1]].saved_bytes += nbytes
            if tensor.layout is torch.strided:
                self._saver[id(storage)] = self._stack[-1]
        else:
            self.unattributed += nbytes
        return tensor


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _held_storages(value: Any) -> list[torch.UntypedStorage]:
    """Each distinct storage a model's output holds: in containers and in plain objects' attributes.

    A returned cache (transformers' ``DynamicCache``: layers holding ``keys``/``values``) is an
    object pytree does not open, so attributes are walked too (modules are not: their parameters
    are not activations).  Every object is visited once.
    """
    storages: dict[int, torch.UntypedStorage] = {}
    seen: set[int] = set()
    todo = [value]
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, (nn.Module, str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            if item.layout is torch.strided:
                storages.setdefault(id(item.untyped_storage()), item.untyped_storage())
        elif isinstance(item, Mapping):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            todo.extend(vars(item).values())
    return list(storages.values())


class Timer(_Hooks):
    """Per-module forward time (sum over calls) and whole-step time of one step."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        super().__init__(model)
        self._cuda = device.type == "cuda"
        self._device = device
        self._open: dict[int, list[Any]] = {}
        self._spans: list[tuple[int, Any, Any]] = []
        self._start: Any = None
        self._end: Any = None

    def _now(self) -> Any:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def __enter__(self) -> Timer:
        super().__enter__()
        if self._cuda:
            torch.cuda.synchronize(self._device)
        self._start = self._now()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._end = self._now()
            if self._cuda:
                torch.cuda.synchronize(self._device)
        finally:
            super().__exit__(*exc_info)

    def _pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        self._open.setdefault(id(module), []).append(self._now())

    def _post(self, module: nn.Module, args: Any, kwargs: Any, output: Any = None) -> None:
        starts = self._open.get(id(module))
        if starts:
            self._spans.append((id(module), starts.pop(), self._now()))

    def _elapsed(self, start: Any, end: Any) -> float:
        if self._cuda:
            return start.elapsed_time(end) / 1000.0
        return end - start

    def result(self) -> tuple[dict[int, float], float]:
        per_module: dict[int, float] = {}
        for key, start, end in self._spans:
            per_module[key] = per_module.get(key, 0.0) + self._elapsed(start, end)
        return per_module, self._elapsed(self._start, self._end)


def tensors_in(tree: Any) -> list[torch.Tensor]:
    """Distinct tensors among the leaves of a nested structure, in order."""
    seen: set[int] = set()
    out = []
    for leaf in pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and id(leaf) not in seen:
            seen.add(id(leaf))
            out.append(leaf)
    return out


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def unique_storages(tensors: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
    seen: set[int] = set()
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            yield t


def qualname(cls: type) -> str:
    return qualified_type_name(cls)  # the plan's class identity: never a private module name or a path


def module_profile(name: str, module: nn.Module, record: Record, seconds: float, binary: bool) -> ModuleProfile:
    """One module's row of a profile: what ``record`` saw of its calls, ``seconds`` a call
    (forward and recompute alike), its input packed when ``binary`` says it holds only 0 and 1."""
    return ModuleProfile(
        name=name,
        type=qualname(type(module)),
        children=len(module._modules),
        is_sequential=isinstance(module, nn.Sequential),
        is_module_list=isinstance(module, nn.ModuleList),
        calls=record.calls,
        order=record.order,
        forward_seconds=seconds,
        recompute_seconds=seconds,
        saved_bytes=record.saved_bytes,
        input_bytes=record.input_bytes,
        input_numel=record.input_numel,
        packed_input_bytes=record.packed_bytes if binary else record.input_bytes,
        output_bytes=record.output_bytes,
        input_binary=binary,
        kept_bytes=record.kept_bytes,
    )
