"""Editor stage: completion — the words the parser accepts where the cursor is, and the model's names.

Statements at the top of the file; policies at the start of a line in a rule; a
policy's options after it, without those already written; an option's words after
its ``=``; a config block's keys not yet set and their choices; budget modes; inline
example functions and their keywords.  After ``module`` (and after ``not``): the
model's module paths, spelt as a selector must spell them, and after ``:`` or
``class`` its class names, when the model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from memoplan.lsp import language
from memoplan.lsp.context import Context, context_at
from memoplan.lsp.reference import reference, row_markdown, section_markdown


@dataclass(frozen=True)
class Item:
    label: str
    kind: str  # "keyword" | "property" | "value" | "module" | "class" | "function"
    detail: str = ""
    documentation: str = ""
    insert: str | None = None  # text to insert instead of the label
    replace: int = 0  # characters before the cursor the item replaces (the word being typed)


def completions(text: str, offset: int, model: dict | None) -> list[Item]:
    """The completion items at character ``offset`` of ``text``; ``model``: the model process's
    last reply for this document (module paths and classes), or None."""
    ctx = context_at(text, offset)
    if ctx.in_comment or ctx.in_string:
        return []
    items = _items(ctx, text, model)
    prefix = ctx.prefix
    if ":" in prefix and ctx.block is None and ctx.statement == "module":  # `features.*:Co` -> class part
        prefix = prefix.rsplit(":", 1)[1]
    return [_with_replace(item, prefix) for item in items if item.label.startswith(prefix) or not prefix]


def _with_replace(item: Item, prefix: str) -> Item:
    return Item(item.label, item.kind, item.detail, item.documentation, item.insert, len(prefix))


def _items(ctx: Context, text: str, model: dict | None) -> list[Item]:
    words = ctx.words
    if ctx.block in language.BLOCK_NAMES:
        return _block_items(ctx)
    if ctx.block == "module":
        return _rule_items(ctx)
    if ctx.block is not None:
        return []
    if not words:
        has_header = any(line.strip().startswith("memplan") for line in text.split("\n"))
        names = language.STATEMENTS if has_header else ("memplan",) + language.STATEMENTS
        return [_keyword(name) for name in names]
    head = words[0]
    if head == "module":
        return _selector_items(ctx, model)
    if head == "budget" and len(words) >= 2:
        return [_keyword(mode, "budget mode") for mode in language.BUDGET_MODES]
    if head == "example":
        return _example_items(words)
    return []


def _keyword(name: str, detail: str = "keyword") -> Item:
    section = reference().section(name)
    return Item(name, "keyword", detail, section_markdown(section) if section else "")


def _block_items(ctx: Context) -> list[Item]:
    block, words = ctx.block, ctx.words
    assert block is not None  # called only inside a config block (see _items)
    if not words:
        given = {w[0] for w in ctx.block_words if w}
        return [
            Item(key, "property", f"{block} key", _row(block, key), insert=f"{key} = ")
            for key in language.block_keys(block)
            if key not in given
        ]
    if len(words) >= 2 and words[-1] == "=":
        return [Item(value, "value", f"{words[-2]} value") for value in language.key_values(block, words[-2])]
    return []


def _rule_items(ctx: Context) -> list[Item]:
    words = ctx.words
    if not words:
        given = {w[0] for w in ctx.block_words if w}
        return [_keyword(name, "policy") for name in language.POLICIES if name not in given]
    policy = words[0]
    if policy not in language.POLICY_CLASSES:
        return []
    if words[-1] == "=":
        key = words[-2] if len(words) >= 2 else ""
        if policy in language.POLICY_ASSIGNMENTS and len(words) == 2:
            return [Item(v, "value", f"{policy} mode") for v in language.option_values(policy, "=")]
        if policy == "compress" and key == "input":
            return [Item(codec, "value", "codec", _row("compress", codec)) for codec in language.CODECS]
        return [Item(v, "value", f"{key} value") for v in language.option_values(policy, key)]
    if policy == "compress" and len(words) == 1:
        return [Item("input", "keyword", "compress input = CODEC", insert="input = ")]
    if policy == "temporal_chunk" and len(words) == 2:
        return [Item("dim", "keyword", "temporal_chunk N dim D", insert="dim ")]
    if policy in language.POLICY_ASSIGNMENTS:
        return []
    if policy == "compress" and len(words) == 4 and words[3] in language.LOSSY_CODECS:
        extra = [Item("lossy", "keyword", "the codec is lossy (with `tolerance`)")]
    else:
        extra = []
    given = set(words)
    return extra + [
        Item(option, "property", f"{policy} option", _row(policy, option), insert=f"{option} = ")
        for option in language.policy_options(policy)
        if option not in given
    ]


def _selector_items(ctx: Context, model: dict | None) -> list[Item]:
    words = ctx.words
    last = words[-1]
    if last in (":", "class") or ":" in ctx.prefix:
        return [Item(name, "class", "class in the model") for name in (model or {}).get("classes", [])]
    if last not in ("module", "not"):
        return [Item("not", "keyword", "selector: leave out what the next term selects")]
    items = [Item("class", "keyword", "selector: every module of a class")]
    for path, cls in (model or {}).get("modules", []):
        items.append(Item(_spelt(path), "module", cls))
    return items


def _spelt(path: str) -> str:
    """A module path as a selector spells it (names that are not identifiers quoted)."""
    from memoplan.syntax import ast
    from memoplan.syntax.formatter import format_path

    return format_path(ast.PathPattern(tuple(ast.Name(part) for part in path.split("."))))


def _example_items(words: list[str]) -> list[Item]:
    inside = words.count("(") > words.count(")")
    if words[-1] == "=" and len(words) >= 2 and words[-2] == "dtype":
        return [Item(dtype, "value", "dtype") for dtype in language.DTYPES]
    if inside and words[-1] == ",":
        return [Item(key, "property", "tensor keyword", insert=f"{key}=") for key in language.TENSOR_KEYWORDS]
    if not inside and words[-1] in ("example", ","):
        return [Item(fn, "function", "inline example tensor", insert=f"{fn}(") for fn in language.TENSOR_FUNCTIONS]
    return []


def _row(owner: str, name: str) -> str:
    row = reference().row(owner, name)
    return "" if row is None else row_markdown(row, f"**`{name}`**")
