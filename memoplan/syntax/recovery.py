"""Error recovery: every error of a plan with a syntax error, in time linear in its length.

After each error the offending line (or the whole block a bad line opens) is blanked out and
the text parsed again (:func:`parse_tree_locked`), so later errors are found too, without
cascades; a long plan is cut into its top-level statements (:func:`errors_by_statement`) so an
error costs a parse of its own statement, not of the whole plan.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import replace
from typing import overload

from lark.exceptions import UnexpectedInput

from memoplan.diagnostics import Diagnostic, Span
from memoplan.syntax import inline
from memoplan.syntax.assemble import check_unique
from memoplan.syntax.errors import diagnose, error_line, is_end, open_before_statement, unclosed_block
from memoplan.syntax.lalr import lark_parser
from memoplan.syntax.pieces import brace_depth, code_part, statement_pieces
from memoplan.syntax.reading import BLANK

MAX_ERRORS = 50


RECOVERY_BATCH = 8_192  # characters of whole statements parsed together while looking for errors
RECOVERY_SLACK = 65_536  # characters recovery may parse beyond the plan's length


class _Work:
    """What recovery may still parse, in characters: the plan's length plus :data:`RECOVERY_SLACK`.

    Each parse of a piece of text (and the line scans of its elision) costs its length.  The
    statements of a plan are parsed about once, so this is reached only by many errors deep
    inside one huge statement (each of which re-parses that statement): recovery then stops
    looking for more errors, as it does after :data:`MAX_ERRORS`, and the errors found so far
    are reported.  It bounds the time and memory of any plan under the size limit."""

    def __init__(self, text: str) -> None:
        self.left = len(text) + RECOVERY_SLACK
        self.parsed = 0  # characters parsed in all (what tests read)

    def spend(self, characters: int) -> None:
        self.left -= characters
        self.parsed += characters


class _Found:
    """What recovery has found so far: the diagnostics, each statement with its line shift, the syntax errors."""

    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []
        self.statements: list[tuple[object, int]] = []
        self.syntax_errors = 0

    def add(self, built, errors: list[Diagnostic], values: list[Diagnostic], found: list, shift: int) -> None:
        self.syntax_errors += sum(d.code.startswith("MP1") for d in errors)
        if built is not None:  # no syntax error here: its values are still checked
            _, *found = built
            errors = errors + values
        self.diagnostics.extend(_shifted(d, shift) for d in errors)


def errors_by_statement(
    text: str, file: str, work: _Work | None = None, first: list[Diagnostic] | None = None
) -> list[Diagnostic]:
    """Every error of a plan that has a syntax error, in time linear in its length.

    The text is cut into pieces of whole top-level statements of about 1 KiB
    (:func:`memoplan.syntax.pieces.statement_pieces`); runs of pieces up to
    :data:`RECOVERY_BATCH` characters are parsed together behind a `memplan 1` header.  A run
    with a syntax error is parsed again up to the piece of the error, and that piece statement
    by statement (:func:`_recover_piece`), each with the recovery of :func:`parse_tree_locked`:
    an error costs a parse of its own statement and of a few runs, not of the whole plan, and a
    plan of many small statements is not one parse per statement.  Each statement's values are
    checked as before; positions are those of the whole text; a statement given twice across
    statements is found
    at the end (``MP208``).  ``work`` bounds what is parsed in all (:class:`_Work`); ``first``:
    the error a parse of the whole text found, reported if the bound stops recovery before it.
    """
    work = work or _Work(text)
    found = _Found()
    firsts, starts, end = statement_pieces(text)
    count = len(firsts)

    def chunk(k: int) -> tuple[int, str]:
        return firsts[k], text[starts[k] : starts[k + 1] if k + 1 < count else end]

    # Piece `bad` holds the plan's line `bad_line` where a parse (of the whole plan, at first) failed.
    bad_line = first[0].span.line if first and first[0].span is not None else 0
    i, bad = 0, max(0, bisect.bisect_right(firsts, bad_line) - 1) if bad_line else count
    while i < count and found.syntax_errors < MAX_ERRORS and work.left > 0:
        if i == bad:  # the error's piece: statement by statement, without parsing it first
            _recover_piece(*chunk(i), file, found, work, bad_line)
            i, bad, bad_line = i + 1, count, 0
            continue
        j = i + 1
        while j < min(bad, count) and (starts[j + 1] if j + 1 < count else end) - starts[i] <= RECOVERY_BATCH:
            j += 1
        error_line = _parse_run(firsts[i], text[starts[i] : starts[j] if j < count else end], file, found, work)
        if error_line is None:
            i = j
            continue
        bad_line, bad = error_line, max(i, min(bisect.bisect_right(firsts, error_line, i, j) - 1, j - 1))
    check_unique([_shifted_statement(stmt, shift) for stmt, shift in found.statements], found.diagnostics)
    if not found.syntax_errors and first:  # the bound ran out before the first error's statement
        found.diagnostics[:0] = first
    return found.diagnostics


def _behind_header(first: int, chunk: str) -> tuple[str, int]:
    """A piece of the plan as parsed on its own (behind a `memplan 1` line unless it holds the header),
    and the lines before it in the plan."""
    return (chunk, 0) if first == 1 else ("memplan 1\n" + chunk, first - 2)


def _parse_run(first: int, run: str, file: str, found: _Found, work: _Work) -> int | None:
    """Parse whole statements together without recovery (``first``: the plan's line where they start):
    None when they parse (their statements and values are kept), else the plan's line of the
    syntax error (found again statement by statement)."""
    source, shift = _behind_header(first, run)
    work.spend(len(source))
    statements: list = []
    built, _, errors, values = parse_tree_locked(source, file, "start", False, statements, shift)
    if built is None:
        spans = [d.span.line for d in errors if d.span is not None]
        return (spans[0] if spans else 1) + shift
    found.add(built, errors, values, statements, shift)
    return None


def _recover_piece(first: int, piece: str, file: str, found: _Found, work: _Work, error_line: int) -> None:
    """A piece with a syntax error on the plan's line ``error_line``, statement by statement: the
    statements before the error's as one run, the error's on its own (with recovery), then the
    rest of the piece again as a run, and so on; so an error costs a parse of its own statement
    and of at most two runs, and the statements around it are checked as if it were not there."""
    firsts, starts, end = statement_pieces(piece, chunk=1)

    def text(k: int, stop: int) -> str:
        return piece[starts[k] : starts[stop] if stop < len(firsts) else end]

    k = 0
    while k < len(firsts) and found.syntax_errors < MAX_ERRORS and work.left > 0:
        if error_line == 0:
            error_line = _parse_run(first + firsts[k] - 1, text(k, len(firsts)), file, found, work) or -1
        if error_line < 0:
            return  # the rest of the piece parses
        bad = max(k, bisect.bisect_right(firsts, error_line - first + 1) - 1)
        if bad > k and _parse_run(first + firsts[k] - 1, text(k, bad), file, found, work) is not None:
            bad = k  # not the statement of the run's error after all: this one on its own
        _parse_statement((first + firsts[bad] - 1, text(bad, bad + 1)), file, found, work)
        k, error_line = bad + 1, 0


def _parse_statement(chunk: tuple[int, str], file: str, found: _Found, work: _Work) -> None:
    source, shift = _behind_header(*chunk)
    statements: list = []
    built, _, errors, values = parse_tree_locked(source, file, "start", True, statements, shift, budget=work)
    found.add(built, errors, values, statements, shift)


def _shifted(diagnostic: Diagnostic, lines: int) -> Diagnostic:
    if not lines:
        return diagnostic
    notes = tuple((label, _shift_span(span, lines)) for label, span in diagnostic.notes)
    return replace(diagnostic, span=_shift_span(diagnostic.span, lines), notes=notes)


@overload
def _shift_span(span: Span, lines: int) -> Span: ...
@overload
def _shift_span(span: None, lines: int) -> None: ...
@overload
def _shift_span(span: Span | None, lines: int) -> Span | None: ...
def _shift_span(span: Span | None, lines: int) -> Span | None:
    return None if span is None else replace(span, line=span.line + lines, end_line=span.end_line + lines)


def _shifted_statement(stmt, lines: int):
    return stmt if not lines else replace(stmt, span=_shift_span(stmt.span, lines))


def parse_tree_locked(
    text: str,
    file: str,
    start: str,
    recover: bool,
    statements: list | None = None,
    shift: int = 0,
    budget: _Work | None = None,
):
    """Parse; after a syntax error blank out its line (or block) and go on, reporting each line once.

    ``statements``: a list that gets the statements of the text (errors elided) instead of
    their ``MP208`` check, which the caller makes (:func:`errors_by_statement`).  ``budget``:
    what recovery may still parse (each parse spends the text's length); when another parse
    would spend more than is left, the errors found so far are returned.

    Returns ``(built items or None, comments, diagnostics, value diagnostics of the built items)``."""
    parser, sink, builder = lark_parser()
    diagnostics: list[Diagnostic] = []
    reported: set[int] = set()
    work = text
    for _ in range(MAX_ERRORS):
        if budget is not None:
            if budget.left < len(work) and diagnostics:  # another parse would overspend: stop here
                return None, [], diagnostics, []
            budget.spend(len(work))
        sink.tokens = []
        builder.file, builder.diagnostics = file, []  # a failed parse's value errors are dropped
        try:
            node = parser.parse(work, start=start)
        except UnexpectedInput as error:
            line = error_line(error, work)
            again = line in reported
            if not again:  # a second error on a line already reported is a cascade: not shown
                diagnostics.append(diagnose(error, work, file, shift))
                reported.add(line)
            work_next = _elide(work, error, again) if recover else None
            if work_next is None or work_next == work:
                return None, [], diagnostics, []
            work = work_next
            continue
        built = node.value if type(node) is inline.Node else node
        if diagnostics:
            # The build of an elided text is only used to find more errors.
            sink.tokens = []
            return _build_only_for_errors(built, builder.diagnostics, diagnostics, statements)
        return built, list(sink.tokens), diagnostics, builder.diagnostics
    return None, [], diagnostics, []


def _build_only_for_errors(built, values: list[Diagnostic], diagnostics, collect: list | None = None):
    _, *statements = built
    diagnostics.extend(values)
    if collect is not None:
        collect.extend(statements)
    else:
        check_unique([s for s in statements if s is not None], diagnostics)
    return None, [], diagnostics, []


def _elide(text: str, error: UnexpectedInput, again: bool = False) -> str | None:
    """Blank out the line of an error (or the block it opens), keeping positions of the rest.

    ``again``: the line was blanked before except for its closing braces; now blank it all.
    """
    lines = text.split("\n")
    if is_end(error):
        opened = unclosed_block(text)
        if opened is None:
            return None
        start = sum(len(line) + 1 for line in lines[: opened - 1])
        return text[:start] + _NOT_A_BREAK.sub(" ", text[start:])  # the block to the end, blanked
    index = error.line - 1
    if not 0 <= index < len(lines):
        return None
    inside = open_before_statement(error, text)
    if inside and not again:
        opened = inside[0]
        # A statement inside an unclosed block: drop the block, keep the statement.
        for i in range(opened - 1, error.line - 1):
            lines[i] = " " * len(lines[i])
        return "\n".join(lines)
    header = next((i for i, line in enumerate(lines) if code_part(line).strip(BLANK)), -1)
    if index == header:
        if again:
            return None
        lines[index] = "memplan 1".ljust(len(lines[index]))
        return "\n".join(lines)
    depth = brace_depth(lines[index])
    if again:
        lines[index] = " " * len(lines[index])
        return "\n".join(lines)
    if depth < 0:
        # Keep the braces that close an enclosing block; a line of braces only goes entirely.
        code = code_part(lines[index])
        only_braces = not code.replace("}", "").strip()
        lines[index] = " " * len(lines[index]) if only_braces else re.sub(r"[^}]", " ", code).ljust(len(lines[index]))
        return "\n".join(lines)
    last = index
    while depth > 0 and last + 1 < len(lines):
        last += 1
        depth += brace_depth(lines[last])
    if depth > 0:
        return None
    for i in range(index, last + 1):
        lines[i] = " " * len(lines[i])
    return "\n".join(lines)


_NOT_A_BREAK = re.compile(r"[^\n]")
