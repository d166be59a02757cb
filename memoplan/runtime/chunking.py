"""Runtime stage: time chunks (``temporal_chunk``): the chosen arguments split along a dimension,
one region per chunk run one after another with the state passed on, and the outputs joined in
place as they come; a training-mode BatchNorm inside normalises with the whole batch's statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils.checkpoint import get_device_states, set_device_states

from memoplan.diagnostics import warn
from memoplan.runtime import batchnorm, gradroot, inplace
from memoplan.runtime.recompute import ChunkStarts as _Boundaries
from memoplan.runtime.region_function import RegionOptions, WithStatistics, run_region
from memoplan.runtime.state import get_state, load_state

# (where, chunks, length) already warned about, so a clamp is reported once, not every step.
_CLAMPED: set[tuple[str, int, int]] = set()


def run_chunked(
    roots: Sequence[nn.Module],
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: RegionOptions,
    stateful: Sequence[nn.Module],
    *,
    chunks: int,
    dim: int,
    chunk_args: Sequence[int | str],
    root_only: bool = False,
    recompute_boundaries: bool = False,
) -> Any:
    """Split the chosen arguments along ``dim`` into ``chunks`` regions run one after another.

    The stateful modules' state passes from each chunk to the next, so with
    time-local layers the result equals the unchunked forward; tensor outputs are
    concatenated along ``dim``.  A training-mode BatchNorm inside normalises every
    chunk with the whole batch's statistics (:mod:`memoplan.runtime.batchnorm`).

    ``root_only``: the result is a recompute's, only differentiated from, so the
    outputs are not joined.  Either way the first argument's gradient may go in
    place, over the output's (:mod:`memoplan.runtime.gradroot`).

    ``recompute_boundaries``: only the first chunk keeps the state it starts from; the
    others' are recomputed in backward (:class:`_Boundaries`).
    """
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    for key in chunk_args:  # MP408 before torch's IndexError
        tensor = args[key] if isinstance(key, int) else kwargs[key]
        inplace.check_chunk_dim(roots[0], tensor, chunks, dim, key, options.where)
    first = args[0] if args and chunk_args[0] == 0 else None
    sink = None
    if isinstance(first, torch.Tensor) and first.requires_grad:
        sink = gradroot.Sink(dim, _chunk_sizes(first.shape[dim], chunks))
    chunked = _split_chunks(args, kwargs, options, chunks=chunks, dim=dim, chunk_args=chunk_args, sink=sink)
    key = chunk_args[0]
    sizes = [(a[key] if isinstance(key, int) else kw[key]).shape[dim] for a, kw in chunked]
    joined = _Join(dim, sizes, options.where, root_only=root_only, sink=sink)
    if batchnorm.normalising_modules(roots):
        _chunks_with_batch_statistics(roots, fn, chunked, options, stateful, joined, sink, recompute_boundaries)
    else:
        boundaries = _Boundaries(options.where) if recompute_boundaries and stateful else None
        for k, (a, kw) in enumerate(chunked):
            chunk_sink = None if sink is None else (sink, k)
            joined.add(run_region(roots, fn, a, kw, options, stateful, sink=chunk_sink, boundaries=boundaries))
    return joined.result()


def _chunk_sizes(size: int, chunks: int) -> list[int]:
    """The lengths of ``chunks`` near-equal pieces of ``size`` steps (at most ``size`` pieces)."""
    parts = max(1, min(chunks, size))
    return [size // parts + (1 if i < size % parts else 0) for i in range(parts)]


def _split_chunks(args, kwargs, options: RegionOptions, *, chunks: int, dim: int, chunk_args, sink=None):
    """Each chunk's ``(args, kwargs)``: the chosen arguments split along ``dim``, the rest as they are."""
    pieces: dict[int | str, tuple[torch.Tensor, ...]] = {}
    length = None
    for key in chunk_args:
        tensor = args[key] if isinstance(key, int) else kwargs[key]
        size = tensor.shape[dim]
        if length is not None and size != length:
            raise ValueError(
                f"memoplan: {options.where}: chunked arguments differ in length along dim {dim} ({length} vs {size})"
            )
        length = size
        if chunks > size and key == chunk_args[0] and (options.where, chunks, size) not in _CLAMPED:
            _CLAMPED.add((options.where, chunks, size))
            warn(
                f"memoplan: {options.where}: temporal_chunk {chunks} over a time axis of {size} steps; "
                f"using {max(1, size)} chunks",
                RuntimeWarning,
            )
        # One split (not per-chunk slices): its backward concatenates the chunks'
        # gradients once instead of adding a full-size zero-padded tensor per chunk.
        sizes = _chunk_sizes(size, chunks)
        if sink is not None and key == chunk_args[0]:
            pieces[key] = gradroot.Split.apply(tensor, sizes, dim, sink)
        else:
            pieces[key] = torch.split(tensor, sizes, dim=dim)
    result = []
    for k in range(len(next(iter(pieces.values())))):
        chunk_args_k, chunk_kwargs_k = list(args), dict(kwargs)
        for key, parts in pieces.items():
            if isinstance(key, int):
                chunk_args_k[key] = parts[k]
            else:
                chunk_kwargs_k[key] = parts[k]
        result.append((chunk_args_k, chunk_kwargs_k))
    return result


