"""``memoplan profile`` and ``memoplan plan``: the step, model and example of a planning run, the
options as a :class:`~memoplan.planner.request.PlanRequest`, the one planning run
(:func:`memoplan.planner.pipeline.run`, which ``memoplan.plan`` calls too) and the plan written."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from memoplan import cli_output, cli_target
from memoplan.cli_load import cache_warnings, load_example, load_model, progress, show
from memoplan.cli_output import load_plan, write_output
from memoplan.cli_step import checked, first_step, present, sharded_step, stepping
from memoplan.cli_sublinear import sublinear_config
from memoplan.targets import check_output, model_file, plan_inputs, replace_file, writing


def _start_model_and_example(start, args):
    """The model and example of ``memoplan plan PLAN``: the options', else the plan's, on ``--device``."""
    device = cli_target.device(args.device, estimating=args.method != "measured")
    model = load_model(start, args.start, args.model, required=True)
    example = load_example(start, args.start, args.example, required=True)
    return cli_target.on_target(model, example, device, args)


def _model_and_example(args):
    """The model and example named by --model and --example (no plan involved), on ``--device``.

    The model is this command's own, loaded for it, so it is moved there rather than copied.
    """
    device = cli_target.device(args.device, estimating=args.method != "measured")  # refused before the model is built
    model, example = (
        load_model(None, None, args.model, required=True),
        load_example(None, None, args.example, required=True),
    )
    return cli_target.on_target(model, example, device, args)


def profile_command(args) -> int:
    from memoplan.planner.profiling.estimate import take_profile
    from memoplan.planner.profiling.report import profile_table

    check_output(args.output, model_file(args.model))
    step = _sharded_step(args)
    model, example = _model_and_example(args)
    checked(step, model, cli_target.device(args.device, estimating=True))
    with stepping(step):
        result = first_step(
            lambda: take_profile(
                model,
                example,
                method=args.method,
                note=progress,
                repeats=args.repeats,
                shards=step.config.shards,
                optimizer=step.config.optimizer,
            ),
            "profile",
        )
    if cli_output.to_stdout(args.output):  # `-o -`: the JSON on stdout, the table on stderr
        with contextlib.redirect_stdout(sys.stderr):
            show(profile_table(result))
        return _save_to_stdout(result)
    with writing(args.output):
        result.save(args.output)
    show(profile_table(result))
    print(f"wrote {args.output}: {len(result.modules)} modules, unplanned peak {result.peak_bytes} B ({result.method})")
    return 0


def _shards(args) -> int:
    """``--shards``, else ``WORLD_SIZE`` (torchrun), else 1."""
    from memoplan.planner.profiling.shard import default_shards

    shards = args.shards if args.shards is not None else default_shards()
    if args.shards is None and shards > 1:
        progress(
            f"note: WORLD_SIZE={shards}: planning the step of one of {shards} FSDP2 ranks (--shards 1 for an unsharded one)"
        )
    return shards


def _sharded_step(args, plan=None, path=None):
    return sharded_step(args, plan, path, shards=_shards(args))


def _save_to_stdout(result) -> int:
    """A profile's JSON (as ``Profile.save`` writes it) on standard output."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "profile.json"
        result.save(path)
        write_output(Path("-"), path.read_text(encoding="utf-8"))
    return 0


def plan_command(args) -> int:
    """`memoplan plan`: the options as a PlanRequest, checked before any model loads; the model and
    example on the target, inside the step; one planning run (memoplan.planner.pipeline.run); the plan written."""
    from memoplan.planner.request import PlanRequestError

    start = load_plan(args.start) if args.start is not None else None
    request = _plan_request(args, start)
    try:
        request.check()
        sublinear = sublinear_config(args, request.sublinear_block())
    except PlanRequestError as exc:
        return _refused(exc)
    check_output(
        args.output,
        *(plan_inputs(start, args.start, args.model) if start is not None else ()),
        model_file(args.model),
        *(args.profile or ()),
    )
    step = _sharded_step(args, start, args.start)
    model, example = _model_and_example(args) if start is None else _start_model_and_example(start, args)
    cli_target.refuse_dtr(args, model)  # MP413: the dtr threshold is measured by real steps
    checked(step, model, cli_target.device(args.device, estimating=True), start)
    with stepping(step, start):
        return _plan_with(args, start, request, sublinear, step, model, example)


def _refused(exc: Exception) -> int:
    print(f"memoplan plan: error: {exc}", file=sys.stderr)
    return 2


