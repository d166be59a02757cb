"""Diagnostics shared by every stage: spans, coded messages and their rendering.

A diagnostic has a stable code, the file, line and column, a caret under the span and
help text.  Codes are grouped by what they are about (``MP1xx`` the text's grammar,
``MP2xx`` values, plan-wide statements and the ``memonger`` block, ``MP3xx`` the plan against
a model, ``MP4xx`` installing and running a plan, ``MP5xx`` specs, the command line, the
report and the editor, ``MP6xx`` the planner); ``memoplan.rules`` lists every code once, with
its group and the stage that raises it (``memoplan rule CODE`` prints one).  Bad input never surfaces as a Python traceback: callers raise
:class:`PlanError` carrying every diagnostic found, and the CLI prints them.
"""

from __future__ import annotations

import argparse
import enum
import functools
import math
import re
import unicodedata
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Span:
    """A region of a source file; lines and columns are 1-based, ``end_column`` exclusive."""

    file: str
    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class Severity(enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"  # not a problem: where a statement acts, when it cannot act here


@dataclass(frozen=True)
class Diagnostic:
    code: str
    message: str
    span: Span | None = None
    help: str | None = None
    severity: Severity = Severity.ERROR
    # Secondary locations, e.g. the other rule of a conflict: (label, span).
    notes: tuple[tuple[str, Span], ...] = ()

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def render(self, source: str | None = None) -> str:
        """Render as ``file:line:col: error[MP101]: message`` plus source line and caret.

        Messages, help and notes name modules of the user's model: they are passed
        through :func:`printable`, so no name can move the cursor or recolour a terminal.
        """
        head = f"{self.severity.value}[{self.code}]: {_printable_lines(self.message)}"
        lines = [f"{printable(str(self.span))}: {head}" if self.span else head]
        if self.span is not None and source is not None:
            lines.extend(_excerpt(source, self.span))
        for label, span in self.notes:
            lines.append(f"  note: {printable(label)} at {printable(str(span))}")
            if source is not None and self.span is not None and span.file == self.span.file:
                lines.extend(_excerpt(source, span))
        if self.help:
            lines.append(f"  help: {_printable_lines(self.help)}")
        return "\n".join(lines)


def _excerpt(source: str, span: Span) -> list[str]:
    """The span's source line and a caret under the span.

    Lines end in ``\\n``, ``\\r\\n`` or ``\\r``, as the parser reads them.  The line is shown
    through :func:`printable` (a comment may hold an escape sequence or a bidi override)
    with the caret under the escaped text, and a line longer than :data:`EXCERPT_WIDTH`
    is clipped to a window around the caret, marked with ``...``.
    """
    lines = _source_lines(source)
    if not 1 <= span.line <= len(lines):
        return []
    text = lines[span.line - 1]
    if span.line == 1:
        text = text.removeprefix("\ufeff")  # the parser drops a byte-order mark too
    start = max(0, span.column - 1)
    end = span.end_column - 1 if span.end_line == span.line else len(text)
    lo, hi = 0, len(text)
    if hi > EXCERPT_WIDTH:
        lo = max(0, min(start - EXCERPT_WIDTH // 4, hi - EXCERPT_WIDTH))
        hi = lo + EXCERPT_WIDTH
    before = ("..." if lo else "") + _shown(text[lo:start])
    marked = _shown(text[start : max(start, min(end, hi))])
    after = _shown(text[max(start, min(end, hi)) : hi]) + ("..." if hi < len(text) else "")
    gutter = str(span.line)
    return [
        f"  {gutter} | {before}{marked}{after}",
        f"  {' ' * len(gutter)} | {' ' * len(before)}{'^' * max(1, len(marked))}",
    ]


EXCERPT_WIDTH = 160  # characters of one source line shown under a diagnostic

_LINE_BREAKS = re.compile(r"\r\n|\r|\n")


@functools.lru_cache(maxsize=4)
def _source_lines(source: str) -> list[str]:
    """``source`` split into lines as the parser counts them (cached: one plan, many diagnostics)."""
    return _LINE_BREAKS.split(source)


def _shown(text: str) -> str:
    """Part of a source line as an excerpt shows it: a tab is one space, the rest :func:`printable`."""
    return printable(text.replace("\t", " "))


@dataclass
class PlanError(Exception):
    """Raised with every diagnostic of one input; ``str()`` renders them all."""

    diagnostics: tuple[Diagnostic, ...]
    source: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        super().__init__(self.render())

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.is_error)

    @property
    def codes(self) -> list[str]:
        return [d.code for d in self.diagnostics]

    def render(self) -> str:
        return "\n".join(d.render(self.source) for d in self.diagnostics)

    def __str__(self) -> str:
        return self.render()


class MemoplanWarning(UserWarning):
    """A plan's warning shown through Python's :mod:`warnings` (``memoplan.apply``, a planned forward).

    ``diagnostic`` is the :class:`Diagnostic` it renders (``code`` its code).  Filter them like any
    warning: ``warnings.filterwarnings("ignore", category=memoplan.MemoplanWarning)``, or one
    code with ``message=r".*\\[MP322\\]"`` (the text starts with the plan's ``file:line:column``).
    """

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.render())
        self.diagnostic = diagnostic

    @property
    def code(self) -> str:
        return self.diagnostic.code


def warn(message: Warning | str, category: type[Warning] = UserWarning) -> None:
    """Issue a warning at the user's line: the innermost caller that is not memoplan, a plan
    module it generated, torch, the standard library or an installed package (a
    ``trainer.train()`` line, not ``torch/nn/modules/module.py``).  Where every caller is
    library code, the innermost one outside memoplan, torch and the standard library."""
    import sys
    import warnings

    frame = _user_frame(sys._getframe(1))
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    if isinstance(message, Warning):
        category = type(message)
    module_globals = frame.f_globals
    warnings.warn_explicit(
        message,
        category,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=module_globals.get("__name__", "<unknown>"),
        registry=module_globals.setdefault("__warningregistry__", {}),
        module_globals=module_globals,
    )


def _user_frame(frame):
    fallback = None
    while frame is not None:
        if not _ours_or_torch(frame):
            fallback = fallback or frame
            if not frame.f_code.co_filename.startswith(_library_folders()):
                return frame
        frame = frame.f_back
    return fallback


def _ours_or_torch(frame) -> bool:
    name = frame.f_globals.get("__name__") or ""
    top = name.split(".", 1)[0]
    generated = "RUNTIME_ABI" in frame.f_globals and "PLAN_ID" in frame.f_globals  # memoplan write-module's module
    stdlib = frame.f_code.co_filename.startswith(("<", *_library_folders(stdlib_only=True)))
    return top in ("memoplan", "torch") or name.startswith("memoplan_generated_") or generated or stdlib


@functools.cache
def _library_folders(stdlib_only: bool = False) -> tuple[str, ...]:
    import os
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    found = [paths["stdlib"], paths["platstdlib"]]
    if not stdlib_only:
        found += [paths["purelib"], paths["platlib"], *getattr(site, "getsitepackages", list)()]
        found.append(site.getusersitepackages() if site.ENABLE_USER_SITE else "")
    both = [form(p) for p in found if p for form in (os.path.abspath, os.path.realpath)]
    return tuple(dict.fromkeys(os.path.join(p, "") for p in both))


# Bidirectional overrides and isolates: they reorder the text that follows them on screen.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(text: str) -> str:
    """``text`` safe to print to a terminal: control characters (C0, DEL, C1), line and
    paragraph separators, lone surrogates and bidirectional overrides become Python-style escapes (``\\x1b``,
    ``\\udc80``); everything else, other scripts included, is kept as it is.

    Module names come from the user's model and may hold any character; every place
    that prints one (diagnostics, ``explain``, ``verify``) goes through here.
    """
    if text.isprintable() and not _BIDI.intersection(text):
        return text  # the common case: nothing to escape
    return "".join(_escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if not (unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp") or ch in _BIDI):
        return ch
    if code < 0x100:
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\x{code:02x}")
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _printable_lines(text: str) -> str:
    """:func:`printable`, line by line: a message's own line breaks stay."""
    return "\n".join(printable(line) for line in text.split("\n"))


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest insertions, deletions and substitutions from ``a`` to ``b``."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def closest(word: str, candidates, *, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The ``n`` candidates nearest ``word``: those similar enough (difflib's ratio at least
    ``cutoff``), fewest edits first, then in the order given (``featurs.0``: ``features.0``,
    ``features.1``, ``features.2``)."""
    import difflib

    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(word)
    similar = []
    for order, candidate in enumerate(dict.fromkeys(candidates)):
        matcher.set_seq1(candidate)
        if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff and matcher.ratio() >= cutoff:
            similar.append((edit_distance(word, candidate), order, candidate))
    return [candidate for _, _, candidate in sorted(similar)[:n]]


def did_you_mean(word: str, candidates, *, n: int = 3, cutoff: float = 0.6) -> str | None:
    """Return a 'did you mean ...?' help string for the closest candidates, or None."""
    ordered = sorted(candidates) if isinstance(candidates, (set, frozenset)) else candidates  # a set has no order
    matches = closest(word, ordered, n=n, cutoff=cutoff)
    if not matches:
        return None
    quoted = ", ".join(f"`{m}`" for m in matches)
    return f"did you mean {quoted}?"


def nonnegative_float(text: str) -> float:
    """A float option's value (an ``argparse`` type): a finite number, at least 0; ``nan``, ``inf``
    and ``-1`` are usage errors that show the value as :func:`printable` does."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: `{printable(text)}`") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number, at least 0, got `{printable(text)}`")
    return value
