"""Runtime stage: what a region's recompute runs under, and the chunk boundaries it replays.

A region (:mod:`memoplan.runtime.region`) recomputes its forward in backward.  This module
holds what that recompute needs apart from the region's own autograd function: the RNG,
autocast and buffer values the forward saw (:func:`as_in_forward`, :func:`autocast_state`),
the node the decoded input enters through (:class:`Entry`), the saved-tensor hooks that keep
views of the decoded input as the compressed payload (:func:`saved_as_payload`), and the
states time chunks start from when they are recomputed instead of kept (:class:`ChunkStarts`).
"""

from __future__ import annotations

import contextlib
import math
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import set_device_states

from memoplan.runtime import codecs
from memoplan.runtime.state import load_state

__all__ = [
    "RECOMPUTE_NOTE",
    "ChunkStarts",
    "Entry",
    "as_in_forward",
    "autocast_state",
    "recomputing",
    "saved_as_payload",
]

#: How the note that :func:`recomputing` adds to an exception starts.
RECOMPUTE_NOTE = "memoplan: raised while recomputing"
# torch's own early stop of a non-reentrant checkpoint's recompute: control flow, not an error.
_STOP = getattr(torch.utils.checkpoint, "_StopRecomputationError", ())


def autocast_state() -> list[tuple[str, bool, torch.dtype]]:
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    return [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devices]


class Entry(torch.autograd.Function):
    """The decoded input as it enters a recompute: an alias whose gradient the region takes.

    The region's backward differentiates up to this node's output and never runs it.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


@dataclass(frozen=True)
class _PayloadView:
    """A saved tensor that is (a view of) the decoded input: the payload and where in it."""

    payload: codecs.Payload
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int | torch.SymInt  # a SymInt while torch.compile traces


def saved_as_payload(decoded: torch.Tensor, payload: codecs.Payload) -> Any:
    """While recomputing, ops that save the decoded input (or a view of it) keep the payload.

    A convolution's backward needs its input; without this, the recompute would hold the
    decoded input at full size until the region's backward reaches that op.  Each
    saved view is decoded again when backward unpacks it.  A tensor changed in place
    since decoding is saved as it is.
    """
    # No strong reference: the hooks live as long as what they saved, and must not keep the
    # input.  Once the input is freed its address may hold a new tensor, hence the weak one
    # (a view of the input keeps the input alive).
    alive = weakref.ref(decoded)
    pointer, version = decoded.untyped_storage().data_ptr(), decoded._version
    dtype, device = decoded.dtype, decoded.device

    def pack(t: torch.Tensor) -> Any:
        if (
            alive() is not None
            and t.untyped_storage().data_ptr() == pointer
            and t._version == version
            and t.dtype == dtype
            and t.device == device
        ):
            return _PayloadView(payload, tuple(t.shape), tuple(t.stride()), t.storage_offset())
        return t

    def unpack(saved: Any) -> torch.Tensor:
        if isinstance(saved, _PayloadView):
            return codecs.decode(saved.payload).as_strided(saved.size, saved.stride, saved.offset)
        return saved

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


@contextlib.contextmanager
def as_in_forward(ctx) -> Any:
    """The RNG state, autocast and buffer values the region's forward saw (all put back on exit)."""
    with contextlib.ExitStack() as stack:
        if ctx.cpu_rng is not None:
            stack.enter_context(torch.random.fork_rng(devices=ctx.devices))
            torch.set_rng_state(ctx.cpu_rng)
            set_device_states(ctx.devices, ctx.device_rng)
        for device, enabled, dtype in ctx.autocast:
            stack.enter_context(torch.autocast(device, dtype=dtype, enabled=enabled))
        stack.enter_context(ctx.recompute_context)
        yield


@contextlib.contextmanager
def recomputing(where: str, what: str) -> Any:
    """Name the module in any exception its recompute raises (``what``: how the plan runs it).

    The exception keeps its type and traceback; it gains a note (``add_note``), once, from
    the innermost recompute, saying that this was the module's forward run again in backward.
    """
    try:
        yield
    except BaseException as error:
        if not isinstance(error, _STOP) and not any(
            str(note).startswith(RECOMPUTE_NOTE) for note in getattr(error, "__notes__", ())
        ):
            name = f"`{where}`" if where else "the model's root module"
            _add_note(
                error,
                f"{RECOMPUTE_NOTE} {name} ({what}) in backward: the plan runs its forward a second "
                "time there to rebuild the activations it did not keep; the first run succeeded, so "
                "look for what differs on the second (state changed after forward, a side effect)",
            )
        raise


