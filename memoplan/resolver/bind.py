"""Resolve stage: binds a plan's rules to a real model, runs the legality checks
(:mod:`memoplan.resolver.checks`) and lowers the result to the IR (:mod:`memoplan.resolver.lower`).

Every policy belongs to one *aspect* of a module (recompute: ``checkpoint`` or
``keep``; ``compress``; ``temporal_chunk``; ``state``; ``buffers``).  For each
module and aspect the most specific matching rule wins; two equally specific rules
that disagree are an error naming both lines.  All problems are reported at once.
"""

from __future__ import annotations

import json
from dataclasses import replace

from torch import nn

from memoplan import ir
from memoplan.diagnostics import PlanError, did_you_mean
from memoplan.resolver.checks import check
from memoplan.resolver.dtr import candidates as dtr_candidates
from memoplan.resolver.effects import statement_effects
from memoplan.resolver.lower import to_ir
from memoplan.resolver.resolution import Candidate, Decision, Resolution, in_order
from memoplan.resolver.selectors import ModelIndex, no_match_help, select, specificity
from memoplan.runtime.state import is_stateful
from memoplan.syntax import ast
from memoplan.syntax.formatter import format_policy, format_selector
from memoplan.syntax.parser import parse_with_diagnostics
from memoplan.syntax.policies import POLICIES, spec_of

# The aspect of each policy's AST class (syntax/policies.py says it once).
ASPECTS = {spec.node: spec.aspect for spec in POLICIES.values()}


def resolve(plan: ast.Plan, model: nn.Module) -> ir.ResolvedPlan:
    """Bind ``plan`` to ``model``; raise :class:`PlanError` with every problem found."""
    resolution = analyse(plan, model)
    errors = [d for d in resolution.diagnostics if d.is_error]
    if errors:
        raise PlanError(tuple(in_order(resolution.diagnostics)), plan.source)
    return to_ir(resolution)


def analyse(plan: ast.Plan, model: nn.Module) -> Resolution:
    """Match rules, pick winners and run the legality checks, collecting diagnostics."""
    resolution = Resolution(plan, ModelIndex(model))
    # Plan-wide statements that cannot act are refused here, so nothing `apply` runs drops them;
    # the notes (what cannot act on this machine) are printed with the warnings.
    resolution.diagnostics.extend(statement_effects(plan))
    _match_rules(resolution)
    check(resolution)
    _choose_evictable(resolution, model)
    return resolution


def _choose_evictable(res: Resolution, model: nn.Module) -> None:
    """The `dtr` block's candidates: the blocks, or the modules its `modules` key names, that no
    memory rule touches (:mod:`memoplan.resolver.dtr`)."""
    block = res.plan.block(ast.BlockKind.DTR)
    if block is None:
        return
    ruled: dict[str, int] = {}
    for path, aspects in res.decisions.items():
        lines = [d.winner.line for aspect, d in aspects.items() if aspect not in ("state", "buffers")]
        if lines:
            ruled[path] = min(lines)
    entry = next((e for e in block.entries if e.key == "modules"), None)
    named = None
    if entry is not None:
        named = _named_candidates(res, entry)
        if named is None:
            return
    res.evictable, res.not_evictable = dtr_candidates(model, ruled, named)
    if not res.evictable:
        res.error(
            "MP230",
            "the `dtr` block has no module to act on: "
            + (
                "every module it names has a rule of its own"
                if named
                else "every block of the model has a rule of its own"
            ),
            replace(block.span, end_line=block.span.line, end_column=block.span.column + len("dtr")),
            "remove the `dtr` block, or the rules on the blocks it should evict "
            "(`memoplan explain` lists the blocks and why each is left out)",
        )


