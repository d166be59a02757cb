"""Planner stage: measured refinement of a plan (SpikingJelly-style refinement levels).

The planners choose checkpoints from a cost model; this module improves their plan by
measuring it.  A *level* is a list of *trials*; a trial is one edit of the plan AST (so the
plan stays ordinary, commented ``.memplan`` text), measured with memoplan's deterministic
meter (:func:`memoplan.measure.measure_step`) on a deep copy of the model, and kept only
when the measurement says it helps -- otherwise the plan goes back to what it was.

Levels, run in the order given:

* ``split`` -- checkpointed ``nn.Sequential`` regions, heaviest first, are cut into
  ``checkpoint segments = N`` regions (``RefineOptions.segments``).  Kept when the peak drops.
* ``temporal`` -- checkpointed regions that contain stateful modules (``state = functional``:
  spiking neurons, recurrent cells), heaviest first, become ``temporal_chunk N dim 0``
  (``RefineOptions.chunks``).  Kept when the peak drops.
* ``narrow`` -- each plain ``checkpoint`` of a module with children, the later first, moves to
  its heaviest child (``blocks.5`` -> ``blocks.5.mlp``).  Kept when the peak does not rise:
  the same memory for less recompute (where the peak is set elsewhere, say in the loss, the
  rest of the module need not be recomputed).
* ``unwrap`` -- each region rule (``checkpoint`` or ``temporal_chunk``), lightest first (the
  later first among equals), is dropped.  Kept when the peak does not rise: the same memory
  for less recompute.
* ``save`` -- plain checkpoints (no compression, chunks or stateful modules inside) become
  ``checkpoint save = [matmul, attention]``: the region keeps those ops' outputs and recomputes
  only the cheap ops between them.  Kept when the peak does not rise: the same memory for less
  recompute (where the peak is set elsewhere).

In ``split`` and ``temporal``, regions of one module class (the identical blocks of a
network) are first tried all together: while every block holds the same memory, changing
one block cannot lower the peak, which the others still reach.  Then each region is tried
on its own.  An edit the resolver refuses (``MP304``: dropout, attention or SyncBatchNorm
inside a chunk) is recorded as a skipped trial, costs no measurement and does not count
against ``RefineOptions.max_trials``; a trial whose step raises is recorded and reverted.

Only rules whose selector is one literal module path (``module blocks.0 { ... }``, what the
planners write) take part; other rules are left as they are.  A kept edit gets a comment on
its rule (``# refine: segments = 2 lowered the measured peak 12.30 -> 10.10 MiB``); a
dropped rule is noted in the plan's header comments.

The user's model is never changed: every measurement runs on a deep copy, and around every
trial the model's parameters' gradients, buffers (BatchNorm running statistics), stateful
modules' state (:mod:`memoplan.runtime.state`), train/eval modes and the RNG states (torch,
CUDA, Python's ``random``) are snapshotted and restored, so every trial also starts from
the same random state as the first (:class:`memoplan.planner.profiling.profile.Snapshot`).
"""

from __future__ import annotations

import contextlib
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TextIO, TypeVar

import torch
from torch import nn

from memoplan import api
from memoplan.diagnostics import PlanError, printable
from memoplan.measure import measure_step
from memoplan.planner.config import ALL_LEVELS, Level, RefineOptions
from memoplan.planner.profiling.copies import unplanned_copy
from memoplan.planner.profiling.profile import Snapshot
from memoplan.progress import REPORTER, size
from memoplan.resolver import resolve
from memoplan.runtime.state import is_stateful
from memoplan.specs import Example
from memoplan.syntax import ast

__all__ = ["ALL_LEVELS", "Level", "RefineOptions", "Refinement", "Trial", "measure_plan", "refine"]

_MIB = 1024 * 1024


@dataclass(frozen=True)
class Trial:
    """One measured (or refused) edit of the plan."""

    level: Level
    modules: tuple[str, ...]  # the module paths of the rules it edits
    edit: str  # e.g. "segments = 2", "temporal_chunk 4 dim 0", "drop checkpoint"
    before: int  # bytes: the measured peak of the plan the trial started from
    after: int | None  # bytes: the measured peak with the edit; None when it did not resolve or run
    kept: bool
    note: str  # why it was kept or reverted


