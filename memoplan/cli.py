"""The ``memoplan`` command line — thin: every subcommand calls the public API.

Exit codes: 0 clean, 1 diagnostics (or not equivalent, or ``fmt --check`` would
change a file), 2 usage errors, 3 ``fmt`` could not read, parse or write a plan, 130
interrupted (``docs/reference/cli.md``).  Diagnostics go to stderr, results to
stdout, progress to stderr; ``--format json|github`` and ``-q``/``-v`` are
``memoplan.cli_output``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import sys
from pathlib import Path

from memoplan import cli_output, cli_target, isolate, needs_torch
from memoplan.cli_output import OUTPUT, load_plan, write_output
from memoplan.cli_parser import SUBLINEAR_OPTIONS, build_parser
from memoplan.cli_step import checked, command_step, first_step, present, sharded_step, stepping
from memoplan.cli_sublinear import sublinear_config
from memoplan.diagnostics import Diagnostic, PlanError, Severity, printable
from memoplan.targets import check_output, model_file, plan_inputs, replace_file, writing

SUBCOMMANDS = (
    "check",
    "fmt",
    "rule",
    "docs",
    "explain",
    "verify",
    "write-module",
    "profile",
    "plan",
    "report",
    "lsp",
    "demo",
)
# and, hidden, the old names of memoplan.deprecations.COMMANDS (`compile`), with MP540


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    command = next((a for a in given if not a.startswith("-")), None)
    # No printed line starts with a `::` of the user's (a GitHub workflow command); the language
    # server's standard output is its protocol, left alone.
    guard = contextlib.nullcontext() if command == "lsp" else cli_output.guarded_output()
    with guard:
        code = isolate.finished(_main(argv))  # in an --isolate child: memoplan finished, nothing crashed
    if argv is None:  # the `memoplan` process itself (not a caller in Python): only its teardown is left
        _ctrl_c_ends_with(code)
    return code


def _ctrl_c_ends_with(code: int) -> None:
    """From now on Ctrl-C ends the process with ``code``: the command is done and its output
    complete, so it was not interrupted (exit 130 and a traceback from torch's or Python's
    teardown, which can take a second, would say it was).

    While Python waits for threads a model may have left running, Ctrl-C exits at once; once
    it runs its exit functions (the last stretch, torch's among them) Ctrl-C is ignored, as
    the signal handlers Python sets are gone before its last steps."""
    import atexit
    import os
    import signal
    import threading

    def done(signum, frame) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGINT, done)
            atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)  # runs first: after threads are joined


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    out = cli_output.configure(args)
    for said in getattr(args, "deprecated", ()):  # an old name (memoplan.deprecations): MP540, then run
        out.diagnostic(said, None)
    try:
        if isolate.requested(args):  # the command, and the model's code, in a child process
            out.begin(str(isolate.plan_path(args) or ""))  # named in --format json if the child crashes
            return isolate.run(sys.argv[1:] if argv is None else list(argv), isolate.plan_path(args))
        # In a context of its own: the target device a command sets (memoplan.planner.target.TARGET)
        # ends with it, also when main() runs several commands in one process.
        # needs_torch.run: MP550 where the command needs torch and there is none.
        return out.finish(contextvars.copy_context().run(needs_torch.run, args))
    except PlanError as error:
        if not out.failed(error):
            _report(error)
        return out.finish(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return cli_output.EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout closed early (`memoplan explain plan | head`): not an error of ours.
        sys.stdout = None  # no flush at exit, no second traceback
        return 1


def _parser() -> argparse.ArgumentParser:
    runners = {
        "check": _check,
        "explain": _explain,
        "verify": _verify,
        "write-module": _write_module,
        "profile": _profile,
        "plan": _plan,
        "report": _report_html,
        "lsp": _lsp,
        "demo": _demo,
    }
    return build_parser(runners, _report)


# ---------------------------------------------------------------- helpers


def _report(error: PlanError) -> None:
    print(error.render(), file=sys.stderr)
    errors = len(error.errors)
    summary = f"{errors} error{'s' if errors != 1 else ''}"
    for severity in (Severity.WARNING, Severity.NOTE):
        count = sum(d.severity is severity for d in error.diagnostics)
        if count:
            summary += f", {count} {severity.value}{'s' if count != 1 else ''}"
    print(summary, file=sys.stderr)


_progress = cli_output.progress


def _load(path: Path):
    return load_plan(path)  # `-` is standard input


def _model(plan, path: Path | None, spec: str | None, *, required: bool, seed: int = 0):
    """The model named by ``spec`` or the plan's `model` statement, built after ``torch.manual_seed(seed)``.

    Seeding first makes a factory's random initialisation, and an example factory
    called after it, the same on every run: a command gives the same figures and the
    same verdict each time.
    """
    import torch

    from memoplan import specs

    torch.manual_seed(seed)
    if spec is not None:
        _progress(f"loading model {spec}")
        return isolate.ran(specs.load_model(spec))
    if plan.model is not None:
        _progress(f"loading model {plan.model.spec}")
        with _shown_in(plan.source):
            return isolate.ran(specs.load_model(plan.model.spec, base_dir=present(path).parent, span=plan.model.span))
    if required:
        raise PlanError(
            (Diagnostic("MP502", f"no model for `{path}`", help="pass --model SPEC or add a `model` statement"),)
        )
    return None


def _example(plan, path: Path | None, spec: str | None, *, required: bool):
    from memoplan import specs
    from memoplan.syntax import parse_example_spec

    if spec is not None:
        stmt = parse_example_spec(spec, "--example")
        isolate.note(f"building example {spec.strip()}")
        with _shown_in(f"example {spec.strip()}"):  # the text parse_example_spec's spans point into
            return isolate.ran(specs.make_example(stmt))
    if plan.example is not None:
        isolate.note(f"building example {plan.example.spec or 'inline'}")
        with _shown_in(plan.source):
            return isolate.ran(specs.make_example(plan.example, base_dir=present(path).parent))
    if required:
        raise PlanError(
            (
                Diagnostic(
                    "MP502", f"no example input for `{path}`", help="pass --example SPEC or add an `example` statement"
                ),
            )
        )
    return None


@contextlib.contextmanager
def _shown_in(source: str | None):
    """Diagnostics raised inside, which point into ``source``, render it with a caret."""
    try:
        yield
    except PlanError as error:
        if error.source is not None or source is None:
            raise
        raise PlanError(error.diagnostics, source) from None


def _show(text: str) -> None:
    """Print a table or report that holds names from the model, each line through ``printable``."""
    print("\n".join(printable(line) for line in text.split("\n")))


def _resolve(plan, model):
    from memoplan.resolver import resolve

    resolved = resolve(plan, model)
    for warning in resolved.warnings:
        OUTPUT.diagnostic(warning, plan.source)
    return resolved


# ---------------------------------------------------------------- subcommands


def _check(args) -> int:
    """`memoplan check PLAN...`: each plan on its own; exit 1 if any has errors."""
    failed = False
    for path in cli_output.expand_plans(args.plans):
        OUTPUT.begin(cli_output.display_name(path))
        try:
            _check_one(args, path)
        except PlanError as error:
            if not OUTPUT.failed(error):
                _report(error)
            failed = True
    return 1 if failed else 0


def _check_one(args, path: Path) -> None:
    plan = _load(path)
    if args.syntax_only:  # no model, no torch: for pre-commit hooks and editors
        OUTPUT.result(
            f"{cli_output.display_name(path)}: ok, {len(plan.rules)} rule{'s' if len(plan.rules) != 1 else ''}"
        )
        return
    from memoplan.resolver.effects import statement_effects

    effects = statement_effects(plan, checking=True)  # refused before a model is loaded; notes say where the rest act
    if any(d.is_error for d in effects):
        raise PlanError(tuple(effects), plan.source)
    model = _model(plan, path, args.model, required=False)
    printed_by_resolve = statement_effects(plan) if model is not None else []  # _resolve prints those
    for note in effects:
        if note not in printed_by_resolve:
            OUTPUT.diagnostic(note, plan.source)
    summary = f"{cli_output.display_name(path)}: ok, {len(plan.rules)} rule{'s' if len(plan.rules) != 1 else ''}"
    if model is not None:
        resolved = _resolve(plan, model)
        summary += f", {len(resolved.modules)} module{'s' if len(resolved.modules) != 1 else ''} planned"
    example = _example(plan, path, getattr(args, "example", None), required=False)
    if example is not None:
        summary += f", example of {_inputs(example)}"
        if model is not None:
            from memoplan.resolver.shapes import check_example

            found = check_example(plan, model, example.args, example.kwargs)  # MP324: a chunk dim past the input's
            if found:
                raise PlanError(tuple(found), plan.source)
            _cache_warnings(resolved, model, example, plan)  # MP327: a returned cache the regions write
    OUTPUT.result(summary)


def _cache_warnings(resolved, model, example, plan) -> None:
    """MP327 (a returned cache the regions write); without ``plan``, not located (a plan being written)."""
    import dataclasses

    from memoplan.resolver.caches import returned_cache

    for warning in returned_cache(resolved, model, example.args, example.kwargs, plan):
        located = warning if plan is not None else dataclasses.replace(warning, span=None)
        OUTPUT.diagnostic(located, plan.source if plan is not None else None)


def _inputs(example) -> str:
    """``2 inputs`` (positional), ``1 input and keywords `x`, `mask```, ``keyword `x```."""
    count = len(example.args)
    text = f"{count} input{'s' if count != 1 else ''}"
    if not example.kwargs:
        return text
    names = ", ".join(f"`{printable(name)}`" for name in example.kwargs)
    keywords = f"keyword{'s' if len(example.kwargs) != 1 else ''} {names}"
    return f"{text} and {keywords}" if count else keywords


def _explain(args) -> int:
    from memoplan.resolver import explain, render_explain
    from memoplan.syntax import ast

    plan = _load(args.plan)
    model = _model(plan, args.plan, args.model, required=True)
    _resolve(plan, model)  # report errors and warnings first; explain only a plan that resolves
    rows = explain(plan, model)
    print(render_explain(rows, all_modules=not args.planned_only))
    if plan.block(ast.BlockKind.MEMONGER) is not None:  # the arena: captured with the plan's example
        from memoplan.memonger.build import plan_arena
        from memoplan.memonger.report import describe

        print()
        _show(describe(present(plan_arena(model, plan))))
    return 0


def _verify(args) -> int:
    """`memoplan verify`; with ``--format json|github`` the human-readable report goes to stderr."""
    OUTPUT.begin(str(args.plan))
    if not OUTPUT.collecting:
        return _verify_plan(args)
    with contextlib.redirect_stdout(sys.stderr):  # stdout holds only the JSON document or annotations
        return _verify_plan(args)


def _verify_plan(args) -> int:
    device = cli_target.device(args.device, estimating=True)  # a device not here: only a model that cannot run anyway
    plan = _load(args.plan)
    step = command_step(args, plan, args.plan)
    model = _model(plan, args.plan, args.model, required=True, seed=args.seed)
    example = _example(plan, args.plan, args.example, required=True)
    resolved = _resolve(plan, model)
    checked(step, model, device, plan)
    with stepping(step, plan):
        return _verify_with(args, plan, device, step, model, example, resolved)


def _verify_with(args, plan, device, step, model, example, resolved) -> int:
    """`memoplan verify` once its step, model, example and resolved plan are known."""
    from memoplan.codegen.emit import plan_table
    from memoplan.syntax import ast
    from memoplan.verification import budget_check, dtr_check, render_report, verify

    print(f"resolved plan {args.plan} ({len(resolved.modules)} modules):")
    for row in plan_table(resolved):
        _show(f"  {row}")
    if cli_target.cannot_run(model, device):
        return _verify_estimated(args, plan, model, example, device)
    cli_target.device(args.device)  # MP506: a real step needs the device here
    _cache_warnings(resolved, model, example, plan)
    print(f"step: {step.describe()}")
    if step.config.shards > 1:
        print(
            f"  one process runs the whole step here: the {step.config.shards} FSDP2 ranks' sharding and "
            "mixed precision are estimated by `memoplan plan`, not measured"
        )
    _progress(f"running one training step without and one with the plan{f' on {device}' if device else ''}")
    smaller = _example(None, None, args.compare_example, required=True) if args.compare_example else None
    report = first_step(
        lambda: verify(
            model,
            resolved,
            example,
            seed=args.seed,
            rtol=args.rtol,
            device=device,
            compare_example=smaller,
            compile=args.compile,
        ),
        instead="`verify` estimates the unplanned peak only with `--compare-example` or when the full-size "
        "unplanned step does not fit; without them both steps run for real",
    )
    _show(render_report(report))
    present(OUTPUT.current).details.update(cli_output.verify_details(report))
    missed = None
    if plan.budget is not None:
        line, missed = budget_check(plan.budget, report)
        print(line)
        if missed is not None:
            OUTPUT.diagnostic(missed, plan.source)
    dtr_block = plan.block(ast.BlockKind.DTR)
    unmet = dtr_check(dtr_block, report) if dtr_block is not None else None
    if unmet is not None:
        OUTPUT.diagnostic(unmet, plan.source)
    passed = report.equivalent and (missed is None or not missed.is_error) and unmet is None
    present(OUTPUT.current).status = "ok" if passed else "error"
    return 0 if passed else 1


def _verify_estimated(args, plan, model, example, device) -> int:
    """`memoplan verify` of a model on the meta device: the plan resolved (above), the peaks
    estimated, the budget checked against them, and MP414: equivalence is not checked."""
    from memoplan.verification import estimated_budget_check, estimated_verify

    _progress("estimating one training step without and one with the plan on fake tensors")
    check = first_step(lambda: estimated_verify(model, plan, example, device))
    _show(check.render())
    missed = None
    if plan.budget is not None:
        line, missed = estimated_budget_check(plan.budget, check)
        print(line)
        if missed is not None:
            OUTPUT.diagnostic(missed, plan.source)
    OUTPUT.diagnostic(
        Diagnostic(
            "MP414",
            f"`{args.plan}`: equivalence not checked: {check.why}",
            help="verify the plan on a smaller real build of the model (`memoplan docs meta`)",
            severity=Severity.WARNING,
        ),
        plan.source,
    )
    passed = missed is None or not missed.is_error
    present(OUTPUT.current).status = "ok" if passed else "error"
    return 0 if passed else 1


def _start_model_and_example(start, args):
    """The model and example of ``memoplan plan PLAN``: the options', else the plan's, on ``--device``."""
    device = cli_target.device(args.device, estimating=args.method != "measured")
    model = _model(start, args.start, args.model, required=True)
    example = _example(start, args.start, args.example, required=True)
    return cli_target.on_target(model, example, device, args)


def _model_and_example(args):
    """The model and example named by --model and --example (no plan involved), on ``--device``.

    The model is this command's own, loaded for it, so it is moved there rather than copied.
    """
    device = cli_target.device(args.device, estimating=args.method != "measured")  # refused before the model is built
    model, example = _model(None, None, args.model, required=True), _example(None, None, args.example, required=True)
    return cli_target.on_target(model, example, device, args)


def _profile(args) -> int:
    from memoplan.planner.estimate import take_profile
    from memoplan.planner.report import profile_table

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
                note=_progress,
                repeats=args.repeats,
                shards=step.config.shards,
                optimizer=step.config.optimizer,
            ),
            "profile",
        )
    if cli_output.to_stdout(args.output):  # `-o -`: the JSON on stdout, the table on stderr
        with contextlib.redirect_stdout(sys.stderr):
            _show(profile_table(result))
        return _save_to_stdout(result)
    with writing(args.output):
        result.save(args.output)
    _show(profile_table(result))
    print(f"wrote {args.output}: {len(result.modules)} modules, unplanned peak {result.peak_bytes} B ({result.method})")
    return 0


def _shards(args) -> int:
    """``--shards``, else ``WORLD_SIZE`` (torchrun), else 1."""
    from memoplan.planner.shard import default_shards

    shards = args.shards if args.shards is not None else default_shards()
    if args.shards is None and shards > 1:
        _progress(
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


def _plan(args) -> int:
    """Pick the preset, apply the explicit options over it, plan, refine, write the plan."""
    from memoplan.planner.device_budget import device_budget_refused, device_budget_text
    from memoplan.planner.presets import parse_budget
    from memoplan.planner.request import PlanRequestError

    start = _load(args.start) if args.start is not None else None
    request = _plan_request(args, start)
    try:
        request.check()
        device_budget = device_budget_text(args.budget)
        parsed = None
        if device_budget is not None:  # bytes once the model is on the device: a placeholder until then
            device_budget_refused(
                cli_target.device(args.device, estimating=True), args.budget, cli_target.device_memory(args)
            )
            parsed = parse_budget("1 B" + device_budget[1])
        preset = request.make_preset(parsed)
        sublinear = sublinear_config(args, request.sublinear_block())
        request.check_preset(preset, sublinear=sublinear is not None)
    except PlanRequestError as exc:
        print(f"memoplan plan: error: {exc}", file=sys.stderr)
        return 2
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
        return _plan_with(args, start, request, preset, sublinear, device_budget, step, model, example)


def _plan_with(args, start, request, preset, sublinear, device_budget, step, model, example) -> int:
    """`memoplan plan` once its step, model and example are known: profile, search, write."""
    from memoplan.planner.profile import Profile, merge
    from memoplan.planner.request import PlanRequestError

    try:
        prof = merge([Profile.load(path) for path in args.profile]) if args.profile else None
    except ValueError as exc:  # profiles of different models
        print(f"memoplan plan: error: {exc}", file=sys.stderr)
        return 1
    if args.preset:
        levels = ", ".join(level.value for level in preset.levels) or "none"
        _progress(f"preset {preset.name}: {_preset_how(preset)}, refinement levels: {levels}")
    try:
        request.check_nested(preset)
    except PlanRequestError as exc:
        print(f"memoplan plan: error: {exc}", file=sys.stderr)
        return 2
    shards = step.config.shards
    if device_budget is not None:
        limit = cli_target.device_budget_limit(args, model, shards, step.config.optimizer, device_budget, _progress)
        preset = preset.with_overrides(planner=None, budget=limit, hard=preset.hard)
    if args.dtr and shards > 1:
        print(
            "memoplan plan: error: --dtr measures its threshold with real steps: not with --shards above 1",
            file=sys.stderr,
        )
        return 2
    prof = _plan_profile(args, model, example, prof, step)
    if prof is None:
        return 2
    if args.dtr:
        return _plan_dtr(args, model, example, prof, preset, step)
    result = first_step(
        lambda: preset.run(
            model,
            example,
            prof=prof,
            named=args.preset is not None,
            nested=args.nested,
            sublinear=sublinear,
            start=start,
            trials="measured" if args.method == "measured" else "estimated",
        ),
        "planned",
        only_oom=True,
    )
    _write_plan(args, start, preset, result, model, example, prof, step)
    return 0


def _plan_profile(args, model, example, prof, step):
    """The profile ``plan`` searches over: the one given (``--profile``) or one taken now (with
    ``--method``); None, with the error said, when ``--method measured`` got an estimated one."""
    from memoplan.planner.estimate import take_profile

    if prof is None:
        # Planning from estimated trials needs the profile's times only roughly: one timed step.
        repeats = 3 if args.method == "measured" else 1
        prof = first_step(
            lambda: take_profile(
                model,
                example,
                method=args.method,
                note=_progress,
                repeats=repeats,
                fake_peak=args.method == "auto",
                shards=step.config.shards,
                optimizer=step.config.optimizer,
            ),
            "profile",
        )
    if args.method == "measured" and prof.method == "estimated":
        print(
            "memoplan plan: error: --method measured needs a measured profile; --profile gave an estimated one",
            file=sys.stderr,
        )
        return None
    return prof


def _plan_request(args, start):
    """The options of `memoplan plan` as a PlanRequest (memoplan.planner.request)."""
    from memoplan.planner.request import PlanRequest

    given = tuple(f"--{k.replace('_', '-')}" for k in SUBLINEAR_OPTIONS if getattr(args, k) is not None)
    return PlanRequest(
        budget=args.budget,
        coverage=args.coverage,
        preset=args.preset,
        planner=args.planner,
        hint=args.hint,
        nested=args.nested,
        dtr=args.dtr,
        sublinear_options=given,
        start=start,
        start_name=None if args.start is None else str(args.start),
        sources=args.model is not None and args.example is not None,
    )


def _preset_how(preset) -> str:
    """How a named preset plans, for its progress line."""
    from memoplan.planner import search

    if isinstance(preset.budget, search.Preset):
        return f"coverage budget {preset.budget.word}"  # takes its share; no planner search
    if isinstance(preset.budget, search.Coverage):
        return "a coverage budget"
    if isinstance(preset.budget, search.LeastPeak):
        return "the least peak (every search measured)"
    return f"planner {preset.planner.value}"


def _write_plan(args, start, preset, result, model, example, prof, step) -> None:
    """Write the plan ``memoplan plan`` made (its sources and budget stated) and say what it did."""
    from memoplan.planner.write import rebased, with_budget, with_sources, with_step
    from memoplan.resolver import resolve
    from memoplan.syntax import format_plan, parse_example_spec

    plan = result.plan
    if start is not None and args.model is None and args.example is None and start.model is not None:
        plan = rebased(plan, args.start.parent, args.output.parent)  # its specs, seen from where it is written
    else:
        # The specs as given (a completed plan's own, seen from here), so `explain` and `verify`
        # of the written plan need no flags.
        own = rebased(start, args.start.parent, ".") if start is not None else None
        plan = with_sources(
            plan,
            args.model or present(present(own).model).spec,
            parse_example_spec(args.example, "--example") if args.example else present(present(own).example),
            args.output.parent,
        )
    plan = with_step(with_budget(plan, preset.budget, preset.hard), step.config, args.output.parent)
    shown = write_output(args.output, format_plan(plan))  # `-o -`: the plan on stdout, this line on stderr
    _cache_warnings(resolve(plan, model), model, example, None)  # MP327, for the plan written
    verdict = "met" if result.met else "NOT met (hint)"
    if prof.shards > 1:  # no sharded step runs here: both are one rank's, on fake tensors
        peaks = (
            f"per rank of {prof.shards}, on fake tensors: unplanned peak {result.measured_before} B "
            f"-> planned peak {result.measured_after} B"
        )
    elif cli_target.runs_nowhere(model):  # a meta model, a GPU not here: nothing ran for real
        peaks = f"on fake tensors: unplanned peak {result.measured_before} B -> planned peak {result.measured_after} B"
    elif prof.method == "estimated":
        peaks = (
            f"estimated unplanned peak {result.measured_before} B -> measured planned peak {result.measured_after} B"
        )
    elif prof.peak_method == "fake-tensor":
        peaks = f"unplanned peak {result.measured_before} B (on fake tensors) -> measured planned peak {result.measured_after} B"
    else:
        peaks = f"measured peak {result.measured_before} B -> {result.measured_after} B"
    refined = ""
    if result.refinement is not None:
        refined = f" ({len(result.refinement.kept)} of {len(result.refinement.trials)} refinement trials kept)"
    print(
        f"wrote {args.output}: {result.regions} checkpoint{'s' if result.regions != 1 else ''}, {peaks}, "
        f"budget {verdict}{refined}",
        file=sys.stderr if shown else sys.stdout,
    )


def _plan_dtr(args, model, example, prof, preset, step) -> int:
    """`memoplan plan --budget B --dtr`: a plan with one `dtr` block (memoplan.planner.dtr_plan)."""
    from memoplan.planner.dtr_plan import make_dtr_plan
    from memoplan.planner.write import with_sources, with_step
    from memoplan.syntax import format_plan, parse_example_spec

    result = make_dtr_plan(model, example, preset.budget, hard=preset.hard, prof=prof)
    plan = with_sources(result.plan, args.model, parse_example_spec(args.example, "--example"), args.output.parent)
    plan = with_step(plan, step.config, args.output.parent)
    with writing(args.output):
        replace_file(args.output, format_plan(plan))
    sim = result.simulation
    print(
        f"wrote {args.output}: dtr threshold {result.threshold} B, predicted peak {result.predicted_after} B "
        f"({sim.evictions} evictions, {sim.recomputes} recomputes), measured peak {result.measured_before} B -> "
        f"{result.measured_after} B, budget {'met' if result.met else 'NOT met (hint)'}"
    )
    return 0


def _report_html(args) -> int:
    """`memoplan report`: the plan is loaded, checked and resolved as `check` does it, then
    measured and drawn by memoplan.report; no file is written unless all of it succeeds."""
    from memoplan.report import command as report_command
    from memoplan.report import estimated as estimated_report
    from memoplan.resolver.effects import statement_effects
    from memoplan.resolver.shapes import check_example

    options = report_command.options_from(args)
    report_command.require_matplotlib()
    device = cli_target.device(args.device, estimating=True)  # a device not here: only a model that cannot run anyway
    plan = _load(args.plan)
    check_output(args.output, *plan_inputs(plan, args.plan, args.model))
    refused = [d for d in statement_effects(plan, checking=True) if d.is_error]
    if refused:
        raise PlanError(tuple(refused), plan.source)
    step = command_step(args, plan, args.plan)
    model = _model(plan, args.plan, args.model, required=True, seed=args.seed)
    estimated = cli_target.estimated_only(model, args.device)  # a meta model: the page drawn from the estimate
    example = _example(plan, args.plan, args.example, required=True)
    resolved = _resolve(plan, model)
    found = check_example(plan, model, example.args, example.kwargs)
    if found:
        raise PlanError(tuple(found), plan.source)
    checked(step, model, device, plan)
    write = estimated_report.write_estimated_report if estimated else report_command.write_report
    with writing(args.output), stepping(step, plan):
        result = first_step(
            lambda: write(plan, resolved, model, example, args.output, options, device=device, progress=_progress)
        )
    print(f"wrote {', '.join(str(p) for p in result.written)}: sections {', '.join(result.sections)}")
    if estimated:  # MP414: every figure an estimate, equivalence not checked
        OUTPUT.diagnostic(estimated_report.not_checked(args.plan, model), plan.source)
    return 0


def _write_module(args) -> int:
    import tempfile

    from memoplan.api import write_module as compile_plan

    if args.check and cli_output.to_stdout(args.output):
        message = "`--check` compares with a file: `-o -` is standard output"
        raise PlanError((Diagnostic("MP508", message, help="give -o the committed plan module"),))
    plan = _load(args.plan)
    check_output(args.output, *plan_inputs(plan, args.plan, args.model))
    model = _model(plan, args.plan, args.model, required=True)
    resolved = _resolve(plan, model)
    source = args.plan.as_posix()
    if cli_output.to_stdout(args.output):  # `-o -`: the module on standard output, as plan and profile do
        with tempfile.TemporaryDirectory() as tmp:
            text = compile_plan(model, resolved, Path(tmp) / "plan.py", source=source).read_text(encoding="utf-8")
        write_output(args.output, text)
        return 0
    if not args.check:
        with writing(args.output):
            path = compile_plan(model, resolved, args.output, source=source)
        print(f"wrote {path} ({len(resolved.modules)} modules, plan id {resolved.digest})")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = compile_plan(model, resolved, Path(tmp) / args.output.name, source=source).read_bytes()
    return cli_output.compare_compiled(args.output, fresh)


def _demo(args) -> int:
    """`memoplan demo [FOLDER]`: the bundled plans, copied out of the package, and `verify` of one."""
    written = cli_output.copy_demo(args.folder)
    print(f"copied {len(written)} example plans into {args.folder}/ (existing files kept)")
    first = args.folder / "cnn_bn_dropout.memplan"
    code = main(["verify", str(first), *(["-q"] if args.quiet else [])])
    if code != 0:
        return code
    print(f"next: memoplan explain {first}   memoplan report {first} -o report.html   (docs: memoplan docs tutorial)")
    return code


def _lsp(args) -> int:
    """The language server (``memoplan.lsp``); it needs pygls, the ``lsp`` extra."""
    try:
        from memoplan.lsp.server import serve
    except ImportError as exc:
        print(f"memoplan lsp: error: {exc}; install the editor extra: pip install 'memoplan[lsp]'", file=sys.stderr)
        return 2
    return serve()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
