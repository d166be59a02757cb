"""Runtime stage: dynamic eviction of saved activations (the plan's ``dtr`` block).

A *candidate* module (a block the resolver chose, :mod:`memoplan.resolver.bind`) runs
its forward as usual, with grad, so backward runs through exactly the graph the
unplanned model builds.  What changes is who holds the tensors autograd saves for
backward: a ``saved_tensors_hooks`` pack hook hands each one to a small *slot* that
the autograd graph owns, and the :class:`Tracker` of the model knows every slot.

* **Resident**: after a candidate runs, its saved tensors stay in their slots.  The
  tracker counts the bytes it holds: the storages of all candidates' saved tensors and
  of the inputs each candidate keeps (parameters and buffers are never counted; a
  storage held twice counts once), with the RNG states their recomputes replay.  A
  ledger (:class:`_Ledger`) keeps that total as slots fill, empty and die, so checking
  the threshold costs nothing until it is reached.
* **Eviction**: whenever a candidate's saved bytes would take that total over
  ``eviction_threshold`` (checked before it runs, from its size on its previous call or,
  on its first, the largest size seen so far; and again after it ran), the tracker
  empties the slots of resident candidates, the lowest score first, until the total fits::

      score = cost ** recomp_time_factor / (bytes ** recomp_memory_factor * staleness)

  ``cost`` is the candidate's recompute time (its forward time on its first call,
  then a moving average of its measured recomputes), ``bytes`` what evicting it
  frees, ``staleness`` the logical time since its tensors were last used.  A
  candidate that would free less than ``evictee_minimum_size`` is never evicted.
* **Recompute**: when backward unpacks an empty slot, the candidate's forward runs
  again from the inputs it kept, with the RNG state, autocast state, buffer values
  and argument objects its forward saw, and its stateful modules put back where they
  started (then restored); every slot still owned by the graph is filled again and
  the recomputed graph is dropped.  The recompute makes the same ops on the same
  values, so the saved tensors and every gradient are bit for bit those of the
  unplanned model.  After a recompute the tracker fits the total again, evicting
  other candidates if it must.
* **Kept inputs**: a candidate keeps its inputs (and the state its stateful modules
  started from) until its backward has run, evicted or not, so an evicted candidate
  never depends on another one being recomputed first.  Kept inputs are counted in
  the total and never evicted: if they alone exceed the threshold the tracker cannot
  meet it; it then evicts everything it can, counts the miss in
  :class:`DtrStats` (``over_threshold``) and warns once (``MP430``); ``memoplan verify``
  fails on it.

The bound: at every candidate boundary the tracked total is at most
``eviction_threshold`` (unless kept inputs alone exceed it); while a candidate runs,
the total is at most the threshold plus that candidate's own saved bytes.

:func:`dtr_stats` reads what happened: evictions, recomputes, recompute seconds and
the tracked peak.

Under ``torch.compile`` a traced graph saves its activations itself and saved-tensor
hooks are not called (pytorch/pytorch#148222): a compiled graph cannot evict at run time.
:func:`memoplan.runtime.evictable.run_evictable` (what generated code calls) then lowers the
candidates to a static checkpoint choice made by the dtr simulator from what this tracker
measured in eager steps (:attr:`Tracker.measured`), see that module and docs/compile.md.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils.checkpoint import get_device_states

from memoplan.diagnostics import warn
from memoplan.runtime.argstate import ArgumentGuard
from memoplan.runtime.buffers import BufferGuard
from memoplan.runtime.recompute import as_in_forward, autocast_state, recomputing
from memoplan.runtime.state import get_state, is_stateful, load_state

__all__ = ["DTR_ATTR", "DtrSettings", "DtrStats", "Tracker", "dtr_stats"]

#: The key in the ``__dict__`` of the root model and of every candidate under which the tracker lives.
DTR_ATTR = "_memoplan_dtr"

#: Weight of a new recompute time in the moving average of a candidate's cost.
SMOOTHING = 0.5


@dataclass(frozen=True)
class DtrSettings:
    """The plan's ``dtr`` block as the generated module passes it to :func:`memoplan.runtime.install`."""

    eviction_threshold: int  # bytes
    evictee_minimum_size: int = 1024**2  # bytes
    recomp_memory_factor: float = 1.0
    recomp_time_factor: float = 1.0


