"""Codegen stage: the memonger arena section of a plan module, from an ArenaPlan.

Decisions are made here: each value's name (through the one name allocator), each
step's call as text, where each value is deleted, the table of arena slots.  The
template ``arena_section.py.j2`` prints them.  Every literal goes through
``pyrepr`` or a torch constant whose name is checked to be an identifier; every
name from the model goes through the allocator; module paths and notes reach the
file only in comments, escaped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memoplan.codegen.names import NameAllocator
from memoplan.codegen.render import pyrepr, render
from memoplan.memonger.plan import ArenaPlan
from memoplan.memonger.program import Const, ConstGuard, Ref, ScalarTensor, Step
from memoplan.memonger.report import slot_table
from memoplan.runtime.arena_into import FORMS

# Names the arena section defines or uses itself.
RESERVED = ("ARENA", "arena_graph", "arena_forward", "arena", "inputs", "attributes", "_arena", "torch")


@dataclass(frozen=True)
class _Line:
    comment: str | None  # printed as a comment line before the code
    code: str


def render_arena(plan: ArenaPlan, names: NameAllocator) -> str:
    """The arena section: the ``ARENA`` spec, ``arena_graph`` and ``arena_forward``."""
    program = plan.program
    value_names = [names.allocate(hint) for hint in program.names]
    lines = _forward_lines(plan, value_names)
    n_inputs = len(program.inputs)
    inputs = [value_names[i] for i in range(n_inputs)]
    attributes = [value_names[n_inputs + i] for i in range(len(program.attributes))]
    slots = _slot_specs(plan)
    stats = plan.layout.stats
    text = render(
        "arena_section.py.j2",
        device=program.device,
        model_class=program.model_class,
        algo=plan.algo,
        ordering=plan.ordering,
        stats=stats,
        outside=len(plan.outside),
        outside_bytes=sum(program.buffers[i].size for i in plan.outside),
        baseline_bytes=plan.baseline_bytes,
        buffers=len(plan.arena_buffers),
        scratch_bytes=sum(program.buffers[i].scratch for i in plan.arena_buffers),
        arena_peak=plan.arena_peak,
        eager_peak=plan.eager_peak,
        arena_peak_inside=plan.arena_peak_inside,
        eager_peak_inside=plan.eager_peak_inside,
        slack=None if plan.slack is None else pyrepr(plan.slack),
        slack_percent=None if plan.slack is None else f"{plan.slack * 100:g}%",
        left_out=len(plan.left_out),
        slots=slots,
        table=slot_table(plan),
        guards=[_guard(g) for g in program.inputs],
        in_spec=program.in_spec,
        out_spec=program.out_spec,
        attribute_guards=[
            f"({pyrepr(path)}, {_guard(guard)})" for path, guard in zip(program.attributes, program.attribute_guards)
        ],
        inputs=inputs,
        attributes=attributes,
        lines=lines,
        outputs=[_arg(o, value_names) for o in program.outputs],
    )
    return text.rstrip("\n")


def _forward_lines(plan: ArenaPlan, value_names: list[str]) -> list[_Line]:
    """``arena_forward``'s body: each step's call in the arena's order (its out= form where its
    buffer has a slot), a comment where the module changes, and a ``del`` after a value's last use."""
    program = plan.program
    slot_of = plan.slot_of()
    order = plan.layout.order
    last_use = _last_uses(program, order)
    keep = {o.index for o in program.outputs if isinstance(o, Ref)}
    lines: list[_Line] = []
    module = None
    made_by = {info.producer: b for b, info in enumerate(program.buffers)}
    for position, index in enumerate(order):
        step = program.steps[index]
        note = step.note
        buffer = made_by.get(index)
        if buffer in slot_of:
            out_step = program.buffers[buffer].out_step
            assert out_step is not None, "a buffer with an arena slot has its out= form"
            step = out_step
        elif buffer is not None:
            note = plan.note(buffer)
        comment = None
        if step.module != module:
            module = step.module
            comment = f"{module or '(the model itself)'}"
        if note:
            comment = f"{comment + ': ' if comment else ''}{note}"
        lines.append(_Line(comment, _call(step, value_names, slot_of)))
        dead = [v for v in last_use.get(position, ()) if v not in keep]
        if dead:
            lines.append(_Line(None, "del " + ", ".join(value_names[v] for v in sorted(dead))))
    return lines


