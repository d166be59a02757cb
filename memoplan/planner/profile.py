"""Measure stage: profile one training step per module, as plain data a planner can read.

:func:`profile` runs a few training steps of a model on an example and records,
for every path of ``named_modules()`` (natural order), what a planner needs to
decide where to checkpoint and what to compress; :class:`Profile` is a frozen,
JSON-serialisable record of it.  Planners are pure functions of a profile, so a
profile taken once (or on every rank and :func:`merge`-d) gives the same plan
everywhere.

This module measures; the records themselves, their JSON form, :func:`merge` and
:func:`chain` are the profile schema, :mod:`memoplan.planner.schema` (re-exported here).

Steps (each starts from the same model state and RNG state, see below):

1. **peak** — one clean step under :func:`memoplan.measure.measure_step` (the
   deterministic live-storage meter on CPU, the caching allocator on CUDA): the
   unplanned peak, with no profiling hooks installed.
2. **probe** — one step with forward pre/post hooks on every module and a
   ``torch.autograd.graph.saved_tensors_hooks`` pack hook: saved-activation bytes,
   input/output bytes, binary inputs, execution order.
3. **time** x ``repeats`` — steps with timing hooks only: per-module forward time
   and whole-step time, the median over the repeats (``time.perf_counter`` on
   CPU, CUDA events on GPU).

Attribution of saved activations: every tensor the pack hook sees is
attributed to the *innermost module whose forward is running* when it is saved
(the top of a stack kept by the pre/post hooks; code in the root's own forward
goes to the root ``""``; the loss, outside the model, to
:attr:`Profile.unattributed_saved_bytes`).  Bytes are those of the tensor's
*storage* (a saved view keeps its whole storage alive), and a storage is counted
once per step, by the first module that saves it: when a ReLU saves its output
and the next Linear saves the same tensor as its input, the ReLU is charged and
the Linear is not.  Storages of parameters and buffers are never counted.
:meth:`Profile.subtree_saved_bytes` adds a module's descendants.

A module called several times in one step (a shared block) adds up its calls:
saved, input and output bytes and forward time are sums over calls, ``calls``
says how many, and ``input_binary`` holds only if every call's inputs were
binary.  A module that never runs (an ``nn.ModuleList``, an unused branch) has
zeros, ``calls == 0`` and ``order is None``.

Binary inputs are probed in **train mode** (train-mode dropout rescales spikes to
``1/(1-p)``, which an eval-mode probe would miss): a model whose root is in
training mode is profiled with its modes as they are; a model in eval mode is put
in train mode for the profile (and back afterwards).

The model is left exactly as it was: parameters (identity and ``.grad``),
buffers (identity and values), every module's attributes (so neuron membrane
potentials and counters rebound in ``forward`` come back), state exposed through
:mod:`memoplan.runtime.state`, training flags, the CPU/CUDA and Python ``random``
RNG states, the ``.grad`` of example tensors, and no hooks left behind.  A
forward that modifies a parameter in place cannot be undone without a copy of
every weight; it is detected (version counters) and reported with a warning.
"""

from __future__ import annotations

import contextlib
import copy
import random
import statistics
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from memoplan.measure import LossFn, indexed_device, measure_step, step_device, training_step
from memoplan.planner.schema import (
    FORMAT_VERSION,
    ChainLink,
    ModuleProfile,
    Profile,
    TensorMeta,
    chain,
    default_candidates,
    merge,
    nested_candidates,
    some_names,
)
from memoplan.progress import REPORTER
from memoplan.runtime import codecs
from memoplan.runtime.install import qualified_type_name
from memoplan.runtime.state import get_state, is_stateful, load_state
from memoplan.specs import Example
from memoplan.version import __version__

# The profile's records, JSON, merging and candidate chains live in memoplan.planner.schema; they
# are re-exported here, so ``from memoplan.planner.profile import Profile, chain`` keeps working.
__all__ = [
    "FORMAT_VERSION",
    "ChainLink",
    "ModuleProfile",
    "Profile",
    "Snapshot",
    "TensorMeta",
    "binary_inputs",
    "chain",
    "default_candidates",
    "merge",
    "nested_candidates",
    "on_device",
    "profile",
]


