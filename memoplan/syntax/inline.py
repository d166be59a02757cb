"""Build the AST while Lark parses: no parse tree, no second pass over it.

Lark's own inline transformer cannot pass positions (``v_args(meta=True)``) to its
callbacks, and its position propagation only follows trees.  :func:`install` replaces the
callbacks of a Lark LALR parser (built with ``propagate_positions=True``) with ones that
call a :class:`~lark.Transformer`'s methods as each rule is reduced, computing the
positions exactly as Lark's ``PropagatePositions`` would on the tree (the start of the
first child's container, the end of the last one's, anonymous tokens such as ``}``
included), so spans are those of ``transformer.transform(parser.parse(text))``.

A reduction is a post-order visit, so methods run in the order the transformer would run
them; a parse that fails part way has run some: the caller discards what they recorded.
"""

from __future__ import annotations

from lark import Lark, Token, Tree
from lark.parse_tree_builder import PropagatePositions


class Meta:
    """The positions of a node (what Lark's ``Tree.meta`` holds, the fields memoplan reads)."""

    __slots__ = (
        "empty", "line", "column", "end_line", "end_column",
        "container_line", "container_column", "container_end_line", "container_end_column",
    )  # fmt: skip

    def __init__(self, extent: tuple | None) -> None:
        self.empty = extent is None
        if extent is not None:
            self.line, self.column, self.end_line, self.end_column = extent
            self.container_line, self.container_column, self.container_end_line, self.container_end_column = extent


class Node:
    """A transformer method's result with the positions of the rule it was built from."""

    __slots__ = ("value", "meta")

    def __init__(self, value, meta: Meta) -> None:
        self.value = value
        self.meta = meta


def _extent(children: list):
    """(line, column, end line, end column) of a node's container, or None if it has no position:
    from the first and last child that has one (a token, or a node that is not empty)."""
    for child in children:
        if child is None:
            continue
        if child.__class__ is Token:
            line, column = child.line, child.column
            break
        meta = child.meta
        if not meta.empty:
            line, column = meta.container_line, meta.container_column
            break
    else:
        return None
    for i in range(len(children) - 1, -1, -1):
        child = children[i]
        if child is None:
            continue
        if child.__class__ is Token:
            return line, column, child.end_line, child.end_column
        meta = child.meta
        if not meta.empty:
            return line, column, meta.container_end_line, meta.container_end_column
    return None  # not reached: the first loop found a child with a position


def _callback(inner, name: str, method, with_meta: bool):
    """The callback of one rule: ``inner`` (Lark's child filter) gives the kept children."""
    inlined = name.startswith("_") and method is None

    def reduce(children):
        kept = inner(children)
        if kept.__class__ is not list:  # a `?rule` with one child: that child, its container widened
            if len(children) > 1 and kept is not None and kept.__class__ is not Token:  # one child: its own extent
                extent = _extent(children)
                if extent is not None:
                    meta = kept.meta
                    meta.container_line, meta.container_column, meta.container_end_line, meta.container_end_column = (
                        extent
                    )
            return kept
        meta = Meta(_extent(children))
        if inlined:  # `_rule`: its parent takes its children as they are (no copy: `a: a _x` stays linear)
            return Tree(name, kept, meta)  # type: ignore[arg-type]  # a lighter Meta, the fields memoplan reads
        values = [item.value if item.__class__ is Node else item for item in kept]
        if method is None:
            return Tree(name, values, meta)  # type: ignore[arg-type]  # a lighter Meta, the fields memoplan reads
        return Node(method(meta, values) if with_meta else method(values), meta)

    return reduce


def _kept(children):
    return children


def install(parser: Lark, transformer) -> None:
    """Make ``parser.parse`` return a :class:`Node` whose value is ``transformer``'s result."""
    callbacks = {}
    for rule, chain in parser._parse_tree_builder.rule_builders:
        inner = _kept
        for wrapper in chain:
            if wrapper is not PropagatePositions:
                inner = wrapper(inner)
        name = rule.alias or rule.options.template_source or rule.origin.name
        method = getattr(transformer, name, None)
        with_meta = getattr(method, "visit_wrapper", None) is not None  # v_args(meta=True)
        if method is not None and with_meta:
            method = method.base_func  # already bound to the transformer
        callbacks[rule] = _callback(inner, name, method, with_meta)
    parser._callbacks.update(callbacks)