@dataclass(frozen=True)
class DtrStats:
    """What the tracker did since it was installed or last reset (:func:`dtr_stats`)."""

    threshold: int
    evictions: int
    recomputes: int
    recompute_seconds: float
    tracked_peak: int  # the most bytes held at a boundary, besides the region running then (the enforced bound)
    working_peak: int  # the most bytes held at once, the running region's included
    tracked_now: int
    over_threshold: int  # candidate boundaries where even evicting everything did not fit
    candidates: int  # candidate calls recorded

    def summary(self) -> str:
        return (
            f"dtr: {self.evictions} eviction{'' if self.evictions == 1 else 's'}, "
            f"{self.recomputes} recompute{'' if self.recomputes == 1 else 's'} "
            f"({self.recompute_seconds * 1000:.1f} ms), tracked peak {self.tracked_peak} B "
            f"of a {self.threshold} B threshold ({self.working_peak} B with the block running then)"
            + (f"; the threshold could not be met {self.over_threshold} time(s)" if self.over_threshold else "")
        )


def dtr_stats(model: nn.Module, *, reset: bool = False) -> DtrStats:
    """The eviction statistics of the ``dtr`` block installed on ``model``.

    ``reset``: start counting afresh after reading (the tracked peak restarts from
    what the tracker holds now).  A model without a ``dtr`` block raises ``ValueError``.
    """
    tracker = model.__dict__.get(DTR_ATTR)
    if not isinstance(tracker, Tracker):
        raise ValueError("memoplan: the model has no `dtr` block installed")
    return tracker.stats(reset=reset)


class _Slot:
    """One saved tensor of a candidate call, owned by the autograd graph (the pack hook returns it).

    ``tensor`` is None while evicted.  When autograd frees the node that saved it (its
    backward ran, or the graph was dropped), the slot goes and the tensor with it.
    """

    __slots__ = ("__weakref__", "call", "index", "pinned", "shape", "dtype", "tensor", "version", "held")

    def __init__(self, call: _Call, index: int, tensor: torch.Tensor, pinned: bool, key: int) -> None:
        self.call, self.index, self.pinned = call, index, pinned
        self.shape, self.dtype = tensor.shape, tensor.dtype
        self.tensor: torch.Tensor | None = None
        self.version = 0
        # What the ledger counts for this slot; released when the slot is emptied or dies.
        self.held: list[tuple[int, int]] = []
        self.fill(tensor, key)

    def __del__(self) -> None:
        if self.held:
            self.call.tracker.ledger.release(self.held)

    def fill(self, tensor: torch.Tensor, key: int | None = None) -> None:
        self.tensor = tensor
        self.version = tensor._version  # autograd's own check, which saved-tensor hooks turn off
        if self.pinned:
            # A parameter's or buffer's (never counted), or an input's, entry state's: the call holds
            # those itself until it dies, and it outlives its slots; nothing more to count.
            return
        storage = tensor.untyped_storage()
        key = _storage_key(storage) if key is None else key
        if key not in self.call.weights:
            ref = self.call.tracker.ledger.hold_one(key, storage.nbytes(), id(self.call))
            if ref is not None:
                self.held.append(ref)

    def empty(self) -> None:
        self.tensor = None
        self.call.tracker.ledger.release(self.held)


