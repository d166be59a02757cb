"""A syntax error as a coded diagnostic (``MP100``-``MP106``): what Lark expected, in the
language's words; an unknown policy, statement or unit with a did-you-mean; an unclosed block."""

from __future__ import annotations

import re
from functools import cache

from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternRE, PatternStr

from memoplan.diagnostics import Diagnostic, Span, did_you_mean
from memoplan.syntax.build import POLICY_NAMES, STATEMENT_NAMES
from memoplan.syntax.lalr import lark_parser
from memoplan.syntax.literals import unit_help
from memoplan.syntax.pieces import code_part

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


@cache
def _terminal_words() -> dict[str, str]:
    parser, _, _ = lark_parser()
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


def is_end(error: UnexpectedInput) -> bool:
    return isinstance(error, UnexpectedToken) and error.token.type == "$END"


def error_line(error: UnexpectedInput, text: str) -> int:
    return text.count("\n") + 1 if is_end(error) else error.line


def diagnose(error: UnexpectedInput, text: str, file: str, shift: int = 0) -> Diagnostic:
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
        opened = unclosed_block(text)
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
    inside = open_before_statement(error, text)
    if inside:
        opened, column, word = inside
        return Diagnostic(
            "MP106",
            f"the block opened on line {opened + shift} is not closed before this `{word}`",
            Span(file, error.line, column, error.line, column + len(word)),
            "add `}` before this line",
            notes=(("opened", Span(file, opened, 1, opened, 1)),),
        )
    known = _misplaced_word(value, token.type, span, expected_words)
    if known is not None:
        return known
    return Diagnostic("MP100", f"unexpected {shown}", span, _expected_help(expected, words))


def _misplaced_word(value: str, kind: str, span: Span, expected_words: set[str]) -> Diagnostic | None:
    """A policy where a statement goes (``MP101``), an unknown policy, statement (``MP102``,
    ``MP101``) or unit (``MP100``), each with the words it may have meant; None for other tokens."""
    policies = {f"`{p}`" for p in POLICY_NAMES}
    statements = {f"`{s}`" for s in STATEMENT_NAMES}
    if value in POLICY_NAMES and kind != "NAME" and statements & expected_words:
        return Diagnostic(
            "MP101",
            f"`{value}` is a policy, not a statement",
            span,
            f"policies go inside a rule, e.g. `module fc {{ {value} }}`",
        )
    if kind == "NAME":
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
    return None


def _expected_help(expected: list[str], words: dict[str, str]) -> str | None:
    names = sorted({words.get(name, name) for name in expected if name not in ("SEMICOLON",)})
    if not names:
        return None
    if len(names) > 8:
        names = names[:8] + ["..."]
    return "expected " + ", ".join(names)


def open_before_statement(error: UnexpectedInput, text: str) -> tuple[int, int, str] | None:
    """``(block line, column, keyword)`` if the error's line starts a statement inside an unclosed block."""
    if not isinstance(error, UnexpectedToken) or is_end(error):
        return None
    lines = text.split("\n")
    line = lines[error.line - 1]
    word = re.match(r"[ \t\f;]*(\w*)", line)
    assert word is not None, "every part of the pattern matches the empty string"
    if word.group(1) not in STATEMENT_NAMES:
        return None
    opened = unclosed_block("\n".join(lines[: error.line - 1]))
    return None if opened is None else (opened, word.start(1) + 1, word.group(1))


def unclosed_block(text: str) -> int | None:
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
