"""Editor stage: where the cursor is in a plan being typed — which block, which statement, which word.

A document being edited rarely parses, so this is a forgiving scan of the text before
the cursor, not the parser: strings and comments are skipped, braces open and close
blocks, and new lines and ``;`` end statements, as the grammar has it.  The result is
what completion and hover need: the enclosing block (a rule's braces or a config
block), the words of the current statement before the cursor, and the word being typed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# One token of the scan.  A path (`layer1.0`, `blocks.*`, `h[0:2]`) is one WORD so a
# selector reads as one thing; numbers with units are one token as in the grammar.
_TOKEN = re.compile(
    r"""
    (?P<string>"(?:[^"\\\n]|\\.)*"?)
  | (?P<comment>\#[^\n]*)
  | (?P<continuation>\\[ \t]*\n)
  | (?P<newline>\n)
  | (?P<open>\{)
  | (?P<close>\})
  | (?P<semi>;)
  | (?P<word>[\w*?.\[\]:+\-%]+)
  | (?P<equals>=)
  | (?P<other>\S)
  | (?P<space>[ \t\f\r]+)
    """,
    re.VERBOSE,
)

# What may stand in the word under the cursor: a path, a glob, a name, a number.
_WORD_CHARS = re.compile(r"[\w*?.\[\]:+\-]")


@dataclass
class Context:
    """The cursor's place in the plan."""

    block: str | None = None  # None at the top; "module" inside a rule's braces; else the config block's word
    words: list[str] = field(default_factory=list)  # the current statement's tokens before the word being typed
    prefix: str = ""  # the word being typed, up to the cursor
    in_comment: bool = False
    in_string: bool = False
    block_words: list[list[str]] = field(default_factory=list)  # earlier statements of the enclosing block
    rule_head: list[str] = field(default_factory=list)  # the `module SELECTOR` words of the enclosing rule

    @property
    def statement(self) -> str | None:
        return self.words[0] if self.words else None


def context_at(text: str, offset: int) -> Context:
    """The context of the cursor at ``offset`` (characters) in ``text``."""
    before = text[:offset]
    stack: list[tuple[str, list[str], list[list[str]]]] = []  # (block word, head words, earlier statements)
    statements: list[list[str]] = []
    words: list[str] = []
    ctx = Context()
    for match in _TOKEN.finditer(before):
        kind = match.lastgroup
        value = match.group()
        at_end = match.end() == len(before)
        if kind == "comment":
            if at_end:
                ctx.in_comment = True
            continue
        if kind == "string":
            closed = len(value) >= 2 and value.endswith('"') and not value.endswith('\\"')
            if at_end and not closed:
                ctx.in_string = True
            words.append(value)
            continue
        if kind in ("space", "continuation"):
            continue
        if kind in ("newline", "semi"):
            if words:
                statements.append(words)
            words = []
        elif kind == "open":
            head = words[0] if words else ""
            stack.append((head, words, statements))
            statements, words = [], []
        elif kind == "close":
            if stack:
                _, _, statements = stack.pop()
            words = []
        else:
            words.append(value)
    if words and _WORD_CHARS.match(before[-1:] or " ") and not ctx.in_string:
        ctx.prefix = words.pop()
    ctx.words = words
    if stack:
        head, head_words, _ = stack[-1]
        ctx.block = head or None
        ctx.rule_head = head_words if head == "module" else []
    ctx.block_words = statements
    return ctx


def word_at(line: str, column: int) -> tuple[int, int] | None:
    """The ``(start, end)`` columns (0-based, end exclusive) of the word at ``column``, or None.

    Words are names and keywords here (letters, digits, ``_``); a path is several.
    """
    if not line:
        return None
    start = column
    while start > 0 and (line[start - 1].isalnum() or line[start - 1] == "_"):
        start -= 1
    end = column
    while end < len(line) and (line[end].isalnum() or line[end] == "_"):
        end += 1
    return (start, end) if end > start else None