class _Ledger:
    """The storages the tracker holds, each counted once: key -> [bytes, {holder: references}].

    A holder is a candidate call's id (its evictable saved tensors) or 0 (what is kept:
    inputs, entry state, RNG states, pinned saved tensors).  ``total`` is kept up to date,
    so checking the threshold costs nothing while it is not reached.
    """

    def __init__(self) -> None:
        self.entries: dict[int, list[Any]] = {}
        self.total = 0

    def hold(self, tensors: Sequence[torch.Tensor], holder: int) -> list[tuple[int, int]]:
        refs = []
        for tensor in tensors:
            storage = tensor.untyped_storage()
            size = storage.nbytes()
            if not size:
                continue
            key = _storage_key(storage)
            entry = self.entries.get(key)
            if entry is None:
                entry = self.entries[key] = [size, {}]
                self.total += size
            entry[1][holder] = entry[1].get(holder, 0) + 1
            refs.append((key, holder))
        return refs

    def hold_one(self, key: int, size: int, holder: int) -> tuple[int, int] | None:
        """:meth:`hold` for one storage already looked up (a saved tensor's, the hot path)."""
        if not size:
            return None
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = [size, {}]
            self.total += size
        holders = entry[1]
        holders[holder] = holders.get(holder, 0) + 1
        return (key, holder)

    def release(self, refs: list[tuple[int, int]]) -> None:
        for key, holder in refs:
            entry = self.entries[key]
            holders = entry[1]
            holders[holder] -= 1
            if not holders[holder]:
                del holders[holder]
                if not holders:
                    del self.entries[key]
                    self.total -= entry[0]
        refs.clear()

    def owners(self) -> dict[int, tuple[int, set[int]]]:
        """Every storage held: its bytes and its holders."""
        return {key: (size, set(holders)) for key, (size, holders) in self.entries.items()}


def _forgetting(calls: dict[int, weakref.ref[_Call]], key: int) -> Callable[[weakref.ref[_Call]], object]:
    """The weak reference's callback: drop ``calls[key]`` once its call is collected."""
    return lambda _: calls.pop(key, None)


class _Call:
    """One candidate call: what its recompute needs, and weak references to its slots."""

    # Set by Tracker.forward when the call runs, before anything reads them.
    autocast: list[tuple[str, bool, torch.dtype]]
    recompute_context: contextlib.AbstractContextManager[Any]
    arguments_recompute: contextlib.AbstractContextManager[Any]

    def __init__(self, tracker: Tracker, module: nn.Module, where: str, fn, args, kwargs) -> None:
        self.tracker, self.module, self.where, self.fn = tracker, module, where, fn
        if not kwargs and all(type(a) is torch.Tensor or isinstance(a, torch.Tensor) for a in args):
            leaves, self.spec = list(args), None  # the common call: tensors only (no pytree walk)
        else:
            leaves, self.spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        self.tensor_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self.leaves = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        self.inputs: list[torch.Tensor] = [leaves[i] for i in self.tensor_at]
        self.stateful = tracker.stateful_in(module)
        self.entry_states = [get_state(m) for m in self.stateful]
        self.slots: list[weakref.ref[_Slot]] = []
        self.weights = _storages_of(tracker.weights_of(module))
        self.held = _storages_of(self.inputs) | _storages_of(_state_tensors(self.entry_states))
        self.evictable = True
        self.last_used = 0
        self.forward_seconds = 0.0
        self.versions: list[int] = []
        self.cpu_rng = torch.get_rng_state()
        # CPU tensors have no device RNG state to replay (get_device_states walks its arguments with pytree).
        on_device = any(t.device.type not in ("cpu", "meta") for t in self.inputs)
        self.devices, self.device_rng = get_device_states(*self.inputs) if on_device else ([], [])

    def counts(self, tensor: torch.Tensor) -> bool:
        """Whether a saved tensor counts in the tracked bytes (parameters and buffers do not)."""
        return _key(tensor) not in self.weights

    def hold_kept(self) -> int:
        """Count what the call keeps until its backward: inputs, entry state, RNG states; return their bytes."""
        kept = [*self.inputs, *_state_tensors(self.entry_states), self.cpu_rng, *self.device_rng]
        ledger = self.tracker.ledger
        refs = ledger.hold([t for t in kept if self.counts(t)], 0)
        weakref.finalize(self, ledger.release, refs)
        return sum(ledger.entries[key][0] for key in {key for key, _ in refs})

    # -- the forward
    def pack(self, tensor: torch.Tensor) -> _Slot:
        key = _key(tensor)
        pinned = key in self.weights or key in self.held
        slot = _Slot(self, len(self.slots), tensor.detach(), pinned, key)
        self.slots.append(weakref.ref(slot))
        return slot

    def evictable_bytes(self) -> int:
        """The bytes of the storages its evictable slots hold (each once)."""
        entries = self.tracker.ledger.entries
        keys = {key for slot in self.live_slots() for key, holder in slot.held if holder}
        return sum(entries[key][0] for key in keys)

    def live_slots(self) -> list[_Slot]:
        return [s for s in (ref() for ref in self.slots) if s is not None]

    def evict(self) -> None:
        for slot in self.live_slots():
            if not slot.pinned:
                slot.empty()

    # -- the recompute
    def recompute(self) -> None:
        for tensor, version in zip(self.inputs, self.versions):
            if tensor._version != version:
                raise RuntimeError(
                    f"memoplan: MP431: `{self.where}`: an input of this dtr candidate was changed in place after "
                    "its forward, so its evicted activations cannot be recomputed; keep the module out of "
                    "eviction with a `keep` rule, or make the later change out of place"
                )
        leaves = list(self.leaves)
        for i, tensor in zip(self.tensor_at, self.inputs):
            leaves[i] = tensor.detach().requires_grad_(tensor.requires_grad)
        args, kwargs = (tuple(leaves), {}) if self.spec is None else pytree.tree_unflatten(leaves, self.spec)
        entry = [dict(s) for s in self.entry_states]
        for state in entry:
            for name, value in state.items():
                if isinstance(value, torch.Tensor):
                    state[name] = value.detach().requires_grad_(value.requires_grad)
        slots = self.slots
        count = [0]

        def refill(tensor: torch.Tensor) -> None:
            i = count[0]
            count[0] += 1
            slot = slots[i]() if i < len(slots) else None
            if slot is not None and slot.tensor is None:
                if tensor.shape != slot.shape or tensor.dtype != slot.dtype:
                    raise _mismatch(self.where)
                slot.fill(tensor.detach())

        def unpack(_: None) -> torch.Tensor:
            raise RuntimeError(f"memoplan: `{self.where}`: a recomputed graph is never differentiated")

        post = [get_state(m) for m in self.stateful]
        with recomputing(self.where, "an evicted dtr candidate"), as_in_forward(self), self.arguments_recompute:
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(refill, unpack):
                try:
                    for module, state in zip(self.stateful, entry):
                        load_state(module, state)
                    self.fn(*args, **kwargs)
                finally:
                    for module, state in zip(self.stateful, post):
                        load_state(module, state)
        if count[0] != len(slots):
            raise _mismatch(self.where)


