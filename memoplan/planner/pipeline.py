"""Planner stage: one planning run, the same for ``memoplan plan`` and :func:`memoplan.plan`.

Both build a :class:`~memoplan.planner.request.PlanRequest` and call :func:`run` with the model
and example on the device planned for, inside the training step planned for
(:func:`memoplan.step.running`).  :func:`run` checks the request (its preset), checks a given
profile against the step (MP604) or takes one, turns ``--budget device`` into bytes, searches
(:meth:`~memoplan.planner.presets.PlannerPreset.run`, or :func:`~memoplan.planner.dtr.plan.make_dtr_plan`
for ``--dtr``) and writes the budget and the step into the plan.  What is left to a caller is its
own: the command line loads the model and example files, says its progress and writes the file
with the plan's sources; the API moves a copy of the model to its device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memoplan.planner.request import PlanRequest, PlanRequestError

if TYPE_CHECKING:  # pragma: no cover
    from memoplan.planner.dtr.plan import DtrPlanResult
    from memoplan.planner.presets import PlannerPreset
    from memoplan.planner.profiling.profile import Profile
    from memoplan.planner.trial import PlanResult
    from memoplan.syntax import ast
    from memoplan.syntax.blocks import StepConfig, SublinearConfig

__all__ = ["Planned", "plan", "run"]


def _unguarded(run: Callable[[], Any], step: str, *, only_oom: bool = False) -> Any:
    return run()


@dataclass(frozen=True)
class Planned:
    """What :func:`run` made: the search's ``result``, the ``plan`` to write (the result's, with its
    budget statement and the `step` block of the step planned for) and the ``profile`` searched over."""

    result: PlanResult | DtrPlanResult
    plan: ast.Plan
    profile: Profile


def run(
    request: PlanRequest,
    model,
    example,
    *,
    step: StepConfig,
    sublinear: SublinearConfig | None = None,
    profile: Profile | None = None,
    profile_name: str = "the profile",
    progress: bool = False,
    note: Callable[[str], None] | None = None,
    guard: Callable[..., Any] = _unguarded,
    folder: Path | str = ".",
) -> Planned:
    """Plan ``model`` on ``example`` as ``request`` asks, for the training step ``step``.

    ``sublinear``: the sublinear search's settings (default: the `sublinear` block of the plan
    completed); ``profile``: one already taken (``profile_name`` names it in MP604), else one is
    taken by ``request.method``; ``progress``: the profiler and the search report as they go;
    ``note``: receives the run's lines (the preset, ``budget device``'s bytes, a profile estimated
    after an out-of-memory step); ``guard(run, step, only_oom=...)`` runs the profile (step
    ``profile``) and the search (``planned``), the command line's MP411/MP504 for a step that
    fails; ``folder``: where the plan is written (the `step` block's file specs are relative to it).
    :class:`PlanRequestError` for a request that cannot plan.
    """
    preset = request.check()
    say = note if note is not None else (lambda line: None)
    if profile is not None:  # MP604: a profile of another step (loss, precision, shards, optimizer, device)
        from memoplan.planner.profiling.stamp import check_same_step
        from memoplan.planner.profiling.target import target_for

        check_same_step(profile, model, step, example, target_for(model).device, profile_name)
    if request.preset is not None:
        levels = ", ".join(level.value for level in preset.levels) or "none"
        say(f"preset {preset.name}: {_preset_how(preset)}, refinement levels: {levels}")
    preset = _on_device(request, preset, model, step, say)
    if request.dtr and step.shards > 1:
        raise PlanRequestError("--dtr measures its threshold with real steps: not with --shards above 1")
    profile = _profile(request, model, example, profile, step, progress, note, guard)
    if request.dtr:
        from memoplan.planner.dtr.plan import make_dtr_plan

        made = make_dtr_plan(model, example, preset.budget, hard=preset.hard, prof=profile)  # type: ignore[arg-type]
        return Planned(made, _with_step(made.plan, step, folder), profile)
    result = guard(
        lambda: _search(request, preset, model, example, profile, sublinear, progress), "planned", only_oom=True
    )
    return Planned(result, _written(result.plan, preset, step, folder), profile)


def _search(request: PlanRequest, preset: PlannerPreset, model, example, profile, sublinear, progress: bool):
    """The preset's search: estimated trials unless ``request.method`` is ``measured``."""
    if sublinear is None and request.sublinear_block() is not None:
        from memoplan.syntax.blocks import config_of

        sublinear = config_of(request.sublinear_block())
    return preset.run(
        model,
        example,
        prof=profile,
        progress=progress,
        named=request.preset is not None,
        nested=request.nested,
        sublinear=sublinear,
        start=request.start,
        trials="measured" if request.method == "measured" else "estimated",
    )


def _profile(request: PlanRequest, model, example, profile, step: StepConfig, progress: bool, note, guard) -> Profile:
    """``profile``, else one taken now by ``request.method``; a measured run refuses an estimated one."""
    from memoplan.planner.profiling.estimate import take_profile

    if profile is None:
        method = request.method
        profile = guard(
            lambda: take_profile(
                model,
                example,
                method=method,
                note=note,
                progress=progress,
                repeats=3 if method == "measured" else 1,  # estimated trials need the times only roughly
                fake_peak=method == "auto",
                shards=step.shards,
                optimizer=step.optimizer,
            ),
            "profile",
        )
    if request.method == "measured" and profile.method == "estimated":
        raise PlanRequestError("--method measured needs a measured profile; --profile gave an estimated one")
    return profile


def _on_device(request: PlanRequest, preset: PlannerPreset, model, step: StepConfig, say) -> PlannerPreset:
    """``preset`` with a device budget turned into its bytes: the device's less what the model holds there."""
    from memoplan.planner.budgets import DeviceBudget
    from memoplan.planner.profiling.aim import device_budget_limit

    if not isinstance(preset.budget, DeviceBudget):
        return preset
    limit = device_budget_limit(preset.budget, model, request.device, request.device_memory, step, say)
    return replace(preset, budget=limit)


def _written(plan, preset: PlannerPreset, step: StepConfig, folder: Path | str):
    """``plan`` with its budget statement (hard or hint as planned) and the `step` block of ``step``."""
    from memoplan.planner.search.write import with_budget

    return _with_step(with_budget(plan, preset.budget, preset.hard), step, folder)


def _with_step(plan, step: StepConfig, folder: Path | str):
    from memoplan.planner.search.write import with_step

    return with_step(plan, step, folder)


def _preset_how(preset: PlannerPreset) -> str:
    """How a named preset plans, for its progress line."""
    from memoplan.planner import budgets

    if isinstance(preset.budget, budgets.Preset):
        return f"coverage budget {preset.budget.word}"  # takes its share; no planner search
    if isinstance(preset.budget, budgets.Coverage):
        return "a coverage budget"
    if isinstance(preset.budget, budgets.LeastPeak):
        return "the least peak (every search measured)"
    return f"planner {preset.planner.value}"


def plan(
    model,
    example,
    budget: str | None = None,
    *,
    coverage: str | None = None,
    preset: str | None = None,
    planner: str | None = None,
    hint: bool = False,
    nested: bool = False,
    start=None,
    sublinear=None,
    profile=None,
    method: str = "auto",
    progress: bool = False,
    step=None,
    device=None,
    device_memory=None,
) -> PlanResult:
    """Plan ``model`` on ``example`` for ``budget`` (``"4 GiB"``, ``"50%"``, ``"60% hint"``,
    ``"checkpoint-half"``), a ``coverage`` (``"60%"`` or ``"5"`` of the candidate modules) or a ``preset`` (``safe``, ``balanced``, ``memory``, ``exhaustive``), as
    ``memoplan plan`` does (the same :class:`PlanRequest` and :func:`run`); return the
    :class:`~memoplan.planner.plan.PlanResult`: ``.plan`` (a :class:`memoplan.syntax.ast.Plan`, with
    its ``budget`` statement; ``format_plan`` writes it) and the figures (``measured_before``,
    ``measured_after``, ``met``, ``regions``).

    ``example``: a tensor, a tuple of arguments or a :class:`memoplan.specs.Example`.
    ``planner``: ``optimal``, ``greedy`` or ``sublinear``; ``hint``: the budget is not
    enforced; ``nested``: offer each block's children too; ``start``: a plan (``Plan``, path or
    text) whose rules are kept and completed; ``sublinear``: a
    :class:`memoplan.syntax.blocks.SublinearConfig` (with ``planner="sublinear"``); ``profile``:
    a :class:`~memoplan.planner.profiling.profile.Profile` already taken, else one is taken by ``method``
    (``auto``, ``measured``, ``estimated``, as ``--method``); ``step``: the training step planned for, a
    :class:`memoplan.syntax.blocks.StepConfig` (default ``start``'s), written as the plan's `step` block;
    ``device`` and ``device_memory``: the device planned for and its capacity (``"cuda"``, ``"80GiB"``
    or bytes), as ``--device`` and ``--device-memory`` (:func:`memoplan.planner.profiling.aim.aimed`; ``budget="device"``
    is the device's memory less what the model holds).  Impossible combinations raise
    :class:`PlanRequestError` (a :class:`ValueError`) before the model runs; a hard budget
    that no plan meets raises :class:`memoplan.PlanError` (MP601).  ``model`` is not changed.
    """
    from memoplan.api import as_plan
    from memoplan.planner.profiling.aim import aimed
    from memoplan.planner.profiling.profile import as_example
    from memoplan.step import make_step, running

    parsed_start = None if start is None else as_plan(start)
    request = PlanRequest(
        budget=budget,
        coverage=coverage,
        preset=preset,
        planner=planner,
        hint=hint,
        nested=nested,
        method=method,
        sublinear_options=("`sublinear`",) if sublinear is not None else (),
        start=parsed_start,
        start_name=None if parsed_start is None else parsed_start.file,
        device=device,
        device_memory=device_memory,
    )
    request.check()  # before the model runs
    config = _step_config(step, parsed_start)  # the `step` block of `start` with `step` over it
    ran = make_step(config)
    aim = aimed(model, as_example(example), device, device_memory, ran, method=method, plan=parsed_start)
    with aim as (model, example), running(ran):
        planned = run(request, model, example, step=config, sublinear=sublinear, profile=profile, progress=progress)
    return replace(planned.result, plan=planned.plan)  # type: ignore[return-value]  # no `dtr` here: a PlanResult


def _step_config(step, start):
    """The step ``plan`` plans for: ``start``'s `step` block with the keys ``step`` sets (those
    that differ from the default step) over it; MP254 where they contradict the block."""
    from dataclasses import fields

    from memoplan.step import merged, step_block
    from memoplan.syntax.blocks import StepConfig

    written, spans = step_block(start)
    default = StepConfig()
    given = {} if step is None else {f.name: getattr(step, f.name) for f in fields(step)}
    given = {k: v for k, v in given.items() if written is None or v != getattr(default, k)}
    return merged(written, spans, given, None if start is None else start.source)