# ---------------------------------------------------------------- profile()


def on_device(
    model: nn.Module, example: Example, device: torch.device | str | None
) -> tuple[nn.Module, Example, torch.device]:
    """``model`` and ``example`` on ``device`` (default: where the step runs now), as deep copies
    when it is another device, and that device (a CUDA one with its index)."""
    here = step_device(model, example.args, example.kwargs)
    target = indexed_device(device) if device is not None else here
    if target != here:
        model = copy.deepcopy(model).to(target)
        example = example.to(target)
    return model, example, target


def _timed_steps(
    model, example: Example, target, restored, bar, repeats: int, loss_fn
) -> tuple[list[dict[int, float]], list[float]]:
    """``repeats`` timed training steps: each module's seconds (by ``id``) and each step's, the
    model restored after each."""
    timings: list[dict[int, float]] = []
    steps: list[float] = []
    for i in range(repeats):
        bar.step(f"time {i + 1}/{repeats}")
        timer = _Timer(model, target)
        with timer:
            training_step(model, example.args, dict(example.kwargs), loss_fn)
        per_module, step = timer.result()
        timings.append(per_module)
        steps.append(step)
        restored.reset()
    return timings, steps


def _module_profiles(model: nn.Module, timings: list[dict[int, float]], found: Probe) -> tuple[ModuleProfile, ...]:
    """Every module's row: its median seconds over the timed steps and what the probe saw."""
    modules = []
    for name, module in model.named_modules():
        key = id(module)
        seconds = float(statistics.median(per_module.get(key, 0.0) for per_module in timings))
        record = found.records.get(key, Record())
        modules.append(module_profile(name, module, record, seconds, record.binary))
    return tuple(modules)


