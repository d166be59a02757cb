"""Codegen stage: ``emit`` — a pure function from a ResolvedPlan to generated source files.

Decisions are made here in Python (which wrappers exist, their names, which call each
makes with which values); templates print them: ``plan_module.py.j2`` the module, and one
template per kind of generated call under ``memoplan/codegen/templates/calls/`` (``evict``: a ``dtr``
candidate; ``checkpoint``: torch's checkpoint; ``segments``: ``checkpoint regions = [...]``;
``region``: memoplan's own region for ``compress``, ``temporal_chunk`` and state; ``memory`` and
``dtr``: the blocks' settings).  No generated code is built as a Python string here.  Output is sorted and has no timestamps,
so the same plan gives byte-identical files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memoplan.codegen.arena import RESERVED as ARENA_RESERVED
from memoplan.codegen.arena import render_arena
from memoplan.codegen.names import NameAllocator
from memoplan.codegen.render import render
from memoplan.diagnostics import printable
from memoplan.enums import Boundaries
from memoplan.ir import (
    Action,
    BuffersCommitOnceAction,
    CheckpointAction,
    CompressAction,
    EvictAction,
    KeepAction,
    ModulePlan,
    Origin,
    ResolvedPlan,
    StateAction,
    TemporalChunkAction,
)
from memoplan.memonger.plan import ArenaPlan
from memoplan.runtime.abi import ABI

# Names the template defines itself.
RESERVED = (
    "apply",
    "remove",
    "TARGETS",
    "PLAN_ID",
    "SOURCE",
    "RUNTIME_ABI",
    "MEMORY",
    "DTR",
    "_rt",
    "self",
    "args",
    "kwargs",
    "torch",
)


@dataclass(frozen=True)
class GeneratedFile:
    name: str  # file name, e.g. "plan_module.py"
    text: str


@dataclass(frozen=True)
class GeneratedCode:
    plan_id: str
    files: tuple[GeneratedFile, ...]

    @property
    def main(self) -> GeneratedFile:
        return self.files[0]


@dataclass(frozen=True)
class _Wrapper:
    name: str
    doc: str
    call: str


def emit(
    plan: ResolvedPlan, *, source: str | None = None, module_name: str = "plan_module", arena: ArenaPlan | None = None
) -> GeneratedCode:
    """Render the plan module; ``source`` is the plan's name as printed in the header; ``arena``:
    the memonger block's captured program and layout (``memoplan.memonger.plan_arena``)."""
    names = NameAllocator(RESERVED + (ARENA_RESERVED if arena is not None else ()))
    lines_of: dict[_Policy, set[str]] = {}
    texts_of: dict[_Policy, list[str]] = {}
    targets: list[tuple[ModulePlan, _Policy | None]] = []
    evictable: _Wrapper | None = None
    for module in plan.modules:
        draft = _draft_of(module)
        if draft.evict is not None:
            if evictable is None:
                evictable = _Wrapper(
                    names.allocate("dtr_candidate"),
                    f"dtr: its saved activations may be evicted and recomputed  ({draft.evict})",
                    render("calls/evict.py.j2"),
                )
            targets.append((module, None))
            continue
        if not draft.region:
            continue
        policy = draft.policy(module.region_state)
        for origin in draft.origins:
            lines_of.setdefault(policy, set()).add(str(origin))
            texts = texts_of.setdefault(policy, [])
            if origin.policy not in texts:
                texts.append(origin.policy)
        targets.append((module, policy))
    order = sorted(lines_of, key=repr)
    wrappers: dict[_Policy | None, _Wrapper] = {
        p: _wrapper(p, texts_of[p], sorted(lines_of[p], key=_line_order), names) for p in order
    }
    if evictable is not None:  # the wrapper of the dtr candidates that no policy wraps
        wrappers[None] = evictable
    context = {
        "abi": ABI,
        "source": source or plan.file,
        "plan_id": plan.digest,
        "rows": plan_table(plan),
        "module_count": len(plan.modules),
        "policies": [wrappers[p] for p in order] + ([evictable] if evictable else []),
        "targets": [
            {"path": m.path, "type_name": m.type_name, "forward": wrappers[p].name, "evictable": p is None}
            for m, p in targets
        ],
        "memory": _memory_call(plan),
        "dtr": _dtr_call(plan),
        "arena": render_arena(arena, names) if arena is not None else None,
    }
    text = render("plan_module.py.j2", **context)
    return GeneratedCode(plan.digest, (GeneratedFile(f"{module_name}.py", text),))


@dataclass(frozen=True)
class _Policy:
    """One distinct wrapper: everything its generated call passes (nothing module-specific)."""

    groups: tuple[tuple[str, ...], ...] | None
    preserve_rng: bool
    codec: str | None  # None: inputs kept as they are
    validate: str
    tolerance: float | None
    stateful: tuple[str, ...]
    chunks: int | None
    dim: int
    chunk_args: tuple[int | str, ...]
    boundaries: Boundaries
    save: tuple[str, ...] = ()  # op families the region keeps (`checkpoint save = [...]`)

    @property
    def own_region(self) -> bool:
        """Whether memoplan's region runs it (torch's checkpoint cannot compress, chunk or carry state)."""
        return self.codec is not None or self.chunks is not None or bool(self.stateful)

    @property
    def chunk_boundaries(self) -> str | None:
        """The ``boundaries`` a chunked region is told, None for the default (``keep``)."""
        return None if self.boundaries is Boundaries.KEEP else self.boundaries.value

    @property
    def call_template(self) -> str:
        """The template of this wrapper's call (see the module docstring)."""
        if self.groups is not None:
            return "calls/segments.py.j2"
        return "calls/region.py.j2" if self.own_region else "calls/checkpoint.py.j2"


