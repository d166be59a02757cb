"""The parsed statements as one :class:`~memoplan.syntax.ast.Plan`: each statement kind at most
once (``MP208``), and the comments attached to the nodes they stand above or beside."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lark import Token

from memoplan.diagnostics import Diagnostic
from memoplan.syntax import ast


def assemble(items, comments: list[Token], file: str, text: str, diagnostics: list[Diagnostic]) -> ast.Plan:
    (_, version, header_span), *statements = items
    statements = [s for s in statements if s is not None]
    check_unique(statements, diagnostics)
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


def check_unique(statements, diagnostics: list[Diagnostic]) -> None:
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
