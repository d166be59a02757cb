"""Output targets (``-o PATH`` and ``memoplan.compile``'s ``output``): checked before any work.

A target is written only when it is absent or a regular file, its folder exists, and it is
none of the command's inputs (the plan, a profile, the model's file).  Anything else is
``MP508`` and the target is left alone: never replaced, never read (``/dev/null`` stays a
device, ``/dev/full`` is not read to compare it), no folder is created.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from memoplan.diagnostics import Diagnostic, PlanError


def check_target(path: Path | str, inputs: Iterable[Path | str | None] = ()) -> Path:
    """``path`` if it may be written; PlanError (MP508) saying why not otherwise."""
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        _refuse(path, exc.strerror or str(exc), "give -o the path of a file you can write")
    if info is not None and stat.S_ISDIR(info.st_mode):
        _refuse(path, "it is a directory", "give -o the path of a file")
    if info is not None and not stat.S_ISREG(info.st_mode):
        _refuse(
            path,
            "it is not a regular file (a device, a pipe or a socket): it is never replaced",
            "give -o the path of a regular file, or leave it absent",
        )
    parent = path.parent
    if not parent.is_dir():
        _refuse(
            path, f"the folder `{parent}` does not exist (it is not created)", f"create it first: mkdir -p {parent}"
        )
    for given in inputs:
        if given is not None and info is not None and _same_file(path, Path(given)):
            _refuse(
                path,
                f"it is an input of this command (`{given}`): an input is never a target",
                "write the output to another path",
            )
    return path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _refuse(path: Path, reason: str, help_: str) -> None:
    raise PlanError((Diagnostic("MP508", f"cannot write `{path}`: {reason}", help=help_),))


def check_output(path: Path, *inputs: Path | str | None) -> Path:
    """A command's ``-o PATH`` (:func:`check_target`) before any work; ``-`` is standard output."""
    if str(path) == "-":
        return path
    return check_target(path, [p for p in inputs if p is not None and str(p) != "-"])


def model_file(spec: str | None, base: Path | None = None) -> Path | None:
    """The file a ``path/file.py:factory`` spec names (an input no ``-o`` may overwrite), else None."""
    module = spec.rpartition(":")[0] if spec else ""
    if not module.endswith(".py"):
        return None
    return (base or Path(".")) / module


def plan_inputs(plan, path: Path, spec: str | None) -> tuple[Path | None, ...]:
    """A plan command's inputs: the plan's file and its model's file (``--model``, else its own)."""
    own = plan.model.spec if plan is not None and plan.model is not None else None
    return (path, model_file(spec) if spec else model_file(own, path.parent))


@contextlib.contextmanager
def writing(path: Path):
    """Writing ``path``: an OSError becomes MP508 instead of a traceback."""
    try:
        yield
    except OSError as exc:
        _refuse(path, exc.strerror or str(exc), "give -o the path of a file you can write")