def profile(
    model: nn.Module,
    example: Example | torch.Tensor | Sequence[Any],
    *,
    device: torch.device | str | None = None,
    repeats: int = 3,
    progress: bool = True,
    loss_fn: LossFn | None = None,
    peak_bytes: int | None = None,
    probe: bool = True,
) -> Profile:
    """Profile training steps of ``model`` on ``example``; leave the model as it was.

    ``example`` is an :class:`~memoplan.specs.Example` (a tensor or a tuple of
    positional arguments is accepted too).  ``device`` defaults to the model's
    (its first parameter's, else the example's); naming another device profiles a
    deep copy moved there, so the model itself is never moved.  ``repeats`` timed
    steps give the medians.  ``progress`` draws a bar on stderr.  ``loss_fn`` maps
    the output to the loss (default: the running step's, :func:`memoplan.measure.step_loss`).
    ``peak_bytes``: the unplanned peak found otherwise (on fake tensors, ``memoplan plan``'s
    default): the peak step is not run, and ``peak_method`` says ``fake-tensor``.  ``probe``
    False: no probe step either (every module's bytes are 0: the caller has them from elsewhere).
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, not {repeats!r}")
    model, example, target = on_device(model, as_example(example), device)

    # On CUDA a process's first steps allocate what then stays (cuBLAS workspaces, compiled
    # and autotuned kernels): measured cold, the unplanned peak would carry them, and every
    # budget given as a share of it would be too loose.  One step first, then the peak.
    warm_up = target.type == "cuda"
    bar = _Progress((2 if peak_bytes is None else int(probe)) + repeats + warm_up, enabled=progress)
    with bar, Restored(model, example, target) as restored:
        if warm_up:
            bar.step("warm-up")
            training_step(model, example.args, dict(example.kwargs), loss_fn)
            restored.reset()
        if peak_bytes is None:
            bar.step("peak")
            measured = measure_step(model, example.args, example.kwargs, loss_fn=loss_fn)
            peak, peak_method = measured.peak_bytes, measured.method
            restored.reset()
        else:
            peak, peak_method = peak_bytes, "fake-tensor"

        def probed() -> Probe:
            bar.step("probe")
            probe = Probe(model, target)
            with probe:
                output, _ = training_step(model, example.args, dict(example.kwargs), loss_fn)
                probe.kept_by(output)
                del output
            restored.reset()
            return probe

        # Without the peak step, the first real step is a timed one: it has the fewest Python
        # objects of its own, so a step that does not fit leaves the least behind it.
        probe_first = probed() if peak_bytes is None else None
        timings, steps = _timed_steps(model, example, target, restored, bar, repeats, loss_fn)
        found = probe_first or (probed() if probe else Probe(model, target))

    return Profile(
        modules=_module_profiles(model, timings, found),
        peak_bytes=int(peak),
        peak_method=peak_method,
        step_seconds=float(statistics.median(steps)),
        parameter_bytes=sum(tensor_bytes(p) for p in unique_storages(model.parameters())),
        unattributed_saved_bytes=found.unattributed,
        inputs=input_metas(example),
        device=str(target),
        torch_version=torch.__version__,
        memoplan_version=__version__,
        repeats=repeats,
    )


# ---------------------------------------------------------------- hooks


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

    # Overridden by the estimate's probe (memoplan.planner.estimate), whose tensors hold no data.
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
        tensors = _tensors((args, kwargs))
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
            record.output_bytes += sum(tensor_bytes(t) for t in _tensors(output))

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


class _Timer(_Hooks):
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

    def __enter__(self) -> _Timer:
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


# ---------------------------------------------------------------- leaving the model as it was


class Snapshot:
    """Everything a training step can change in ``model`` and around it; ``restore()`` puts it back.

    Modules' attributes and train/eval modes, parameters (the objects, their ``.grad`` and
    ``requires_grad``), buffers (the tensors and their values), stateful modules' state
    (:mod:`memoplan.runtime.state`), the gradients of the example's tensors, and the torch,
    CUDA and Python RNG states.  As a context manager it restores on exit, exceptions
    included.  Used around profiling steps and around the planner's measured trials.
    """

    def __init__(self, model: nn.Module, example: Example, device: torch.device | None = None) -> None:
        paths = {id(m): path for path, m in model.named_modules()}
        modules = list(model.modules())
        self.training = [(m, m.training) for m in modules]
        self.attributes = [(m, dict(m.__dict__)) for m in modules]
        # (module, name, parameter, its .grad, its requires_grad, its version counter, its full path)
        self.parameters = [
            (
                m,
                name,
                p,
                None if p is None else p.grad,
                None if p is None else p.requires_grad,
                None if p is None else p._version,
                f"{paths[id(m)]}.{name}".lstrip("."),
            )
            for m in modules
            for name, p in m._parameters.items()
        ]
        self.buffers = [
            (m, name, b, None if b is None else b.detach().clone()) for m in modules for name, b in m._buffers.items()
        ]
        self.states = [(m, get_state(m)) for m in modules if is_stateful(m)]
        self.example_grads = [(t, t.grad) for t in _tensors((example.args, dict(example.kwargs))) if t.requires_grad]
        self.rng_cpu = torch.get_rng_state()
        cuda = (device is not None and device.type == "cuda") or torch.cuda.is_initialized()
        self.rng_cuda = torch.cuda.get_rng_state_all() if cuda else None
        self.rng_python = random.getstate()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()

    def modified_parameters(self) -> list[str]:
        """Paths of parameters changed in place since the snapshot (which cannot be undone)."""
        return sorted(
            {path for _, _, p, _, _, version, path in self.parameters if p is not None and p._version != version}
        )

    def restore(self) -> None:
        """Put back the state captured at construction."""
        for m, attributes in self.attributes:
            current = m.__dict__
            for key in [k for k in current if k not in attributes]:
                del current[key]
            for key, value in attributes.items():
                if current.get(key, _MISSING) is not value:
                    current[key] = value
        for m, mode in self.training:
            m.training = mode
        for m, name, p, grad, requires_grad, _, _ in self.parameters:
            m._parameters[name] = p
            if p is not None:
                p.grad = grad
                p.requires_grad_(bool(requires_grad))  # a parameter's flag, never None
        with torch.no_grad():
            for m, name, b, saved in self.buffers:
                m._buffers[name] = b
                if b is not None and saved is not None:
                    b.copy_(saved)
        for m, state in self.states:
            load_state(m, dict(state))
        for t, grad in self.example_grads:
            t.grad = grad
        torch.set_rng_state(self.rng_cpu)
        if self.rng_cuda is not None:
            torch.cuda.set_rng_state_all(self.rng_cuda)
        random.setstate(self.rng_python)


def binary_inputs(model: nn.Module, example: Example, device: torch.device) -> dict[int, bool]:
    """Per module (by ``id``): whether the tensor inputs of its every call were binary, found by
    one forward of ``example`` in train mode without grad (values are what counts: no backward
    is needed); the model is left as it was."""
    with Restored(model, example, device):
        probe = Probe(model, device)
        with probe, torch.no_grad():
            model(*example.args, **dict(example.kwargs))
    return {key: record.binary for key, record in probe.records.items()}


class Restored(Snapshot):
    """The snapshot around a whole profile, which runs in train mode.

    Entered: puts the model in train mode if its root is in eval mode; ``reset()`` before
    every step (same buffers, states and RNG, so every step sees the same dropout masks);
    on exit restores everything, modes included, and warns about parameters changed in place.
    """

    def __init__(self, model: nn.Module, example: Example, device: torch.device) -> None:
        super().__init__(model, example, device)
        self.model = model

    def __enter__(self) -> Restored:
        self._train()
        return self

    def _train(self) -> None:
        if not self.model.training:
            self.model.train()

    def __exit__(self, *exc_info: object) -> None:
        self.restore()
        changed = self.modified_parameters()
        if changed:
            warnings.warn(
                f"the model's forward modified parameter(s) {some_names(changed)} in place; "
                "profile() restored everything else but cannot undo that",
                RuntimeWarning,
                stacklevel=3,
            )

    def reset(self) -> None:
        """Put back the state captured at construction, in the profiling modes."""
        self.restore()
        self._train()


_MISSING = object()


# ---------------------------------------------------------------- progress


class _Progress:
    """The profile's steps as a stage of :data:`memoplan.progress.REPORTER`: a bar with the time
    left on a terminal, one line elsewhere; with ``-v`` a line per step."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.done_steps = 0
        self._stage = contextlib.ExitStack()

    def __enter__(self) -> _Progress:
        if self.enabled:
            self._stage.enter_context(REPORTER.stage("measuring the training step", self.total, "steps"))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and self.done_steps and exc[0] is None:
            REPORTER.advance()  # the last step has finished
        self._stage.close()

    def step(self, label: str) -> None:
        """Step ``label`` starts (the one before it has finished)."""
        if self.enabled:
            if self.done_steps:
                REPORTER.advance()
            REPORTER.detail(f"profile: {label} step")
        self.done_steps += 1


# ---------------------------------------------------------------- helpers


def as_example(example: Example | torch.Tensor | Sequence[Any]) -> Example:
    if isinstance(example, Example):
        return example
    if isinstance(example, torch.Tensor):
        return Example((example,))
    if isinstance(example, (tuple, list)):
        return Example(tuple(example))
    raise TypeError(
        f"example must be a memoplan.specs.Example, a Tensor or a tuple of arguments, not {type(example).__name__}"
    )


def _tensors(tree: Any) -> list[torch.Tensor]:
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


def input_metas(example: Example) -> tuple[TensorMeta, ...]:
    metas = []
    for root, tree in (("args", tuple(example.args)), ("kwargs", dict(example.kwargs))):
        for path, leaf in pytree.tree_flatten_with_path(tree)[0]:
            if isinstance(leaf, torch.Tensor):
                name = root + pytree.keystr(path)
                metas.append(TensorMeta(name, tuple(leaf.shape), _dtype_name(leaf.dtype)))
    return tuple(metas)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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
