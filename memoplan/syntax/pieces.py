"""Syntax stage: a plan's text cut into pieces of whole top-level statements, for error recovery.

``memoplan.syntax.parser`` parses a plan with a syntax error piece by piece
(``_errors_by_statement``); this module only finds where statements begin and end, from
braces, strings, comments and line continuations, without the parser.
"""

from __future__ import annotations

import re
from array import array


def code_part(line: str) -> str:
    """The line without its comment (a `#` outside a string)."""
    in_string = escaped = False
    for i, ch in enumerate(line):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "#":
            return line[:i]
    return line


def brace_depth(line: str) -> int:
    code = re.sub(r'"([^"\\]|\\.)*"', "", code_part(line))
    return code.count("{") - code.count("}")


STATEMENT_CHUNK = 1_024  # characters: whole statements are grouped up to this before a piece ends
_CODE_LINE = re.compile(r"^[ \t\f;]*[^ \t\f;#\n]", re.M)  # a line with code (not blank, `;` or a comment)
_SPECIAL_LINE = re.compile(r'^[^\n{}"#\\]*[{}"#\\][^\n]*', re.M)  # a line with a brace, quote, `#` or `\\`


def statement_pieces(text: str, chunk: int | None = None) -> tuple[array, array, int]:
    """The text cut into pieces of whole top-level statements: ``(first lines, start offsets, end)``.

    A statement runs over the lines up to where its braces close (the first piece runs to the
    header line), a line ending in ``\\`` joined to the next.  A piece ends at the end of the
    first statement that makes it ``chunk`` (:data:`STATEMENT_CHUNK`) characters or more, so a
    plan of a million one-line statements is a thousand pieces (``chunk=1``: one a statement).
    Each piece starts where the one before ends; the last ends at ``end``.  Only lines with a
    brace, a quote, a comment or a backslash are looked at one by one: the lines between them
    change no depth, and their ends are found with ``str.find``."""
    header = _CODE_LINE.search(text)
    cut = _Cuts(text, text.find("\n", header.start()) if header else len(text), chunk or STATEMENT_CHUNK)
    position = 0
    for special in _SPECIAL_LINE.finditer(text):
        cut.plain(position, special.start())
        line = special.group()
        code = code_part(line)
        cut.depth = max(0, cut.depth + brace_depth(line))
        joined = code.rstrip(" \t").endswith("\\") and special.end() < len(text)
        cut.line_end(special.end(), joined)
        position = special.end() + 1
    cut.plain(position, len(text) + 1)
    if cut.begin < len(text):
        cut.firsts.append(cut.begin_line)
        cut.starts.append(cut.begin)
    return cut.firsts, cut.starts, len(text)


class _Cuts:
    """Where :func:`statement_pieces` cuts: the pieces so far, where the current one begins, the brace depth."""

    def __init__(self, text: str, header_end: int, chunk: int) -> None:
        self.text, self.header_end, self.chunk = text, header_end, chunk
        self.firsts, self.starts = array("q"), array("q")
        self.begin, self.begin_line, self.depth = 0, 1, 0
        self.lines_before = 0  # line breaks before ``self.counted``
        self.counted = 0

    def line_end(self, end: int, joined: bool = False) -> None:
        """The line ending at offset ``end`` (its ``\\n``, or the end of the text) ends a statement unless
        it is inside a block, before the header's end or joined to the next; cut there if the piece is large."""
        if self.depth > 0 or joined or end < self.header_end or end + 1 - self.begin < self.chunk:
            return
        self._cut(min(end + 1, len(self.text)))

    def plain(self, start: int, stop: int) -> None:
        """The lines from offset ``start`` up to ``stop`` (the start of the next line looked at, or past
        the end): none opens, closes or joins anything, so each ends a statement outside a block."""
        if self.depth > 0 or start >= stop:
            return
        while True:
            after = max(self.begin + self.chunk - 1, start, self.header_end)
            end = self.text.find("\n", after, stop)
            if end < 0:
                if stop > len(self.text) and len(self.text) >= after:  # the last line, without a line break
                    self.line_end(len(self.text))
                return
            self._cut(end + 1)

    def _cut(self, offset: int) -> None:
        if offset <= self.begin:
            return  # the empty line after the last line break: no piece
        self.firsts.append(self.begin_line)
        self.starts.append(self.begin)
        self.lines_before += self.text.count("\n", self.counted, offset)
        self.counted = offset
        self.begin, self.begin_line = offset, self.lines_before + 1
