"""The AST builder's selector rules: path segments (names, globs, `*`, `**`, indexes, slices),
class terms and the selector with its exclusions."""

from __future__ import annotations

from lark import v_args

from memoplan.syntax import ast
from memoplan.syntax.build_values import ValueRules
from memoplan.syntax.literals import number


class SelectorRules(ValueRules):
    """Grammar rules of a selector -> :class:`~memoplan.syntax.ast.Selector` and its parts."""

    def name_segment(self, children):
        token = children[0]
        text = self.string(token) if token.type == "STRING" else str(token)
        if token.type == "STRING" and text == "":
            self._empty_segments.append(self.span(token))  # the root when alone: `path` decides
        elif token.type == "STRING" and "." in text:
            self.error(
                "MP105",
                "a quoted path segment cannot contain `.`",
                self.span(token),
                "PyTorch module names never contain `.`; split the path into segments",
            )
        return ast.Name(text)

    def star_segment(self, children):
        return ast.DoubleStar() if children[0] == "**" else ast.Star()

    def glob_segment(self, children):
        token = children[0]
        if "**" in token:
            self.error(
                "MP211",
                f"`**` inside the segment `{token}`",
                self.span(token),
                "`**` (any number of segments) stands alone between dots, e.g. `layer*.**`; "
                "inside a segment `*` already matches any run of characters",
            )
        return ast.Glob(str(token))

    def first_segment(self, children):
        return children[0]

    def index(self, children):
        token = children[0]
        value = number(token)
        if not isinstance(value, int):
            self.error("MP202", "an index must be an integer", self.span(token), "e.g. `layers[0]` or `layers[-1]`")
            return ast.Index(0)
        return ast.Index(value)

    def slice(self, children):
        bounds: list[int | None] = []
        for token in children:
            value = None if token is None else number(token)
            if value is not None and not isinstance(value, int):
                self.error("MP202", "slice bounds must be integers", self.span(token), "e.g. `layers[0:24:2]`")
                value = None
            bounds.append(value)
        start, stop, step = (bounds + [None, None, None])[:3]
        if step == 0:
            self.error("MP203", "slice step cannot be zero", self.span(children[2]), "leave it out for a step of 1")
            step = None
        return ast.Slice(start, stop, step)

    def path(self, children):
        empty, self._empty_segments = self._empty_segments, []
        if len(children) > 1:  # `""` alone selects the root; inside a longer path it names nothing
            for span in empty:
                self.error(
                    "MP105",
                    "a quoted path segment cannot be empty inside a path",
                    span,
                    'PyTorch module names are never empty; `""` alone selects the model itself (the root)',
                )
        return ast.PathPattern(tuple(children))

    def qualname(self, children):
        return ".".join(str(c) for c in children)

    def path_term(self, children):
        path, class_name = children
        return ast.SelectorTerm(path=path, class_name=class_name)

    def class_term(self, children):
        return ast.SelectorTerm(class_name=children[0])

    @v_args(meta=True)
    def selector(self, meta, children):
        include, *exclude = children
        return ast.Selector(include, tuple(exclude), span=self.span(meta))
