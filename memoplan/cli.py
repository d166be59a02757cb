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
from memoplan.cli_load import (
    cache_warnings,
    describe_inputs,
    load_example,
    load_model,
    progress,
    report_error,
    resolve_plan,
    show,
)
from memoplan.cli_output import OUTPUT, load_plan, write_output
from memoplan.cli_parser import build_parser
from memoplan.cli_plan import plan_command, profile_command
from memoplan.cli_step import checked, command_step, first_step, present, stepping
from memoplan.cli_verify import verify_command
from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.targets import check_output, plan_inputs, writing

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
        # In a context of its own: the target device a command sets (memoplan.planner.profiling.target.TARGET)
        # ends with it, also when main() runs several commands in one process.
        # needs_torch.run: MP550 where the command needs torch and there is none.
        return out.finish(contextvars.copy_context().run(needs_torch.run, args))
    except PlanError as error:
        if not out.failed(error):
            report_error(error)
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
        "verify": verify_command,
        "write-module": _write_module,
        "profile": profile_command,
        "plan": plan_command,
        "report": _report_html,
        "lsp": _lsp,
        "demo": _demo,
    }
    return build_parser(runners, report_error)


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
                report_error(error)
            failed = True
    return 1 if failed else 0


def _check_one(args, path: Path) -> None:
    plan = load_plan(path)
    if args.syntax_only:  # no model, no torch: for pre-commit hooks and editors
        OUTPUT.result(
            f"{cli_output.display_name(path)}: ok, {len(plan.rules)} rule{'s' if len(plan.rules) != 1 else ''}"
        )
        return
    from memoplan.resolver.effects import statement_effects

    effects = statement_effects(plan, checking=True)  # refused before a model is loaded; notes say where the rest act
    if any(d.is_error for d in effects):
        raise PlanError(tuple(effects), plan.source)
    model = load_model(plan, path, args.model, required=False)
    printed_by_resolve = statement_effects(plan) if model is not None else []  # resolve_plan prints those
    for note in effects:
        if note not in printed_by_resolve:
            OUTPUT.diagnostic(note, plan.source)
    summary = f"{cli_output.display_name(path)}: ok, {len(plan.rules)} rule{'s' if len(plan.rules) != 1 else ''}"
    if model is not None:
        resolved = resolve_plan(plan, model)
        summary += f", {len(resolved.modules)} module{'s' if len(resolved.modules) != 1 else ''} planned"
    example = load_example(plan, path, getattr(args, "example", None), required=False)
    if example is not None:
        summary += f", example of {describe_inputs(example)}"
        if model is not None:
            from memoplan.resolver.shapes import check_example

            found = check_example(plan, model, example.args, example.kwargs)  # MP324: a chunk dim past the input's
            if found:
                raise PlanError(tuple(found), plan.source)
            cache_warnings(resolved, model, example, plan)  # MP327: a returned cache the regions write
    OUTPUT.result(summary)


def _explain(args) -> int:
    from memoplan.resolver import explain, render_explain
    from memoplan.syntax import ast

    plan = load_plan(args.plan)
    model = load_model(plan, args.plan, args.model, required=True)
    resolve_plan(plan, model)  # report errors and warnings first; explain only a plan that resolves
    rows = explain(plan, model)
    print(render_explain(rows, all_modules=not args.planned_only))
    if plan.block(ast.BlockKind.MEMONGER) is not None:  # the arena: captured with the plan's example
        from memoplan.memonger.build import plan_arena
        from memoplan.memonger.report import describe

        print()
        show(describe(present(plan_arena(model, plan))))
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
    plan = load_plan(args.plan)
    check_output(args.output, *plan_inputs(plan, args.plan, args.model))
    refused = [d for d in statement_effects(plan, checking=True) if d.is_error]
    if refused:
        raise PlanError(tuple(refused), plan.source)
    step = command_step(args, plan, args.plan)
    model = load_model(plan, args.plan, args.model, required=True, seed=args.seed)
    estimated = cli_target.estimated_only(model, args.device)  # a meta model: the page drawn from the estimate
    example = load_example(plan, args.plan, args.example, required=True)
    resolved = resolve_plan(plan, model)
    found = check_example(plan, model, example.args, example.kwargs)
    if found:
        raise PlanError(tuple(found), plan.source)
    checked(step, model, device, plan)
    write = estimated_report.write_estimated_report if estimated else report_command.write_report
    with writing(args.output), stepping(step, plan):
        result = first_step(
            lambda: write(plan, resolved, model, example, args.output, options, device=device, progress=progress)
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
    plan = load_plan(args.plan)
    check_output(args.output, *plan_inputs(plan, args.plan, args.model))
    model = load_model(plan, args.plan, args.model, required=True)
    resolved = resolve_plan(plan, model)
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
