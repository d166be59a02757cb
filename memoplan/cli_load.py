"""What the ``memoplan`` commands load and how they print it: a plan, the model and the example it
names (or the options name), its resolution's warnings, a table of model names, an error's summary."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from memoplan import cli_output, isolate
from memoplan.cli_output import OUTPUT
from memoplan.cli_step import present
from memoplan.diagnostics import Diagnostic, PlanError, Severity, printable


def report_error(error: PlanError) -> None:
    print(error.render(), file=sys.stderr)
    errors = len(error.errors)
    summary = f"{errors} error{'s' if errors != 1 else ''}"
    for severity in (Severity.WARNING, Severity.NOTE):
        count = sum(d.severity is severity for d in error.diagnostics)
        if count:
            summary += f", {count} {severity.value}{'s' if count != 1 else ''}"
    print(summary, file=sys.stderr)


progress = cli_output.progress


def load_model(plan, path: Path | None, spec: str | None, *, required: bool, seed: int = 0):
    """The model named by ``spec`` or the plan's `model` statement, built after ``torch.manual_seed(seed)``.

    Seeding first makes a factory's random initialisation, and an example factory
    called after it, the same on every run: a command gives the same figures and the
    same verdict each time.
    """
    import torch

    from memoplan import specs

    torch.manual_seed(seed)
    if spec is not None:
        progress(f"loading model {spec}")
        return isolate.ran(specs.load_model(spec))
    if plan.model is not None:
        progress(f"loading model {plan.model.spec}")
        with shown_in(plan.source):
            return isolate.ran(specs.load_model(plan.model.spec, base_dir=present(path).parent, span=plan.model.span))
    if required:
        raise PlanError(
            (Diagnostic("MP502", f"no model for `{path}`", help="pass --model SPEC or add a `model` statement"),)
        )
    return None


def load_example(plan, path: Path | None, spec: str | None, *, required: bool):
    from memoplan import specs
    from memoplan.syntax import parse_example_spec

    if spec is not None:
        stmt = parse_example_spec(spec, "--example")
        isolate.note(f"building example {spec.strip()}")
        with shown_in(f"example {spec.strip()}"):  # the text parse_example_spec's spans point into
            return isolate.ran(specs.make_example(stmt))
    if plan.example is not None:
        isolate.note(f"building example {plan.example.spec or 'inline'}")
        with shown_in(plan.source):
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
def shown_in(source: str | None):
    """Diagnostics raised inside, which point into ``source``, render it with a caret."""
    try:
        yield
    except PlanError as error:
        if error.source is not None or source is None:
            raise
        raise PlanError(error.diagnostics, source) from None


def show(text: str) -> None:
    """Print a table or report that holds names from the model, each line through ``printable``."""
    print("\n".join(printable(line) for line in text.split("\n")))


def resolve_plan(plan, model):
    from memoplan.resolver import resolve

    resolved = resolve(plan, model)
    for warning in resolved.warnings:
        OUTPUT.diagnostic(warning, plan.source)
    return resolved


def cache_warnings(resolved, model, example, plan) -> None:
    """MP327 (a returned cache the regions write); without ``plan``, not located (a plan being written)."""
    import dataclasses

    from memoplan.resolver.caches import returned_cache

    for warning in returned_cache(resolved, model, example.args, example.kwargs, plan):
        located = warning if plan is not None else dataclasses.replace(warning, span=None)
        OUTPUT.diagnostic(located, plan.source if plan is not None else None)


def describe_inputs(example) -> str:
    """``2 inputs`` (positional), ``1 input and keywords `x`, `mask```, ``keyword `x```."""
    count = len(example.args)
    text = f"{count} input{'s' if count != 1 else ''}"
    if not example.kwargs:
        return text
    names = ", ".join(f"`{printable(name)}`" for name in example.kwargs)
    keywords = f"keyword{'s' if len(example.kwargs) != 1 else ''} {names}"
    return f"{text} and {keywords}" if count else keywords
