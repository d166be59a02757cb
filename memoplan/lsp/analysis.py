"""Editor stage: what ``memoplan check`` says about a document, and positions as editors count them.

``check`` reads a plan, reports every syntax and value diagnostic, and for a plan
without errors the notes and refusals of its plan-wide statements
(``memoplan.resolver.effects``); with a model it resolves the plan too, which the
language server does in a separate process (``memoplan.lsp.worker``).  Positions:
memoplan's spans count characters from 1 in the text the parser reads (a byte-order
mark dropped); the Language Server Protocol counts lines from 0 and columns in UTF-16
code units.  The functions here convert between the two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memoplan.diagnostics import Diagnostic, Span
from memoplan.syntax import ast, parse_with_diagnostics

BOM = "\ufeff"
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Checked:
    """A document as ``check`` sees it: the plan (None when it has errors) and every diagnostic."""

    plan: ast.Plan | None
    diagnostics: tuple[Diagnostic, ...]
    parsed: ast.Plan | None = None  # the plan even with value errors (None: a syntax error)

    @property
    def clean(self) -> bool:
        return self.plan is not None and not any(d.is_error for d in self.diagnostics)


def parse_text(text: str, file: str) -> Checked:
    """The syntax and value diagnostics of a document: the parser alone, no torch imported.

    For a plan with errors this is all ``check`` says; for a plan without, the statement
    checks (:func:`with_effects`) add theirs.
    """
    plan, diagnostics = parse_with_diagnostics(text, file)
    if plan is None or any(d.is_error for d in diagnostics):
        return Checked(None, tuple(diagnostics), plan)
    return Checked(plan, tuple(diagnostics), plan)


def with_effects(parsed: Checked) -> Checked:
    """``parsed`` with the refusals and notes of its plan-wide statements (imports torch)."""
    if not parsed.clean:
        return parsed  # a plan with errors is not given to the statement checks, as `check` does
    try:
        from memoplan.resolver.effects import statement_effects  # imports torch: only when needed
    except ModuleNotFoundError as exc:
        from memoplan.needs_torch import is_missing_torch

        if not is_missing_torch(exc):
            raise
        return parsed  # installed without torch: the syntax checks alone (the server said so once)

    assert parsed.plan is not None  # clean implies a plan
    effects = statement_effects(parsed.plan, checking=True)
    return Checked(parsed.plan, parsed.diagnostics + tuple(effects), parsed.parsed)


def check_text(text: str, file: str) -> Checked:
    """The diagnostics ``memoplan check FILE`` prints without a model, in source order.

    A plan with errors is not given to the statement checks, as ``check`` does not;
    a plan without errors gets the refusals and notes of its plan-wide statements
    (``resolver.effects``).
    """
    return with_effects(parse_text(text, file))


def lines_of(text: str) -> list[str]:
    """The lines of a document as editors number them (``\\n``, ``\\r\\n`` and ``\\r`` all end one)."""
    return _LINE_BREAK.split(text)


_CODECS = {"utf-8": ("utf-8", 1), "utf-16": ("utf-16-le", 2), "utf-32": ("utf-32-le", 4)}


def units(text: str, encoding: str = "utf-16") -> int:
    """The length of ``text`` in the editor's code units (UTF-16 unless the editor chose another)."""
    codec, width = _CODECS.get(str(encoding), _CODECS["utf-16"])
    return len(text.encode(codec, "surrogatepass")) // width


def to_units(line: str, column: int, encoding: str = "utf-16") -> int:
    """The column in code units of character ``column`` (0-based) of ``line``."""
    return units(line[:column], encoding)


def from_units(line: str, count: int, encoding: str = "utf-16") -> int:
    """The character column (0-based) at ``count`` code units into ``line`` (clamped to the line)."""
    seen = 0
    for index, char in enumerate(line):
        if seen >= count:
            return index
        seen += units(char, encoding)
    return len(line)


def span_range(
    span: Span | None, lines: list[str], encoding: str = "utf-16"
) -> tuple[tuple[int, int], tuple[int, int]]:
    """A span as ``((line, column), (line, column))``, 0-based, columns in code units, for the editor.

    A span past the end of the document (the end of the file) is clamped to it; a
    missing span is the start of the document.
    """
    if span is None or span.line < 1:
        return (0, 0), (0, 0)
    bom = 1 if lines and lines[0].startswith(BOM) else 0

    def point(line: int, column: int) -> tuple[int, int]:
        index = min(max(line - 1, 0), len(lines) - 1)
        text = lines[index]
        shift = bom if index == 0 else 0
        char = min(max(column - 1 + shift, 0), len(text))
        return index, to_units(text, char, encoding)

    start = point(span.line, span.column)
    end = point(span.end_line, span.end_column)
    return start, max(start, end)


def contains(span: Span, line: int, column: int) -> bool:
    """Whether 1-based ``(line, column)`` lies in ``span`` (its end included, where a cursor may stand)."""
    if (line, column) < (span.line, span.column):
        return False
    return (line, column) <= (span.end_line, span.end_column)