def _memory_call(plan: ResolvedPlan) -> str | None:
    """The ``memory`` block as the ``MemorySettings`` the generated module passes to install."""
    if plan.memory is None:
        return None
    return render("calls/memory.py.j2", m=plan.memory, reserve_bytes=plan.reserve_bytes)


def _dtr_call(plan: ResolvedPlan) -> str | None:
    """The ``dtr`` block as the ``DtrSettings`` the generated module passes to install."""
    if plan.dtr is None:
        return None
    return render("calls/dtr.py.j2", d=plan.dtr)


@dataclass
class _Draft:
    """A module's forward as its actions shape it, before it is keyed to a wrapper."""

    region: bool = False  # a checkpoint or temporal_chunk: memoplan wraps forward in a region
    evict: Origin | None = None  # a dtr candidate: its own wrapper
    origins: list[Origin] = field(default_factory=list)  # the rules the wrapper's docstring cites
    groups: tuple[tuple[str, ...], ...] | None = None
    preserve_rng: bool = True
    save: tuple[str, ...] = ()
    codec: str | None = None
    validate: str = "sample"
    tolerance: float | None = None
    chunks: int | None = None
    dim: int = 0
    chunk_args: tuple[int | str, ...] = (0,)
    boundaries: Boundaries = Boundaries.KEEP

    def policy(self, stateful: tuple[str, ...]) -> _Policy:
        return _Policy(
            groups=self.groups,
            preserve_rng=self.preserve_rng,
            codec=self.codec,
            validate=self.validate,
            tolerance=self.tolerance,
            stateful=stateful,
            chunks=self.chunks,
            dim=self.dim,
            chunk_args=self.chunk_args,
            boundaries=self.boundaries,
            save=self.save,
        )


def _checkpoint(action: CheckpointAction, draft: _Draft) -> None:
    draft.region = True
    draft.origins.append(action.origin)
    draft.groups, draft.preserve_rng, draft.save = action.groups, action.preserve_rng, action.save


def _compress(action: CompressAction, draft: _Draft) -> None:
    draft.origins.append(action.origin)
    draft.codec, draft.validate, draft.tolerance = action.codec.value, action.validate.value, action.tolerance


def _temporal_chunk(action: TemporalChunkAction, draft: _Draft) -> None:
    draft.region = True
    draft.origins.append(action.origin)
    draft.chunks, draft.dim, draft.chunk_args, draft.boundaries = (
        action.chunks,
        action.dim,
        action.args,
        action.boundaries,
    )


def _evict(action: EvictAction, draft: _Draft) -> None:
    draft.evict = action.origin


def _leaves_forward(action: Action, draft: _Draft) -> None:
    """keep, state and buffers change no call: the region reads ``state`` via ``region_state``."""


# Each IR action type -> how it shapes its module's generated forward.
EMITTERS: dict[type, Callable[[Any, _Draft], None]] = {
    CheckpointAction: _checkpoint,
    CompressAction: _compress,
    TemporalChunkAction: _temporal_chunk,
    StateAction: _leaves_forward,
    KeepAction: _leaves_forward,
    BuffersCommitOnceAction: _leaves_forward,
    EvictAction: _evict,
}


def _draft_of(module: ModulePlan) -> _Draft:
    draft = _Draft()
    for action in module.actions:
        EMITTERS[type(action)](action, draft)
    return draft


def _line_order(origin: str) -> tuple:
    file, _, line = origin.rpartition(":")
    return (file, int(line) if line.isdigit() else 0)


def _wrapper(policy: _Policy, texts: list[str], lines: list[str], names: NameAllocator) -> _Wrapper:
    hint = ["checkpoint" if policy.chunks is None else f"temporal_chunk_{policy.chunks}"]
    if policy.groups is not None:
        hint.append(f"regions_{len(policy.groups)}")
    if not policy.preserve_rng:
        hint.append("rng_off")
    if policy.codec is not None:
        hint.append(policy.codec)
    if policy.stateful:
        hint.append("stateful")
    if policy.boundaries is not Boundaries.KEEP:
        hint.append(policy.boundaries.value)
    if policy.save:
        hint.append("saving_" + "_".join(policy.save))
    name = names.allocate("_".join(hint))
    doc = f"{'; '.join(texts)}  ({', '.join(lines)})"
    return _Wrapper(name, doc, render(policy.call_template, p=policy))


def plan_table(plan: ResolvedPlan) -> list[str]:
    """The resolved plan as aligned text rows: module, class, policy, rule (names escaped
    with ``printable``, so the columns line up on a terminal too)."""
    rows = [("module", "class", "policy", "rule")]
    for m in plan.modules:
        for policy, origin in m.decisions():
            rows.append((printable(m.path), printable(m.type_name.rsplit(".", 1)[-1]), policy, printable(str(origin))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
