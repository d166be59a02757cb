"""Runtime stage: memoplan's own checkpointed region, one ``autograd.Function`` — compressed input, threaded state.

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
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.utils.checkpoint import get_device_states

from memoplan.runtime import batchnorm, codecs, gradroot, inplace
from memoplan.runtime.buffers import BufferGuard

# The recompute's surroundings live in their own module; ``_Boundaries`` (the states chunks
# start from) and ``_saved_as_payload`` keep their names here, where the tests reach them.
from memoplan.runtime.recompute import ChunkStarts as _Boundaries
from memoplan.runtime.recompute import Entry, as_in_forward, autocast_state, recomputing
from memoplan.runtime.recompute import saved_as_payload as _saved_as_payload
from memoplan.runtime.state import get_state, load_state


@dataclass(frozen=True)
class RegionOptions:
    codec: str = "none"  # for the first positional tensor argument; "auto" chooses once per region
    validate: str = "sample"
    tolerance: float | None = None
    preserve_rng: bool = True
    where: str = ""  # the module path, for messages


# (region root, where) -> codec chosen by "auto" on the region's first train-mode call.
_AUTO: weakref.WeakKeyDictionary[nn.Module, dict[str, str]] = weakref.WeakKeyDictionary()


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


class Chain:
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


class WithStatistics:
    """``fn`` with its BatchNorm calls normalising with given statistics (:func:`batchnorm.given_statistics`).

    Passes an owned input on to a :class:`Chain`, so a chunk of a Sequential lets
    go of its decoded input in the main and statistics passes too.
    """

    def __init__(self, fn: Callable[..., Any], run: batchnorm.Pass) -> None:
        self.fn, self.run = fn, run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return batchnorm.given_statistics(self.fn, self.run, *args, **kwargs)

    def run_owned(self, box: list[Any], kwargs: dict[str, Any]) -> Any:
        if not isinstance(self.fn, Chain):
            return self(box.pop(), **kwargs)
        chain = self.fn
        return batchnorm.given_statistics(lambda **rest: chain.run_owned(box, rest), self.run, **kwargs)


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

        ``root_only``: a recompute, whose output is only differentiated from (see :meth:`Chain.run_owned`).
        """
        leaves = list(self.leaves)
        for i, at in enumerate(self.tensor_at):
            leaves[at] = arg_tensors[i]
        arg_tensors.clear()
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        del leaves
        if isinstance(self.fn, (Chain, WithStatistics)) and len(args) == 1:
            box = list(args)
            del args
            if isinstance(self.fn, Chain):
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