def _mismatch(where: str) -> RuntimeError:
    return RuntimeError(
        f"memoplan: MP433: `{where}`: the recompute of this dtr candidate saved different tensors than its "
        "forward (control flow that depends on something other than its inputs, buffers and RNG); "
        "keep it out of eviction with a `keep` rule"
    )


def frees_of(owners: Mapping[int, tuple[int, set[int]]], call: _Call | None) -> int:
    """The bytes only ``call``'s evictable slots hold."""
    if call is None:
        return 0
    return sum(size for size, who in owners.values() if who == {id(call)})


def _key(tensor: torch.Tensor) -> int:
    return _storage_key(tensor.untyped_storage())


def _storage_key(storage: torch.UntypedStorage) -> int:
    """A storage's identity: its address; a storage without one (a fake tensor's, when the estimate
    runs a planned step: reading its address is undefined behaviour) by its C++ identity."""
    return int(storage._cdata) if storage.device.type == "meta" else storage.data_ptr()


def _storages_of(tensors: Sequence[torch.Tensor]) -> set[int]:
    return {_key(t) for t in tensors if t.untyped_storage().nbytes()}


def _state_tensors(states: Sequence[Mapping[str, Any]]) -> list[torch.Tensor]:
    return [v for s in states for v in s.values() if isinstance(v, torch.Tensor)]


