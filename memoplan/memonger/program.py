"""Memonger stage: the captured program as plain data — what the arena module runs, step by step.

Values are numbered: the flat inputs first, then the model attributes the graph reads
(parameters and buffers, by path), then each step's result.  A step's arguments are
literals (``int``, ``float``, ``bool``, ``str``, ``None``, :class:`Const` for torch's
dtype/device/layout/memory-format values, :class:`ScalarTensor`, tuples for lists) and
:class:`Ref` to values.
Nothing here holds a tensor: the program prints as code and compares by value.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ref:
    """The value numbered ``index``."""

    index: int


@dataclass(frozen=True)
class Const:
    """A torch constant: ``kind`` is ``dtype``, ``device``, ``layout`` or ``memory_format``;
    ``text`` its name (``float32``, ``cpu``, ``strided``, ``contiguous_format``)."""

    kind: str
    text: str


@dataclass(frozen=True)
class ScalarTensor:
    """A number passed where the op takes a tensor, as a 0-dim tensor of ``dtype`` made once
    (``memoplan.runtime.arena_into.scalar``) instead of a fresh one wrapped on every call."""

    value: bool | int | float
    dtype: str


@dataclass(frozen=True)
class TensorGuard:
    """A tensor input as captured: the arena runs only for inputs exactly like it."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class ConstGuard:
    """A non-tensor input leaf, baked into the graph: the arena runs only when it is equal."""

    value: object


@dataclass(frozen=True)
class Step:
    """One call of the captured graph.

    ``op``: ``"ns.name.overload"`` called with ``args``/``kwargs`` (the ``.out`` overload when
    ``buffer`` is set: the result is written into that arena buffer through ``out=``),
    ``"into.name"`` (the form ``name`` of ``memoplan.runtime.arena_into``, writing into the
    buffer), or ``"getitem"`` (``args[0][args[1]]``).  ``result``: the value it defines, or None.
    ``function``: the op as the model called it.  ``note``: why its result is not in the
    arena, for the generated comment.  ``module``: the module path it came from.
    """

    op: str
    args: tuple
    kwargs: tuple[tuple[str, object], ...]
    result: int | None
    function: str
    module: str = ""
    buffer: int | None = None
    note: str = ""


@dataclass(frozen=True)
class BufferInfo:
    """A fresh allocation of the graph: made by step ``producer`` as value ``value``."""

    value: int
    producer: int
    users: tuple[int, ...]
    size: int  # bytes of its storage
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    arena: bool  # can be written into the arena through an out= variant (``out_step``)
    note: str = ""  # why not, when not
    out_step: Step | None = None  # the producing step through its out= variant, writing buffer ``buffer``
    scratch: int = 0  # bytes out_step allocates and frees inside on every call (a kernel's workspace)
    over: int | None = None  # a buffer out_step may write over: its producer is pointwise and reads it once


@dataclass(frozen=True)
class Program:
    """The captured inference graph of a model, with what the arena needs to run it."""

    model_class: str
    device: str
    inputs: tuple[TensorGuard | ConstGuard, ...]
    in_spec: str  # torch.utils._pytree.treespec_dumps of (args, kwargs)
    out_spec: str
    attributes: tuple[str, ...]  # model attribute paths, values len(inputs) ...
    attribute_guards: tuple[TensorGuard, ...]  # each attribute as captured
    names: tuple[str, ...]  # a name hint for every value
    steps: tuple[Step, ...]  # capture order
    deps: tuple[tuple[int, ...], ...]  # per step: the steps that must run before it
    buffers: tuple[BufferInfo, ...]
    outputs: tuple[object, ...]  # Ref or literal, flat, in out_spec order
    workspaces: tuple[int, ...] = ()  # per step: bytes its op, as the model calls it, allocates and frees inside

    @property
    def first_step_value(self) -> int:
        return len(self.inputs) + len(self.attributes)

    def arena_buffers(self) -> tuple[int, ...]:
        """The buffers an out= variant can write into the arena."""
        return tuple(i for i, b in enumerate(self.buffers) if b.arena)