@dataclass(frozen=True)
class Refinement:
    """The refined plan, its measured peaks and every trial, in order."""

    plan: ast.Plan
    before: int  # bytes: the measured peak of the plan given
    after: int  # bytes: the measured peak of ``plan``
    trials: tuple[Trial, ...] = ()
    levels: tuple[Level, ...] = ()  # the levels that ran, in order

    @property
    def kept(self) -> tuple[Trial, ...]:
        return tuple(t for t in self.trials if t.kept)

    def summary(self) -> str:
        """One line for a plan's header: levels, trials kept, measured peaks."""
        levels = ", ".join(level.value for level in self.levels) or "no levels"
        return (
            f"{levels}: {len(self.kept)} of {len(self.trials)} trials kept, "
            f"measured peak {self.before} B -> {self.after} B"
        )


# ---------------------------------------------------------------- measuring without side effects


_copy = unplanned_copy


def measure_plan(model: nn.Module, example: Example, plan: ast.Plan, *, loss_fn=None) -> int:
    """Peak bytes of one training step of a copy of ``model`` with ``plan``; ``model`` is unchanged.

    ``loss_fn`` is the step's loss (the running step's when None: :func:`memoplan.measure.step_loss`).

    Raises :class:`PlanError` when the plan does not resolve against the model.  While planning
    from an estimated profile (:data:`memoplan.planner.profiling.shrink.ESTIMATING`) the peak is estimated
    on fake tensors (:func:`memoplan.planner.profiling.estimate.estimate_plan`) instead.
    """
    from memoplan.planner.profiling.shrink import ESTIMATING

    if ESTIMATING.get():
        from memoplan.planner.profiling.estimate import estimate_plan

        return estimate_plan(model, example, plan)
    example = _as_example(example)
    with Snapshot(model, example):
        clone = api.apply(_copy(model), plan, warn=False)
        return measure_step(clone, example.args, example.kwargs, loss_fn=loss_fn).peak_bytes


def _as_example(example: Example | torch.Tensor | Sequence[Any]) -> Example:
    if isinstance(example, Example):
        return example
    if isinstance(example, torch.Tensor):
        return Example((example,))
    return Example(tuple(example))


# ---------------------------------------------------------------- reading and editing rules


def _literal_path(rule: ast.ModuleRule) -> str | None:
    """The module path of a rule like ``module blocks.0 { ... }``; None for any other selector."""
    term = rule.selector.include
    if rule.selector.exclude or term.class_name is not None or term.path is None:
        return None
    names = [s.text for s in term.path.segments if isinstance(s, ast.Name)]
    if len(names) != len(term.path.segments):
        return None
    return ".".join(names)


_P = TypeVar("_P")


def _policy(rule: ast.ModuleRule, kind: type[_P]) -> _P | None:
    return next((p for p in rule.policies if isinstance(p, kind)), None)


def _is_region(rule: ast.ModuleRule) -> bool:
    return _policy(rule, ast.Checkpoint) is not None or _policy(rule, ast.TemporalChunk) is not None


def _region_word(rule: ast.ModuleRule) -> str:
    """What makes the rule a region, as written: ``temporal_chunk`` or ``checkpoint``."""
    return "temporal_chunk" if _policy(rule, ast.TemporalChunk) is not None else "checkpoint"


def _is_sequential(module: nn.Module) -> bool:
    """Whether ``segments`` may cut the module (the resolver's test, MP306)."""
    return type(module).forward is nn.Sequential.forward


def _splittable(rule: ast.ModuleRule, module: nn.Module) -> bool:
    """A plain ``checkpoint`` (no segments, split or chunks) of an nn.Sequential with 2+ children."""
    check = _policy(rule, ast.Checkpoint)
    return (
        check is not None
        and check.segments is None
        and check.split is None
        and _policy(rule, ast.TemporalChunk) is None
        and _is_sequential(module)
        and len(module._modules) >= 2
    )


def _chunkable(rule: ast.ModuleRule, module: nn.Module) -> bool:
    """A ``checkpoint`` (not yet chunked) of a module holding stateful modules."""
    return (
        _policy(rule, ast.Checkpoint) is not None
        and _policy(rule, ast.TemporalChunk) is None
        and any(is_stateful(sub) for sub in module.modules())
    )


#: What the ``save`` level keeps: the expensive ops of a transformer block.
SAVED_OPS: tuple[str, ...] = ("matmul", "attention")


