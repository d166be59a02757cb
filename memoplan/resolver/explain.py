"""Resolve stage: ``explain`` — for every module of the model, which rule decided what, and why."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from memoplan.diagnostics import printable
from memoplan.resolver.bind import analyse
from memoplan.resolver.resolution import Decision, chunked_ancestor
from memoplan.syntax import ast
from memoplan.syntax.formatter import format_policy, format_selector


@dataclass(frozen=True)
class ExplainRow:
    path: str
    class_name: str
    decisions: tuple[tuple[str, str], ...]  # (what, why), one per aspect; empty: untouched

    def lines(self) -> list[str]:
        if not self.decisions:
            return []
        return [f"{what}  — {why}" for what, why in self.decisions]


def explain(plan: ast.Plan, model: nn.Module) -> list[ExplainRow]:
    """One row per module of ``model``, in ``named_modules()`` order (the order the model
    declares them), also for modules no rule touches; a module reachable by several
    paths has a row for each."""
    resolution = analyse(plan, model)
    rows = []
    root = [("", model)] if "" in resolution.decisions else []  # `module ""` plans the model itself
    for path, module in [*root, *resolution.index.modules.items()]:
        decisions = [
            (format_policy(decision.winner.policy), _why(aspect, decision))
            for aspect, decision in sorted(resolution.decisions.get(path, {}).items())
        ]
        first = resolution.shared_with.get(path)
        if first is not None:
            decisions.append(("shared", f"the same module object as `{first}`, planned there"))
        outer = resolution.inside_region.get(path)
        if outer is not None:
            region = resolution.decisions[outer]["recompute"].winner
            where = f"`{outer}`" if outer else 'the model itself (`""`)'
            decisions.append(("recomputed", f"inside the checkpoint region of {where} (line {region.line})"))
        chunked = chunked_ancestor(resolution, path)
        if chunked is not None and isinstance(module, nn.modules.batchnorm._BatchNorm):
            line = resolution.decisions[chunked]["temporal_chunk"].winner.line
            decisions.append(
                (
                    "whole-batch statistics",
                    f"inside the time chunks of `{chunked}` (line {line}): in training, a first pass over "
                    "the chunks measures the statistics of every time step",
                )
            )
        if path in resolution.evictable:
            dtr_block = resolution.plan.block(ast.BlockKind.DTR)
            assert dtr_block is not None, "only a dtr block makes modules evictable"
            line = dtr_block.span.line
            decisions.append(("dtr candidate", f"line {line} `dtr`: {resolution.evictable[path]}"))
        elif path in resolution.not_evictable:
            decisions.append(("not a dtr candidate", resolution.not_evictable[path]))
        rows.append(ExplainRow(path, type(module).__qualname__, tuple(decisions)))
    return rows


def _why(aspect: str, decision: Decision) -> str:
    winner = decision.winner
    where = f"line {winner.line} `module {format_selector(winner.rule.selector)}`"
    others = [c for c in decision.candidates if c is not winner]
    if not others:
        return f"{where}, the only rule that sets {aspect} for this module"
    beaten = sorted({c.line for c in others if c.specificity < winner.specificity})
    equal = [c for c in others if c.specificity == winner.specificity]
    agreeing = sorted({c.line for c in equal if c.same_as(winner)})
    disagreeing = sorted({c.line for c in equal if not c.same_as(winner)})
    parts = [where]
    if beaten:
        lines = ", ".join(str(n) for n in beaten)
        parts.append(f"more specific {winner.specificity} than line{'s' if len(beaten) > 1 else ''} {lines}")
    if agreeing:
        parts.append(f"line{'s' if len(agreeing) > 1 else ''} {', '.join(map(str, agreeing))} agree")
    if disagreeing:
        lines = ", ".join(str(n) for n in disagreeing)
        parts.append(
            f"CONFLICT: line{'s' if len(disagreeing) > 1 else ''} {lines} equally specific "
            f"but disagree{'' if len(disagreeing) > 1 else 's'} (MP303)"
        )
    return ", ".join(parts)


def render_explain(rows: list[ExplainRow], *, all_modules: bool = True) -> str:
    """A readable table: path, class, then each decision with its reason.

    Names come from the model: they are printed through :func:`printable`.
    """
    shown = [r for r in rows if all_modules or r.decisions]
    paths = {id(r): printable(r.path) if r.path else '""' for r in shown}  # `""`: the model itself
    classes = {id(r): printable(r.class_name) for r in shown}
    width_path = max((len(p) for p in paths.values()), default=4)
    width_cls = max((len(c) for c in classes.values()), default=5)
    out = [f"{'module'.ljust(width_path)}  {'class'.ljust(width_cls)}  decision"]
    for row in shown:
        lead = f"{paths[id(row)].ljust(width_path)}  {classes[id(row)].ljust(width_cls)}  "
        lines = [printable(line) for line in row.lines()] or ["-  (no rule)"]
        out.append(lead + lines[0])
        out.extend(" " * len(lead) + line for line in lines[1:])
    return "\n".join(out)