def _named_candidates(res: Resolution, entry: ast.ConfigEntry) -> list[str] | None:
    """The modules the `dtr` block's `modules` key selects, or None after an MP232 error."""
    assert isinstance(entry.value, ast.Text), "check_block reads `modules` as a string"
    text = entry.value.value
    rule, problems = parse_with_diagnostics(f"memplan 1\nmodule {text} {{ keep }}\n", "<modules>")
    errors = [d for d in problems if d.is_error]
    statements = [] if rule is None else [s for s in rule.statements if isinstance(s, ast.ModuleRule)]
    if errors or len(statements) != 1:
        why = errors[0].message if errors else "it is not one selector"
        res.error(
            "MP232",
            f"`modules = {json.dumps(text)}` is not a selector: {why}",
            entry.span,
            'write a selector as in a module rule, e.g. `modules = "layers.*"`',
        )
        return None
    paths = select(res.index, statements[0].selector)
    if not paths:
        res.error(
            "MP232",
            f"`modules = {json.dumps(text)}` matches no module of the model",
            entry.span,
            did_you_mean(text, res.index.paths) or "`memoplan explain` lists the model's modules",
        )
        return None
    chosen = set(paths)
    nested = [(".".join(p.split(".")[:k]), p) for p in paths for k in range(1, p.count(".") + 1)]
    nested = [(outer, inner) for outer, inner in nested if outer in chosen]
    if nested:
        outer, inner = nested[0]
        res.error(
            "MP232",
            f"`modules = {json.dumps(text)}` selects `{outer}` and `{inner}`, inside it",
            entry.span,
            "candidates must not contain one another: select one level",
        )
        return None
    return paths


# ---------------------------------------------------------------- matching and precedence


def _match_rules(res: Resolution) -> None:
    candidates: dict[str, dict[str, list[Candidate]]] = {}
    for rule in res.plan.rules:
        paths = select(res.index, rule.selector)
        if not paths:
            _no_match(res, rule)
            continue
        spec = specificity(rule.selector)
        for path in paths:
            per_aspect = candidates.setdefault(path, {})
            for policy in rule.policies:
                per_aspect.setdefault(spec_of(policy).aspect, []).append(Candidate(rule, policy, spec))
    for path in sorted(candidates, key=ir.path_key):
        for aspect, found in candidates[path].items():
            best = max(c.specificity for c in found)
            top = [c for c in found if c.specificity == best]
            winner = top[0]
            for other in top[1:]:
                if not other.same_as(winner):
                    res.error(
                        "MP303",
                        f"rules on lines {winner.line} and {other.line} disagree about `{path}` "
                        f"and are equally specific",
                        other.policy.span,
                        "make one selector more specific (e.g. an exact path), or drop one rule",
                        notes=(
                            (
                                f"`{format_policy(winner.policy)}` from `module {format_selector(winner.rule.selector)}`",
                                winner.policy.span,
                            ),
                        ),
                    )
                    break
            res.decisions.setdefault(path, {})[aspect] = Decision(winner, found)
    _spread_state(res)


def _spread_state(res: Resolution) -> None:
    """`state = functional` on a module that keeps no state of its own (a block, a container)
    means the stateful modules inside it: each gets the rule's decision, unless a rule of its own
    decides already.  With none inside, the decision stays and MP315 refuses it."""
    for path in sorted(res.decisions, key=ir.path_key, reverse=True):  # inner rules first
        decision = res.decisions[path].get("state")
        module = res.index.module(path)
        if decision is None or is_stateful(module):
            continue
        inside = [f"{path}.{name}" for name, sub in module.named_modules() if name and is_stateful(sub)]
        if not inside:
            continue
        del res.decisions[path]["state"]
        for sub in inside:
            res.decisions.setdefault(sub, {}).setdefault("state", decision)
    for path in [p for p, aspects in res.decisions.items() if not aspects]:
        del res.decisions[path]


def _no_match(res: Resolution, rule: ast.ModuleRule) -> None:
    text = format_selector(rule.selector)
    help_ = no_match_help(res.index, rule.selector.include)
    res.error("MP301", f"`{text}` matches no module of the model", rule.selector.span, help_)
