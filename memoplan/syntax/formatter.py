"""Syntax stage: prints an AST as canonical ``.memplan`` text.

The canonical form: the header, then each statement separated by one blank line
(consecutive one-line statements of the same kind stay together), blocks indented
by four spaces, one-policy rules without inner comments on one line, ``=`` aligned
inside config blocks, comments where they were.  ``format_plan(parse(x))`` is a
fixed point and parses back to an equal AST.
"""

from __future__ import annotations

import enum
import json
import re
from decimal import Decimal

from memoplan.syntax import ast
from memoplan.syntax.policies import spec_of

INDENT = "    "
# Words that are keywords somewhere in a selector; a path segment spelled like one is quoted.
_SELECTOR_KEYWORDS = {"class", "not"}
_BARE_NAME = re.compile(r"[^\W\d]\w*")
_BARE_INT = re.compile(r"\d+")
_SURROGATE = re.compile("[\ud800-\udfff]")


def format_plan(plan: ast.Plan) -> str:
    out: list[str] = []
    _leading(out, plan.header_comments, "")
    out.append(_with_trailing(f"memplan {plan.version}", plan.header_comments))
    previous = None
    for stmt in plan.statements:
        lines = _statement(stmt)
        if not (_one_line_group(previous, stmt, lines) and not stmt.comments.leading):
            out.append("")
        _leading(out, stmt.comments, "")
        out.extend(lines)
        previous = (stmt, len(lines))
    if plan.trailing:
        out.append("")
        out.extend(plan.trailing)
    return "\n".join(out) + "\n"


def _one_line_group(previous, stmt, lines) -> bool:
    if previous is None:
        return False
    prev_stmt, prev_len = previous
    return prev_len == 1 and len(lines) == 1 and _group(prev_stmt) == _group(stmt)


def _group(stmt) -> str:
    if isinstance(stmt, (ast.ModelStmt, ast.ExampleStmt)):
        return "source"
    return type(stmt).__name__


def _leading(out: list[str], comments: ast.Comments, indent: str) -> None:
    out.extend(indent + c for c in comments.leading)


def _with_trailing(text: str, comments: ast.Comments) -> str:
    return f"{text}  {comments.trailing}" if comments.trailing else text


def _statement(stmt) -> list[str]:
    if isinstance(stmt, ast.ModelStmt):
        return [_with_trailing(f"model {_quote(stmt.spec)}", stmt.comments)]
    if isinstance(stmt, ast.ExampleStmt):
        return [_with_trailing(f"example {format_example(stmt)}", stmt.comments)]
    if isinstance(stmt, ast.Budget):
        text = f"budget {format_value(stmt.amount)}"
        if stmt.mode is not None:
            text += f" {stmt.mode.value}"
        return [_with_trailing(text, stmt.comments)]
    if isinstance(stmt, ast.ModuleRule):
        head = f"module {format_selector(stmt.selector)}"
        return _block(head, [(format_policy(p), p.comments) for p in stmt.policies], stmt)
    if isinstance(stmt, ast.ConfigBlock):
        width = max((len(e.key) for e in stmt.entries), default=0)
        body = [(f"{e.key.ljust(width)} = {format_value(e.value)}", e.comments) for e in stmt.entries]
        return _block(stmt.kind.value, body, stmt, inline=False)
    raise TypeError(f"not a statement: {stmt!r}")


def _block(head: str, body: list[tuple[str, ast.Comments]], node, inline: bool = True) -> list[str]:
    simple = inline and len(body) == 1 and not node.closing and body[0][1] == ast.NO_COMMENTS
    if simple:
        return [_with_trailing(f"{head} {{ {body[0][0]} }}", node.comments)]
    if not body and not node.closing:
        return [_with_trailing(f"{head} {{ }}", node.comments)]
    lines = [_with_trailing(f"{head} {{", node.comments)]
    for text, comments in body:
        _leading(lines, comments, INDENT)
        lines.append(INDENT + _with_trailing(text, comments))
    lines.extend(INDENT + c for c in node.closing)
    lines.append("}")
    return lines


# ---------------------------------------------------------------- pieces (also used by explain/codegen)


def format_selector(selector: ast.Selector) -> str:
    text = _term(selector.include)
    for term in selector.exclude:
        text += f" not {_term(term)}"
    return text


def _term(term: ast.SelectorTerm) -> str:
    if term.path is None:
        return f"class {term.class_name}"
    text = format_path(term.path)
    if term.class_name is not None:
        text += f" : {term.class_name}"
    return text


