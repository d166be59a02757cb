"""The public API: apply and remove a plan, and write it as a module for a repository (`write_module`).

``apply`` is the one back end: it emits code from the templates, writes it to the
cache, imports it and calls its ``apply`` — the same code ``memoplan write-module``
writes into a user's repository.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from torch import nn

from memoplan import runtime
from memoplan.codegen import emit, import_generated, write_files
from memoplan.diagnostics import MemoplanWarning, PlanError, Severity, Span
from memoplan.ir import ResolvedPlan
from memoplan.memonger.build import missing_example, plan_arena
from memoplan.memonger.plan import ArenaPlan
from memoplan.resolver import resolve
from memoplan.runtime import arena, hfcheck
from memoplan.syntax import ast, load, parse
from memoplan.targets import check_target

PlanLike = ast.Plan | ResolvedPlan | Path | str


def as_plan(plan: ast.Plan | Path | str) -> ast.Plan:
    """A parsed plan from a Plan, a path, or plan text (a ``str`` with a newline is text)."""
    if isinstance(plan, ast.Plan):
        return plan
    if isinstance(plan, str) and "\n" in plan:
        return parse(plan)
    return load(plan)


def apply(model: nn.Module, plan: PlanLike, *, warn: bool = True) -> nn.Module:
    """Apply ``plan`` to ``model`` in place and return it; undo with :func:`remove`.

    Nothing changes if the plan does not fit the model: every problem is raised at
    once as a :class:`memoplan.diagnostics.PlanError` before any module is touched, and an
    interruption (Ctrl-C) part way is rolled back before it propagates.  The plan's
    warnings (``ResolvedPlan.warnings``) are shown through :mod:`warnings` as
    :class:`memoplan.MemoplanWarning` (``warn=False``: not shown, for callers that print them
    themselves); ``MP322`` is also warned at the first training forward if the model's own
    gradient checkpointing was turned on after this call (:mod:`memoplan.runtime.hfcheck`).
    """
    parsed, resolved = _parsed_and_resolved(plan, model)
    if warn:  # before anything changes: a warning filtered into an error leaves the model as it was
        for diagnostic in resolved.warnings:
            if diagnostic.severity is Severity.WARNING:
                warnings.warn(MemoplanWarning(diagnostic), stacklevel=2)
    generated = import_generated(emit(resolved, arena=_arena(model, parsed, resolved)))
    generated.apply(model)
    try:
        hfcheck.watch(model, *_regions(resolved))
    except BaseException:
        remove(model)
        raise
    return model


def write_module(model: nn.Module, plan: PlanLike, output: Path | str, *, source: str | None = None) -> Path:
    """Write the plan module for ``model`` to ``output`` and return its path.

    Formerly ``memoplan.compile`` (still there for one release, with a :class:`DeprecationWarning`).
    The model comes first, as in :func:`apply` and :func:`memoplan.plan`; the order of
    memoplan 0.x, ``write_module(plan, model, output)``, still works for one release, with a
    :class:`DeprecationWarning`.

    The file is what :func:`apply` runs — deterministic, byte-identical when compiled
    again — and needs only torch and ``memoplan.runtime``: commit it next to the model
    and call its ``apply(model)``.  ``source`` is the plan's name in the header (default:
    the plan's file as given).
    """
    model, plan = _model_first(model, plan, "write_module")
    parsed, resolved = _parsed_and_resolved(plan, model)
    output = check_target(output, [resolved.file])  # MP508: a device, a missing folder, the plan itself
    code = emit(resolved, source=source, module_name=output.stem, arena=_arena(model, parsed, resolved))
    (path,) = write_files(code, output.parent, main_name=output.name)
    return path


def _model_first(model, plan, name: str):
    """(model, plan) from arguments in either order: the plan first is deprecated (memoplan 0.x)."""
    if isinstance(model, nn.Module):
        return model, plan
    if isinstance(plan, nn.Module):
        warnings.warn(
            f"memoplan.{name}(plan, model, ...) is deprecated: pass the model first, memoplan.{name}(model, plan, ...)",
            DeprecationWarning,
            stacklevel=3,
        )
        return plan, model
    got = type(model).__name__
    raise TypeError(f"memoplan.{name}: the model (a torch.nn.Module) comes first, then the plan; got {got}")


def remove(model: nn.Module) -> nn.Module:
    """Undo :func:`apply`: forwards, attributes and hooks are exactly as before."""
    arena.uninstall(model)
    runtime.uninstall(model)
    return model


def _parsed_and_resolved(
    plan: ast.Plan | ResolvedPlan | Path | str, model: nn.Module
) -> tuple[ast.Plan | None, ResolvedPlan]:
    """The plan as parsed (None: it came resolved) and as resolved against ``model``."""
    if isinstance(plan, ResolvedPlan):
        return None, plan
    parsed = as_plan(plan)
    return parsed, resolve(parsed, model)


def _regions(resolved: ResolvedPlan) -> tuple[tuple[str, ...], Span | None]:
    """The modules the plan recomputes as regions (`checkpoint`, `temporal_chunk`) and the first rule's place."""
    regions = [m for m in resolved.modules if m.checkpoint is not None or m.temporal_chunk is not None]
    origins = [action.origin for m in regions if (action := m.checkpoint or m.temporal_chunk) is not None]
    first = min(origins, key=lambda o: (o.file, o.line), default=None)
    span = None if first is None else Span(first.file, first.line, 1, first.line, 1)
    return tuple(m.path for m in regions), span


def _arena(model: nn.Module, parsed: ast.Plan | None, resolved: ResolvedPlan) -> ArenaPlan | None:
    """The ``memonger`` block's arena plan: the model captured with the plan's example."""
    if resolved.memonger is None:
        return None
    if parsed is None:  # a ResolvedPlan: its example is in the plan file it was resolved from
        parsed = _plan_file(resolved)
    return plan_arena(model, parsed)


def _plan_file(resolved: ResolvedPlan) -> ast.Plan:
    try:
        parsed = load(Path(resolved.file)) if Path(resolved.file).is_file() else None
    except PlanError:
        parsed = None
    if parsed is None or parsed.example is None or parsed.block(ast.BlockKind.MEMONGER) is None:
        raise PlanError((missing_example(None),))
    return parsed
