"""Memonger stage: probing how a captured step can write into the arena — and proving it.

For a step of the captured graph, :func:`out_form` finds the call that writes its result
into a given view: the op's ``out=`` overload (numbers given for tensors passed as tensors
made once), else the op's form in ``memoplan.runtime.arena_into``.  A candidate is taken
only if, on the captured values and on other values of the same shapes, it gives the op's
own bits and allocates less than an eighth of the result inside (more is the op's result
and a copy; less is a kernel's scratch, counted).  :func:`writes_over` checks whether a
pointwise step can write its result over one of its inputs with the same bits.

``Captured`` is what capture knows when it probes: the value of every graph value so far,
which storage each lives in, which values are fresh allocations, and the allocations
already measured (by op and argument signature).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch.utils import _pytree as pytree

from memoplan.memonger.program import Const, Ref, ScalarTensor, Step
from memoplan.memonger.quiet import profiler_quiet
from memoplan.runtime import arena_into
from memoplan.runtime.arena_into import FORMS, scalar

_OPTIONS = {"dtype", "layout", "device", "pin_memory"}  # dropped by out= variants: the out tensor says


class Captured(Protocol):
    values: list[Any]  # every graph value so far, by index
    root: dict[int, int]  # value -> the value whose storage it uses (itself if fresh)
    fresh: list[int]  # values that are fresh allocations by a step
    allocates: dict[tuple, int]  # (call, argument signature) -> bytes it allocates inside


def real(arg, b: Captured, values: dict[int, Any] | None = None):
    """The value of a literal; ``values`` stands in for some of the captured values (by index)."""
    if isinstance(arg, Ref):
        return values[arg.index] if values and arg.index in values else b.values[arg.index]
    if isinstance(arg, tuple):
        return [real(a, b, values) for a in arg]
    if isinstance(arg, Const):
        return _const_value(arg)
    if isinstance(arg, ScalarTensor):
        return scalar(arg.value, getattr(torch, arg.dtype))
    return arg


def _const_value(const: Const):
    if const.kind == "device":
        return torch.device(const.text)
    return getattr(torch, const.text)


def writes_over(b: Captured, functional, out_step: Step, tensor: torch.Tensor) -> int | None:
    """The fresh value a pointwise step's out form may write over (its only read of that storage,
    laid out as the result), checked to give the same bits when it does; None if there is none."""
    if torch.Tag.pointwise not in functional.tags:
        return None
    read = [r.index for r in refs(out_step.args + tuple(v for _, v in out_step.kwargs))]
    fresh = set(b.fresh)
    for candidate in read:
        value = b.values[candidate]
        if (
            candidate not in fresh
            or b.root[candidate] != candidate
            or sum(1 for r in read if b.root.get(r) == candidate) != 1
            or (value.dtype, value.shape, value.stride()) != (tensor.dtype, tensor.shape, tensor.stride())
            or value.untyped_storage().nbytes() != tensor.untyped_storage().nbytes()
        ):
            continue
        shared = value.clone(memory_format=torch.preserve_format)
        if shared.stride() != tensor.stride():
            continue
        values = {candidate: shared}
        try:
            _callable(out_step.op)(
                *(real(a, b, values) for a in out_step.args),
                **{k: real(v, b, values) for k, v in out_step.kwargs},
                out=shared,
            )
        except Exception:  # the form refuses to write over its input: it keeps a buffer of its own
            continue
        if same_bits(shared, tensor):
            return candidate
    return None


def _callable(op: str):
    if op.startswith("into."):
        return getattr(arena_into, op.removeprefix("into."))
    namespace, name, overload = op.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def refs(args) -> Iterator[Ref]:
    for a in args:
        if isinstance(a, Ref):
            yield a
        elif isinstance(a, tuple):
            yield from refs(a)


def bind(schema, args, kwargs) -> dict[str, Any]:
    positional = [a for a in schema.arguments if not a.kwarg_only]
    bound = {a.name: v for a, v in zip(positional, args)}
    bound.update(dict(kwargs))
    return bound


def out_form(b: Captured, step: Step, tensor: torch.Tensor, buffer: int) -> tuple[Step, str, int]:
    """The step written into arena buffer ``buffer``, or why it cannot be, and the scratch bytes it allocates.

    Tried in turn: the op's ``out=`` overload with numbers in tensor arguments passed as
    tensors made once, then as they are; then the op's form in ``memoplan.runtime.arena_into``.
    The first that gives the op's bits on the captured values and on other values without
    allocating its result inside is taken; otherwise the first one's problem is the note.
    """
    namespace, name, overload = step.op.split(".")
    functional = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    candidates: list[tuple[str, Callable, tuple, tuple]] = []
    out = _out_overload(functional)
    if out is not None:
        args, kwargs = _out_arguments(functional, out, step)
        constant = _with_constants(out, args, kwargs, b)
        if constant is not None:
            candidates.append((f"{namespace}.{name}.{out._overloadname}", out, *constant))
        candidates.append((f"{namespace}.{name}.{out._overloadname}", out, args, kwargs))
    form = FORMS.get(step.op)
    if form is not None:
        candidates.append((f"into.{form.__name__}", form, step.args, step.kwargs))
    if not candidates:
        return step, f"{step.op} has no out= variant: allocated by the op", 0
    first = ""
    for op_name, call, args, kwargs in candidates:
        problem, scratch = _check(b, functional, step, call, args, kwargs, tensor)
        if not problem:
            return Step(op_name, args, kwargs, step.result, step.function, step.module, buffer), "", scratch
        first = first or problem
    return step, first, 0


def _out_arguments(functional, out, step: Step) -> tuple[tuple, tuple]:
    """The step's arguments laid out for the ``out=`` overload's schema."""
    bound = bind(functional._schema, step.args, step.kwargs)
    args, kwargs = [], []
    positional = True
    for argument in out._schema.arguments:
        if argument.name == "out":
            continue
        if argument.name not in bound:
            positional = False
            continue
        if positional and not argument.kwarg_only:
            args.append(bound[argument.name])
        else:
            kwargs.append((argument.name, bound[argument.name]))
    return tuple(args), tuple(kwargs)


def _with_constants(out, args: tuple, kwargs: tuple, b: Captured) -> tuple[tuple, tuple] | None:
    """The arguments with each number given for a tensor argument as a :class:`ScalarTensor` of the
    dtype torch computes in (the result type of the first tensor argument and the number); None
    when there is no such number."""
    tensors = [b.values[r.index] for r in refs(args + tuple(v for _, v in kwargs))]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if not tensors:
        return None
    schema = {a.name: str(a.type) for a in out._schema.arguments}
    positional = [a.name for a in out._schema.arguments if not a.kwarg_only]
    changed = False

    def swap(name: str, value):
        nonlocal changed
        if schema.get(name) == "Tensor" and isinstance(value, (bool, int, float)):
            changed = True
            dtype = torch.result_type(tensors[0], value)
            return ScalarTensor(value, str(dtype).removeprefix("torch."))
        return value

    new_args = tuple(swap(n, v) for n, v in zip(positional, args))
    new_kwargs = tuple((k, swap(k, v)) for k, v in kwargs)
    return (new_args, new_kwargs) if changed else None


def _check(
    b: Captured, functional, step: Step, call, args: tuple, kwargs: tuple, tensor: torch.Tensor
) -> tuple[str, int]:
    """Why ``call(*args, **kwargs, out=view)`` does not stand for the step, and the scratch bytes it allocates.

    Checked on the captured values, then on other values drawn for the floating tensors the
    step reads (one matching example could be luck), against the op run on the same values.
    """
    scratch = 0
    for trial in range(2):
        values = None
        expected = tensor
        if trial == 1:
            generator = torch.Generator(tensor.device).manual_seed(0)
            read = sorted({r.index for r in refs(step.args + tuple(v for _, v in step.kwargs))})
            values = {i: _redrawn(b.values[i], generator) for i in read}
            expected = functional(
                *(real(a, b, values) for a in step.args), **{k: real(v, b, values) for k, v in step.kwargs}
            )
        real_args = [real(a, b, values) for a in args]
        real_kwargs = {k: real(v, b, values) for k, v in kwargs}
        problem, allocated = _probe(call, real_args, real_kwargs, expected, b.allocates if trial == 0 else None)
        if problem:
            return problem, 0
        if trial == 0:
            scratch = allocated
    return "", scratch


def _redrawn(value, generator):
    """A floating tensor argument with other values (same shape, strides and dtype); others as they are."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        fresh = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
        try:
            return fresh.normal_(generator=generator)
        except RuntimeError:  # overlapping strides (an expanded tensor): keep the example's values
            return value
    return value


