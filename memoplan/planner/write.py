"""A planner's :class:`~memoplan.planner.choice.Choice` as a plan AST, and its provenance lines."""

from __future__ import annotations

import unicodedata

from memoplan.planner.budgets import format_duration, format_size
from memoplan.planner.chain import Item
from memoplan.planner.choice import BudgetError, Choice, Status
from memoplan.syntax import ast

__all__ = ["describe", "recompute_line", "to_plan"]


# ---------------------------------------------------------------- to a plan


def _comment(text: str) -> str:
    """One comment line: whitespace runs become one space, control characters are escaped."""
    text = " ".join(str(text).split())
    out = []
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return ("# " + "".join(out)).rstrip()


def describe(choice: Choice) -> dict[str, str]:
    """Provenance entries a planner knows: planner, budget, estimated peak before/after, recompute."""
    entries = {"planner": choice.planner}
    if choice.budget is not None:
        entries["budget"] = choice.budget.describe(choice.unplanned_peak)
    entries["estimated peak before"] = f"{format_size(choice.unplanned_peak)} ({choice.unplanned_peak} B)"
    entries["estimated peak after"] = f"{format_size(choice.estimated_peak)} ({choice.estimated_peak} B)"
    entries["recompute"] = recompute_line(
        choice.recompute_seconds, len(choice.checkpointed), "(proven least)" if choice.proven_optimal and choice.ok else ""
    )
    if choice.status is not Status.OK:
        entries["status"] = f"{choice.status.value}: smallest reachable estimate {format_size(choice.minimum_peak)}"
    if choice.reason:
        entries["note"] = choice.reason
    return entries


def recompute_line(seconds: float, modules: int, note: str = "") -> str:
    """The header's ``recompute`` value: ``14.5 ms over 3 modules`` and an optional note."""
    line = f"{format_duration(seconds)} over {modules} module{'s' if modules != 1 else ''}"
    return f"{line} {note}" if note else line


def _reason(item: Item) -> str:
    saving = item.saving
    verb = f"saves {format_size(saving)}" if saving >= 0 else f"costs {format_size(-saving)}"
    kept = f"{format_size(item.saved_bytes)} saved -> {format_size(item.input_bytes)} input"
    return f"{verb} ({kept}) for {format_duration(item.forward_seconds)} of recompute"


def to_plan(
    choice: Choice,
    items: Sequence[Item],
    *,
    header: Mapping[str, str],
    allow_over_budget: bool = False,
) -> ast.Plan:
    """An ordinary plan: one ``module <path> { checkpoint }`` rule per chosen module, in chain order.

    Each rule carries a comment saying why it was chosen; ``header`` (tool and torch versions,
    device, input shapes, budget, planner, estimated peaks -- see :func:`describe`) becomes the
    plan's leading comments, ``# key: value``, in the mapping's order.  A choice whose status is
    not OK raises :class:`BudgetError` unless ``allow_over_budget``.
    """
    if choice.status is not Status.OK and not allow_over_budget:
        raise BudgetError(choice)
    by_name = {item.name: item for item in items}
    rules = []
    for name in choice.names:
        item = by_name.get(name)
        if item is None:
            raise ValueError(f"the choice names `{name}`, which is not in the chain")
        path = ast.PathPattern(tuple(ast.Name(part) for part in name.split(".")))
        rules.append(
            ast.ModuleRule(
                selector=ast.Selector(ast.SelectorTerm(path=path)),
                policies=(ast.Checkpoint(),),
                comments=ast.Comments(leading=(_comment(_reason(item)),)),
            )
        )
    lines = tuple(_comment(f"{key}: {value}") for key, value in header.items())
    return ast.Plan(version=1, statements=tuple(rules), header_comments=ast.Comments(leading=lines))
