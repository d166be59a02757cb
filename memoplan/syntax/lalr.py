"""The one Lark parser of the language (LALR, contextual lexer), its comment sink and the
:class:`~memoplan.syntax.build.Builder` it runs as it parses: built once, shared under :data:`LOCK`."""

from __future__ import annotations

import threading
from functools import cache

from lark import Lark, Token

from memoplan._resources import grammar_text
from memoplan.syntax import inline
from memoplan.syntax.build import Builder

# The grammar's Lark options (a test builds a tree-making parser of the same grammar with them).
OPTIONS = {
    "parser": "lalr",
    "lexer": "contextual",
    "start": ["start", "example_stmt"],
    "propagate_positions": True,
    "maybe_placeholders": True,
}


class _Comments:
    """Collects comment tokens through a Lark lexer callback."""

    def __init__(self) -> None:
        self.tokens: list[Token] = []

    def __call__(self, token: Token) -> Token:
        self.tokens.append(token)
        return token


@cache
def lark_parser() -> tuple[Lark, _Comments, Builder]:
    """The parser, its comment sink and the Builder it runs as it parses (all shared: :data:`LOCK`)."""
    sink = _Comments()
    parser = Lark(grammar_text(), **OPTIONS, lexer_callbacks={"COMMENT": sink})
    builder = Builder("<memory>")
    inline.install(parser, builder)  # the AST is built during the parse: no parse tree
    return parser, sink, builder


LOCK = threading.Lock()  # the parser and its comment sink are shared
