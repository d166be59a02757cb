"""Hard or hint is read from a plan's `budget` statement and worded in one place
(memoplan.planner.budgets): the plan header's `budget mode`, `verify`'s line and the statement a
written plan carries agree."""

from __future__ import annotations

import pytest

from memoplan.planner.budgets import is_hard, mode_line, mode_of, mode_word
from memoplan.syntax import ast, parse


@pytest.mark.parametrize(
    "text, hard", [("budget 4 GiB", True), ("budget 4 GiB hard", True), ("budget 50% hint", False)]
)
def test_a_statement_reads_hard_or_hint_and_is_written_back_the_same(text, hard):
    stmt = parse(f"memplan 1\n{text}\n", "p.memplan").budget
    assert stmt is not None and is_hard(stmt) is hard
    assert mode_word(hard) == ("hard" if hard else "hint") == mode_of(hard).value
    assert mode_of(hard) is (ast.BudgetMode.HARD if hard else ast.BudgetMode.HINT)


def test_the_headers_budget_mode():
    assert mode_line(True) == "hard (verified by measurement)"
    assert mode_line(True, estimated=True) == "hard (verified on fake tensors)"
    assert mode_line(False) == mode_line(False, estimated=True) == "hint"


def test_the_device_budget_is_read_once_into_a_typed_value():
    from memoplan.diagnostics import PlanError
    from memoplan.planner.budgets import DeviceBudget
    from memoplan.planner.presets import parse_budget

    assert parse_budget("device", device=True) == (DeviceBudget("device", 0), None)
    assert parse_budget("device - 2GiB hint", device=True) == (DeviceBudget("device - 2GiB hint", 2 * 2**30), False)
    assert parse_budget("device hard", device=True)[1] is True
    assert parse_budget("4 GiB", device=True) == parse_budget("4 GiB")
    with pytest.raises(PlanError) as caught:  # the margin is a size
        parse_budget("device - 50%", device=True)
    assert caught.value.codes == ["MP509"] and "the margin is a size" in str(caught.value)
    with pytest.raises(PlanError):  # only the command line's budget may be the device's
        parse_budget("device")
