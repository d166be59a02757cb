"""What the editor offers and shows agrees with the parser and with grammar/README.md.

Completion lists each policy's options from the AST's fields and each block's keys from the
schema; here they are compared with what the parser accepts, and every word offered is parsed.
Hover reads grammar/README.md's tables: every key, option, codec, policy and statement has its
row or section there.
"""

from __future__ import annotations

import re

import pytest

from memoplan.lsp import language
from memoplan.lsp.context import context_at
from memoplan.lsp.hover import hover_at
from memoplan.lsp.reference import parse_reference, reference
from memoplan.syntax import parse_with_diagnostics
from memoplan.syntax.blocks import SCHEMA

HEADS = {"checkpoint": "checkpoint", "compress": "compress input = bit", "temporal_chunk": "temporal_chunk 2 dim 0"}


def _parser_options() -> dict[str, set[str]]:
    """The options each policy's builder accepts, as its MP201 for an unknown option lists them."""
    found = {}
    for policy, head in HEADS.items():
        _, diagnostics = parse_with_diagnostics(f"memplan 1\nmodule a {{ {head} qqqq = 1 }}\n")
        (error,) = [d for d in diagnostics if d.code == "MP201"]
        found[policy] = set(re.findall(r"\w+", error.help.partition("takes:")[2]))
    return found


def test_completion_offers_exactly_the_options_the_parser_accepts() -> None:
    accepted = _parser_options()
    assert set(accepted) == {"checkpoint", "compress", "temporal_chunk"}
    for policy in language.POLICIES:
        assert set(language.policy_options(policy)) == accepted.get(policy, set()), policy


@pytest.mark.parametrize("policy", sorted(HEADS))
def test_every_offered_option_value_parses(policy: str) -> None:
    for option in language.policy_options(policy):
        for value in language.option_values(policy, option):
            text = f"memplan 1\nmodule a {{ {HEADS[policy]} {option} = {value} }}\n"
            plan, diagnostics = parse_with_diagnostics(text)
            assert plan is not None and not [d for d in diagnostics if d.is_error], (text, diagnostics)
    for codec in language.CODECS:
        lossy = " lossy tolerance = 0.1" if codec in language.LOSSY_CODECS else ""
        plan, diagnostics = parse_with_diagnostics(f"memplan 1\nmodule a {{ compress input = {codec}{lossy} }}\n")
        assert plan is not None and not diagnostics, codec


def test_every_offered_key_and_choice_parses() -> None:
    for block in language.BLOCK_NAMES:
        assert language.block_keys(block) == tuple(SCHEMA[next(k for k in SCHEMA if k.value == block)][1])
        for key in language.block_keys(block):
            for value in language.key_values(block, key):
                required = {"dtr": "eviction_threshold = 1 GiB; ", "step": "shards = 2; "}.get(block, "")
                text = f"memplan 1\n{block} {{ {required}{key} = {value} }}\n"
                plan, diagnostics = parse_with_diagnostics(text)
                assert plan is not None and not [d for d in diagnostics if d.is_error], (text, diagnostics)
    for mode in language.option_values("state", "="):
        assert parse_with_diagnostics(f"memplan 1\nmodule a {{ state = {mode} }}\n")[1] == []


def test_the_reference_has_a_row_for_every_key_option_and_codec() -> None:
    ref = reference()
    for block in language.BLOCK_NAMES:
        for key in language.block_keys(block):
            row = ref.row(block, key)
            assert row is not None, (block, key)
            cells = dict(row.cells)
            assert cells["meaning"] and cells["default"] and cells["type"], (block, key)
    for policy in language.POLICIES:
        assert ref.section(policy) is not None, policy
        for option in language.policy_options(policy):
            row = ref.row(policy, option)
            heading = ref.section(policy).heading
            assert row is not None or f"{option} = " in heading, (policy, option)
    for codec in language.CODECS:
        assert ref.row("compress", codec) is not None, codec
    for statement in language.STATEMENTS:
        assert ref.section(statement) is not None or statement == "module", statement


def test_hover_text_is_the_readme_row() -> None:
    text = "memplan 1\nsublinear {\n    genetic_pool_size = 20\n}\n"
    hover = hover_at(text, 2, 6, None, None, "")
    cells = dict(reference().row("sublinear", "genetic_pool_size").cells)
    assert hover.markdown == (
        "**`genetic_pool_size`** — key of the `sublinear` block\n\n"
        f"type: {cells['type']} · range: {cells['range']} · default: {cells['default']}\n\n{cells['meaning']}"
    )
    assert (hover.line, hover.start, hover.end) == (2, 4, 21)


def test_reference_parser_reads_tables_under_their_sections() -> None:
    ref = parse_reference(
        "# T\n\n### `knob` — a knob\n\nTurns.\n\n| key | type | meaning |\n| --- | --- | --- |\n"
        "| `level` | integer | how far, `a \\| b` |\n\n```memplan\n| `no` | table | here |\n```\n"
    )
    row = ref.row("knob", "level")
    assert dict(row.cells) == {"type": "integer", "meaning": "how far, `a | b`"}
    assert ref.section("knob").summary == "Turns."
    assert ref.row("knob", "no") is None


def test_context_of_the_cursor() -> None:
    text = 'memplan 1\nmodule a.b { checkpoint segments = 2; compress input = "x # y" # c\n  '
    assert context_at(text, text.index("segments")).words == ["checkpoint"]
    assert context_at(text, text.index("= 2") + 2).words == ["checkpoint", "segments", "="]
    inside_string = context_at(text, text.index("x # y") + 3)
    assert inside_string.in_string and not inside_string.in_comment
    at_end = context_at(text, len(text))
    assert at_end.block == "module" and at_end.words == [] and at_end.rule_head == ["module", "a.b"]
    assert [w[0] for w in at_end.block_words] == ["checkpoint", "compress"]
    comment = context_at(text, text.index("# c") + 2)
    assert comment.in_comment
