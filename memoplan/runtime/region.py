"""Runtime stage: memoplan's own checkpointed region — compressed input, threaded state, time chunks.

``torch.utils.checkpoint`` keeps a region's inputs as they are and knows nothing
of module state kept between calls.  A region that must keep its input in a
compact form (``compress input = bit``), carry a stateful module's state
(``state = functional``) or run in time chunks (``temporal_chunk``) runs here
instead, as one ``autograd.Function``:

* forward, without grad: encode the first positional tensor argument with the
  region's codec and keep only the payload; run the forward; return its tensor
  outputs *and* the stateful modules' new state as outputs, so gradients flow
  through the state into the next call or chunk;
* backward: decode the input, put back the state the forward started from and
  the buffer values and RNG state it saw, recompute with grad, take
  ``autograd.grad`` with respect to the inputs, the entering state and the
  parameters, then restore the modules' post-forward state and buffers.

Compression therefore happens inside the checkpointed computation, not through
ambient saved-tensor hooks (which save nothing under ``torch.compile``,
pytorch/pytorch#148222).  Parameters are explicit inputs of the Function and
their gradients come back through the outer autograd engine, so DDP sees each
parameter ready exactly once (pytorch/pytorch#24005) and frozen inputs and
parameters behave as without a plan (huggingface/transformers#23170).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.utils.checkpoint import get_device_states, set_device_states

from memoplan.diagnostics import warn
from memoplan.enums import Boundaries
from memoplan.runtime import batchnorm, codecs, gradroot, inplace
from memoplan.runtime.buffers import BufferGuard
from memoplan.runtime.compiled import outside_graph, outside_needed, region_kind
from memoplan.runtime.install import PATH_ATTR

# The recompute's surroundings live in their own module; ``_Boundaries`` (the states chunks
# start from) and ``_saved_as_payload`` keep their names here, where the tests reach them.
from memoplan.runtime.recompute import ChunkStarts as _Boundaries
from memoplan.runtime.recompute import Entry, as_in_forward, autocast_state, recomputing
from memoplan.runtime.recompute import saved_as_payload as _saved_as_payload
from memoplan.runtime.state import get_state, load_state

__all__ = ["RegionOptions", "run_chunked", "run_planned", "run_region"]


@dataclass(frozen=True)
class RegionOptions:
    codec: str = "none"  # for the first positional tensor argument; "auto" chooses once per region
    validate: str = "sample"
    tolerance: float | None = None
    preserve_rng: bool = True
    where: str = ""  # the module path, for messages


# (where, chunks, length) already warned about, so a clamp is reported once, not every step.
_CLAMPED: set[tuple[str, int, int]] = set()

# (region root, where) -> codec chosen by "auto" on the region's first train-mode call.
_AUTO: weakref.WeakKeyDictionary[nn.Module, dict[str, str]] = weakref.WeakKeyDictionary()


def run_planned(
    module: nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    codec: str = "none",
    validate: str = "sample",
    tolerance: float | None = None,
    preserve_rng: bool = True,
    where: str = "",
    stateful: Sequence[str] = (),
    chunks: int | None = None,
    dim: int = 0,
    chunk_args: Sequence[int | str] = (0,),
    boundaries: str | Boundaries = "keep",
) -> Any:
    """A planned module's forward as memoplan regions (what generated code calls).

    ``stateful`` names the submodules (paths relative to ``module``, ``""`` for itself)
    whose state the region threads; ``chunks`` splits ``chunk_args`` along ``dim``;
    ``boundaries="recompute"`` keeps only the state the first chunk starts from
    (:class:`_Boundaries`).
    """
    if outside_needed():
        return outside_graph(
            run_planned,
            where or module.__dict__.get(PATH_ATTR, ""),
            region_kind(codec, stateful, chunks),
            module,
            args,
            kwargs,
            codec=codec,
            validate=validate,
            tolerance=tolerance,
            preserve_rng=preserve_rng,
            where=where,
            stateful=stateful,
            chunks=chunks,
            dim=dim,
            chunk_args=chunk_args,
            boundaries=boundaries,
        )
    options = RegionOptions(codec, validate, tolerance, preserve_rng, where or module.__dict__.get(PATH_ATTR, ""))
    modules = tuple(module.get_submodule(path) if path else module for path in stateful)
    fn = (
        _Chain(cast(nn.Sequential, module))
        if type(module).forward is nn.Sequential.forward
        else partial(type(module).forward, module)
    )
    root_only = gradroot.takes_root_only(module)
    if chunks is not None:
        return run_chunked(
            (module,),
            fn,
            args,
            kwargs,
            options,
            modules,
            chunks=chunks,
            dim=dim,
            chunk_args=chunk_args,
            root_only=root_only,
            recompute_boundaries=Boundaries(boundaries) is Boundaries.RECOMPUTE,
        )
    return run_region((module,), fn, args, kwargs, options, modules)


def run_region(
    roots: Sequence[nn.Module],
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: RegionOptions,
    stateful: Sequence[nn.Module] = (),
    payloads: dict[int, tuple[torch.Tensor, int, Any]] | None = None,
    sink: tuple[gradroot.Sink, int] | None = None,
    boundaries: _Boundaries | None = None,
) -> Any:
    """``fn(*args, **kwargs)`` as one region over ``roots`` (whose parameters and buffers it uses).

    ``payloads``, shared by regions that read the same input tensors, holds each
    input's payload once it is encoded, so the regions keep one payload between them.
    ``sink`` is ``(sink, k)`` for time chunk ``k`` of a module whose output is only a
    gradient root: its first argument's gradient may go in place (:mod:`memoplan.runtime.gradroot`).
    ``boundaries``, shared by the time chunks of one call, recomputes the state each
    chunk starts from instead of keeping it (:class:`_Boundaries`).
    """
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    run = _Run(roots, fn, args, kwargs, options, stateful, payloads, sink)
    run.boundaries = boundaries
    outputs = _RegionFunction.apply(run, *run.inputs)
    return run.finish(outputs)


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
        region_fn = _WithStatistics(fn, run)
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


class _Chain:
    """``nn.Sequential.forward`` of ``module``, able to let go of each module's input once it has run.

    A recompute that decoded its input keeps it, for ops that save it, as the
    payload; releasing the decoded tensor after the first module frees it there.
    """

    def __init__(self, module: nn.Sequential) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return nn.Sequential.forward(self.module, *args, **kwargs)

    def run_owned(self, box: list[Any], kwargs: dict[str, Any], root_only: bool = False) -> Any:
        """The forward of the one argument in ``box``, which it empties (see :meth:`_Run.call`).

        ``root_only``: the chain's output is only differentiated from (a recompute), so
        the last module may return a stand-in for it (:mod:`memoplan.runtime.gradroot`).
        """
        if kwargs:
            return self(box.pop(), **kwargs)
        x = box.pop()
        last = len(self.module) - 1
        for i, child in enumerate(self.module):
            if root_only and i == last and gradroot.result_unread(child):
                with gradroot.root_only(child):
                    x = child(x)
            else:
                x = child(x)
        return x


class _WithStatistics:
    """``fn`` with its BatchNorm calls normalising with given statistics (:func:`batchnorm.given_statistics`).

    Passes an owned input on to a :class:`_Chain`, so a chunk of a Sequential lets
    go of its decoded input in the main and statistics passes too.
    """

    def __init__(self, fn: Callable[..., Any], run: batchnorm.Pass) -> None:
        self.fn, self.run = fn, run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return batchnorm.given_statistics(self.fn, self.run, *args, **kwargs)

    def run_owned(self, box: list[Any], kwargs: dict[str, Any]) -> Any:
        if not isinstance(self.fn, _Chain):
            return self(box.pop(), **kwargs)
        chain = self.fn
        return batchnorm.given_statistics(lambda **rest: chain.run_owned(box, rest), self.run, **kwargs)


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


class _Run:
    """Everything one region call needs between its forward and its backward.

    It is reachable from the autograd graph (through ``ctx``), so after the
    forward it keeps no tensor of its own: inputs live on as a codec payload or in
    ``save_for_backward``, outputs belong to the caller.
    """

    def __init__(self, roots, fn, args, kwargs, options: RegionOptions, stateful, payloads=None, sink=None) -> None:
        self.roots = tuple(roots)
        self.payloads = payloads
        self.sink: tuple[gradroot.Sink, int] | None = sink
        self.boundaries: _Boundaries | None = None
        self.fn = fn
        self.options = options
        self.stateful = tuple(stateful)
        leaves, self.spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        self.tensor_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        positional = len(pytree.tree_leaves(tuple(args)))
        self.primary = next((n for n, i in enumerate(self.tensor_at) if i < positional), None)
        self.entry_states = [get_state(m) for m in self.stateful]
        self.state_keys = _tensor_keys(self.entry_states)
        seen: set[int] = set()
        self.params = []
        for root in self.roots:
            for p in root.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    self.params.append(p)
        self.inputs: list[torch.Tensor] = (
            [leaves[i] for i in self.tensor_at]
            + [self.entry_states[j][name] for j, name in self.state_keys]
            + self.params
        )
        self.n_args = len(self.tensor_at)
        self.n_state = len(self.state_keys)
        self.leaves = _without_tensors(leaves)
        self.entry_states = [_state_without_tensors(s) for s in self.entry_states]

    def call(self, arg_tensors: list[torch.Tensor], root_only: bool = False) -> Any:
        """``fn`` on these tensor arguments, emptying ``arg_tensors``: a chain then holds its input only until its first module has run.

        ``root_only``: a recompute, whose output is only differentiated from (see :meth:`_Chain.run_owned`).
        """
        leaves = list(self.leaves)
        for i, at in enumerate(self.tensor_at):
            leaves[at] = arg_tensors[i]
        arg_tensors.clear()
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        del leaves
        if isinstance(self.fn, (_Chain, _WithStatistics)) and len(args) == 1:
            box = list(args)
            del args
            if isinstance(self.fn, _Chain):
                return self.fn.run_owned(box, kwargs, root_only)
            return self.fn.run_owned(box, kwargs)
        return self.fn(*args, **kwargs)

    def chunk_starts(self) -> _Boundaries:
        """The time chunks' recomputed starts; only a chunked call (``ctx.chunk`` set) asks, and it has them."""
        assert self.boundaries is not None
        return self.boundaries

    def read_states(self) -> list[dict[str, Any]]:
        return [get_state(m) for m in self.stateful]

    def load_states(self, states: Sequence[dict[str, Any]], keys, tensors) -> None:
        states = [dict(s) for s in states]
        for (j, name), tensor in zip(keys, tensors):
            states[j][name] = tensor
        for module, state in zip(self.stateful, states):
            load_state(module, state)

    def split_outputs(self, out: Any, states: list[dict[str, Any]]) -> list[torch.Tensor]:
        """The forward's tensor outputs followed by the new state's tensors."""
        leaves, self.out_spec = pytree.tree_flatten(out)
        self.out_tensor_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self.out_state_keys = _tensor_keys(states)
        tensors = [leaves[i] for i in self.out_tensor_at]
        tensors += [states[j][name] for j, name in self.out_state_keys]
        self.out_leaves = _without_tensors(leaves)
        self.out_states = [_state_without_tensors(s) for s in states]
        return tensors

    def finish(self, outputs: Sequence[torch.Tensor]) -> Any:
        """Rebuild the forward's output and hand the new state (with its history) to the modules."""
        self.inputs, self.payloads = [], None  # read once, by apply; let go of them now
        n = len(self.out_tensor_at)
        leaves = list(self.out_leaves)
        for i, tensor in zip(self.out_tensor_at, outputs[:n]):
            leaves[i] = tensor
        self.load_states(self.out_states, self.out_state_keys, outputs[n:])
        return pytree.tree_unflatten(leaves, self.out_spec)

    def encode(self, x: torch.Tensor) -> codecs.Payload | None:
        """The input's payload, or None when it is kept as it is."""
        if self.payloads is None:
            return self._encode(x)
        known = self.payloads.get(id(x))
        if known is not None and known[0] is x and known[1] == x._version:
            return known[2]
        payload = self._encode(x)
        self.payloads[id(x)] = (x, x._version, payload)
        return payload

    def _encode(self, x: torch.Tensor) -> codecs.Payload | None:
        options = self.options
        if options.codec != "auto":
            if options.codec == "none":
                return None
            return codecs.encode(
                x, options.codec, validate=options.validate, where=options.where, tolerance=options.tolerance
            )
        # `auto`: chosen on the region's first call, agreed across ranks, widened when an
        # input the codec cannot hold comes (codecs.encode_auto).
        return codecs.encode_auto(x, _AUTO.setdefault(self.roots[0], {}), options.where)


