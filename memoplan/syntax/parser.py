"""Syntax stage: ``.memplan`` text -> AST, with every error of a file reported in one run.

Parsing never runs user code.  Syntax errors are mapped to coded diagnostics
(``MP1xx``).  A text with one is cut into its top-level statements, each parsed on
its own; after each error the offending line (or the whole block a bad line opens)
is blanked out and that statement parsed again, so later errors are found too,
without cascades and in time linear in the text.  Value errors (``MP2xx``) come from
``build``.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import os
import re
import stat
import threading
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any, overload

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternRE, PatternStr

from memoplan._resources import grammar_text
from memoplan.diagnostics import Diagnostic, PlanError, Span, did_you_mean
from memoplan.syntax import ast, inline
from memoplan.syntax.build import POLICY_NAMES, STATEMENT_NAMES, Builder, unit_help
from memoplan.syntax.pieces import brace_depth, code_part, statement_pieces

MAX_ERRORS = 50

_TERMINAL_WORDS = {
    "NAME": "a name",
    "INT": "an integer",
    "NUMBER": "a number",
    "STRING": "a quoted string",
    "SIZE": "a size such as `4 GiB`",
    "PERCENT": "a percentage such as `50%`",
    "DURATION": "a duration such as `10 ms`",
    "_NL": "the end of the line",
    "$END": "the end of the file",
    "STAR": "`*`",
    "DOUBLESTAR": "`**`",
}
UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB")


class _Comments:
    """Collects comment tokens through a Lark lexer callback."""

    def __init__(self) -> None:
        self.tokens: list[Token] = []

    def __call__(self, token: Token) -> Token:
        self.tokens.append(token)
        return token


@cache
def _lark() -> tuple[Lark, _Comments, Builder]:
    """The parser, its comment sink and the Builder it runs as it parses (all shared: :data:`_LOCK`)."""
    sink = _Comments()
    parser = Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        start=["start", "example_stmt"],
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"COMMENT": sink},
    )
    builder = Builder("<memory>")
    inline.install(parser, builder)  # the AST is built during the parse: no parse tree
    return parser, sink, builder


@cache
def _terminal_words() -> dict[str, str]:
    parser, _, _ = _lark()
    words = dict(_TERMINAL_WORDS)
    for terminal in parser.terminals:
        if isinstance(terminal.pattern, PatternStr):
            words.setdefault(terminal.name, f"`{terminal.pattern.value}`")
        elif isinstance(terminal.pattern, PatternRE):
            keyword = _KEYWORD_RE.fullmatch(terminal.pattern.value)
            if keyword:
                words.setdefault(terminal.name, f"`{keyword.group(1)}`")
    return words


_KEYWORD_RE = re.compile(r"(\w+)\(\?!\\w\)")  # a keyword terminal: /word(?!\w)/


# ---------------------------------------------------------------- public API


def parse(text: str, file: str = "<memory>") -> ast.Plan:
    """Parse plan text; raise :class:`PlanError` with every diagnostic if anything is wrong.

    Warnings alone do not raise; they are available from :func:`parse_with_diagnostics`.
    """
    plan, diagnostics = parse_with_diagnostics(text, file)
    if plan is None or any(d.is_error for d in diagnostics):
        raise PlanError(tuple(diagnostics), text)
    return plan


def load(path: str | Path) -> ast.Plan:
    """Read and parse a ``.memplan`` file (UTF-8, a byte-order mark allowed)."""
    return parse(read_plan(path), str(path))


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
    return _missing_header(text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n"), name)


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


def parse_with_diagnostics(text: str, file: str = "<memory>") -> tuple[ast.Plan | None, list[Diagnostic]]:
    """Parse plan text and return ``(plan or None, diagnostics)`` without raising.

    Lines may end in ``\\n``, ``\\r\\n`` or ``\\r`` (each is one line break, as Python's
    text files read them); the plan's ``source`` has ``\\n`` only.  Text longer than
    :data:`MAX_PLAN_BYTES` characters is ``MP109`` and not parsed.
    """
    with _gc_paused():
        return _parse_with_diagnostics(text, file)


@contextlib.contextmanager
def _gc_paused():
    """The cyclic garbage collector off while a plan is parsed.

    A parse allocates a few objects per character and frees none of them until it ends: the
    collector's passes over them found nothing and took half the time of a large plan
    (``benchmarks/parse_speed.py``).  Reference counting still frees everything; the
    collector runs again as soon as the parse returns.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _parse_with_diagnostics(text: str, file: str) -> tuple[ast.Plan | None, list[Diagnostic]]:
    if len(text) > MAX_PLAN_BYTES:
        return None, [too_large(file, len(text), "characters")]
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    missing = _missing_header(text, file)
    if missing:
        return None, [missing]
    items, comments, diagnostics = _parse_tree(text, file, "start")
    if items is None:
        return None, _in_order(diagnostics)
    plan = _assemble(items, comments, file, text, diagnostics)
    return plan, _in_order(diagnostics)