def _savable(rule: ast.ModuleRule, module: nn.Module) -> bool:
    """A ``checkpoint`` without ``save`` that torch's region runs (no compress, chunks or state inside)."""
    check = _policy(rule, ast.Checkpoint)
    return (
        check is not None
        and check.save is None
        and _policy(rule, ast.TemporalChunk) is None
        and _policy(rule, ast.Compress) is None
        and not any(is_stateful(sub) for sub in module.modules())
    )


def _with_save(rule: ast.ModuleRule) -> ast.ModuleRule:
    check = _policy(rule, ast.Checkpoint)
    assert check is not None, "only checkpoint regions are edited"
    policies = tuple(replace(check, save=SAVED_OPS) if p is check else p for p in rule.policies)
    return replace(rule, policies=policies)


def _with_segments(rule: ast.ModuleRule, n: int) -> ast.ModuleRule:
    check = _policy(rule, ast.Checkpoint)
    assert check is not None, "only checkpoint regions are edited"
    policies = tuple(replace(check, segments=n, split=None) if p is check else p for p in rule.policies)
    return replace(rule, policies=policies)


def _narrowable(rule: ast.ModuleRule, module: nn.Module) -> bool:
    """A ``checkpoint`` with no options as the rule's only policy, of a module with children."""
    check = _policy(rule, ast.Checkpoint)
    plain = check is not None and all(
        getattr(check, name) is None for name in ("segments", "split", "rng", "impl", "nested")
    )
    return plain and len(rule.policies) == 1 and len(module._modules) > 0


def _with_path(rule: ast.ModuleRule, path: str) -> ast.ModuleRule:
    """The rule with its selector moved to the literal module ``path``."""
    term = ast.SelectorTerm(path=ast.PathPattern(tuple(ast.Name(part) for part in path.split("."))))
    return replace(rule, selector=replace(rule.selector, include=term))


def _with_chunks(rule: ast.ModuleRule, n: int) -> ast.ModuleRule:
    """The rule with its ``checkpoint`` (or chunking) replaced by ``temporal_chunk n dim 0``."""
    kept = tuple(p for p in rule.policies if not isinstance(p, (ast.Checkpoint, ast.TemporalChunk)))
    return replace(rule, policies=(*kept, ast.TemporalChunk(chunks=n, dim=0)))


def _comment(text: str) -> str:
    """One comment line: whitespace runs become one space, control characters are escaped."""
    text = " ".join(str(text).split())
    safe = "".join(f"\\u{ord(ch):04x}" if unicodedata.category(ch) in ("Cc", "Cs") else ch for ch in text)
    return "# " + safe


def _noted(rule: ast.ModuleRule, text: str) -> ast.ModuleRule:
    """The rule with ``text`` as its refinement comment (replacing an earlier one)."""
    leading = tuple(c for c in rule.comments.leading if not c.startswith("# refine:"))
    return replace(rule, comments=replace(rule.comments, leading=(*leading, _comment(f"refine: {text}"))))


def _sizes(before: int, after: int) -> str:
    """``12.30 -> 10.10 MiB``: both figures in the unit of the first."""
    for unit, factor in (("MiB", _MIB), ("KiB", 1024)):
        if before >= factor:
            return f"{before / factor:.2f} -> {after / factor:.2f} {unit}"
    return f"{before} -> {after} B"


# ---------------------------------------------------------------- the levels


@dataclass(frozen=True)
class _Candidate:
    """One edit to try: the region rules it changes (by module path) and how."""

    paths: tuple[str, ...]
    edit: str  # what the progress line and the comment call it
    change: Callable[[ast.ModuleRule], ast.ModuleRule] | None  # None: drop the rules (unwrap)
    # Kept when the peak does not rise (it costs less recompute), not only when it drops.
    cheaper: bool = False

    @property
    def drops(self) -> bool:
        return self.change is None


def _where(candidate: _Candidate) -> str:
    paths = candidate.paths
    return paths[0] if len(paths) == 1 else f"{len(paths)} regions ({', '.join(paths)})"


def _segments_edit(n: int) -> Callable[[ast.ModuleRule], ast.ModuleRule]:
    return lambda rule: _with_segments(rule, n)


def _chunks_edit(n: int) -> Callable[[ast.ModuleRule], ast.ModuleRule]:
    return lambda rule: _with_chunks(rule, n)


def _path_edit(path: str) -> Callable[[ast.ModuleRule], ast.ModuleRule]:
    return lambda rule: _with_path(rule, path)


