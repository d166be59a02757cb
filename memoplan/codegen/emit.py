"""Codegen stage: ``emit`` — a pure function from a ResolvedPlan to generated source files.

Decisions are made here in Python (which wrappers exist, their names, their
calls); the template only prints them.  Output is sorted and has no timestamps,
so the same plan gives byte-identical files.
"""

from __future__ import annotations

from dataclasses import dataclass

from memoplan import __version__
from memoplan.codegen.names import NameAllocator
from memoplan.codegen.render import pyrepr, render
from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.ir import CheckpointAction, ModulePlan, ResolvedPlan

# Names the template defines itself.
RESERVED = ("apply", "remove", "TARGETS", "PLAN_ID", "SOURCE", "_rt", "self", "args", "kwargs", "torch")


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


def emit(plan: ResolvedPlan, *, source: str | None = None, module_name: str = "plan_module") -> GeneratedCode:
    """Render the plan module; ``source`` is the plan's name as printed in the header."""
    _refuse_unsupported(plan)
    names = NameAllocator(RESERVED)
    wrappers: dict[object, _Wrapper] = {}
    lines_of: dict[object, list[str]] = {}
    targets = []
    for module in plan.modules:
        action = module.checkpoint
        if action is None:
            continue
        key = _key(action)
        lines_of.setdefault(key, []).append(str(action.origin))
        targets.append((module, key))
    for key in sorted(lines_of, key=repr):
        lines = sorted(set(lines_of[key]), key=_line_order)
        wrappers[key] = _wrapper(key, lines, names)
    context = {
        "version": __version__,
        "source": source or plan.file,
        "plan_id": plan.digest,
        "rows": plan_table(plan),
        "module_count": len(plan.modules),
        "policies": [wrappers[k] for k in sorted(wrappers, key=repr)],
        "targets": [
            {"path": m.path, "type_name": m.type_name, "forward": wrappers[k].name} for m, k in targets
        ],
    }
    text = render("plan_module.py.j2", **context)
    return GeneratedCode(plan.digest, (GeneratedFile(f"{module_name}.py", text),))


def _key(action: CheckpointAction) -> tuple:
    return ("checkpoint", action.groups, action.preserve_rng)


def _line_order(origin: str) -> tuple:
    file, _, line = origin.rpartition(":")
    return (file, int(line) if line.isdigit() else 0)


def _wrapper(key: tuple, lines: list[str], names: NameAllocator) -> _Wrapper:
    _, groups, preserve_rng = key
    where = ", ".join(lines)
    if groups is None:
        name = names.allocate("checkpoint" if preserve_rng else "checkpoint_rng_off")
        doc = f"checkpoint{'' if preserve_rng else ' rng = off'}: recompute this module in backward ({where})"
        call = (
            f"_rt.run_checkpointed(self, type(self).forward, args, kwargs, preserve_rng={pyrepr(preserve_rng)})"
        )
    else:
        name = names.allocate(f"checkpoint_segments_{len(groups)}")
        doc = f"checkpoint segments = {len(groups)}: one region per group of children ({where})"
        call = f"_rt.run_segmented(self, {pyrepr(groups)}, args, kwargs, preserve_rng={pyrepr(preserve_rng)})"
    return _Wrapper(name, doc, call)


def plan_table(plan: ResolvedPlan) -> list[str]:
    """The resolved plan as aligned text rows: module, class, policy, rule."""
    rows = [("module", "class", "policy", "rule")]
    for m in plan.modules:
        for policy, origin in _decisions(m):
            rows.append((m.path, m.type_name.rsplit(".", 1)[-1], policy, str(origin)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _decisions(m: ModulePlan):
    for action in (m.checkpoint, m.compress, m.temporal_chunk, m.state):
        if action is not None:
            yield action.origin.policy, action.origin
    if m.keep is not None:
        yield m.keep.policy, m.keep
    if m.buffers_commit_once is not None:
        yield m.buffers_commit_once.policy, m.buffers_commit_once


def _refuse_unsupported(plan: ResolvedPlan) -> None:
    problems = []
    for m in plan.modules:
        for action in (m.compress, m.temporal_chunk):
            if action is not None:
                problems.append(
                    Diagnostic(
                        "MP404",
                        f"`{action.origin.policy}` on `{m.path}` is checked but not yet run by this "
                        f"memoplan version's runtime",
                        help=f"rule at {action.origin}; remove it to apply the rest of the plan",
                    )
                )
    if problems:
        raise PlanError(tuple(problems))