def _tensor_keys(states: Sequence[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(j, name) for j, state in enumerate(states) for name, v in state.items() if isinstance(v, torch.Tensor)]


def _without_tensors(leaves: Sequence[Any]) -> list[Any]:
    return [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]


def _state_without_tensors(state: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, torch.Tensor) else v) for k, v in state.items()}


class _RegionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run: _Run, *inputs: torch.Tensor):
        ctx.run = run
        ctx.set_materialize_grads(False)  # an output nobody differentiated stays None, not zeros
        arg_tensors = inputs[: run.n_args]
        ctx.autocast = autocast_state()
        ctx.cpu_rng = torch.get_rng_state() if run.options.preserve_rng else None
        ctx.devices, ctx.device_rng = get_device_states(*arg_tensors) if run.options.preserve_rng else ([], [])
        forward_context, ctx.recompute_context = BufferGuard(run.roots).contexts()
        before = inplace.versions(arg_tensors)
        with forward_context:
            out = run.call(list(arg_tensors))
        inplace.unchanged(arg_tensors, before, run.roots, run.options.where)
        outputs = tuple(run.split_outputs(out, run.read_states()))
        # Keep the inputs: the first positional tensor as a codec payload, the rest as they are.
        ctx.payload = None
        kept: list[torch.Tensor | None] = list(arg_tensors)
        ctx.primary_requires_grad = False
        if run.primary is not None:
            x = arg_tensors[run.primary]
            ctx.payload = run.encode(x)
            if ctx.payload is not None:
                ctx.primary_requires_grad = x.requires_grad
                kept[run.primary] = None
        ctx.dropped = [t is None for t in kept]
        state_in = inputs[run.n_args : run.n_args + run.n_state]
        ctx.state_requires_grad = [t.requires_grad for t in state_in]
        # The chunk's place among time chunks that recompute the state they start from; the
        # first keeps its state, the others find theirs by replaying the chunks before them.
        ctx.chunk = None if run.boundaries is None else run.boundaries.add(ctx)
        if ctx.chunk:
            state_in = ()
        ctx.save_for_backward(*[t for t in kept if t is not None], *state_in)
        ctx.mark_non_differentiable(*[t for t in outputs if not (t.is_floating_point() or t.is_complex())])
        return outputs

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        # First, before anything else takes a reference: which incoming gradients are this backward's alone.
        alone = gradroot.held_alone(grads)
        run: _Run = ctx.run
        saved = list(ctx.saved_tensors)
        args = [None if dropped else saved.pop(0) for dropped in ctx.dropped]
        entry = run.chunk_starts().state(ctx.chunk) if ctx.chunk else saved  # before this chunk's input is decoded
        state_in = [t.detach().requires_grad_(wanted) for t, wanted in zip(entry, ctx.state_requires_grad)]
        del entry
        detached: list[torch.Tensor] = []
        decoded: torch.Tensor | None = None
        for t in args:
            if t is None:  # the compressed input
                decoded = codecs.decode(ctx.payload)
                if ctx.primary_requires_grad:
                    # A non-leaf: a leaf would be kept alive by its gradient accumulator.
                    with torch.enable_grad():
                        decoded = Entry.apply(decoded, torch.zeros((), requires_grad=True))
                detached.append(decoded)
            else:
                detached.append(t.detach().requires_grad_(t.requires_grad))
        candidates: list[Any] = [*detached, *state_in, *run.params]
        saving: Any = contextlib.nullcontext()
        if decoded is not None:
            # From here on only the payload stands for the decoded input: the recompute owns it.
            at = next(i for i, t in enumerate(detached) if t is decoded)
            candidates[at] = get_gradient_edge(decoded) if decoded.requires_grad else None
            saving = _saved_as_payload(decoded, ctx.payload)
            del decoded

        post_forward = run.read_states()
        with recomputing(run.options.where, "a memoplan region"), as_in_forward(ctx), saving:
            try:
                run.load_states(run.entry_states, run.state_keys, state_in)
                with torch.enable_grad():
                    out = run.call(detached, root_only=True)
                    states = run.read_states()
            finally:
                # The recompute must not advance the state (fangwei123456/spikingjelly#629).
                for module, state in zip(run.stateful, post_forward):
                    load_state(module, state)
        if ctx.chunk is not None:
            run.chunk_starts().reached(ctx.chunk, [states[j][name] for j, name in run.out_state_keys])

        out_tensors = [leaf for leaf in pytree.tree_leaves(out) if isinstance(leaf, torch.Tensor)]
        out_tensors += [states[j][name] for j, name in run.out_state_keys]
        pairs = [(o, g) for o, g in zip(out_tensors, grads) if g is not None and o.requires_grad]
        roots: Sequence[torch.Tensor] | Sequence[GradientEdge] = [o for o, _ in pairs]
        root_grads = [g for _, g in pairs]
        if all(o.grad_fn is not None for o, _ in pairs):
            # Differentiate from the outputs' graph edges, so the recomputed outputs
            # themselves can be freed before backward runs through the region.
            roots = [get_gradient_edge(o) for o, _ in pairs]
            del out, out_tensors, states, pairs
        wanted = [
            i for i, t in enumerate(candidates) if isinstance(t, GradientEdge) or (t is not None and t.requires_grad)
        ]
        # A time chunk whose incoming gradient is a slice of the module's own (gradroot.Sink)
        # may leave its input's gradient there, if nothing kept the slice meanwhile; a
        # statistics pass's chunk adds its part of that gradient there afterwards.
        sink = run.sink if run.sink is not None and run.sink[0].is_slot(grads[0], run.sink[1]) else None
        in_place = sink is not None and run.primary == 0 and run.out_tensor_at[:1] == [0] and 0 in wanted
        slot = grads[0] if in_place else None  # in_place: is_slot found grads[0] to be the sink's slot
        before = sink[0].watch(slot) if sink is not None and slot is not None else None
        with gradroot.vouched(alone):
            found = (
                torch.autograd.grad(roots, [candidates[i] for i in wanted], root_grads, allow_unused=True)
                if roots and wanted
                else [None] * len(wanted)
            )
        grads_in: list[torch.Tensor | None] = [None] * len(candidates)
        for i, g in zip(wanted, found):
            grads_in[i] = g
        del found, alone
        if sink is not None and slot is not None and sink[0].watch(slot) == before:
            grads_in[0] = sink[0].fill(slot, grads_in[0], sink[1])
        elif run.sink is not None and run.primary == 0 and grads_in and run.sink[0].add_into(run.sink[1], grads_in[0]):
            grads_in[0] = None
        return (None, *grads_in)


def _probe_region(site: str, x: torch.Tensor) -> torch.Tensor:
    """The region :func:`gradroot.held_alone`'s probe differentiates through at ``site``."""
    if site == "region":
        return run_region((nn.Module(),), lambda t: t * 2, [x], {}, RegionOptions())
    return run_chunked((nn.Module(),), lambda t: t * 2, [x], {}, RegionOptions(), (), chunks=2, dim=0, chunk_args=(0,))


gradroot.set_probe_region(_probe_region)