def _slot_specs(plan: ArenaPlan) -> list[dict[str, object]]:
    """Each arena slot's offset, dtype, shape and stride, as the template writes them."""
    program = plan.program
    offsets = plan.layout.assignment.offsets
    slots = []
    for slot, held in enumerate(plan.slots):
        info = program.buffers[held[0]]  # every buffer of a slot has its dtype, shape and stride
        slots.append(
            {
                "offset": offsets[slot],
                "dtype": _torch_name(info.dtype),
                "shape": pyrepr(tuple(info.shape)),
                "stride": pyrepr(tuple(info.stride)),
            }
        )
    return slots


def _last_uses(program, order) -> dict[int, list[int]]:
    """Position -> the values read or defined for the last time there."""
    last: dict[int, int] = {}
    for position, index in enumerate(order):
        step = program.steps[index]
        for ref in _refs(step.args + tuple(v for _, v in step.kwargs)):
            last[ref.index] = position
        if step.result is not None:
            last.setdefault(step.result, position)
    found: dict[int, list[int]] = {}
    for value, position in last.items():
        found.setdefault(position, []).append(value)
    return found


def _refs(args):
    for a in args:
        if isinstance(a, Ref):
            yield a
        elif isinstance(a, tuple):
            yield from _refs(a)


def _call(step: Step, names: list[str], slot_of: dict[int, int]) -> str:
    """One step's line, from ``calls/arena_step.py.j2`` (the names checked here, the text there)."""
    args = [_arg(a, names) for a in step.args]
    keywords = [(k, _arg(v, names)) for k, v in step.kwargs if _keyword(k)]
    result = None if step.result is None else names[step.result]
    if step.op == "getitem":
        return render(
            "calls/arena_step.py.j2", kind="getitem", op=None, args=args, keywords=[], slot=None, result=result
        )
    if step.op.startswith("into."):
        form = step.op.removeprefix("into.")
        if not form.isidentifier() or form not in {f.__name__ for f in FORMS.values()}:
            raise ValueError(f"form {step.op!r} is not one of memoplan.runtime.arena_into's")
        assert step.buffer is not None, "an into. form writes into its buffer"
        slot: int | None = slot_of[step.buffer]
        return render(
            "calls/arena_step.py.j2", kind="into", op=form, args=args, keywords=keywords, slot=slot, result=result
        )
    if not all(part.isidentifier() for part in step.op.split(".")) or step.op.count(".") != 2:
        raise ValueError(f"op name {step.op!r} is not made of identifiers")
    slot = slot_of[step.buffer] if step.buffer is not None and step.buffer in slot_of else None
    return render(
        "calls/arena_step.py.j2", kind="op", op=step.op, args=args, keywords=keywords, slot=slot, result=result
    )


def _keyword(name: str) -> bool:
    if not name.isidentifier():
        raise ValueError(f"argument name {name!r} is not an identifier")
    return True


def _arg(value, names: list[str]) -> str:
    if isinstance(value, Ref):
        return names[value.index]
    if isinstance(value, tuple):
        return "[" + ", ".join(_arg(v, names) for v in value) + "]"
    if isinstance(value, ScalarTensor):
        return f"_arena.scalar({_number(value.value)}, {_torch_name(value.dtype)})"
    if isinstance(value, Const):
        if value.kind == "device":
            return f"torch.device({pyrepr(value.text)})"
        return _torch_name(value.text)
    return _number(value)


def _number(value) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({pyrepr(repr(value))})"
    return pyrepr(value)


def _torch_name(text: str) -> str:
    if not text.isidentifier():
        raise ValueError(f"torch constant {text!r} is not an identifier")
    return f"torch.{text}"


def _guard(guard) -> str:
    if isinstance(guard, ConstGuard):
        value = guard.value
        text = (
            f"float({pyrepr(repr(value))})" if isinstance(value, float) and not math.isfinite(value) else pyrepr(value)
        )
        return f"('const', {text})"
    return f"({_torch_name(guard.dtype)}, {pyrepr(tuple(guard.shape))}, {pyrepr(tuple(guard.stride))})"