def _probe(out, args, kwargs, expected: torch.Tensor, allocates: dict | None) -> tuple[str, int]:
    """Why ``out(*args, **kwargs, out=view)`` does not stand for the op that gave ``expected``, and
    the bytes it allocates inside.

    ``allocates``: whether the call allocates inside is measured (and remembered there, by the
    op and its arguments' shapes, strides and dtypes) when given, else only the result checked.
    A call that allocates an eighth of the result or more runs the op into a tensor of its own
    and copies it; less is a kernel's scratch (BatchNorm's per-channel factors), which the
    step keeps and the statistics count.
    """
    probe = torch.empty(expected.untyped_storage().nbytes(), dtype=torch.uint8, device=expected.device)
    view = probe.view(expected.dtype).as_strided(expected.shape, expected.stride())
    key = (_call_name(out), _signature((args, kwargs)), _signature(expected))
    try:
        if allocates is not None and key not in allocates:
            allocated, result = allocated_inside(lambda: out(*args, **kwargs, out=view), expected.device)
            allocates[key] = allocated
        else:
            result = out(*args, **kwargs, out=view)
    except Exception as error:  # the variant refuses these arguments: keep the op as the model called it
        return f"its out= variant fails here ({type(error).__name__}): allocated by the op", 0
    allocated = allocates.get(key, 0) if allocates is not None else 0
    if allocated * 8 >= max(1, probe.numel()):
        return (
            f"its out= variant allocates {allocated} bytes inside (the op's result, then a copy): allocated by the op"
        ), 0
    same_place = (
        isinstance(result, torch.Tensor)
        and result.data_ptr() == view.data_ptr() == probe.data_ptr()
        and tuple(result.shape) == tuple(expected.shape)
        and tuple(result.stride()) == tuple(expected.stride())
        and result.dtype == expected.dtype
    )
    if not same_place:
        return "its out= variant does not write into the view it is given: allocated by the op", 0
    if not same_bits(result, expected):
        return "its out= variant gives other bits than the op: allocated by the op", 0
    return "", allocated