def _chunks_with_batch_statistics(
    roots,
    fn,
    chunked,
    options: RegionOptions,
    stateful,
    joined: _Join,
    sink: gradroot.Sink | None = None,
    recompute_boundaries: bool = False,
) -> None:
    """The chunks' outputs, joined in ``joined``, BatchNorm normalising with the whole batch's statistics.

    One statistics pass per training-mode ``batch_norm`` call, then the main pass
    (see :mod:`memoplan.runtime.batchnorm`); every pass starts from the step's
    buffers, state and RNG.
    """
    entry_states = [get_state(m) for m in stateful]
    snapshot = batchnorm.Snapshot(roots)
    tensors = [t for a, kw in chunked[:1] for t in pytree.tree_leaves((a, kw)) if isinstance(t, torch.Tensor)]
    cpu_rng = torch.get_rng_state()
    devices, device_rng = get_device_states(*tensors)
    stats: list[torch.Tensor] = []  # the batch's mean and variance per known call, flat
    local: list[list[torch.Tensor]] = [[] for _ in chunked]  # each chunk's own, the same way
    totals: list[int] = []
    payloads: dict[int, tuple[torch.Tensor, int, Any]] = {}  # every pass keeps a chunk's input as one payload
    while True:
        run = batchnorm.Pass(known=len(totals))
        region_fn = WithStatistics(fn, run)
        outputs, counters = [], []
        calls: list[batchnorm.Call] = []
        # A statistics pass stops before the stateful modules change: its chunks all start
        # from the step's state, so only the main pass's chunks pass state on.
        boundaries = _Boundaries(options.where) if recompute_boundaries and stateful else None
        for k, (args, kwargs) in enumerate(chunked):
            run.measured, run.record = False, ([] if k == 0 else None)
            kwargs = {**kwargs, batchnorm.STATS_KEYWORD: (tuple(stats), tuple(local[k]))}
            chunk_sink = None if sink is None else (sink, k)
            output = run_region(roots, region_fn, args, kwargs, options, stateful, payloads, chunk_sink, boundaries)
            if k == 0:
                assert run.record is not None  # chunk 0 records (set above)
                measuring, calls, run.record = run.measured, run.record, None
                counters = [] if measuring else snapshot.counters()
                if measuring:
                    boundaries = None
            elif run.measured != measuring:
                raise RuntimeError(f"memoplan: {options.where}: the time chunks made different BatchNorm calls")
            if measuring:
                outputs.append(output)
            else:
                joined.add(output)
            del output
        if not measuring:
            break
        mean, var, total = batchnorm.combine([(m, v) for m, v, _ in outputs], [n for _, _, n in outputs])
        if total <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got {total} (memoplan: {options.where})"
            )
        stats += [mean, var]
        totals.append(total)
        for mine, (m, v, _) in zip(local, outputs):
            mine += [m, v]
        # The next pass starts where this one started.
        snapshot.restore()
        for module, state in zip(stateful, entry_states):
            load_state(module, state)
        torch.set_rng_state(cpu_rng)
        set_device_states(devices, device_rng)
    if len(calls) != len(totals):
        raise RuntimeError(f"memoplan: {options.where}: the time chunks made different BatchNorm calls")
    # num_batches_tracked as after one forward; running statistics from the batch's.
    with torch.no_grad():
        for counter, value in counters:
            counter.copy_(value)
    batchnorm.update_running(calls, stats, totals)


