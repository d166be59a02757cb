"""Error recovery does bounded work (issue 39, item 6): a syntax error followed by many lines
costs about one more parse of the plan, not one parse per line or per error.

Work is counted, not timed: every text given to Lark's parser is recorded, so these tests
fail the same way on a loaded machine.  ``benchmarks/parse_worst.py`` times the worst cases
at the size limit (docs/benchmarks.md).
"""

from __future__ import annotations

import pytest

from memoplan.lsp.analysis import parse_text
from memoplan.syntax import lalr, parser, pieces, recovery


@pytest.fixture
def parsed(monkeypatch) -> list[int]:
    """The length of every text Lark parses from now on (runs of 1,024 characters: small plans show it)."""
    monkeypatch.setattr(recovery, "RECOVERY_BATCH", 1_024)
    lark, _, _ = lalr.lark_parser()
    lengths: list[int] = []
    real = lark.parse

    def counting(text, *args, **kwargs):
        lengths.append(len(text))
        return real(text, *args, **kwargs)

    monkeypatch.setattr(lark, "parse", counting)
    return lengths


@pytest.mark.parametrize(
    "line",
    ["\n", "# a comment\n", ";\n", "module a.b { checkpoint }\n", "module c {\n  checkpoint\n}\n"],
    ids=["blank", "comment", "semicolon", "rule", "block"],
)
def test_a_bad_line_before_many_lines_is_not_a_parse_per_line(parsed, line) -> None:
    text = "memplan 1\nmodle x\n" + line * 1_500
    _, diagnostics = parser.parse_with_diagnostics(text)
    assert [d.code for d in diagnostics if d.code.startswith("MP1")] == ["MP101"]
    # The plan, a run that fails, the run before the error, its statement twice, then a parse a run:
    # it was one parse per statement.
    assert len(parsed) <= 6 + 2 * len(text) // recovery.RECOVERY_BATCH, parsed
    assert sum(parsed) <= 3 * len(text) + 100  # counted as if each failed parse read its whole text


def test_errors_spread_over_many_statements_cost_a_run_each(parsed) -> None:
    text = "memplan 1\n" + ("module a.b { checkpoint }\n" * 100 + "modle x\n") * 10
    _, diagnostics = parser.parse_with_diagnostics(text)
    assert [d.code for d in diagnostics] == ["MP101"] * 10
    assert len(parsed) <= 1 + 10 * 4 + 2 * len(text) // recovery.RECOVERY_BATCH, parsed
    assert sum(parsed) <= 2 * len(text) + 10 * (2 * recovery.RECOVERY_BATCH + 50)


def test_many_errors_at_the_end_of_a_huge_block_stop_at_the_work_bound(parsed, monkeypatch) -> None:
    """Each error inside one statement re-parses that statement: 50 of them at the end of a
    huge block were 50 parses of the plan; the bound stops the search after about two."""
    monkeypatch.setattr(recovery, "RECOVERY_SLACK", 0)  # the bound without its floor: a small plan shows it
    text = "memplan 1\nmodule x {\n" + "  ;\n" * 3_000 + "  bogus\n" * 50 + "}\n"
    _, diagnostics = parser.parse_with_diagnostics(text)
    assert diagnostics and diagnostics[0].code == "MP102" and diagnostics[0].span.line == 3_003
    assert sum(parsed) <= 2 * len(text) + 50, (len(parsed), sum(parsed), len(text))


def test_below_the_bound_every_error_of_a_block_is_still_found(parsed) -> None:
    text = "memplan 1\nmodule x {\n" + "  ;\n" * 100 + "  bogus\n" * 20 + "}\n"
    _, diagnostics = parser.parse_with_diagnostics(text)
    assert [d.span.line for d in diagnostics] == list(range(103, 123))


def test_the_language_server_parses_with_the_same_bound(parsed) -> None:
    text = "memplan 1\nmodle x\n" + ";\n" * 5_000
    checked = parse_text(text, "doc.memplan")
    assert [d.code for d in checked.diagnostics] == ["MP101"]
    assert len(parsed) <= 6 + 2 * len(text) // recovery.RECOVERY_BATCH


def test_statements_are_cut_into_pieces_of_whole_statements() -> None:
    text = "memplan 1\nmodule a {\n  checkpoint\n}\n\nbudget 1 GiB \\\n 2\n"
    firsts, starts, end = pieces.statement_pieces(text, chunk=1)  # one statement a piece
    assert (list(firsts), list(starts), end) == ([1, 2, 5, 6], [0, 10, 36, 37], 55)
    firsts, starts, end = pieces.statement_pieces(text)
    assert (list(firsts), list(starts), end) == ([1], [0], 55)
    many = "memplan 1\n" + "budget 1 GiB\n" * 10_000
    firsts, starts, end = pieces.statement_pieces(many)
    assert len(firsts) == len(many) // pieces.STATEMENT_CHUNK + 1  # not one a line
    assert all(many[start - 1] == "\n" for start in starts[1:]) and end == len(many)
    assert [many.count("\n", 0, start) + 1 for start in starts] == list(firsts)


def test_a_plan_of_blank_lines_is_not_a_gigabyte() -> None:
    """The newline terminal was a repeated group: Python's regex engine kept ~250 bytes a blank line."""
    import tracemalloc

    text = "memplan 1\n" + "\n" * 120_000 + "modle x\n"
    parser.parse_with_diagnostics("memplan 1\n")
    tracemalloc.start()
    try:
        _, diagnostics = parser.parse_with_diagnostics(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [d.code for d in diagnostics] == ["MP101"]
    assert peak < 20 * len(text), peak  # was about 250 bytes a line: 30 MB here