def format_path(path: ast.PathPattern) -> str:
    parts: list[str] = []
    for segment in path.segments:
        if isinstance(segment, (ast.Slice, ast.Index)):
            parts.append(_bracket(segment))
            continue
        if isinstance(segment, ast.Star):
            text = "*"
        elif isinstance(segment, ast.DoubleStar):
            text = "**"
        elif isinstance(segment, ast.Glob):
            text = segment.pattern
        else:
            text = _segment_name(segment.text)
        parts.append(("." if parts else "") + text)
    return "".join(parts)


def _segment_name(name: str) -> str:
    bare = (_BARE_NAME.fullmatch(name) or _BARE_INT.fullmatch(name)) and name not in _SELECTOR_KEYWORDS
    return name if bare else _quote(name)


def _bracket(segment) -> str:
    if isinstance(segment, ast.Index):
        return f"[{segment.value}]"

    def bound(value):
        return "" if value is None else str(value)

    text = f"{bound(segment.start)}:{bound(segment.stop)}"
    if segment.step is not None:
        text += f":{segment.step}"
    return f"[{text}]"


def format_policy(policy) -> str:
    """One policy as written: its head, then its options in the order of its spec."""
    spec = spec_of(policy)
    return _with_options(_head(policy), [(o.key, _shown(o.key, getattr(policy, o.key))) for o in spec.options])


def _head(policy) -> str:
    if isinstance(policy, ast.Compress):
        return f"compress input = {policy.codec.value}" + (" lossy" if policy.lossy else "")
    if isinstance(policy, ast.TemporalChunk):
        return f"temporal_chunk {policy.chunks} dim {policy.dim}"
    if isinstance(policy, (ast.State, ast.Buffers)):
        return f"{spec_of(policy).name} = {policy.mode.value}"
    return spec_of(policy).name


def _shown(key: str, value):
    """An option's value as the formatter writes it (the list options hold names, not values)."""
    if value is None:
        return None
    if key == "split":
        return ast.ValueList(tuple(_child_value(n) for n in value))
    if key == "args":
        return ast.ValueList(tuple(_arg_value(a) for a in value))
    if key == "save":
        return ast.ValueList(tuple(ast.Word(n) for n in value))
    return value


def _child_value(name: str):
    return int(name) if _BARE_INT.fullmatch(name) and str(int(name)) == name else _arg_value(name)


def _arg_value(arg: int | str):
    if isinstance(arg, int):
        return arg
    return ast.Word(arg) if _BARE_NAME.fullmatch(arg) else ast.Text(arg)


def _with_options(head: str, options) -> str:
    parts = [head]
    for key, value in options:
        if value is None:
            continue
        if isinstance(value, bool):
            value = ast.Word("true" if value else "false")
        elif isinstance(value, enum.Enum):
            value = ast.Word(value.value)
        parts.append(f"{key} = {format_value(value)}")
    return " ".join(parts)


def format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, ast.Size):
        return f"{_amount(value.amount)} {value.unit.symbol}"
    if isinstance(value, ast.Percent):
        return f"{_amount(value.value)}%"
    if isinstance(value, ast.Duration):
        return f"{_amount(value.amount)} {value.unit}"
    if isinstance(value, ast.Word):
        return value.name
    if isinstance(value, ast.Text):
        return _quote(value.value)
    if isinstance(value, ast.ValueList):
        return "[" + ", ".join(format_value(v) for v in value.items) + "]"
    raise TypeError(f"not a value: {value!r}")


def _amount(amount: int | float) -> str:
    # Written without an exponent, every digit of the float kept, and a point so it stays a float.
    if isinstance(amount, int):
        return str(amount)
    text = format(Decimal(repr(amount)), "f")
    return text if "." in text else text + ".0"


def format_example(stmt: ast.ExampleStmt) -> str:
    if stmt.spec is not None:
        return _quote(stmt.spec)
    return ", ".join(_tensor(t) for t in stmt.tensors)


def _tensor(spec: ast.TensorSpec) -> str:
    args = [str(d) for d in spec.shape]
    if spec.low is not None:
        args.append(f"low={spec.low}")
    if spec.high is not None:
        args.append(f"high={spec.high}")
    if spec.dtype is not None:
        args.append(f"dtype={spec.dtype}")
    return f"{spec.fn.value}({', '.join(args)})"


def _quote(text: str) -> str:
    # Lone surrogates (from a "\ud800" escape) are escaped again, so the text stays valid UTF-8.
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(text, ensure_ascii=False))
