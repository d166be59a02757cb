"""The ``memoplan`` command line's arguments: one function a command, no torch imported.

:func:`build_parser` takes the function that runs each command (``memoplan.cli``'s), so this
module says what every command accepts and ``memoplan.cli`` what each one does.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memoplan import cli_output, deprecations, isolate
from memoplan.cli_output import add_common_options
from memoplan.diagnostics import did_you_mean, nonnegative_float, printable
from memoplan.version import __version__

Runner = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """argparse's parser, which also says "did you mean `check`?" for a mistyped command or choice."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as error:
            hint = did_you_mean(value, list(action.choices or ())) if isinstance(value, str) else None
            if hint is None:
                raise
            raise argparse.ArgumentError(action, f"{error.message}; {hint}") from None

    def error(self, message: str):  # NoReturn, as argparse's
        """A usage error, with what the user typed escaped: ``unrecognized arguments: --x\\x1b[2J``,
        never the raw escape (subcommands' parsers are of this class too)."""
        super().error("\n".join(printable(line) for line in message.split("\n")))


# `--help` lists a command's options in these groups, in this order: the basics first.  An option
# is placed by its dest; one not named here (a new option) goes to "other options", before the
# sublinear search's knobs, which are their own group (memoplan.planner.knobs.SUBLINEAR_KNOBS).
OPTION_GROUPS: dict[str, tuple[str, ...]] = {
    "basic options": tuple("model example budget output preset check syntax_only stdio".split()),
    "advanced options": tuple(
        "coverage planner hint nested dtr profile method repeats loss planned_only seed rtol compare_example "
        "compile sweep budgets peers".split()
    ),
    "where the step runs": tuple(
        "device device_memory autocast shards optimizer master_weights mixed_precision isolate".split()
    ),
    "output options": ("format", "json", "quiet", "verbose", "help"),
}
OTHER_OPTIONS = "other options"

# A few command lines for each command's `--help` (and the top-level one).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "": (
        "memoplan demo my-plans                            # the example plans, one verified",
        "memoplan check my-plans/cnn_bn_dropout.memplan    # parse, check, resolve against the model",
        "memoplan plan --model memoplan.examples.cnn:build --example 'randn(8, 3, 32, 32)' --budget 80% -o cnn.memplan",
        "memoplan rule MP301                               # what a diagnostic code means",
    ),
    "check": (
        "memoplan check plans/                        # every *.memplan under plans/",
        "memoplan check --syntax-only plans/          # no model built, no torch imported",
        "memoplan check plans/ --format github        # GitHub Actions annotations",
    ),
    "fmt": ("memoplan fmt plans/", "memoplan fmt --check plans/     # exit 1 and a diff if a plan is not canonical"),
    "rule": ("memoplan rule MP301", "memoplan rule                   # every code"),
    "explain": ("memoplan explain plan.memplan --planned-only",),
    "verify": ("memoplan verify plan.memplan", "memoplan verify plan.memplan --device cuda --format json"),
    "write-module": (
        "memoplan write-module plan.memplan -o plan_module.py",
        "memoplan write-module plan.memplan -o plan_module.py --check",
    ),
    "profile": (
        "memoplan profile --model memoplan.examples.cnn:build --example 'randn(8, 3, 32, 32)' -o profile.json",
    ),
    "plan": (
        "memoplan plan --model memoplan.examples.cnn:build --example 'randn(8, 3, 32, 32)' --budget 80% -o cnn.memplan",
        "memoplan plan --model mypkg.models:build --example 'randn(8, 3, 224, 224)' --budget '4 GiB' -o plan.memplan",
        "memoplan plan start.memplan --preset memory -o plan.memplan   # complete a hand-written plan",
    ),
    "report": ("memoplan report plan.memplan -o report.html",),
    "docs": ("memoplan docs", "memoplan docs errors            # every diagnostic code"),
    "lsp": ("memoplan lsp          # started by the editor (memoplan docs editors)",),
    "demo": ("memoplan demo my-plans",),
}


def _examples(name: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES.get(name, ()))


def group_options(parser: argparse.ArgumentParser) -> None:
    """Sort the options `--help` lists under "options" into OPTION_GROUPS (basic first)."""
    default = next(g for g in parser._action_groups if g.title in ("options", "optional arguments"))
    where = {dest: title for title, dests in OPTION_GROUPS.items() for dest in dests}
    groups = {title: parser.add_argument_group(title) for title in (*OPTION_GROUPS, OTHER_OPTIONS)}
    for action in list(default._group_actions):
        groups[where.get(action.dest, OTHER_OPTIONS)]._group_actions.append(action)
    default._group_actions.clear()
    order = [default, *groups.values()]  # positionals first, then the groups, then the sublinear knobs
    rest = [g for g in parser._action_groups if g not in order]
    parser._action_groups[:] = [g for g in (*rest[:1], *order, *rest[1:]) if g._group_actions]


