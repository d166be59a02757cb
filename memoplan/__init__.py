"""memoplan: declarative activation-memory plans for PyTorch, with equivalence checking.

Data flows one way: ``.memplan`` text --parse--> AST --resolve(model)--> ResolvedPlan
--emit--> generated Python --import--> applied to the model.
"""

__version__ = "0.1.0"

from memoplan.api import apply, remove  # noqa: E402
from memoplan.diagnostics import Diagnostic, PlanError  # noqa: E402
from memoplan.resolve import explain, resolve  # noqa: E402
from memoplan.syntax import format_plan, load, parse  # noqa: E402

__all__ = [
    "Diagnostic",
    "PlanError",
    "__version__",
    "apply",
    "explain",
    "format_plan",
    "load",
    "parse",
    "remove",
    "resolve",
]