class _Refiner:
    """The loop state: the current plan, its measured peak, the trials so far."""

    def __init__(
        self,
        model: nn.Module,
        example: Example,
        plan: ast.Plan,
        peak: int,
        weights: dict[str, int],
        options: RefineOptions,
        say: Callable[..., None],
    ) -> None:
        self.model = model
        self.example = example
        self.plan = plan
        self.peak = peak
        self.weights = weights
        self.options = options
        self.say = say
        self.trials: list[Trial] = []
        self.dropped: list[str] = []  # header comments for the rules unwrap removed

    # -- what the plan holds

    def rules(self) -> list[tuple[int, ast.ModuleRule, str, nn.Module]]:
        """(statement index, rule, module path, module) of every literal-path rule whose module exists."""
        found = []
        for index, stmt in enumerate(self.plan.statements):
            if not isinstance(stmt, ast.ModuleRule):
                continue
            path = _literal_path(stmt)
            if path is None:
                continue
            try:
                module = self.model.get_submodule(path)
            except AttributeError:
                continue
            found.append((index, stmt, path, module))
        return found

    def _weight(self, path: str) -> int:
        return self.weights.get(path, 0)

    def _indices(self, candidate: _Candidate) -> list[int]:
        """Where the candidate's region rules are in the current plan (unwrap removes rules)."""
        found = []
        for path in candidate.paths:
            for index, stmt in enumerate(self.plan.statements):
                if isinstance(stmt, ast.ModuleRule) and _is_region(stmt) and _literal_path(stmt) == path:
                    found.append(index)
                    break
        return found

    # -- running levels

    def run(self, level: Level, bar: bool = False) -> None:
        """Try the level's candidates in order, up to ``max_trials`` measured trials; ``bar``:
        a progress bar over them (:data:`memoplan.progress.REPORTER`)."""
        limit = self.options.max_trials
        done = 0
        candidates = self._candidates(level)
        total = len(candidates) if limit is None else min(limit, len(candidates))
        with contextlib.ExitStack() as stack:
            if bar and total:
                stack.enter_context(REPORTER.stage(f"improving the plan: {_LEVEL_WORDS[level]}", total, "trials"))
            for candidate in candidates:
                if limit is not None and done >= limit:
                    break
                # Candidates are listed up front; skip one an earlier kept edit already made.
                if self._changes(candidate) and self._try(
                    level, candidate, f"{done + 1}/{limit}" if limit is not None else str(done + 1)
                ):
                    done += 1
                if bar and total:
                    REPORTER.advance()

    def _candidates(self, level: Level) -> list[_Candidate]:
        rules = self.rules()
        if level is Level.UNWRAP:
            regions = [(i, path, _region_word(rule)) for i, rule, path, _ in rules if _is_region(rule)]
            # Lightest first; among equals the later first: the last region is recomputed as
            # soon as backward starts, so its checkpoint is the likeliest to save nothing.
            regions.sort(key=lambda r: (self._weight(r[1]), -r[0]))
            return [_Candidate((path,), f"drop {word}", None, cheaper=True) for _, path, word in regions]
        if level is Level.SAVE:
            edit = f"save = [{', '.join(SAVED_OPS)}]"
            chosen = sorted(((i, path, m) for i, rule, path, m in rules if _savable(rule, m)), key=lambda r: -r[0])
            by_type: dict[type, list[str]] = {}
            for _, path, module in chosen:
                by_type.setdefault(type(module), []).append(path)
            groups = [tuple(paths) for paths in by_type.values() if len(paths) > 1]
            return [
                _Candidate(paths, edit, _with_save, cheaper=True) for paths in (*groups, *((p,) for _, p, _ in chosen))
            ]
        if level is Level.NARROW:
            out = []
            for _, rule, path, module in sorted(rules, key=lambda r: -r[0]):  # the later first
                parts = [f"{path}.{name}" for name in module._modules if self._weight(f"{path}.{name}") > 0]
                if _narrowable(rule, module) and parts:
                    part = max(parts, key=self._weight)  # the first among equals
                    out.append(_Candidate((path,), f"narrow to {part}", _path_edit(part), cheaper=True))
            return out
        if level is Level.SPLIT:
            # Plain checkpoints of an nn.Sequential with children to cut between; more
            # segments than children would be MP307.
            chosen = [(i, path, m) for i, rule, path, m in rules if _splittable(rule, m)]
            edits = [(n, f"segments = {n}", _segments_edit(n)) for n in self.options.segments]
        else:
            # Checkpointed regions holding stateful modules: their time axis can be chunked.
            chosen = [(i, path, m) for i, rule, path, m in rules if _chunkable(rule, m)]
            edits = [(n, f"temporal_chunk {n} dim 0", _chunks_edit(n)) for n in self.options.chunks]
        # Which edit fits which region: more segments than children would be MP307, and an
        # edit the resolver refuses for the region alone (MP304: dropout in a chunk) is
        # reported once here and left out of the trials, so it cannot spoil a group.
        fits = {}
        for i, path, module in chosen:
            for n, edit, change in edits:
                if level is Level.SPLIT and n > len(module._modules):
                    fits[i, n] = False
                    continue
                fits[i, n] = self._resolves(level, _Candidate((path,), edit, change))
        chosen.sort(key=lambda c: (-self._weight(c[1]), c[0]))  # heaviest first
        by_class: dict[type, list[tuple[int, str]]] = {}
        for i, path, module in chosen:
            by_class.setdefault(type(module), []).append((i, path))
        out = []
        # Identical blocks all together first: while they hold the same memory, changing one
        # of them cannot lower the peak the others still reach.  Then one region at a time.
        for n, edit, change in edits:
            for members in by_class.values():
                paths = tuple(path for i, path in members if fits[i, n])
                if len(paths) > 1:
                    out.append(_Candidate(paths, edit, change))
        for i, path, _ in chosen:
            for n, edit, change in edits:
                if fits[i, n]:
                    out.append(_Candidate((path,), edit, change))
        return out

    def _changes(self, candidate: _Candidate) -> bool:
        indices = self._indices(candidate)
        if not indices:
            return False
        change = candidate.change
        if change is None:  # it drops the rules
            return True
        return any(change(rule) != rule for rule in (self._rule(i) for i in indices))

    def _rule(self, index: int) -> ast.ModuleRule:
        rule = self.plan.statements[index]
        assert isinstance(rule, ast.ModuleRule), "_indices finds module rules"
        return rule

    def _edited(self, candidate: _Candidate, note: str | None) -> ast.Plan:
        """The current plan with the candidate's edit; ``note`` becomes the edited rules' comment."""
        statements: list[ast.Statement | None] = list(self.plan.statements)
        change = candidate.change
        for i in self._indices(candidate):
            if change is None:  # it drops the rules
                statements[i] = None
            else:
                new = change(self._rule(i))
                statements[i] = new if note is None else _noted(new, note)
        return replace(self.plan, statements=tuple(s for s in statements if s is not None))

    def _resolves(self, level: Level, candidate: _Candidate) -> bool:
        """Whether the edited plan resolves; a refusal is recorded as a skipped trial (nothing measured)."""
        try:
            resolve(self._edited(candidate, None), self.model)
        except PlanError as error:
            first = error.errors[0] if error.errors else error.diagnostics[0]
            note = f"skipped: {first.code} {first.message}"
            self._record(level, candidate.paths, candidate.edit, self.peak, None, False, note)
            self.say(f"refine {level.value} {_where(candidate)}: {candidate.edit}: refused ({first.code}), skipped")
            return False
        return True

    def _try(self, level: Level, candidate: _Candidate, counter: str) -> bool:
        """Measure one trial; keep it or revert it.  False when nothing was measured (skipped)."""
        paths = candidate.paths
        where = _where(candidate)
        before = self.peak
        if not self._resolves(level, candidate):
            return False
        try:
            after = measure_plan(self.model, self.example, self._edited(candidate, None))
        except Exception as exc:  # noqa: BLE001  the edited model failed to run: not a plan to keep
            self._record(level, paths, candidate.edit, before, None, False, f"skipped: {type(exc).__name__}: {exc}")
            self.say(
                f"refine {level.value} [{counter}] {where}: {candidate.edit}: failed ({_one_line(exc)}), reverted", 0
            )
            return True
        # unwrap and narrow keep an edit that leaves the peak where it was: the same memory, less recompute.
        better = after < before or (candidate.cheaper and after <= before)
        if better and candidate.drops:
            note = f"measured peak {_sizes(before, after)} without it, less recompute"
        elif better and candidate.cheaper and level is Level.SAVE:
            note = f"{candidate.edit}: measured peak {_sizes(before, after)}, less recompute"
        elif better and candidate.cheaper:
            note = f"narrowed from {paths[0]}: measured peak {_sizes(before, after)}, less recompute"
        elif better:
            note = f"{candidate.edit} lowered the measured peak {_sizes(before, after)}"
        else:
            note = f"reverted: measured peak {_sizes(before, after)}"
        if better:
            self.plan = self._edited(candidate, note)
            self.peak = after
            if candidate.drops:
                what = candidate.edit.removeprefix("drop ")
                self.dropped.extend(_comment(f"refine: dropped the {what} of {p}: {note}") for p in paths)
        self._record(level, paths, candidate.edit, before, after, better, note)
        verdict = "kept" if better else "reverted"
        self.say(f"refine {level.value} [{counter}] {where}: {candidate.edit}: peak {_sizes(before, after)}, {verdict}")
        return True

    def _record(self, level, paths, edit, before, after, kept, note) -> None:
        self.trials.append(Trial(level, paths, edit, before, after, kept, note))


