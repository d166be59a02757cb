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
    from memoplan.planner.budgets import AskedBudget, DeviceBudget, read_budget

    assert read_budget("device") == AskedBudget(DeviceBudget("device", 0), None)
    assert read_budget("device - 2GiB hint") == AskedBudget(DeviceBudget("device - 2GiB hint", 2 * 2**30), False)
    assert read_budget(" Device-2 GiB ") == AskedBudget(DeviceBudget(" Device-2 GiB ", 2 * 2**30), None)
    assert read_budget("device hard").hard is True
    with pytest.raises(PlanError) as caught:  # the margin is a size
        read_budget("device - 50%")
    assert caught.value.codes == ["MP509"] and "the margin is a size" in str(caught.value)
    for text in ("devices", "device x", "device 2GiB", "device - 2GiB hard hint", "device minus lots", "device -"):
        with pytest.raises(PlanError) as caught:
            read_budget(text)
        assert caught.value.codes == ["MP509"] and "is not a device budget" in str(caught.value), text
    with pytest.raises(PlanError) as caught:  # the margin read as the language reads a size
        read_budget("device - 0 B")
    assert caught.value.codes == ["MP203"]