def _call_name(call) -> str:
    return str(call) if isinstance(call, torch._ops.OpOverload) else f"into.{call.__name__}"


def _signature(tree) -> tuple:
    """Shapes, strides and dtypes of the tensors in ``tree``, and its other values, in order."""
    return tuple(
        (tuple(v.shape), v.stride(), str(v.dtype), str(v.device)) if isinstance(v, torch.Tensor) else repr(v)
        for v in pytree.tree_leaves(tree)
    )


def allocated_inside(fn, device: torch.device) -> tuple[int, Any]:
    """The most bytes the allocator holds at once while ``fn()`` runs, above what it held when the
    call began (its results and kernels' temporaries, even those freed inside), and its result.

    Many ``out=`` overloads are wrappers that run the op into a tensor of their own and copy it
    (``relu.out``, ``masked_fill.Scalar_out``, ``embedding.out``): writing through them saves
    nothing, and the live-storage meter, which sees only what ops return, would not show it.
    On CPU the profiler's memory events, in time order, see every allocation and free (its
    own lines on stderr held back, :mod:`memoplan.memonger.quiet`); on CUDA the allocator's peak.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before), result
    from torch.profiler import ProfilerActivity, profile

    with profiler_quiet(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak, result


def _out_overload(op):
    """The ``out=`` overload of ``op`` taking the same arguments (less dtype/device options), or None."""
    packet = op.overloadpacket
    overload = op._overloadname
    names = ["out"] if overload == "default" else [f"{overload}_out", "out"]
    functional = {a.name: a for a in op._schema.arguments}
    for name in names:
        if name not in packet.overloads():
            continue
        candidate = getattr(packet, name)
        schema = candidate._schema
        outs = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        if len(outs) != 1 or outs[0].name != "out" or len(schema.returns) != 1:
            continue
        others = {a.name for a in schema.arguments if a.name != "out"}
        if not others <= functional.keys() or not (functional.keys() - others) <= _OPTIONS:
            continue
        if any(
            str(schema_arg.type) != str(functional[schema_arg.name].type)
            for schema_arg in schema.arguments
            if schema_arg.name != "out"
        ):
            continue
        return candidate
    return None


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes, dtypes and bytes (so -0.0 differs from 0.0, and a NaN matches only itself)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
