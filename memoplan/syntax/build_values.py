"""The base of the AST builder: spans, diagnostics, enum words, and the grammar's value rules
(numbers, sizes, percentages, durations, words, strings, lists), each checked as it is built."""

from __future__ import annotations

from lark import Token, Transformer

from memoplan.diagnostics import Diagnostic, Span, did_you_mean
from memoplan.syntax import ast
from memoplan.syntax.literals import MAX_SIZE_BYTES, bad_escape, is_finite, number, unit_parts, unquote


class ValueRules(Transformer):
    """The helpers every rule of :class:`~memoplan.syntax.build.Builder` uses, and the value rules."""

    def __init__(self, file: str):
        super().__init__(visit_tokens=False)
        self.file = file
        self.diagnostics: list[Diagnostic] = []
        self._empty_segments: list[Span] = []  # `""` segments, legal only alone (the root)

    # ------------------------------------------------------------ helpers

    def span(self, item) -> Span:
        """Span of a token or of a tree's meta."""
        return Span(self.file, item.line, item.column, item.end_line, item.end_column)

    def error(self, code, message, span, help=None, notes=()) -> None:
        self.diagnostics.append(Diagnostic(code, message, span, help, notes=notes))

    def enum_value(self, enum_cls, value, span: Span, what: str):
        """The member of ``enum_cls`` named by a word (a Word or a str), or None after an error."""
        words = [m.value for m in enum_cls]
        if not isinstance(value, (ast.Word, str)):
            self.error("MP202", f"{what} expects a word", span, "allowed: " + ", ".join(words))
            return None
        name = value.name if isinstance(value, ast.Word) else value
        for member in enum_cls:
            if member.value == name:
                return member
        self.error(
            "MP204",
            f"unknown value `{name}` for {what}",
            span,
            did_you_mean(str(name), words) or "allowed: " + ", ".join(words),
        )
        return None

    # ------------------------------------------------------------ values

    def string(self, token: Token) -> str:
        """The value of a STRING token; a bad escape is reported and the string kept as written."""
        offset = bad_escape(str(token))
        if offset is None:
            return unquote(token)
        assert token.line is not None and token.column is not None, "the parser keeps positions"
        column = token.column + offset
        self.error(
            "MP108",
            f"invalid escape `{token[offset : offset + 2]}` in a string",
            Span(self.file, token.line, column, token.line, column + 2),
            'escapes are those of JSON: \\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX',
        )
        return str(token)[1:-1]

    def finite(self, value, token: Token, scale: int = 1):
        """``value`` if ``value * scale`` is a finite number, else report it and return None.

        A None value is not checked again by whatever holds it: one error per mistake.
        """
        if is_finite(value * scale):
            return value
        self.error("MP203", f"`{token}` is out of range", self.span(token), "numbers must fit a 64-bit float")
        return None

    def number(self, children):
        return self.finite(number(children[0]), children[0])

    def size(self, children):
        """A size; wherever it stands, its byte count must fit in 64 bits (one rule for all)."""
        token = children[0]
        amount, symbol = unit_parts(str(token))
        unit = ast.Unit[symbol]
        value = number(amount)
        if not (is_finite(value * unit.factor) and abs(value * unit.factor) <= MAX_SIZE_BYTES):
            self.error(
                "MP203", f"`{token}` is out of range", self.span(token), "a size is at most 2**63 - 1 bytes (8 EiB)"
            )
            return None
        return ast.Size(value, unit)

    def percent(self, children):
        value = self.finite(number(str(children[0])[:-1]), children[0])
        return None if value is None else ast.Percent(value)

    def duration(self, children):
        amount, unit = unit_parts(str(children[0]))
        value = self.finite(number(amount), children[0])
        return None if value is None else ast.Duration(value, unit)

    def word(self, children):
        return ast.Word(str(children[0]))

    def text(self, children):
        return ast.Text(self.string(children[0]))

    def value_list(self, children):
        return ast.ValueList(tuple(c for c in children if c is not None))