def _one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 200 characters of it), for a progress line."""
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > 200:
        message = message[:199] + "…"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def refine(
    model: nn.Module,
    example: Example | torch.Tensor | Sequence[Any],
    plan: ast.Plan,
    options: RefineOptions = RefineOptions(),
    *,
    baseline: int | None = None,
    weights: dict[str, int] | None = None,
    progress: bool = True,
    stream: TextIO | None = None,
) -> Refinement:
    """Run ``options.levels`` over ``plan`` and return the refined plan with every trial.

    ``plan`` must resolve against ``model`` (a planner's plan, with its ``state =
    functional`` rules).  ``baseline`` is its measured peak when already known (as
    :func:`measure_plan` gives it); it is measured otherwise.  ``weights`` maps module paths
    to the activation bytes they hold (a profile's ``subtree_saved_bytes``) and orders the
    trials, heaviest region first for ``split``/``temporal`` and lightest first for
    ``unwrap``; without it a one-step profile is taken.  ``progress`` writes a line per trial
    to ``stream`` (default stderr).  ``model`` is left exactly as it was.
    """
    example = _as_example(example)

    def say(message: str, level: int = 1) -> None:
        """A trial's line (a detail: ``-v``), or with ``level`` 0 what a person wants to know."""
        if not progress:
            return
        if stream is not None:  # the caller's stream: every line
            print(f"memoplan: {printable(message)}", file=stream, flush=True)
        else:
            REPORTER.say(printable(message), level)  # names come from the model

    if baseline is None:
        say("refine: measuring the plan as given")
        baseline = measure_plan(model, example, plan)
    if weights is None and options.levels:
        weights = _weights(model, example)
    refiner = _Refiner(model, example, plan, baseline, dict(weights or {}), options, say)
    for level in options.levels:
        refiner.run(level, progress and stream is None)
    result = refiner.plan
    if refiner.dropped:
        header = result.header_comments
        result = replace(result, header_comments=replace(header, leading=(*header.leading, *refiner.dropped)))
    refinement = Refinement(result, baseline, refiner.peak, tuple(refiner.trials), options.levels)
    say(f"refine: {refinement.summary()}")
    kept = sum(t.kept for t in refinement.trials)
    if refinement.trials and stream is None:
        say(
            f"improved the plan: {kept} of {len(refinement.trials)} changes kept, peak {_plain(baseline, refiner.peak)}",
            0,
        )
    return refinement


# What each level tries, in plain words, for the progress bar.
_LEVEL_WORDS = {
    Level.SPLIT: "splitting checkpointed regions into shorter runs",
    Level.TEMPORAL: "chunking stateful regions over time",
    Level.NARROW: "narrowing checkpoints to their heaviest part",
    Level.UNWRAP: "dropping checkpoints that save nothing",
    Level.SAVE: "keeping matmul and attention outputs inside checkpoints",
}


def _plain(before: int, after: int) -> str:
    return f"{size(before)} -> {size(after)}" if after != before else f"{size(after)}, unchanged"


def _weights(model: nn.Module, example: Example) -> dict[str, int]:
    """Activation bytes each module's subtree holds, from a one-step profile (model left as it was)."""
    from memoplan.planner.profiling.profile import profile

    with Snapshot(model, example):
        prof = profile(model, example, repeats=1, progress=False)
    return {name: prof.subtree_saved_bytes(name) for name in prof.names}