class _Join:
    """The chunks' outputs joined along ``dim`` as they come, each tensor output into one buffer.

    A tensor output as long along ``dim`` as its chunk's input goes straight into
    its place in a buffer of the whole length (:class:`_Place`), so a chunk's
    output is freed as soon as the next one runs, instead of every chunk's output
    and their concatenation being alive at once.  Any other tensor output is
    concatenated at the end; non-tensor outputs must be equal in every chunk.

    ``root_only``: the joined output is never read, so it is a stand-in that holds
    no memory (:class:`gradroot.Mark`).  The first output's gradient is offered to
    ``sink``: by every placement's backward when ``root_only``, else by the last
    placement's, which the engine reaches first.
    """

    def __init__(
        self, dim: int, sizes: Sequence[int], where: str, *, root_only: bool = False, sink: gradroot.Sink | None = None
    ) -> None:
        self.dim, self.sizes, self.where = dim, list(sizes), where
        self.root_only, self.sink = root_only, sink
        self.count = 0
        self.spec: Any = None
        self.columns: list[Any] = []  # per output leaf: a buffer, a list of pieces, or the non-tensor value

    def add(self, output: Any) -> None:
        leaves, spec = pytree.tree_flatten(output)
        k, self.count = self.count, self.count + 1
        if k == 0:
            self.spec = spec
            self.columns = [self._first(i, leaf) for i, leaf in enumerate(leaves)]
            return
        if spec != self.spec:
            raise ValueError(f"memoplan: {self.where}: chunks returned outputs of different structure")
        for i, leaf in enumerate(leaves):
            column = self.columns[i]
            if not isinstance(leaf, torch.Tensor):
                if isinstance(column, (torch.Tensor, list)) or leaf != column:
                    raise ValueError(f"memoplan: {self.where}: chunks returned different non-tensor outputs")
            elif isinstance(column, list):
                column.append(leaf)
            elif isinstance(column, torch.Tensor) and self._fits(leaf, k):
                self.columns[i] = self._place(i, column, leaf, sum(self.sizes[:k]), last=k == len(self.sizes) - 1)
            elif isinstance(column, torch.Tensor):  # not as long as its chunk: concatenate instead
                self.columns[i] = [column.narrow(self.dim, 0, sum(self.sizes[:k])), leaf]
            else:
                raise ValueError(f"memoplan: {self.where}: chunks returned different non-tensor outputs")

    def _fits(self, leaf: torch.Tensor, k: int) -> bool:
        return -leaf.dim() <= self.dim < leaf.dim() and leaf.shape[self.dim] == self.sizes[k]

    def _first(self, i: int, leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        if not self._fits(leaf, 0) or len(self.sizes) == 1:
            return [leaf]
        shape = list(leaf.shape)
        shape[self.dim] = sum(self.sizes)
        buffer = gradroot.stand_in(shape, leaf.dtype, leaf.device) if self.root_only else leaf.new_empty(shape)
        return self._place(i, buffer, leaf, 0)

    def _place(self, i: int, column: torch.Tensor, leaf: torch.Tensor, start: int, last: bool = False) -> torch.Tensor:
        sink = self.sink if i == 0 else None
        if self.root_only:
            return gradroot.Mark.apply(column, leaf, start, self.dim, sink)
        return _Place.apply(column, leaf, start, self.dim, sink if last else None)

    def result(self) -> Any:
        joined = []
        for column in self.columns:
            if isinstance(column, list):
                column = column[0] if len(column) == 1 else torch.cat(column, dim=self.dim)
            joined.append(column)
        self.columns = []
        return pytree.tree_unflatten(joined, self.spec)


class _Place(torch.autograd.Function):
    """``buffer`` with ``piece`` copied in along ``dim`` from ``start`` (in place).

    Backward hands the piece its slice of the gradient and the earlier buffer the
    gradient unchanged: the slots are disjoint and each is written once, and the
    first buffer needs no gradient, so the overwritten values never receive one.

    The last placement's backward, the first to run, hands the gradient to the
    chunks' ``sink`` when nothing else holds it (:func:`gradroot.held_alone`).
    """

    @staticmethod
    def forward(ctx, buffer: torch.Tensor, piece: torch.Tensor, start: int, dim: int, sink) -> torch.Tensor:
        buffer.narrow(dim, start, piece.shape[dim]).copy_(piece)
        ctx.mark_dirty(buffer)
        ctx.slot = (dim, start, piece.shape[dim])
        ctx.sink = sink
        return buffer

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.sink is not None:
            alone = gradroot.held_alone((grad,), "place")
            ctx.sink.take(grad, bool(alone))
            del alone
        dim, start, length = ctx.slot
        return grad, grad.narrow(dim, start, length), None, None, None
