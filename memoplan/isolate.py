"""``--isolate`` (or ``MEMOPLAN_ISOLATE=1``): run a command, and the model's code it runs, in a
child process, so that a crash of that code is a diagnostic instead of a silent death.

Resolving a plan against a model imports and calls what the plan's ``model`` and ``example``
lines name (``docs/security.md``).  memoplan turns any *exception* of that code into ``MP504``,
but a signal (``os.abort()``, a segfault in a C extension, the out-of-memory killer) or
``os._exit()`` ends the process before any Python code can say a word.  With ``--isolate`` the
``memoplan`` process starts ``python -m memoplan`` with the same arguments as a child (same
standard streams, same environment) and waits: when the child finishes, its exit status is
passed on unchanged; when it dies of a signal (``MP530``) or ends before memoplan finished
(``MP531``: ``os._exit``), the parent says so, naming the step the child was at (the last
progress line, e.g. ``loading model os:abort``) and, when that step was loading the plan's
``model``, pointing at that line.  ``MP532``: the child could not be started.

This reports crashes; it is not a sandbox.  The child runs the model's code with the user's
rights, as memoplan without ``--isolate`` does.  For a plan from a source you do not trust,
``memoplan check --syntax-only`` runs no code at all.

How the two processes talk: the parent creates a status file and names it in the child's
environment (``MEMOPLAN_ISOLATED_STATUS``); the child writes each progress step there
(:func:`note`) and, when its ``main`` returns, ``done`` (:func:`finished`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from memoplan.diagnostics import Diagnostic, PlanError

__all__ = ["ENV", "UNTRUSTED", "add_option", "finished", "note", "plan_path", "ran", "requested", "run"]

#: Set to ``1`` to isolate every command that runs a model's code, as ``--isolate`` does.
ENV = "MEMOPLAN_ISOLATE"
_STATUS = "MEMOPLAN_ISOLATED_STATUS"
_DONE = "done"
_RUNNING = "running the model's code"


#: The epilog of `memoplan --help`: what resolving a plan runs, and the guards.
UNTRUSTED = """\
A plan's `model` and `example` lines name Python code: every command that resolves a
plan against a model (check, explain, verify, write-module, profile, plan, report) imports
and runs it, with the plan's folder on sys.path.  Treat a plan like a script: run
those commands only on plans you trust.  `memoplan check --syntax-only` runs no code
(no model, no torch).  --isolate (or MEMOPLAN_ISOLATE=1) runs the command in a child
process so that a crash of that code (a signal, os._exit) is reported as a diagnostic;
it is not a sandbox.  More: memoplan docs security"""


def add_option(parser: Any) -> None:
    """``--isolate`` on a command that loads a model."""
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="run in a child process: a crash of the model's code (signal, os._exit) becomes a diagnostic "
        "(MP530-MP532; also MEMOPLAN_ISOLATE=1). Not a sandbox: the model's code still runs",
    )


def plan_path(args: Any) -> Path | None:
    """The command's one plan file (``check`` takes several: the first when it is the only one)."""
    plans = getattr(args, "plans", None)
    return plans[0] if plans and len(plans) == 1 else getattr(args, "plan", None)


def requested(args: Any) -> bool:
    """Whether this command should run in a child: it runs a model's code and ``--isolate``
    or ``MEMOPLAN_ISOLATE=1`` asks for it (never in the child itself)."""
    if _STATUS in os.environ or not hasattr(args, "isolate") or getattr(args, "syntax_only", False):
        return False
    return bool(args.isolate) or os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def note(step: str) -> None:
    """In the child: the step it is at now (what the parent names if the child dies)."""
    _write(step)


def ran(value: Any) -> Any:
    """In the child: a spec was loaded; what runs next is the model's code at large. Returns ``value``."""
    _write(_RUNNING)
    return value


def finished(code: int) -> int:
    """In the child: ``main`` returned ``code``; anything after this is not a crash of user code."""
    _write(_DONE)
    return code


def _write(text: str) -> None:
    path = os.environ.get(_STATUS)
    if path:
        with contextlib.suppress(OSError):
            Path(path).write_text(text, encoding="utf-8", errors="backslashreplace")


def run(argv: list[str], plan: Path | None = None) -> int:
    """Run ``memoplan ARGV`` in a child; its exit status, or raise :class:`PlanError` when it
    crashed.  ``plan``: the command's plan file, to point at its ``model`` line."""
    with tempfile.TemporaryDirectory(prefix="memoplan-isolate-") as folder:
        status = Path(folder) / "status"
        status.write_text("starting", encoding="utf-8")
        env = dict(os.environ, **{_STATUS: str(status)})
        env.pop(ENV, None)
        try:
            child = subprocess.Popen([sys.executable, "-m", "memoplan", *argv], env=env)
        except OSError as error:
            raise PlanError(
                (
                    Diagnostic(
                        "MP532",
                        f"cannot start the child process for --isolate: {error}",
                        help="run the command without --isolate (and without MEMOPLAN_ISOLATE=1)",
                    ),
                )
            ) from None
        code = _wait(child)
        step = status.read_text(encoding="utf-8", errors="replace").strip()
    if step == _DONE:
        return code
    if code < 0 and -code == signal.SIGINT:
        raise KeyboardInterrupt
    raise _crashed(code, step, plan)


def _wait(child: subprocess.Popen) -> int:
    """The child's exit status; Ctrl-C reaches the child too (same process group): wait for it."""
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            continue


def _crashed(code: int, step: str, plan: Path | None) -> PlanError:
    where = "while starting" if step == "starting" else f"while {step}"
    span, source = _model_line(plan, step)
    if span is None and plan is not None:
        where += f" (plan {plan})"
    if code < 0:
        name = _signal_name(-code)
        hint = (
            "; SIGKILL is most often the kernel's out-of-memory killer"
            if -code == getattr(signal, "SIGKILL", 9)
            else ""
        )
        diagnostic = Diagnostic(
            "MP530",
            f"the model's code crashed the process: it was killed by {name} (signal {-code}) {where}",
            span,
            "the crash is in the code the plan's `model` or `example` names (os.abort(), a fault in a C "
            f"extension, ...){hint}; run that code on its own to find it",
        )
    else:
        diagnostic = Diagnostic(
            "MP531",
            f"the process ended with exit status {code} before memoplan finished, {where}: the model's code "
            "called os._exit() (or the interpreter stopped)",
            span,
            "os._exit() ends the process without any cleanup or message; raise an exception or call sys.exit() "
            "instead (memoplan reports those as MP504)",
        )
    return PlanError((diagnostic,), source)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _model_line(plan: Path | None, step: str):
    """The span of the plan's ``model`` (``example``) line when ``step`` was loading it, and the plan's text."""
    if plan is None or not step.startswith(("loading model ", "building example ")) or str(plan) == "-":
        return None, None
    from memoplan.syntax import parse_with_diagnostics, read_plan

    try:
        text = read_plan(plan)
        parsed, _ = parse_with_diagnostics(text, str(plan))
    except (PlanError, OSError, ValueError):
        return None, None
    if parsed is not None and parsed.model is not None and step == f"loading model {parsed.model.spec}":
        return parsed.model.span, text
    example = None if parsed is None else parsed.example
    if example is not None and step == f"building example {example.spec or 'inline'}":
        return example.span, text
    return None, None
