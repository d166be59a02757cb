"""memoplan: declarative activation-memory plans for PyTorch, with equivalence checking.

Data flows one way: ``.memplan`` text --parse--> AST --resolve(model)--> ResolvedPlan
--emit--> generated Python --import--> applied to the model.

The public names are imported on first use, so that generated plan modules, which
import only ``memoplan.runtime``, never load the parser, resolver or templates.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

from memoplan.version import __version__

# public name -> module that defines it
_EXPORTS = {
    "Diagnostic": "memoplan.diagnostics",
    "MemoplanWarning": "memoplan.diagnostics",
    "PlanError": "memoplan.diagnostics",
    "Plan": "memoplan.syntax.ast",
    "ResolvedPlan": "memoplan.ir",
    "apply": "memoplan.api",
    "dtr_stats": "memoplan.runtime.dtr",
    "remove": "memoplan.api",
    "explain": "memoplan.resolver.explain",
    "resolve": "memoplan.resolver",
    "format_plan": "memoplan.syntax",
    "load": "memoplan.syntax",
    "parse": "memoplan.syntax",
    "plan": "memoplan.planner.pipeline",
    "profile": "memoplan.planner.profiling.aim",
    "PlanRequestError": "memoplan.planner.request",
    "PlanResult": "memoplan.planner.plan",
    "verify": "memoplan.verification",
    "estimated_verify": "memoplan.verification",
    "measure_step": "memoplan.measure",
    "write_module": "memoplan.api",
}

# Names renamed for clarity: old name -> (new name, the module that defines it).  They still
# resolve, with a DeprecationWarning, for one release (docs/reference/api.md).
_DEPRECATED = {
    "compile": ("write_module", "memoplan.api"),  # shadowed the builtin, sounded like torch.compile
}

# A literal list, so that type checkers see the re-exports (tests/test_typing.py checks it
# matches _EXPORTS).
__all__ = [
    "Diagnostic",
    "MemoplanWarning",
    "Plan",
    "PlanError",
    "PlanRequestError",
    "PlanResult",
    "ResolvedPlan",
    "__version__",
    "apply",
    "dtr_stats",
    "estimated_verify",
    "explain",
    "format_plan",
    "load",
    "measure_step",
    "parse",
    "plan",
    "profile",
    "remove",
    "resolve",
    "verify",
    "write_module",
]


def __getattr__(name: str):
    if name in _DEPRECATED:
        new, where = _DEPRECATED[name]
        warnings.warn(f"memoplan.{name} is deprecated: use memoplan.{new}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(where), new)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'memoplan' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:  # memoplan installs without torch (memoplan.needs_torch)
        from memoplan.needs_torch import hint, is_missing_torch

        if not is_missing_torch(exc):
            raise

        raise ModuleNotFoundError(hint(f"memoplan.{name}"), name=exc.name) from exc
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover
    from memoplan.api import apply, remove, write_module
    from memoplan.diagnostics import Diagnostic, MemoplanWarning, PlanError
    from memoplan.ir import ResolvedPlan
    from memoplan.measure import measure_step
    from memoplan.planner.pipeline import plan
    from memoplan.planner.plan import PlanResult
    from memoplan.planner.profiling.aim import profile
    from memoplan.planner.request import PlanRequestError
    from memoplan.resolver.bind import resolve
    from memoplan.resolver.explain import explain  # the function, not the module of that name
    from memoplan.runtime.dtr import dtr_stats
    from memoplan.syntax import format_plan, load, parse
    from memoplan.syntax.ast import Plan
    from memoplan.verification import estimated_verify, verify