def _plan_with(args, start, request, sublinear, step, model, example) -> int:
    """`memoplan plan` once its step, model and example are known: the profiles given, the run, the plan written."""
    from memoplan.planner import pipeline
    from memoplan.planner.profiling.profile import Profile, merge
    from memoplan.planner.request import PlanRequestError

    try:
        prof = merge([Profile.load(path) for path in args.profile]) if args.profile else None
    except ValueError as exc:  # profiles of different models
        print(f"memoplan plan: error: {exc}", file=sys.stderr)
        return 1
    try:
        planned = pipeline.run(
            request,
            model,
            example,
            step=step.config,
            sublinear=sublinear,
            profile=prof,
            profile_name=", ".join(str(path) for path in args.profile or ()),
            progress=True,
            note=progress,
            guard=first_step,
            folder=args.output.parent,
        )
    except PlanRequestError as exc:
        return _refused(exc)
    if args.dtr:
        return _write_dtr(args, planned.result, planned.plan)
    _write_plan(args, start, planned, model, example)
    return 0


def _plan_request(args, start):
    """The options of `memoplan plan` as a PlanRequest (memoplan.planner.request)."""
    from memoplan.planner.knobs import KNOBS, SUBLINEAR_KNOBS
    from memoplan.planner.request import PlanRequest

    given = tuple(row.flag for row in SUBLINEAR_KNOBS if getattr(args, row.name) is not None)
    knobs = {row.name: getattr(args, row.name) for row in KNOBS if row.request}  # budget, preset, hint, ...
    return PlanRequest(
        **knobs,
        sublinear_options=given,
        start=start,
        start_name=None if args.start is None else str(args.start),
        sources=args.model is not None and args.example is not None,
        device=args.device,
        device_memory=getattr(args, "device_memory", None),
    )


def _write_plan(args, start, planned, model, example) -> None:
    """Write the plan ``memoplan plan`` made (its sources stated) and say what it did."""
    from memoplan.resolver import resolve
    from memoplan.syntax import format_plan

    plan = _with_sources(args, start, planned.plan)
    shown = write_output(args.output, format_plan(plan))  # `-o -`: the plan on stdout, this line on stderr
    cache_warnings(resolve(plan, model), model, example, None)  # MP327, for the plan written
    result = planned.result
    verdict = "met" if result.met else "NOT met (hint)"
    refined = ""
    if result.refinement is not None:
        refined = f" ({len(result.refinement.kept)} of {len(result.refinement.trials)} refinement trials kept)"
    print(
        f"wrote {args.output}: {result.regions} checkpoint{'s' if result.regions != 1 else ''}, "
        f"{_peaks(result, planned.profile, model)}, budget {verdict}{refined}",
        file=sys.stderr if shown else sys.stdout,
    )


def _with_sources(args, start, plan):
    """``plan`` with its model and example as the options or the completed plan name them, seen from
    the folder it is written to."""
    from memoplan.planner.search.write import rebased, with_sources
    from memoplan.syntax import parse_example_spec

    if start is not None and args.model is None and args.example is None and start.model is not None:
        return rebased(plan, args.start.parent, args.output.parent)  # its specs, seen from where it is written
    # The specs as given (a completed plan's own, seen from here), so `explain` and `verify`
    # of the written plan need no flags.
    own = rebased(start, args.start.parent, ".") if start is not None else None
    return with_sources(
        plan,
        args.model or present(present(own).model).spec,
        parse_example_spec(args.example, "--example") if args.example else present(present(own).example),
        args.output.parent,
    )


def _peaks(result, prof, model) -> str:
    """The peaks before and after, as they were found (measured, estimated, on fake tensors)."""
    before, after = result.measured_before, result.measured_after
    if prof.shards > 1:  # no sharded step runs here: both are one rank's, on fake tensors
        return f"per rank of {prof.shards}, on fake tensors: unplanned peak {before} B -> planned peak {after} B"
    if cli_target.runs_nowhere(model):  # a meta model, a GPU not here: nothing ran for real
        return f"on fake tensors: unplanned peak {before} B -> planned peak {after} B"
    if prof.method == "estimated":
        return f"estimated unplanned peak {before} B -> measured planned peak {after} B"
    if prof.peak_method == "fake-tensor":
        return f"unplanned peak {before} B (on fake tensors) -> measured planned peak {after} B"
    return f"measured peak {before} B -> {after} B"


def _write_dtr(args, result, plan) -> int:
    """Write the plan of `memoplan plan --budget B --dtr` (one `dtr` block: memoplan.planner.dtr.plan)."""
    from memoplan.planner.search.write import with_sources
    from memoplan.syntax import format_plan, parse_example_spec

    plan = with_sources(plan, args.model, parse_example_spec(args.example, "--example"), args.output.parent)
    with writing(args.output):
        replace_file(args.output, format_plan(plan))
    sim = result.simulation
    print(
        f"wrote {args.output}: dtr threshold {result.threshold} B, predicted peak {result.predicted_after} B "
        f"({sim.evictions} evictions, {sim.recomputes} recomputes), measured peak {result.measured_before} B -> "
        f"{result.measured_after} B, budget {'met' if result.met else 'NOT met (hint)'}"
    )
    return 0