class Tracker:
    """The resident saved bytes of one model's candidates, evicting by score to stay under the threshold."""

    def __init__(self, settings: DtrSettings) -> None:
        self.settings = settings
        # Calls whose graph is alive, by id; an entry goes when its call does.
        self.calls: dict[int, weakref.ref[_Call]] = {}
        self.clock = 0
        self.cost: dict[str, float] = {}  # where -> smoothed recompute seconds
        self.size: dict[str, int] = {}  # where -> saved bytes on its last call
        # where -> (evictable bytes, kept bytes, forward seconds) of its last eager call, in the order of
        # the first calls: what the dtr simulator chooses from under torch.compile (memoplan.runtime.evictable).
        self.measured: dict[str, tuple[int, int, float]] = {}
        self.warned = False
        self.paths: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
        self.ledger = _Ledger()
        self.stateful: weakref.WeakKeyDictionary[nn.Module, list[nn.Module]] = weakref.WeakKeyDictionary()
        self.weights: weakref.WeakKeyDictionary[nn.Module, list[torch.Tensor]] = weakref.WeakKeyDictionary()
        self.buffered: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
        self._reset()

    def __reduce__(self) -> Any:
        # Copies and pickles get a fresh tracker with the same settings and the (copied)
        # candidates, with nothing resident and nothing counted.
        return (_restore, (self.settings, list(self.paths.items())))

    def weights_of(self, module: nn.Module) -> list[torch.Tensor]:
        """The parameters and buffers of ``module`` (listed once per module; their storages are
        read at every call, so a parameter changed in place or moved is still known)."""
        found = self.weights.get(module)
        if found is None:
            found = self.weights[module] = [*module.parameters(), *module.buffers()]
        return found

    def has_buffers(self, module: nn.Module, *, remember: bool = False) -> bool:
        """Whether ``module`` has buffers: remembered after its first call (``remember``: a module
        that registers buffers in its first forward is seen), as :meth:`weights_of` is."""
        found = self.buffered.get(module)
        if found is None:
            found = any(True for _ in module.buffers())
            if remember:
                self.buffered[module] = found
        return found

    def stateful_in(self, module: nn.Module) -> list[nn.Module]:
        """The stateful modules in ``module`` (looked up once per module)."""
        found = self.stateful.get(module)
        if found is None:
            found = self.stateful[module] = [m for m in module.modules() if is_stateful(m)]
        return found

    def attach(self, module: nn.Module, path: str) -> None:
        """Make ``module`` (at ``path`` in the model) a candidate of this tracker."""
        module.__dict__[DTR_ATTR] = self
        self.paths[module] = path

    def _reset(self) -> None:
        self.evictions = self.recomputes = self.over = self.count = 0
        self.recompute_seconds = 0.0
        self.peak = self.working = self.total()

    def stats(self, *, reset: bool = False) -> DtrStats:
        stats = DtrStats(
            threshold=self.settings.eviction_threshold,
            evictions=self.evictions,
            recomputes=self.recomputes,
            recompute_seconds=self.recompute_seconds,
            tracked_peak=self.peak,
            working_peak=max(self.working, self.peak),
            tracked_now=self.total(),
            over_threshold=self.over,
            candidates=self.count,
        )
        if reset:
            self._reset()
        return stats

    # -- accounting
    def live_calls(self) -> list[_Call]:
        return [c for c in (ref() for ref in list(self.calls.values())) if c is not None]

    def owners(self) -> dict[int, tuple[int, set[int]]]:
        """Every storage the tracker holds: its bytes and who holds it (a call's id, or 0 for kept)."""
        return self.ledger.owners()

    def total(self) -> int:
        return self.ledger.total

    def _note(self, total: int, running: int = 0) -> None:
        self.peak = max(self.peak, total - running)
        self.working = max(self.working, total)

    def fit(self, room: int = 0, *, keep: _Call | None = None) -> None:
        """Evict resident candidates, lowest score first, until the total plus ``room`` fits."""
        limit = self.settings.eviction_threshold - room
        total = self.ledger.total
        if total <= limit:
            self._note(total, frees_of(self.ledger.owners(), keep) if keep is not None else 0)
            return
        owners = self.ledger.owners()
        frees: dict[int, int] = {}
        for size, who in owners.values():
            if len(who) == 1 and next(iter(who)):
                frees[next(iter(who))] = frees.get(next(iter(who)), 0) + size
        settings = self.settings
        scored = []
        for call in self.live_calls():
            freed = frees.get(id(call), 0)
            if call is keep or not call.evictable or freed == 0 or freed < settings.evictee_minimum_size:
                continue
            cost = max(self.cost.get(call.where, call.forward_seconds), 1e-9)
            staleness = max(self.clock - call.last_used, 1)
            score = cost**settings.recomp_time_factor / (freed**settings.recomp_memory_factor * staleness)
            scored.append((score, call.last_used, call, freed))
        scored.sort(key=lambda entry: (entry[0], entry[1]))
        for _, _, call, freed in scored:
            if total <= limit:
                break
            call.evict()
            self.evictions += 1
            total -= freed
        # Before a call runs, making room is best effort; after it, or after a recompute (whose
        # own bytes are the working set of the one region running now), the threshold holds.
        running = frees.get(id(keep), 0) if keep is not None else 0
        self._note(total, running)
        if room == 0 and total - running > limit:
            self.over += 1
            if not self.warned:
                self.warned = True
                warn(
                    f"memoplan: MP430: the dtr eviction_threshold ({settings.eviction_threshold} B) cannot be met: "
                    f"after evicting every candidate it may, the tracker still holds {total - running} B (the "
                    "inputs the candidates keep, and those below evictee_minimum_size); raise the threshold or "
                    "lower evictee_minimum_size (`memoplan plan --budget B --dtr` chooses one)",
                    RuntimeWarning,
                )

    # -- a candidate's forward
    def run(self, module: nn.Module, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        where = self.paths.get(module, type(module).__qualname__)
        call = _Call(self, module, where, fn, args, kwargs)
        kept = call.hold_kept()
        self.clock += 1
        call.last_used = self.clock
        # Make room first, from its size on its previous call (on its first call, the largest
        # size seen so far: blocks of a model are often alike).
        estimate = self.size.get(where, max(self.size.values(), default=0))
        if estimate:
            self.fit(estimate)
        call.autocast = autocast_state()
        if self.has_buffers(module):
            forward_context, call.recompute_context = BufferGuard((module,)).contexts()
        else:  # nothing to commit once or to put back for a recompute
            forward_context = call.recompute_context = contextlib.nullcontext()
        arguments = ArgumentGuard(call.leaves)
        arguments_forward, call.arguments_recompute = arguments.contexts()
        call.versions = [t._version for t in call.inputs]

        def unpack(slot: _Slot) -> torch.Tensor:
            return self._unpack(slot)

        start = time.perf_counter()
        with forward_context, arguments_forward, torch.autograd.graph.saved_tensors_hooks(call.pack, unpack):
            out = fn(*args, **kwargs)
        call.forward_seconds = time.perf_counter() - start
        self.has_buffers(module, remember=True)
        if [t._version for t in call.inputs] != call.versions:
            # The forward changed its own input in place: a recompute would start from the
            # changed value.  Such a call is kept whole (never evicted).
            call.evictable = False
            call.versions = [t._version for t in call.inputs]
        self.count += 1
        calls = self.calls
        key = id(call)
        calls[key] = weakref.ref(call, _forgetting(calls, key))
        self.size[where] = call.evictable_bytes()
        self.measured[where] = (self.size[where], kept, call.forward_seconds)
        self.fit(keep=None)
        return out

    def _unpack(self, slot: _Slot) -> torch.Tensor:
        call = slot.call
        self.clock += 1
        call.last_used = self.clock
        if slot.tensor is None:
            start = time.perf_counter()
            call.recompute()
            seconds = time.perf_counter() - start
            self.recomputes += 1
            self.recompute_seconds += seconds
            known = self.cost.get(call.where)
            self.cost[call.where] = seconds if known is None else SMOOTHING * seconds + (1 - SMOOTHING) * known
            self.fit(keep=call)
        tensor = slot.tensor
        assert tensor is not None
        if tensor._version != slot.version:
            raise RuntimeError(
                f"memoplan: MP434: `{call.where}`: a tensor saved for backward (shape {tuple(slot.shape)}) was "
                f"changed by an in-place operation after it was saved (version {slot.version}, now "
                f"{tensor._version}); without the plan autograd refuses this too: make that change out of place"
            )
        return tensor


def _restore(settings: DtrSettings, paths: list[tuple[nn.Module, str]]) -> Tracker:
    tracker = Tracker(settings)
    for module, path in paths:
        tracker.paths[module] = path
    return tracker
