"""Runtime stage: the last module of a recompute, whose output only roots the region's backward.

When a checkpointed region is recomputed in backward, its output is never read:
the region only differentiates from it.  If the region is a chain whose last
module runs in time chunks (``temporal_chunk`` inside ``checkpoint``, as in
``plans/spiking_lif_chunks.memplan``), two things follow.

* **No joined output.**  The chunks' outputs need not be copied into one
  buffer.  Each chunk's output is dropped as soon as the next chunk runs, and the
  module returns a stand-in of the right shape, dtype and device that holds no
  memory (:class:`Mark`).  Its backward hands each chunk its slice of the
  incoming gradient, as the joined buffer's would.
* **Input gradients in place.**  When the region's incoming gradient is held by
  nothing but the region's backward, each chunk's input gradient is written over
  the chunk's own slice of it, once that chunk's backward is done with the slice
  (:class:`Sink`).  The split of the chunked argument then returns that tensor
  as its gradient (:class:`Split`), instead of keeping every chunk's input
  gradient and concatenating them.  This is for chunks whose input and output
  have the same shape and dtype, such as spiking neurons.

The second holds outside a recompute too.  There the chunks' output is a real
joined tensor, and the last chunk's placement, whose backward the engine reaches
first, makes the same check on the gradient it gets (``held_alone(..., "place")``).
A chunked BatchNorm's statistics passes, whose regions run after every chunk of
the main pass, add their part of each input gradient into the same slice
(:meth:`Sink.add_into`).

Nothing here may change a result, so each step checks that nobody else can see
what it skips or overwrites, and falls back to the ordinary path otherwise:

* the last module's output is a stand-in only if the module's forward is one
  memoplan installed, which returns the chunks' result directly, and no forward
  or backward hook, on the module or global, could see that result;
* an incoming gradient counts as held alone (:func:`held_alone`) when it is a
  contiguous tensor of its own, or a reshape of one (what a view's backward
  returns), sharing its storage with no other tensor, and when its C++ and
  Python reference counts are those of a gradient the autograd engine hands to
  exactly one node.  The Python count depends on the frames in between, so it is
  measured once per process on a probe region (:func:`_probe`), through the same
  code.  A second consumer, a hook that kept the tensor or a view of it, and a
  caller's ``grad_tensors`` each raise one of these counts;
* a chunk's slice is overwritten only if its reference counts, and those of the
  whole gradient, are the same after the chunk's backward as before it, so no
  hook inside the chunk kept the slice or a view of it;
* never while building a graph of the backward (``create_graph=True``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn
from torch.nn.modules import module as _module
from torch.utils._python_dispatch import _disable_current_modes

from memoplan.runtime.install import PATH_ATTR

__all__ = [
    "Mark",
    "Sink",
    "Split",
    "held_alone",
    "result_unread",
    "root_only",
    "set_probe_region",
    "stand_in",
    "takes_root_only",
    "vouched",
]

_LOCAL = threading.local()


# -- the last module of a recompute ------------------------------------------------------


def result_unread(module: nn.Module) -> bool:
    """Whether only the caller sees ``module``'s output: a forward memoplan installed, no hook that sees it."""
    if type(module).__call__ is not nn.Module.__call__ or PATH_ATTR not in module.__dict__:
        return False
    if "forward" not in module.__dict__:
        return False
    hooks = (
        module._forward_hooks,
        module._backward_hooks,
        module._backward_pre_hooks,
        _module._global_forward_hooks,
        _module._global_backward_hooks,
        _module._global_backward_pre_hooks,
    )
    return not any(hooks)


@contextlib.contextmanager
def root_only(module: nn.Module) -> Iterator[None]:
    """While ``module`` runs, its planned forward may return a gradient root only (see :func:`takes_root_only`)."""
    previous = getattr(_LOCAL, "root_only", None)
    _LOCAL.root_only = module
    try:
        yield
    finally:
        _LOCAL.root_only = previous


def takes_root_only(module: nn.Module) -> bool:
    """Whether this call of ``module``'s planned forward may return a stand-in; asks once per call."""
    if getattr(_LOCAL, "root_only", None) is not module:
        return False
    _LOCAL.root_only = None
    return True


class Mark(torch.autograd.Function):
    """A chunk's output placed in a joined output that is never read: nothing is copied.

    Returns a stand-in with the joined output's shape that holds no memory;
    backward is that of a placement (:class:`memoplan.runtime.chunking._Place`):
    the earlier stand-in gets the gradient, the chunk its slice of it.  The
    column's :class:`Sink`, if any, is offered the gradient first.
    """

    @staticmethod
    def forward(ctx, previous: torch.Tensor, piece: torch.Tensor, start: int, dim: int, sink: Sink | None):
        ctx.slot = (dim, start, piece.shape[dim])
        ctx.sink = sink
        return stand_in(previous.shape, piece.dtype, piece.device)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dim, start, length = ctx.slot
        if ctx.sink is not None:
            ctx.sink.offer(grad)
        return grad, grad.narrow(dim, start, length), None, None, None


