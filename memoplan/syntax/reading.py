"""Reading a plan: a regular UTF-8 file of at most :data:`MAX_PLAN_BYTES` (``MP107``,
``MP109``), and text that is a plan at all (no NUL byte, the ``memplan`` header first: ``MP104``)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from memoplan.diagnostics import Diagnostic, PlanError, Span
from memoplan.syntax.pieces import code_part


def read_plan(path: str | Path) -> str:
    """The text of a ``.memplan`` file, as ``load`` and the CLI both read it: UTF-8, else
    ``MP107`` with the line and column of the first bad byte (and a caret under it).

    Only a regular file is read (a folder, a device such as ``/dev/zero``, a pipe: ``MP107``,
    nothing read), and at most :data:`MAX_PLAN_BYTES` of it (a larger plan: ``MP109``).
    Line endings are left alone here; parsing reads ``\\n``, ``\\r\\n`` and ``\\r`` alike.

    A file that is not a plan (:func:`not_a_plan`: a NUL byte, or no ``memplan`` header
    before its first statement) is refused without its text: no diagnostic quotes a line of
    it, so a link to ``/proc/self/environ`` or to a credentials file prints none of them.
    """
    path = Path(path)
    try:
        data = _read_regular(path)
    except OSError as exc:
        raise PlanError((Diagnostic("MP107", f"cannot read plan `{path}`: {exc.strerror or exc}"),)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        lines = _LINE_BREAK.split(data[: exc.start])
        line, column = len(lines), len(lines[-1].decode("utf-8", "replace")) + 1
        span = Span(str(path), line, column, line, column + 1)
        message = f"plan `{path}` is not UTF-8 text: byte 0x{data[exc.start]:02x} ({exc.reason})"
        shown = "\n".join(part.decode("utf-8", "replace") for part in _LINE_BREAK.split(data))
        refused = not_a_plan(shown, str(path))
        if refused is not None:
            raise PlanError((refused,)) from None
        raise PlanError((Diagnostic("MP107", message, span, "save the file as UTF-8"),), shown) from None
    refused = not_a_plan(text, str(path))
    if refused is not None:
        raise PlanError((refused,))
    return text


def not_a_plan(text: str, name: str) -> Diagnostic | None:
    """Why ``text`` (the file or input ``name``) is not a plan, or None when it may be one.

    Not a plan: text holding a NUL byte (a binary file, ``/proc/self/environ``), or text whose
    first statement is not the ``memplan`` header (``MP104``, as the parser says it).  The
    diagnostic is raised without the text, so nothing of such a file is printed.
    """
    if "\0" in text:
        return Diagnostic(
            "MP107",
            f"`{name}` is not a plan: it holds NUL bytes (a binary file); none of it is shown",
            help="give the path of a .memplan file",
        )
    return missing_header(text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n"), name)


MAX_PLAN_BYTES = 128 * 1024  # the largest plan read or parsed (MP109): grammar/README.md, "Limits"


def _read_regular(path: Path) -> bytes:
    """The bytes of a regular file of at most MAX_PLAN_BYTES; PlanError (MP107, MP109) otherwise.

    Opened without blocking (a pipe would wait for a writer) and checked with ``fstat``
    before a byte is read, so a device or a folder is never read from."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (a device, a pipe or a socket)"
            raise PlanError(
                (
                    Diagnostic(
                        "MP107", f"cannot read plan `{path}`: it is {kind}", help="give the path of a .memplan file"
                    ),
                )
            )
        data = file.read(MAX_PLAN_BYTES + 1)  # a file may grow after fstat: never read more than the limit
    if max(info.st_size, len(data)) > MAX_PLAN_BYTES:
        raise PlanError((too_large(str(path), max(info.st_size, len(data)), "bytes"),))
    return data


def too_large(name: str, size: int, unit: str) -> Diagnostic:
    """MP109: a plan over :data:`MAX_PLAN_BYTES` (``size`` may be a lower bound: reading stopped there)."""
    return Diagnostic(
        "MP109",
        f"plan `{name}` is too large: {size:,} {unit}, over the limit of {MAX_PLAN_BYTES:,} bytes ({MAX_PLAN_BYTES >> 10} KiB)",
        help="split the plan, or write selectors with wildcards instead of one rule per module",
    )


_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def missing_header(text: str, file: str) -> Diagnostic | None:
    for number, line in enumerate(text.split("\n"), 1):
        code = code_part(line).strip(BLANK)
        if not code:
            continue
        if re.match(r"memplan(?!\w)", code):
            return None
        column = len(line) - len(line.lstrip(BLANK)) + 1
        word = (code.split() or [code])[0]
        return Diagnostic(
            "MP104",
            "a plan must start with its version header",
            Span(file, number, column, number, column + len(word)),
            "add `memplan 1` as the first line",
        )
    return Diagnostic("MP104", "the plan is empty", Span(file, 1, 1, 1, 1), "start with `memplan 1`")


BLANK = " \t\f;"  # what may stand before the header