# The sublinear search's settings on the command line: the `sublinear` block's keys.
def build_parser(run: Mapping[str, Runner], report: Callable[[Any], None]) -> argparse.ArgumentParser:
    """Every command and its options; ``run[name]`` runs command ``name``, ``report`` prints a PlanError."""
    parser = Parser(
        prog="memoplan",
        description="Declarative activation-memory plans for PyTorch models.",
        epilog=_examples("") + "\n\n" + isolate.UNTRUSTED,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"memoplan {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _check(sub, run["check"])
    _fmt(sub, report)
    _rule(sub)
    _docs(sub)
    _explain(sub, run["explain"])
    _verify(sub, run["verify"])
    _write_module(sub, run["write-module"], "write-module")
    _profile(sub, run["profile"])
    _plan(sub, run["plan"])
    _report(sub, run["report"])
    lsp = sub.add_parser("lsp", help="language server for editors (stdio): diagnostics, hover, completion, formatting")
    lsp.add_argument("--stdio", action="store_true", help="talk over stdin and stdout (the default, and the only way)")
    lsp.set_defaults(run=run["lsp"])
    demo = sub.add_parser("demo", help="copy the bundled example plans into a folder and verify one")
    demo.add_argument("folder", nargs="?", type=Path, default=Path("memoplan-demo"), help="default: ./memoplan-demo")
    demo.set_defaults(run=run["demo"])
    for old, new in deprecations.COMMANDS.items():  # hidden (no help): runs the new command, with MP540
        command = _write_module(sub, run[new], old)
        command.set_defaults(deprecated=(deprecations.renamed("the command", f"memoplan {old}", f"memoplan {new}"),))
    for name, command in sub.choices.items():
        add_common_options(command, formats=name in ("check", "fmt", "verify"))
    finish_help(parser)
    return parser


def finish_help(parser: argparse.ArgumentParser) -> None:
    """Every command's `--help`: its one-line help as description, options in groups, examples.

    Called after every option is added (:func:`build_parser` calls it last), so an option added
    to any command lands in its group."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, command in sub.choices.items():
        command.description = command.description or helps.get(name)
        command.epilog = _examples(name) if name in EXAMPLES else command.epilog
        command.formatter_class = argparse.RawDescriptionHelpFormatter
        command.usage = _usage(command)
        group_options(command)


def _usage(command: argparse.ArgumentParser) -> str:
    """``memoplan plan [PLAN] -o PATH [options]``: what a command needs; `--help` lists the rest."""
    parts = []
    for action in command._actions:
        name = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        if not action.option_strings:
            parts.append({"?": f"[{name}]", "+": f"{name} [{name} ...]"}.get(str(action.nargs), name))
        elif action.required:
            parts.append(f"{action.option_strings[0]} {name}")
    return " ".join([command.prog, *parts, "[options]"])


def _check(sub: Any, run: Runner) -> None:
    check = sub.add_parser("check", help="parse and validate a plan (and resolve it against a model)")
    check.add_argument(
        "plans", type=Path, nargs="+", metavar="PLAN", help="plan files, folders (their *.memplan), or - (stdin)"
    )
    model_options(check)
    check.add_argument("--syntax-only", action="store_true", help="parse and check values only: no model, no torch")
    check.set_defaults(run=run)


def _fmt(sub: Any, report: Callable[[Any], None]) -> None:
    fmt = sub.add_parser("fmt", help="rewrite plans in canonical form")
    fmt.add_argument("plans", type=Path, nargs="+", metavar="PLAN", help="plan files, folders, or - (stdin to stdout)")
    fmt.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is not canonical")
    fmt.set_defaults(run=lambda args: cli_output.run_fmt(args, report))


def _rule(sub: Any) -> None:
    from memoplan.rules import print_rule

    rule = sub.add_parser("rule", help="explain a diagnostic code (`memoplan rule MP301`), or list them all")
    rule.add_argument("code", nargs="?", help="a code such as MP301 (leave out to list every code)")
    rule.set_defaults(run=lambda args: print_rule(args.code))


def _docs(sub: Any) -> None:
    from memoplan.doc_pages import print_docs

    docs = sub.add_parser("docs", help="print a page of the documentation (`memoplan docs` lists the topics)")
    docs.add_argument("topic", nargs="?", help="a topic such as tutorial, errors, security (leave out to list them)")
    docs.set_defaults(run=lambda args: print_docs(args.topic))


def _explain(sub: Any, run: Runner) -> None:
    explain = sub.add_parser("explain", help="for every module, which rule decided what and why")
    explain.add_argument("plan", type=Path)
    model_options(explain, example=False)
    explain.add_argument("--planned-only", action="store_true", help="list only modules a rule touches")
    explain.set_defaults(run=run)


def _verify(sub: Any, run: Runner) -> None:
    verify = sub.add_parser("verify", help="one step with and without the plan: peak memory and equivalence")
    verify.add_argument("plan", type=Path)
    model_options(verify)
    verify.add_argument(
        "--seed", type=int, default=0, help="RNG seed for building the model and example, and for both runs (default 0)"
    )
    verify.add_argument(
        "--rtol",
        type=nonnegative_float,
        help="tolerance per tensor, relative to the largest unplanned magnitude of its category "
        "(default 0: bit for bit; 5e-5 for plans with temporal chunks)",
    )
    verify.add_argument(
        "--compare-example",
        metavar="SPEC",
        help="prove equivalence on this (smaller) example and measure the planned step on the full one; "
        "by default only when the unplanned step does not fit, on the example's batch halved until both fit",
    )
    verify.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        type=compile_backend,
        metavar="BACKEND",
        help="run both steps under torch.compile (default backend inductor; aot_eager needs no C++ compiler) "
        "and print the graphs, ops and graph breaks of each next to the peaks",
    )
    shard_options(verify)
    device_option(verify)
    verify.set_defaults(run=run)


def _write_module(sub: Any, run: Runner, name: str) -> Any:
    """``memoplan write-module`` (and its old name ``compile``, hidden: added without help)."""
    shown = {"help": "write the plan module to commit next to the model"} if name not in deprecations.COMMANDS else {}
    write = sub.add_parser(name, **shown)
    write.add_argument("plan", type=Path)
    model_options(write, example=False)
    write.add_argument("-o", "--output", type=Path, required=True, metavar="PATH", help="the .py file to write")
    write.add_argument(
        "--check",
        action="store_true",
        help="write nothing; compare PATH byte for byte with what would be written: exit 1 and a unified diff if it differs",
    )
    write.set_defaults(run=run)
    return write


class _BudgetWord(argparse.Action):
    """``--budget``: an old coverage word becomes its new one, and ``MP540`` says so."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        new = deprecations.BUDGET_WORDS.get(str(values).strip().lower())
        if new is not None:
            said = deprecations.renamed("the budget word", str(values).strip(), new)
            namespace.deprecated = (*getattr(namespace, "deprecated", ()), said)
            values = new
        setattr(namespace, self.dest, values)


def _profile(sub: Any, run: Runner) -> None:
    profile = sub.add_parser("profile", help="measure a model per module (JSON) for the planners")
    spec_options(profile)
    profile.add_argument("-o", "--output", type=Path, required=True, metavar="PATH", help="profile.json to write")
    profile.add_argument(
        "--repeats", type=positive_int, default=3, metavar="N", help="timed steps; times are their medians (default 3)"
    )
    method_option(profile)
    shard_options(profile)
    device_option(profile, estimating=True, memory=False)
    profile.set_defaults(run=run)


def _plan(sub: Any, run: Runner) -> None:
    from memoplan.planner.knobs import KNOBS, PLAN_METHOD_HELP, SUBLINEAR_KNOBS  # pure Python: no torch

    plan = sub.add_parser("plan", help="write a plan that meets a memory budget")
    plan.add_argument(
        "start",
        nargs="?",
        type=Path,
        metavar="PLAN",
        help="a hand-written plan to complete: its model, example, budget and sublinear block are the "
        "defaults of the options, its rules stay as written and the planner adds rules for the rest",
    )
    spec_options(plan, required=False)
    for row in KNOBS:
        if row.name != "method":  # --method comes after the output, as on the other commands
            _knob_option(plan, row)
    plan.add_argument(
        "--profile",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="use this profile.json instead of measuring; several (one per rank) are merged, so every rank plans the same",
    )
    knobs = plan.add_argument_group(
        "sublinear search (with --planner sublinear; ranges and defaults as the `sublinear` block's keys)"
    )
    for row in SUBLINEAR_KNOBS:
        _knob_option(knobs, row)
    plan.add_argument("-o", "--output", type=Path, required=True, metavar="PATH", help="the .memplan to write")
    method_option(plan, PLAN_METHOD_HELP)
    shard_options(plan)
    device_option(plan, estimating=True)
    plan.set_defaults(run=run)


def _knob_option(parser: argparse.ArgumentParser, row: Any) -> None:
    """The option of a planner knob (a row of ``memoplan.planner.knobs.KNOBS``)."""
    if row.kind == "flag":
        parser.add_argument(row.flag, action="store_true", help=row.help)
    elif row.kind == "choice":
        parser.add_argument(row.flag, choices=list(row.allowed()), default=row.default, help=row.help)
    else:
        action = _BudgetWord if row.renames else "store"
        parser.add_argument(row.flag, metavar=row.metavar, action=action, help=row.help)


def _report(sub: Any, run: Runner) -> None:
    from memoplan.report import command as report_command  # no torch, no matplotlib for the parser

    report = sub.add_parser(
        "report", help="one self-contained HTML report with plots: memory over a step, saved bytes, budget sweep"
    )
    report.add_argument("plan", type=Path)
    model_options(report)
    shard_options(report)
    device_option(report)
    report_command.add_arguments(report)
    report.set_defaults(run=run)


# ---------------------------------------------------------------- options several commands take


def spec_options(parser: argparse.ArgumentParser, required: bool = True) -> None:
    also = "" if required else "; default: the plan's `model` statement"
    parser.add_argument(
        "--model", metavar="SPEC", required=required, help=f"pkg.module:factory or path/file.py:factory{also}"
    )
    parser.add_argument(
        "--example",
        metavar="SPEC",
        required=required,
        help="pkg.module:inputs, path/file.py:inputs, or 'randn(4, 3, 32, 32)'" + also.replace("model", "example"),
    )
    isolate.add_option(parser)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def compile_backend(text: str) -> str:
    """``--compile BACKEND``: a backend torch.compile has (imports torch, only when the option is given)."""
    from memoplan.graphs import backend_problem

    problem = backend_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def model_options(parser: argparse.ArgumentParser, example: bool = True) -> None:
    parser.add_argument("--model", metavar="SPEC", help="pkg.module:factory or path/file.py:factory")
    isolate.add_option(parser)
    if example:
        parser.add_argument(
            "--example", metavar="SPEC", help="pkg.module:inputs, path/file.py:inputs, or e.g. 'randn(4, 3, 32, 32)'"
        )


def method_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    from memoplan.planner.knobs import knob  # the planner's table: pure Python

    method = knob("method")
    parser.add_argument(
        method.flag,
        choices=method.allowed(),
        default=method.default,
        help=help
        or "measured: real training steps; estimated: the full-size step on fake tensors (nothing allocated) "
        "with times from a smaller real run; auto (default): measure, estimate if the step runs out of memory",
    )


def shard_options(parser: argparse.ArgumentParser) -> None:
    """The step's options (the `step` block's keys): loss, precision, optimizer, FSDP2 sharding."""
    step = parser  # `--help` places them (OPTION_GROUPS); each sets a key of the `step` block
    step.add_argument(
        "--loss",
        metavar="LOSS",
        help="auto (default): the model's own loss where its output carries one (attribute or key `loss`), "
        "else the sum of its floating outputs; sum; model: the model's own, required; or FILE.py:callable "
        "(pkg.module:callable), called with the output",
    )
    step.add_argument(
        "--autocast",
        choices=("none", "bf16", "fp16"),
        help="run the forward and the loss under torch.autocast in this dtype (default none)",
    )
    step.add_argument(
        "--shards",
        type=positive_int,
        metavar="N",
        help="the step of one of N FSDP2 ranks (`fully_shard` on each block and the root): parameters, "
        "gradients and optimizer state sharded 1/N, activations of the example, which is one rank's batch; "
        "estimated on fake tensors (default: WORLD_SIZE under torchrun, else 1)",
    )
    step.add_argument(
        "--optimizer",
        choices=("none", "sgd", "momentum", "adam", "adamw"),
        help="the optimizer whose state each rank keeps between steps (sharded 1/N), in the parameters' dtype: "
        "sgd none, momentum one tensor per parameter, adam and adamw two; reported, not part of the step's "
        "peak (default none)",
    )
    step.add_argument(
        "--master-weights",
        choices=("none", "fp32"),
        help="fp32: an fp32 copy of every parameter that is not fp32, and the optimizer state in fp32 (default none)",
    )
    step.add_argument(
        "--mixed-precision",
        choices=("none", "bf16", "fp16"),
        help="with --shards: FSDP2's MixedPrecisionPolicy, parameters gathered and computed in this dtype, "
        "gradients reduced in fp32 (default none)",
    )


def device_option(parser: argparse.ArgumentParser, *, estimating: bool = False, memory: bool = True) -> None:
    if not estimating:
        parser.add_argument(
            "--device",
            metavar="DEV",
            help="run the steps there, e.g. `cuda` or `cuda:1` (default: cpu); on CUDA, peaks are the allocator's; "
            "for a model on the meta device, the device its steps are estimated for, on fake tensors",
        )
        return
    parser.add_argument(
        "--device",
        metavar="DEV",
        help="the device the step is planned for, e.g. `cuda` or `cuda:1` (default: where the model is; cpu for "
        "a model on the meta device); on CUDA, peaks are the caching allocator's; a CUDA device this machine "
        "lacks is estimated on fake tensors (the header says with which kernels)",
    )
    if not memory:
        return
    parser.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="the planned device's memory, e.g. `80GiB`, for `--budget device` where the device is not here "
        "(less what the model, its gradients' shards and the optimizer state hold through the step)",
    )
