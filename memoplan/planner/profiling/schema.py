"""Profile schema: the frozen records a profile is made of, their JSON form, merging, candidate chains.

:class:`Profile` is what :func:`memoplan.planner.profiling.profile.profile` measures (see that module for
how each field is measured and attributed) and what planners read; it is plain data, saved and
loaded as JSON (:data:`FORMAT_VERSION`), and profiles of the same model taken on several ranks
are combined with :func:`merge`.  :func:`chain` turns a profile into the candidate modules a
planner chooses from (:func:`default_candidates`, :func:`nested_candidates`).
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from memoplan.planner.profiling.held import Held

__all__ = [
    "FORMAT_VERSION",
    "ChainLink",
    "ModuleProfile",
    "Profile",
    "TensorMeta",
    "chain",
    "default_candidates",
    "merge",
    "nested_candidates",
    "some_names",
]

# ---------------------------------------------------------------- data


#: The ``"version"`` field of :meth:`Profile.to_json`; :meth:`Profile.from_json` accepts only this.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of one tensor of the example, named by its place (``args[0]``, ``kwargs['mask']``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "int64", ... (torch.dtype without the "torch." prefix)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)


@dataclass(frozen=True)
class ModuleProfile:
    """What one training step showed about one module (one path of ``named_modules()``).

    Bytes and times are per step, summed over the module's calls in that step.
    ``saved_bytes`` is the module's *own* (its children's are theirs; see
    :meth:`Profile.subtree_saved_bytes`).  ``packed_input_bytes`` is what the
    tensor inputs take bit-packed (:func:`memoplan.runtime.codecs.estimate_nbytes`
    with ``"bit"``) when ``input_binary``, else ``input_bytes``.
    ``recompute_seconds`` estimates what recomputing the module in backward costs:
    its forward time.
    """

    name: str
    type: str  # qualified class name, "torch.nn.modules.linear.Linear"
    children: int
    is_sequential: bool
    is_module_list: bool
    calls: int
    order: int | None  # position of its first call among all module calls; None if never called
    forward_seconds: float
    recompute_seconds: float
    saved_bytes: int
    input_bytes: int
    input_numel: int
    packed_input_bytes: int
    output_bytes: int
    input_binary: bool
    # Of ``saved_bytes``, the storages the model's output still holds after the step (a returned
    # KV cache, an output that autograd saved too): a checkpoint of the module cannot free them.
    kept_bytes: int = 0

    @property
    def is_container(self) -> bool:
        """An ``nn.Sequential`` or ``nn.ModuleList``: a chain of children."""
        return self.is_sequential or self.is_module_list


@dataclass(frozen=True)
class Profile:
    """A per-module training-step profile; plain data, JSON round-trippable.

    ``modules`` are in ``named_modules()`` order (the root ``""`` first).
    ``peak_bytes`` is the unplanned step's peak (``peak_method``: ``live-storage``
    on CPU, ``cuda-allocator`` on CUDA), ``step_seconds`` the median step time,
    ``ranks`` how many profiles were merged into this one (1 when measured).
    ``method`` says how the bytes were found: ``measured`` (real training steps at the full
    size) or ``estimated`` (a step on fake tensors, :mod:`memoplan.planner.profiling.estimate`).
    ``shards`` > 1: the step of one of that many FSDP2 ranks, estimated (its gradients and
    gathered parameters as :mod:`memoplan.planner.profiling.shard` counts them); ``optimizer_state_bytes``:
    the optimizer state that rank keeps between steps (not part of the step's peak).
    ``kernels`` names the device whose kernels ran an estimate planned for another (``cpu``
    standing in for ``cuda`` on a machine without a GPU, :mod:`memoplan.planner.profiling.target`);
    ``model_device`` is ``meta`` for a model built on the meta device; ``reserved_bytes`` (CUDA)
    what the caching allocator would reserve at the peak (:mod:`memoplan.planner.profiling.cuda_allocator`).
    ``region_seconds``: the fixed time one checkpoint region costs on the device beyond its
    recompute (:mod:`memoplan.planner.profiling.regioncost`), which the search charges per region; 0 where
    not measured (profiles written before it, or estimated with no real step).  ``save_op_seconds``:
    what each op of a region with ``save = [...]`` costs beyond a plain region's, charged to every
    save variant (0 where not measured).
    """

    modules: tuple[ModuleProfile, ...]
    peak_bytes: int
    peak_method: str
    step_seconds: float
    parameter_bytes: int
    unattributed_saved_bytes: int
    inputs: tuple[TensorMeta, ...]
    device: str
    torch_version: str
    memoplan_version: str
    repeats: int
    ranks: int = 1
    method: str = "measured"
    shards: int = 1  # FSDP2 ranks the step is sharded over (memoplan.planner.profiling.shard): bytes are one rank's
    optimizer_state_bytes: int = 0  # the optimizer state one rank holds between steps (--optimizer)
    kernels: str = ""  # the device whose kernels ran the estimate when not ``device``'s (cpu standing in for cuda)
    model_device: str = ""  # "meta": the model was built on the meta device (estimated only)
    reserved_bytes: int = 0  # CUDA: what the caching allocator would reserve at the peak (0: not simulated)
    step: str = ""  # the step it was taken for, every key (memoplan.planner.profiling.stamp); "": not recorded
    parameter_dtypes: str = ""  # the model's parameter dtypes, sorted, comma-separated; "": not recorded
    region_seconds: float = (
        0.0  # one checkpoint region's fixed cost (memoplan.planner.profiling.regioncost); 0: unmeasured
    )
    # What each op of a region that saves some ops' outputs costs beyond a plain region's
    # (memoplan.planner.profiling.regioncost); 0: unmeasured.
    save_op_seconds: float = 0.0
    # The unplanned step's peak between module boundaries, and each module's window of those
    # stretches (memoplan.planner.profiling.held); empty where not recorded (older profiles, CUDA).
    held_peaks: tuple[int, ...] = ()
    held_windows: tuple[tuple[str, int, int, int], ...] = ()
    _index: Mapping[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "modules", tuple(self.modules))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if isinstance(self.held_peaks, list):
            object.__setattr__(self, "held_peaks", tuple(self.held_peaks))
        if isinstance(self.held_windows, list):
            windows = tuple(tuple(w) if isinstance(w, list) else w for w in self.held_windows)
            object.__setattr__(self, "held_windows", windows)
        _check_held(self.held_peaks, self.held_windows)
        index = {m.name: i for i, m in enumerate(self.modules)}
        if len(index) != len(self.modules):
            raise ValueError("a profile lists a module path twice")
        object.__setattr__(self, "_index", index)

    # ------------------------------------------------ queries

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.modules)

    def __getitem__(self, name: str) -> ModuleProfile:
        """The profile of the module at ``name`` (``KeyError`` with suggestions if unknown)."""
        try:
            return self.modules[self._index[name]]
        except KeyError:
            raise KeyError(_unknown(name, self.names)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._index

    @property
    def held(self) -> Held | None:
        """The step's live bytes between module boundaries, when recorded (:mod:`memoplan.planner.profiling.held`)."""
        if not self.held_peaks:
            return None
        return Held(self.held_peaks, {name: (first, last, done) for name, first, last, done in self.held_windows})

    def descendants(self, name: str) -> tuple[ModuleProfile, ...]:
        """The modules strictly below ``name`` (everything but the root, for ``""``)."""
        self[name]
        prefix = f"{name}." if name else ""
        return tuple(m for m in self.modules if m.name != name and m.name.startswith(prefix))

    def subtree_kept_bytes(self, name: str) -> int:
        """Of :meth:`subtree_saved_bytes`, what the model's output keeps alive (``kept_bytes``)."""
        return self[name].kept_bytes + sum(m.kept_bytes for m in self.descendants(name))

    def subtree_saved_bytes(self, name: str) -> int:
        """Saved-activation bytes of ``name`` and all its descendants while it runs."""
        return self[name].saved_bytes + sum(m.saved_bytes for m in self.descendants(name))

    @property
    def saved_bytes(self) -> int:
        """Every saved activation of the step attributed to a module."""
        return sum(m.saved_bytes for m in self.modules)

    # ------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": FORMAT_VERSION}
        for f in fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if f.name == "modules":
                value = [_plain(m) for m in value]
            elif f.name == "inputs":
                value = [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in value]
            out[f.name] = value
        return out

    def to_json(self) -> str:
        """Plain JSON: sorted keys, no NaN or infinity, a ``"version": 1`` field, newline-terminated."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        if not isinstance(data, Mapping):
            raise ValueError(f"a profile is a JSON object, not {type(data).__name__}")
        version = data.get("version")
        if version != FORMAT_VERSION:
            raise ValueError(f"unsupported profile version {version!r}; this memoplan reads version {FORMAT_VERSION}")
        body = {k: v for k, v in data.items() if k != "version"}
        body.setdefault("method", "measured")  # profiles written before estimates existed
        body.setdefault("shards", 1)  # ... and before sharded estimates
        body.setdefault("optimizer_state_bytes", 0)
        body.setdefault("kernels", "")  # ... and before target devices and meta models
        body.setdefault("model_device", "")
        body.setdefault("reserved_bytes", 0)
        body.setdefault("step", "")  # ... and before the step a profile was taken for was recorded
        body.setdefault("parameter_dtypes", "")
        body.setdefault("region_seconds", 0.0)  # ... and before the fixed cost of a region was measured
        body.setdefault("save_op_seconds", 0.0)  # ... and before a saving region's cost per op
        body.setdefault("held_peaks", [])  # ... and before the step's bytes between module boundaries
        body.setdefault("held_windows", [])
        _check_keys("profile", body, [f.name for f in fields(cls) if f.init])
        body["modules"] = tuple(_module_from_dict(m) for m in body["modules"])
        body["inputs"] = tuple(_tensor_meta_from_dict(t) for t in body["inputs"])
        body["step_seconds"] = float(body["step_seconds"])
        body["region_seconds"] = float(body["region_seconds"])
        body["save_op_seconds"] = float(body["save_op_seconds"])
        return cls(**body)

    @classmethod
    def from_json(cls, text: str | bytes) -> Profile:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> None:
        """Write the profile's JSON to ``path``, replacing the file at once (``memoplan.targets.replace_file``)."""
        from memoplan.targets import replace_file

        replace_file(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class ChainLink:
    """One candidate of a chain, as a chain planner sees it.

    ``saved_bytes`` covers the candidate's whole subtree while it runs (its own
    and its descendants'), which is what checkpointing it frees; ``input_bytes``
    is what a checkpoint of it keeps instead (``packed_input_bytes`` when
    bit-packed, meaningful when ``input_binary``).
    """

    name: str
    saved_bytes: int
    input_bytes: int
    forward_seconds: float
    output_bytes: int
    input_binary: bool
    packed_input_bytes: int
    kept_bytes: int = 0  # of saved_bytes, what the output keeps: a checkpoint keeps it too


# ---------------------------------------------------------------- merge()


def merge(profiles: Iterable[Profile]) -> Profile:
    """One profile from profiles of the same model taken on several ranks.

    The module paths (and their classes and structure) must be the same in every
    profile (``ValueError`` otherwise).  Times take the maximum (the slowest rank
    decides), bytes the maximum, ``input_binary`` holds only if it holds on every
    rank.  Every rule is symmetric, so the result does not depend on the order of
    the profiles: every rank that merges the same files plans the same.  Differing
    devices and versions are listed, sorted, comma-separated; of differing example
    inputs the largest (then the first in sorted JSON) is kept.
    """
    items = list(profiles)
    if not items:
        raise ValueError("merge() needs at least one profile")
    first = items[0]
    for i, other in enumerate(items[1:], 1):
        _check_same_modules(first, other, i)
    modules = tuple(_merge_modules([p.modules[i] for p in items]) for i in range(len(first.modules)))
    # The largest inputs; among equally large ones the first in sorted JSON (order-independent).
    candidates = sorted((p.inputs for p in items), key=_inputs_text)
    inputs = max(candidates, key=lambda ts: sum(t.nbytes for t in ts))
    return Profile(
        modules=modules,
        peak_bytes=max(p.peak_bytes for p in items),
        peak_method=_joined(p.peak_method for p in items),
        step_seconds=max(p.step_seconds for p in items),
        parameter_bytes=max(p.parameter_bytes for p in items),
        unattributed_saved_bytes=max(p.unattributed_saved_bytes for p in items),
        inputs=inputs,
        device=_joined(p.device for p in items),
        torch_version=_joined(p.torch_version for p in items),
        memoplan_version=_joined(p.memoplan_version for p in items),
        repeats=min(p.repeats for p in items),
        ranks=sum(p.ranks for p in items),
        method="estimated" if any(p.method == "estimated" for p in items) else "measured",
        shards=max(p.shards for p in items),
        optimizer_state_bytes=max(p.optimizer_state_bytes for p in items),
        kernels=_joined(p.kernels for p in items),
        model_device=_joined(p.model_device for p in items),
        reserved_bytes=max(p.reserved_bytes for p in items),
        step="; ".join(sorted({p.step for p in items})),  # several: checked as differing from any one
        parameter_dtypes=_joined(p.parameter_dtypes for p in items),
        region_seconds=max(p.region_seconds for p in items),
        save_op_seconds=max(p.save_op_seconds for p in items),
        # Of several ranks, no one step's bytes between module boundaries is the merged step's.
        held_peaks=first.held_peaks if len(items) == 1 else (),
        held_windows=first.held_windows if len(items) == 1 else (),
    )


def _check_same_modules(a: Profile, b: Profile, index: int) -> None:
    if a.names != b.names:
        missing = [n for n in a.names if n not in b]
        extra = [n for n in b.names if n not in a]
        detail = []
        if missing:
            detail.append(f"missing from profile {index}: {some_names(missing)}")
        if extra:
            detail.append(f"only in profile {index}: {some_names(extra)}")
        if not detail:
            detail.append("the same paths in a different order")
        raise ValueError("cannot merge profiles of different module sets (" + "; ".join(detail) + ")")
    for x, y in zip(a.modules, b.modules):
        structure = ("type", "children", "is_sequential", "is_module_list")
        differ = [k for k in structure if getattr(x, k) != getattr(y, k)]
        if differ:
            k = differ[0]
            raise ValueError(
                f"cannot merge profiles of different models: module `{x.name}` has "
                f"{k} {getattr(x, k)!r} in profile 0 and {getattr(y, k)!r} in profile {index}"
            )


def _merge_modules(ms: list[ModuleProfile]) -> ModuleProfile:
    orders = [m.order for m in ms if m.order is not None]
    binary = all(m.input_binary for m in ms)
    input_bytes = max(m.input_bytes for m in ms)
    return replace(
        ms[0],
        calls=max(m.calls for m in ms),
        order=min(orders) if orders else None,
        forward_seconds=max(m.forward_seconds for m in ms),
        recompute_seconds=max(m.recompute_seconds for m in ms),
        saved_bytes=max(m.saved_bytes for m in ms),
        input_bytes=input_bytes,
        input_numel=max(m.input_numel for m in ms),
        packed_input_bytes=max(m.packed_input_bytes for m in ms) if binary else input_bytes,
        output_bytes=max(m.output_bytes for m in ms),
        input_binary=binary,
    )


# ---------------------------------------------------------------- chain()


def default_candidates(prof: Profile) -> tuple[str, ...]:
    """The default chain: the children of the container holding the most saved memory.

    Containers are the modules that are an ``nn.Sequential`` or an
    ``nn.ModuleList`` with at least one child (the root included, when the model
    is itself one).  The container with the largest
    :meth:`Profile.subtree_saved_bytes` is chosen; ties go to the one with more
    children, then the shallower, then the first in ``named_modules()`` order.
    Its direct children are the candidates (``features.*``, ``blocks.*``,
    ``layers.*``).  A model with no container uses the root's direct children.
    Nested containers (a Sequential of Sequentials) resolve to the outer one,
    since it holds at least as much as any one inner one.
    """
    containers = [m for m in prof.modules if m.is_container and m.children > 0]
    if containers:
        position = {m.name: i for i, m in enumerate(prof.modules)}
        best = max(
            containers,
            key=lambda m: (
                prof.subtree_saved_bytes(m.name),
                m.children,
                -_depth(m.name),
                -position[m.name],
            ),
        )
        parent = best.name
    else:
        parent = ""
    return tuple(m.name for m in prof.modules if m.name and _parent(m.name) == parent)


def nested_candidates(prof: Profile) -> tuple[str, ...]:
    """:func:`default_candidates` and every module inside them that ran and holds saved memory.

    Checkpointing a block or some of its parts, at any depth (a block's MLP, or only the
    activation function inside it): the exact solver (:func:`memoplan.planner.search.exact.exact`)
    chooses among them.  Parts that would save nothing by the cost model (a Linear keeps its
    input either way) cost the solver nothing: it drops them before it searches.
    """
    outer = default_candidates(prof)
    prefixes = tuple(name + "." for name in outer)
    inner = [
        m.name
        for m in prof.modules
        if m.name.startswith(prefixes) and m.order is not None and prof.subtree_saved_bytes(m.name) > 0
    ]
    return (*outer, *inner)


def chain(prof: Profile, candidates: Iterable[str] | None = None, *, nested: bool = False) -> list[ChainLink]:
    """The candidate modules in execution order, with what a planner needs.

    ``candidates`` defaults to :func:`default_candidates`.  Named candidates must
    be paths of the profile and, unless ``nested``, must not contain one another
    (``ValueError``).  Execution order is the order of each candidate's first
    call; candidates that never ran are left out (they hold no memory and cost no
    time).
    """
    if candidates is None:
        names = list(default_candidates(prof))
    else:
        names = list(dict.fromkeys(candidates))
        for name in names:
            if name not in prof:
                raise ValueError(_unknown(name, prof.names))
        for a in names:
            for b in names:
                if not nested and a != b and (a == "" or b.startswith(a + ".")):
                    raise ValueError(f"chain candidates must not nest: `{b}` is inside `{a or '<root>'}`")
    position = {m.name: i for i, m in enumerate(prof.modules)}
    ran = [prof[n] for n in names if prof[n].order is not None]
    ran.sort(key=lambda m: (m.order, position[m.name]))
    return [
        ChainLink(
            name=m.name,
            saved_bytes=prof.subtree_saved_bytes(m.name),
            input_bytes=m.input_bytes,
            forward_seconds=m.forward_seconds,
            output_bytes=m.output_bytes,
            input_binary=m.input_binary,
            packed_input_bytes=m.packed_input_bytes,
            kept_bytes=prof.subtree_kept_bytes(m.name),
        )
        for m in ran
    ]


# ---------------------------------------------------------------- helpers


def _itemsize(dtype: str) -> int:
    value = getattr(torch, dtype, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return torch.empty((), dtype=value).element_size()


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def _depth(name: str) -> int:
    return 0 if not name else name.count(".") + 1


def _joined(values: Iterable[str]) -> str:
    return ",".join(sorted(set(values)))


def _inputs_text(metas: tuple[TensorMeta, ...]) -> str:
    return json.dumps([[t.name, list(t.shape), t.dtype] for t in metas])


def some_names(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(f"`{n or '<root>'}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _unknown(name: str, names: Sequence[str]) -> str:
    message = f"no module `{name}` in the profile"
    close = difflib.get_close_matches(name, [n for n in names if n], n=3)
    if close:
        message += "; did you mean " + ", ".join(f"`{c}`" for c in close) + "?"
    return message


def _plain(m: ModuleProfile) -> dict[str, Any]:
    return {f.name: getattr(m, f.name) for f in fields(m)}


_MODULE_FLOATS = ("forward_seconds", "recompute_seconds")


def _check_held(peaks: Any, windows: Any) -> None:
    """``held_peaks`` are byte counts; ``held_windows`` are (module path, first, last, done) with
    ``0 <= first <= last <= done <= len(held_peaks)``; windows need peaks."""
    if not isinstance(peaks, tuple) or not all(type(p) is int and p >= 0 for p in peaks):
        raise ValueError("held_peaks must be a list of byte counts (integers >= 0)")
    if not isinstance(windows, tuple):
        raise ValueError("held_windows must be a list of [module path, first, last, done]")
    for window in windows:
        ok = isinstance(window, tuple) and len(window) == 4 and isinstance(window[0], str)
        ok = ok and all(type(v) is int for v in window[1:]) and 0 <= window[1] <= window[2] <= window[3] <= len(peaks)
        if not ok:
            raise ValueError(
                f"held_windows: {window!r} is not [module path, first, last, done] "
                f"with 0 <= first <= last <= done <= {len(peaks)}"
            )


def _module_from_dict(data: Any) -> ModuleProfile:
    if not isinstance(data, Mapping):
        raise ValueError(f"a module profile is a JSON object, not {type(data).__name__}")
    body = dict(data)
    body.setdefault("kept_bytes", 0)  # profiles written before it was measured
    _check_keys("module profile", body, [f.name for f in fields(ModuleProfile)])
    for key in _MODULE_FLOATS:
        body[key] = float(body[key])
    return ModuleProfile(**body)


def _tensor_meta_from_dict(data: Any) -> TensorMeta:
    if not isinstance(data, Mapping):
        raise ValueError(f"an input description is a JSON object, not {type(data).__name__}")
    _check_keys("input description", data, ["name", "shape", "dtype"])
    return TensorMeta(str(data["name"]), tuple(int(d) for d in data["shape"]), str(data["dtype"]))


def _check_keys(what: str, data: Mapping[str, Any], expected: Sequence[str]) -> None:
    missing = sorted(set(expected) - set(data))
    extra = sorted(set(data) - set(expected))
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if extra:
            parts.append("unexpected " + ", ".join(extra))
        raise ValueError(f"malformed {what}: " + "; ".join(parts))
