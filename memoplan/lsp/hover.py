"""Editor stage: hover text — a key's meaning from the reference, a selector's modules from the model.

On a key or an option: its row of the reference table (``grammar/README.md``: type,
range, default, meaning).  On a statement or policy word: the heading and first
paragraph of its section.  On a codec: its row.  On a selector: its specificity, and
with the model loaded the modules it selects (how many, their classes, the first few
paths) and, for each, which rule decides each aspect and why, as ``memoplan explain``
says it.
"""

from __future__ import annotations

from dataclasses import dataclass

from memoplan.lsp import language
from memoplan.lsp.analysis import contains
from memoplan.lsp.context import context_at, word_at
from memoplan.lsp.reference import reference, row_markdown, section_markdown
from memoplan.syntax import ast
from memoplan.syntax.specificity import specificity

# Words with no section of their own, and the reference rows that say what they are.
_ROWS_OF_WORDS = {
    "memplan": ("", "header"),
    "module": ("", "module rule"),
    "class": ("", "class only"),
    "not": ("", "exclusion"),
}
# Words that belong to a policy's section.
_SECTION_OF_WORDS = {"input": "compress", "lossy": "compress", "dim": "temporal_chunk"}


@dataclass(frozen=True)
class Hover:
    markdown: str
    line: int  # 0-based
    start: int  # character columns, 0-based, end exclusive
    end: int


def hover_at(
    text: str, line: int, column: int, plan: ast.Plan | None, model: dict | None, model_state: str
) -> Hover | None:
    """The hover at 0-based ``line`` and character ``column`` of ``text`` (lines split as editors do).

    ``plan`` is the document's plan when it parses; ``model`` the model process's reply
    for this very text (or None), ``model_state`` a sentence for when there is none.
    """
    lines = text.split("\n")
    if not 0 <= line < len(lines):
        return None
    found = word_at(lines[line], column)
    if plan is not None:
        rule = _rule_at(plan, line + 1, column + 1)
        if rule is not None:
            return Hover(_selector_markdown(rule, model, model_state), line, *_selector_columns(rule, line))
    if found is None:
        return None
    start, end = found
    word = lines[line][start:end]
    offset = sum(len(t) + 1 for t in lines[:line]) + start
    ctx = context_at(text, offset)
    if ctx.in_comment or ctx.in_string:
        return None
    after = lines[line][end:].lstrip()
    markdown = _word_markdown(word, ctx, after.startswith("=") and not after.startswith("=="))
    return None if markdown is None else Hover(markdown, line, start, end)


def _word_markdown(word: str, ctx, is_key: bool) -> str | None:
    ref = reference()
    words = ctx.words
    if ctx.block in language.BLOCK_NAMES:
        if is_key and not words:
            return _key_markdown(ctx.block, word)
        if len(words) >= 2 and words[-1] == "=":
            return _key_markdown(ctx.block, words[-2])
        return None
    if ctx.block == "module":
        policy = words[0] if words else word
        if not words and word in language.POLICIES:
            section = ref.section(word)
            return None if section is None else section_markdown(section)
        if is_key and word in language.policy_options(policy):
            row = ref.row(policy, word)
            title = f"**`{word}`** — option of `{policy}`"
            if row is not None:
                return row_markdown(row, title)
            section = ref.section(policy)
            return title + (f"\n\n{section_markdown(section)}" if section else "")
        if policy == "compress" and words[-2:] == ["input", "="] and word in language.CODECS:
            row = ref.row("compress", word)
            return None if row is None else row_markdown(row, f"**`{word}`** — codec")
        if len(words) >= 2 and words[-1] == "=" and words[-2] in language.policy_options(policy):
            row = ref.row(policy, words[-2])
            return None if row is None else row_markdown(row, f"**`{words[-2]}`** — option of `{policy}`")
        if word in _SECTION_OF_WORDS and words and words[0] == _SECTION_OF_WORDS[word]:
            owned = ref.section(_SECTION_OF_WORDS[word])
            return None if owned is None else section_markdown(owned)
        return None
    # top level: statement words
    if words and not (words[0] == "module" and word in ("class", "not")):
        if words[0] == "budget" and word in language.BUDGET_MODES:
            section = ref.section("budget")
            return None if section is None else section_markdown(section)
        return None
    if word in _ROWS_OF_WORDS:
        owner, name = _ROWS_OF_WORDS[word]
        row = ref.row(owner, name)
        return None if row is None else row_markdown(row, f"**`{word}`** — {name}")
    section = ref.section(word)
    if section is not None and word in language.STATEMENTS:
        return section_markdown(section)
    return None


def _key_markdown(block: str, key: str) -> str | None:
    if key not in language.block_keys(block):
        return None
    row = reference().row(block, key)
    title = f"**`{key}`** — key of the `{block}` block"
    return title if row is None else row_markdown(row, title)


def _rule_at(plan: ast.Plan, line: int, column: int) -> ast.ModuleRule | None:
    for rule in plan.rules:
        span = rule.selector.span
        if span.line and contains(span, line, column):
            return rule
    return None


def _selector_columns(rule: ast.ModuleRule, line: int) -> tuple[int, int]:
    span = rule.selector.span
    start = span.column - 1 if span.line == line + 1 else 0
    end = span.end_column - 1 if span.end_line == line + 1 else start
    return start, max(start, end)


def _selector_markdown(rule: ast.ModuleRule, model: dict | None, model_state: str) -> str:
    from memoplan.syntax.formatter import format_selector

    head = f"**`module {format_selector(rule.selector)}`** (line {rule.span.line})"
    head += f"\n\nspecificity {specificity(rule.selector)}: literal, index, glob, `*`, class filter"
    found = None if model is None else next((r for r in model.get("rules", ()) if r["line"] == rule.span.line), None)
    if found is None:
        return f"{head}\n\n{model_state}"
    count = found["count"]
    classes = ", ".join(f"`{name}` ×{n}" for name, n in found["classes"])
    parts = [head, f"selects **{count}** module{'s' if count != 1 else ''}" + (f": {classes}" if classes else "")]
    wins = []
    lines = []
    for module in found["shown"]:
        won = [aspect for aspect, _, this in module["wins"] if this]
        wins.append(bool(won))
        decided = "; ".join(f"`{what}` — {why}" for what, why in module["why"]) or "no rule decides anything"
        lines.append(f"- `{module['path']}` (`{module['class']}`): {decided}")
    if lines:
        parts.append("\n".join(lines))
    if count > len(found["shown"]):
        parts.append(f"… and {count - len(found['shown'])} more (`memoplan explain` lists every module)")
    if found["shown"] and not any(wins):
        parts.append("this rule decides nothing for the modules shown: more specific rules win")
    return "\n\n".join(parts)