def _in_order(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return sorted(diagnostics, key=lambda d: (d.span.line, d.span.column) if d.span else (0, 0))


def parse_example_spec(text: str, file: str = "<example>") -> ast.ExampleStmt:
    """Parse an inline example such as ``randn(4, 3, 32, 32)`` or an import spec in quotes.

    A bare ``pkg.mod:factory`` or ``path.py:factory`` (no parentheses) is taken as an import spec.
    """
    stripped = text.strip()
    if ":" in stripped and "(" not in stripped and not stripped.startswith('"'):
        return ast.ExampleStmt(spec=stripped)
    source = f"example {stripped}"
    stmt, _, diagnostics = _parse_tree(source, file, "example_stmt", recover=False)
    if stmt is None or any(d.is_error for d in diagnostics):
        raise PlanError(tuple(diagnostics), source)
    return stmt


# ---------------------------------------------------------------- parsing with recovery


def _missing_header(text: str, file: str) -> Diagnostic | None:
    for number, line in enumerate(text.split("\n"), 1):
        code = code_part(line).strip(_BLANK)
        if not code:
            continue
        if re.match(r"memplan(?!\w)", code):
            return None
        column = len(line) - len(line.lstrip(_BLANK)) + 1
        word = (code.split() or [code])[0]
        return Diagnostic(
            "MP104",
            "a plan must start with its version header",
            Span(file, number, column, number, column + len(word)),
            "add `memplan 1` as the first line",
        )
    return Diagnostic("MP104", "the plan is empty", Span(file, 1, 1, 1, 1), "start with `memplan 1`")


_BLANK = " \t\f;"  # what may stand before the header


_LOCK = threading.Lock()  # the parser and its comment sink are shared


def _parse_tree(text: str, file: str, start: str, recover: bool = True):
    """``(built items or None, comments, diagnostics)``: the syntax errors, or the value errors of the build."""
    with _LOCK:
        if start != "start" or not recover:
            built, comments, diagnostics, values = _parse_tree_locked(text, file, start, recover)
            return built, comments, diagnostics + values
        built, comments, diagnostics, values = _parse_tree_locked(text, file, start, False)
        if built is None:  # a syntax error: find every error statement by statement
            return None, [], _errors_by_statement(text, file, first=diagnostics)
        return built, comments, diagnostics + values


# ---------------------------------------------------------------- recovery, one statement at a time

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
        self.statements.extend((stmt, shift) for stmt in found if stmt is not None)


def _errors_by_statement(
    text: str, file: str, work: _Work | None = None, first: list[Diagnostic] | None = None
) -> list[Diagnostic]:
    """Every error of a plan that has a syntax error, in time linear in its length.

    The text is cut into pieces of whole top-level statements of about 1 KiB
    (:func:`memoplan.syntax.pieces.statement_pieces`); runs of pieces up to
    :data:`RECOVERY_BATCH` characters are parsed together behind a `memplan 1` header.  A run
    with a syntax error is parsed again up to the piece of the error, and that piece statement
    by statement (:func:`_recover_piece`), each with the recovery of :func:`_parse_tree_locked`:
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
    _check_unique([_shifted_statement(stmt, shift) for stmt, shift in found.statements], found.diagnostics)
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
    built, _, errors, values = _parse_tree_locked(source, file, "start", False, statements, shift)
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
    built, _, errors, values = _parse_tree_locked(source, file, "start", True, statements, shift, budget=work)
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


def _parse_tree_locked(
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
    their ``MP208`` check, which the caller makes (:func:`_errors_by_statement`).  ``budget``:
    what recovery may still parse (each parse spends the text's length); when another parse
    would spend more than is left, the errors found so far are returned.

    Returns ``(built items or None, comments, diagnostics, value diagnostics of the built items)``."""
    parser, sink, builder = _lark()
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
            line = _error_line(error, work)
            again = line in reported
            if not again:  # a second error on a line already reported is a cascade: not shown
                diagnostics.append(_diagnose(error, work, file, shift))
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
        _check_unique([s for s in statements if s is not None], diagnostics)
    return None, [], diagnostics, []


def _is_end(error: UnexpectedInput) -> bool:
    return isinstance(error, UnexpectedToken) and error.token.type == "$END"


def _error_line(error: UnexpectedInput, text: str) -> int:
    return text.count("\n") + 1 if _is_end(error) else error.line


def _elide(text: str, error: UnexpectedInput, again: bool = False) -> str | None:
    """Blank out the line of an error (or the block it opens), keeping positions of the rest.

    ``again``: the line was blanked before except for its closing braces; now blank it all.
    """
    lines = text.split("\n")
    if _is_end(error):
        opened = _unclosed_block(text)
        if opened is None:
            return None
        start = sum(len(line) + 1 for line in lines[: opened - 1])
        return text[:start] + _NOT_A_BREAK.sub(" ", text[start:])  # the block to the end, blanked
    index = error.line - 1
    if not 0 <= index < len(lines):
        return None
    inside = _open_before_statement(error, text)
    if inside and not again:
        opened = inside[0]
        # A statement inside an unclosed block: drop the block, keep the statement.
        for i in range(opened - 1, error.line - 1):
            lines[i] = " " * len(lines[i])
        return "\n".join(lines)
    header = next((i for i, line in enumerate(lines) if code_part(line).strip(_BLANK)), -1)
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


def _diagnose(error: UnexpectedInput, text: str, file: str, shift: int = 0) -> Diagnostic:
    """The diagnostic of a syntax error; ``shift``: lines before ``text`` in the file (messages name file lines)."""
    words = _terminal_words()
    if isinstance(error, UnexpectedCharacters):
        pos = error.pos_in_stream
        char = text[pos] if pos is not None and pos < len(text) else ""
        span = Span(file, error.line, error.column, error.line, error.column + 1)
        help_ = _expected_help(sorted(error.allowed or ()), words)
        if char == "'":
            help_ = 'strings use double quotes: "..."'
        return Diagnostic("MP100", f"unexpected character `{char}`", span, help_)
    assert isinstance(error, UnexpectedToken)
    token = error.token
    expected = sorted(error.accepts or error.expected)
    if token.type == "$END":
        line = text.count("\n") + 1
        span = Span(file, line, 1, line, 1)
        opened = _unclosed_block(text)
        if opened:
            return Diagnostic(
                "MP106",
                f"the block opened on line {opened + shift} is not closed",
                span,
                "add `}`",
                notes=(("opened", Span(file, opened, 1, opened, 1)),),
            )
        return Diagnostic("MP106", "unexpected end of file", span, _expected_help(expected, words))
    span = Span(file, token.line, token.column, token.end_line or token.line, token.end_column or token.column + 1)
    shown = "end of line" if token.type == "_NL" else f"`{token}`"
    expected_words = {words.get(name, name) for name in expected}
    value = str(token)
    inside = _open_before_statement(error, text)
    if inside:
        opened, column, word = inside
        return Diagnostic(
            "MP106",
            f"the block opened on line {opened + shift} is not closed before this `{word}`",
            Span(file, error.line, column, error.line, column + len(word)),
            "add `}` before this line",
            notes=(("opened", Span(file, opened, 1, opened, 1)),),
        )
    policies = {f"`{p}`" for p in POLICY_NAMES}
    statements = {f"`{s}`" for s in STATEMENT_NAMES}
    if value in POLICY_NAMES and token.type != "NAME" and statements & expected_words:
        return Diagnostic(
            "MP101",
            f"`{value}` is a policy, not a statement",
            span,
            f"policies go inside a rule, e.g. `module fc {{ {value} }}`",
        )
    if token.type == "NAME":
        if policies & expected_words:
            return Diagnostic(
                "MP102",
                f"unknown policy `{value}`",
                span,
                did_you_mean(value, POLICY_NAMES) or "policies: " + ", ".join(POLICY_NAMES),
            )
        if statements & expected_words:
            return Diagnostic(
                "MP101",
                f"unknown statement `{value}`",
                span,
                did_you_mean(value, STATEMENT_NAMES) or "statements: " + ", ".join(STATEMENT_NAMES),
            )
        unit = next((u for u in UNITS if u.lower() == value.lower()), None)
        if unit:
            return Diagnostic("MP100", f"unknown unit `{value}`", span, unit_help(value, unit))
    return Diagnostic("MP100", f"unexpected {shown}", span, _expected_help(expected, words))


def _expected_help(expected: list[str], words: dict[str, str]) -> str | None:
    names = sorted({words.get(name, name) for name in expected if name not in ("SEMICOLON",)})
    if not names:
        return None
    if len(names) > 8:
        names = names[:8] + ["..."]
    return "expected " + ", ".join(names)


def _open_before_statement(error: UnexpectedInput, text: str) -> tuple[int, int, str] | None:
    """``(block line, column, keyword)`` if the error's line starts a statement inside an unclosed block."""
    if not isinstance(error, UnexpectedToken) or _is_end(error):
        return None
    lines = text.split("\n")
    line = lines[error.line - 1]
    word = re.match(r"[ \t\f;]*(\w*)", line)
    assert word is not None, "every part of the pattern matches the empty string"
    if word.group(1) not in STATEMENT_NAMES:
        return None
    opened = _unclosed_block("\n".join(lines[: error.line - 1]))
    return None if opened is None else (opened, word.start(1) + 1, word.group(1))


def _unclosed_block(text: str) -> int | None:
    stack: list[int] = []
    for number, line in enumerate(text.split("\n"), 1):
        if "{" not in line and "}" not in line:
            continue  # most lines: nothing to open or close
        code = re.sub(r'"([^"\\]|\\.)*"', "", code_part(line))
        for ch in code:
            if ch == "{":
                stack.append(number)
            elif ch == "}" and stack:
                stack.pop()
    return stack[-1] if stack else None


# ---------------------------------------------------------------- plan assembly and comments


def _assemble(items, comments: list[Token], file: str, text: str, diagnostics: list[Diagnostic]) -> ast.Plan:
    (_, version, header_span), *statements = items
    statements = [s for s in statements if s is not None]
    _check_unique(statements, diagnostics)
    pending = sorted(comments, key=lambda t: (t.line, t.column))
    header_leading = [_text(c) for c in pending if c.line < header_span.line]
    header_trailing = [_text(c) for c in pending if c.line == header_span.line]
    pending = [c for c in pending if c.line > header_span.line]
    attached, rest = _attach(statements, pending)
    return ast.Plan(
        version=version,
        statements=tuple(attached),
        header_comments=ast.Comments(tuple(header_leading), header_trailing[0] if header_trailing else None),
        trailing=tuple(_text(c) for c in rest),
        file=file,
        source=text,
    )


def _check_unique(statements, diagnostics: list[Diagnostic]) -> None:
    first: dict[object, Any] = {}  # the first statement of each kind
    for stmt in statements:
        if isinstance(stmt, ast.ModuleRule):
            continue
        key = stmt.kind if isinstance(stmt, ast.ConfigBlock) else type(stmt)
        if key in first:
            names: dict[object, str] = {ast.ModelStmt: "model", ast.ExampleStmt: "example", ast.Budget: "budget"}
            name = names[key] if key in names else getattr(key, "value", "")
            diagnostics.append(
                Diagnostic(
                    "MP208",
                    f"`{name}` is given twice",
                    stmt.span,
                    "a plan has at most one of each; merge them",
                    notes=(("first given", first[key].span),),
                )
            )
        else:
            first[key] = stmt


def _text(token: Token) -> str:
    return str(token).rstrip()


def _attach(nodes, comments: list[Token]):
    """Attach comments to a sequence of nodes: lines above -> leading, same line -> trailing."""
    out = []
    i = 0
    for node in nodes:
        leading = []
        while i < len(comments) and comments[i].line < node.span.line:
            leading.append(_text(comments[i]))
            i += 1
        inner = []
        while i < len(comments) and comments[i].line <= node.span.end_line:
            inner.append(comments[i])
            i += 1
        trailing = [c for c in inner if c.line == node.span.line]
        inside = [c for c in inner if c.line != node.span.line]
        changes = {}
        if isinstance(node, (ast.ModuleRule, ast.ConfigBlock)):
            field_name = "policies" if isinstance(node, ast.ModuleRule) else "entries"
            children, closing = (
                _attach(getattr(node, field_name), inside) if inside else (getattr(node, field_name), ())
            )
            if inside:
                changes = {field_name: tuple(children), "closing": tuple(_text(c) for c in closing)}
        else:
            trailing += inside
        text = " ".join(_text(c) for c in trailing) or None
        if leading or text or changes:  # else the node is as built (no comments): not copied
            node = replace(node, comments=ast.Comments(tuple(leading), text), **changes)
        out.append(node)
    return out, comments[i:]