def _add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``; on Python 3.10 (no ``add_note``) the same ``__notes__`` list by hand."""
    if sys.version_info >= (3, 11):
        error.add_note(note)
    else:
        error.__notes__ = [*getattr(error, "__notes__", ()), note]  # type: ignore[attr-defined]  # an instance attribute on 3.10, as add_note keeps it


class ChunkStarts:
    """The states the time chunks of one call start from, recomputed in backward instead of kept.

    With ``boundaries = recompute``, chunk 0 keeps the state it starts from, as every
    region does, and chunk k > 0 keeps nothing.  When backward reaches chunk k (the last
    chunk comes first), :meth:`state` replays the chunks before it without grad, from the
    nearest state known.  Of the states it passes, it keeps every ``stride``-th (``stride``
    about the square root of the number of chunks) and those of chunk k's own stretch of
    ``stride`` chunks, whose backward comes next; a later stretch is replayed from its
    first state when backward reaches it.  So a chunked module holds about twice the
    square root of its chunk count in boundary states, and only while backward runs
    through it, not from its forward to its backward; the price is up to about two more
    forwards of its chunks, without grad (11 chunk replays for 8 chunks).  The replays
    reproduce the forward's values exactly: same inputs, state, buffers, RNG and autocast.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.chunks: list[weakref.ref[Any]] = []  # each chunk's ctx; weak, the graph owns them
        self.known: dict[int, list[torch.Tensor]] = {}  # chunk -> the state it starts from
        self.done: set[int] = set()  # chunks whose backward has run

    @property
    def stride(self) -> int:
        """The ceiling of the square root of the number of chunks."""
        return math.isqrt(max(len(self.chunks) - 1, 0)) + 1

    def add(self, ctx: Any) -> int:
        self.chunks.append(weakref.ref(ctx))
        return len(self.chunks) - 1

    def state(self, k: int) -> list[torch.Tensor]:
        """The state tensors chunk ``k`` started from (``k`` > 0)."""
        known = self.known.pop(k, None)
        if known is not None:
            return known
        start = max((i for i in self.known if i < k), default=0)
        state = self.known.get(start)
        for i in range(start, k):
            ctx = self.chunks[i]()
            if ctx is None:
                raise RuntimeError(f"memoplan: {self.where}: time chunk {i} is gone before chunk {k}'s backward")
            state = _replay(ctx, state, self.where)
            if i + 1 < k and ((i + 1) % self.stride == 0 or (i + 1) // self.stride == k // self.stride):
                self.known[i + 1] = state
        assert state is not None
        return state

    def reached(self, k: int, state: list[torch.Tensor]) -> None:
        """Chunk ``k``'s backward recomputed the state chunk ``k + 1`` starts from: keep it if that backward is to come."""
        self.done.add(k)
        following = k + 1
        if following < len(self.chunks) and following not in self.done and following not in self.known:
            self.known[following] = [t.detach() for t in state]


def _replay(ctx: Any, state: list[torch.Tensor] | None, where: str) -> list[torch.Tensor]:
    """The state the chunk of ``ctx`` ends with, recomputed without grad from ``state`` (None: its own saved one)."""
    run = ctx.run
    try:
        saved = list(ctx.saved_tensors)
    except RuntimeError as error:
        raise RuntimeError(
            f"memoplan: {where}: a time chunk's backward ran before a later chunk's, which needs the state "
            "it ended with (`boundaries = recompute`); write `boundaries = keep` for this module"
        ) from error
    args = [None if dropped else saved.pop(0) for dropped in ctx.dropped]
    tensors = [codecs.decode(ctx.payload) if t is None else t.detach() for t in args]
    del args
    post_forward = run.read_states()
    replaying = recomputing(where, "a time chunk replayed for the state it ended with")
    with replaying, torch.no_grad(), as_in_forward(ctx):
        try:
            run.load_states(run.entry_states, run.state_keys, saved if state is None else state)
            run.call(tensors)
            states = run.read_states()
        finally:
            for module, post in zip(run.stateful, post_forward):
                load_state(module, post)
    return [states[j][name] for j, name in run.out_state_keys]