_ONE: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def stand_in(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of this shape, dtype and device that holds no memory of its own: one element, expanded.

    The element is a constant of the process, made outside any dispatch mode.  Its
    value means nothing: a stand-in is only ever differentiated from, never read.
    """
    one = _ONE.get((dtype, device))
    if one is None:
        with _disable_current_modes():
            one = _ONE[(dtype, device)] = torch.zeros((), dtype=dtype, device=device)
    return one.expand(shape)


# -- input gradients in place ------------------------------------------------------------


def _counts(t: torch.Tensor) -> tuple[int, int, int]:
    """(C++ references, Python references, tensors sharing the storage) of ``t``, as seen from the caller's frame."""
    uses: int = t._use_count()  # type: ignore[attr-defined]  # Tensor._use_count exists at runtime; torch's stubs omit it
    return uses, sys.getrefcount(t), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def held_alone(grads: Sequence[torch.Tensor | None], site: str = "region") -> list[torch.Tensor]:
    """The incoming gradients of a backward that nothing else holds (call first thing, on its ``grads``).

    ``site``: whose backward asks, ``"region"`` (a region's) or ``"place"`` (the
    last placement of a joined output, :class:`memoplan.runtime.chunking._Place`);
    each has its own probe, as the frames in between differ.
    """
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return []
    alone = []
    for g in grads:
        if g is None or g.layout != torch.strided or not g.is_contiguous():
            continue
        if g._base is None:
            counts: tuple[int, ...] = _counts(g)
        else:  # a reshape of a tensor of its own (as a view's backward returns): both must be held alone
            base = g._base
            if (
                base._base is not None
                or not base.is_contiguous()
                or (base.data_ptr(), base.numel())
                != (
                    g.data_ptr(),
                    g.numel(),
                )
            ):
                continue
            counts = (*_counts(g), *_counts(base))
            del base
        probing = getattr(_LOCAL, "probing", None)
        if probing is not None:
            if probing[0] == site:
                probing[1].append(counts)
        elif counts in _alone_counts(site):
            alone.append(g)
        del counts
    return alone


_ALONE: dict[str, tuple[tuple[int, ...], ...]] = {}

# The region the probe differentiates through, ``(site, x) -> output``.  Gradient routing does
# not import the region runtime (the dependency is one-way: memoplan.runtime.region imports this
# module); the region registers it with :func:`set_probe_region` when it is imported.
_PROBE_REGION: Callable[[str, torch.Tensor], torch.Tensor] | None = None


def set_probe_region(run: Callable[[str, torch.Tensor], torch.Tensor]) -> None:
    """Register the region :func:`held_alone`'s probe runs: ``run(site, x)`` for ``site`` ``"region"`` or ``"place"``."""
    global _PROBE_REGION
    _PROBE_REGION = run


def _alone_counts(site: str) -> tuple[tuple[int, ...], ...]:
    if site not in _ALONE:
        _ALONE[site] = _probe(site)
    return _ALONE[site]


def _probe(site: str) -> tuple[tuple[int, ...], ...]:
    """The counts :func:`held_alone` sees at ``site`` for gradients the engine hands to one node only.

    Two probes: a gradient of its own (from a multiplication's backward) and a
    reshape of one (from a view's backward), into a region, or into two time
    chunks' joined output.
    """
    if _PROBE_REGION is None:  # pragma: no cover - memoplan.runtime imports the region, which registers it
        raise RuntimeError("memoplan: no probe region registered (import memoplan.runtime)")
    probe_region = _PROBE_REGION

    def region(x: torch.Tensor) -> torch.Tensor:
        return probe_region(site, x)

    seen: list[tuple[int, ...]] = []
    _LOCAL.probing = (site, seen)
    try:
        # Outside any dispatch or function mode (a batchnorm statistics pass, a watched forward):
        # a fact of the process, not memory or ops of the step that first asks.
        with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.enable_grad():
            for follow in (lambda t: t * 1, lambda t: t.view(1, 2)):
                x = torch.ones(2, requires_grad=True)
                (out,) = (region(x),)
                torch.autograd.grad((follow(out) * 1).sum(), x)
    finally:
        _LOCAL.probing = None
    if len(seen) != 2 or len(seen[0]) != 3 or len(seen[1]) != 6:  # pragma: no cover - the probe did not run as built
        raise RuntimeError("memoplan: the gradient probe did not run as expected")
    return tuple(seen)


@contextlib.contextmanager
def vouched(grads: list[torch.Tensor]) -> Iterator[None]:
    """While the region differentiates its recompute, these incoming gradients are its own (:func:`held_alone`)."""
    stack = getattr(_LOCAL, "vouched", None)
    if stack is None:
        stack = _LOCAL.vouched = []
    stack.append(grads)
    try:
        yield
    finally:
        stack.pop()


def _is_vouched(grad: torch.Tensor) -> bool:
    stack = getattr(_LOCAL, "vouched", None)
    return stack is not None and bool(stack) and any(grad is g for g in stack[-1])


class Sink:
    """The incoming gradient of a chunked module's output, once it is known to be the module's own.

    Chunk ``k``'s input gradient is written over slice ``k`` of it (:meth:`fill`)
    after chunk ``k``'s backward, which was the slice's last reader.  Later
    contributions to the same input gradient (the BatchNorm statistics passes'
    regions, which run after every chunk's) are added into the slice
    (:meth:`add_into`) instead of joining it in autograd's buffer.
    """

    def __init__(self, dim: int, sizes: Sequence[int]) -> None:
        self.dim, self.sizes = dim, list(sizes)
        self.starts = [sum(self.sizes[:k]) for k in range(len(self.sizes))]
        self.target: torch.Tensor | None = None
        self.offered = False
        self.filled: set[int] = set()  # the slices that hold their chunk's input gradient

    def offer(self, grad: torch.Tensor) -> None:
        """The first gradient to come back through the stand-in output (the last chunk's, :class:`Mark`)."""
        if self.offered:
            return
        self.offered = True
        if not torch.is_grad_enabled() and _is_vouched(grad) and grad.shape[self.dim] == sum(self.sizes):
            self.target = grad

    def take(self, grad: torch.Tensor, alone: bool) -> None:
        """The gradient of a joined output, as its last placement's backward gets it, in every backward through it."""
        self.filled.clear()
        self.target = grad if alone and grad.shape[self.dim] == sum(self.sizes) else None

    def _slot(self, k: int) -> torch.Tensor:
        assert self.target is not None
        return self.target.narrow(self.dim, self.starts[k], self.sizes[k])

    def is_slot(self, t: torch.Tensor | None, k: int) -> bool:
        """Whether ``t`` is exactly slice ``k`` of the target."""
        if t is None or self.target is None:
            return False
        slot = self._slot(k)
        return (
            t.data_ptr() == slot.data_ptr()
            and t.shape == slot.shape
            and t.stride() == slot.stride()
            and t.dtype == slot.dtype
            and t.device == slot.device
        )

    def watch(self, slot: torch.Tensor) -> tuple[int, ...]:
        """Reference counts to compare before and after a chunk's backward (call with the slice the chunk got)."""
        assert self.target is not None
        return (*_counts(slot), *_counts(self.target))

    def _fits(self, slot: torch.Tensor, grad_in: torch.Tensor | None) -> bool:
        target = self.target
        return (
            grad_in is not None
            and target is not None
            and not torch.is_grad_enabled()
            and grad_in.shape == slot.shape
            and grad_in.dtype == slot.dtype
            and grad_in.device == slot.device
            and grad_in.untyped_storage().data_ptr() != target.untyped_storage().data_ptr()
        )

    def fill(self, slot: torch.Tensor, grad_in: torch.Tensor | None, k: int) -> torch.Tensor | None:
        """Chunk ``k``'s input gradient, written into its slot when it fits; else as it is."""
        if grad_in is None or not self._fits(slot, grad_in):
            return grad_in
        slot.copy_(grad_in)
        self.filled.add(k)
        return slot

    def add_into(self, k: int, grad_in: torch.Tensor | None) -> bool:
        """Add a later contribution to chunk ``k``'s input gradient into its filled slot; False if it does not go there.

        Autograd's buffer for the chunk's input already holds the slot (what
        :meth:`fill` returned), so adding here is the sum autograd would make.
        """
        if k not in self.filled or self.target is None:
            return False
        slot = self._slot(k)
        if grad_in is None or not self._fits(slot, grad_in):
            return False
        slot.add_(grad_in)
        return True

    def whole(self, grads: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
        """The target, if ``grads`` are its slices in order (every chunk's gradient in place); releases it either way."""
        found = len(grads) == len(self.sizes) and all(self.is_slot(g, k) for k, g in enumerate(grads))
        target, self.target = self.target, None
        self.filled.clear()
        return target if found else None


class Split(torch.autograd.Function):
    """``torch.split`` of a chunked argument whose backward takes the :class:`Sink`'s target when it can.

    Otherwise it concatenates the chunks' gradients, as ``torch.split`` does.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, sizes: list[int], dim: int, sink: Sink):
        ctx.sizes, ctx.dim, ctx.sink = sizes, dim, sink
        ctx.shape, ctx.dtype, ctx.device = x.shape, x.dtype, x.device
        return tuple(piece.view_as(piece) for piece in torch.split(x, sizes, dim=dim))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        whole = ctx.sink.whole(grads)
        if whole is not None and whole.shape == ctx.shape:
            return whole, None, None, None
        if all(g is None for g in grads):
            return None, None, None, None
        pieces = []
        for g, size in zip(grads, ctx.sizes):
            if g is None:
                shape = list(ctx.shape)
                shape[ctx.dim] = size
                g = torch.zeros(shape, dtype=ctx.dtype, device=ctx.device)
            pieces.append(g)
        return torch.cat(pieces, dim=ctx.dim), None, None, None
