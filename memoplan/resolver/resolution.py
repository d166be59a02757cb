"""What the resolver learns about a plan bound to a model: the rules that matched each module,
the winner per aspect, the diagnostics, and the queries the checks and the lowering share.

:mod:`memoplan.resolver.bind` fills a :class:`Resolution`; :mod:`memoplan.resolver.checks` adds
its diagnostics; :mod:`memoplan.resolver.lower` and :mod:`memoplan.resolver.explain` read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from memoplan import ir
from memoplan.diagnostics import Diagnostic, Severity
from memoplan.enums import Aspect
from memoplan.resolver.selectors import ModelIndex, Specificity
from memoplan.syntax import ast
from memoplan.syntax.policies import with_defaults

RECOMPUTE = Aspect.RECOMPUTE


@dataclass(frozen=True)
class Candidate:
    """One policy of one rule that matched a module."""

    rule: ast.ModuleRule
    policy: ast.Policy
    specificity: Specificity

    @property
    def line(self) -> int:
        return self.rule.span.line

    def same_as(self, other: Candidate) -> bool:
        return bare(self.policy) == bare(other.policy)


def bare(policy: ast.Policy) -> ast.Policy:
    """The policy as a decision: no comments, and options left out spelled as their defaults
    (syntax/policies.py), so `checkpoint` and `checkpoint rng = preserve` agree."""
    defaults: dict[str, Any] = with_defaults(policy)
    return replace(policy, comments=ast.NO_COMMENTS, **defaults)


@dataclass
class Decision:
    """Winner and losers for one (module, aspect)."""

    winner: Candidate
    candidates: list[Candidate]


@dataclass
class Resolution:
    """Everything the resolver learned; ``ResolvedPlan`` and ``explain`` are views of it."""

    plan: ast.Plan
    index: ModelIndex
    decisions: dict[str, dict[str, Decision]] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    inside_region: dict[str, str] = field(default_factory=dict)  # path -> enclosing checkpointed path
    shared_with: dict[str, str] = field(default_factory=dict)  # second path of a shared module -> first
    # The `dtr` block's candidates and the blocks it leaves out: path -> why (memoplan.resolver.dtr).
    evictable: dict[str, str] = field(default_factory=dict)
    not_evictable: dict[str, str] = field(default_factory=dict)

    def error(self, code, message, span=None, help=None, notes=()) -> None:
        self.diagnostics.append(Diagnostic(code, message, span, help, notes=notes))

    def warn(self, code, message, span=None, help=None, notes=()) -> None:
        self.diagnostics.append(Diagnostic(code, message, span, help, Severity.WARNING, notes))


def in_order(diagnostics):
    return sorted(diagnostics, key=lambda d: (d.span.line, d.span.column) if d.span else (0, 0))


def named(path: str) -> str:
    """A module path as messages quote it: the root (`module ""`) is the model itself."""
    return f"`{path}`" if path else 'the model itself (`""`)'


def winner(res: Resolution, path: str, aspect: str):
    decision = res.decisions.get(path, {}).get(aspect)
    return None if decision is None else decision.winner.policy


def chunked_ancestor(res: Resolution, path: str) -> str | None:
    """The nearest enclosing module (itself excluded) that a `temporal_chunk` rule chunks."""
    parts = path.split(".") if path else []
    for k in range(len(parts) - 1, -1, -1):
        ancestor = ".".join(parts[:k])
        if "temporal_chunk" in res.decisions.get(ancestor, {}):
            return ancestor
    return None


def region_state(res: Resolution, path: str, module: nn.Module) -> tuple[str, ...]:
    """Relative paths of the `state = functional` modules in ``module``'s subtree."""
    found = []
    for name, _ in module.named_modules():
        full = f"{path}.{name}" if name else path
        if isinstance(winner(res, full, "state"), ast.State):
            found.append(name)
    return tuple(sorted(found, key=ir.path_key))
