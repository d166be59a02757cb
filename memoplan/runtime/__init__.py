"""Runtime stage: the small, stable layer that generated plan code imports.

Generated modules call exactly these names: :class:`Target`, :func:`install`,
:func:`uninstall`, :func:`run_checkpointed` and :func:`run_segmented`.  This
package imports only ``torch``, the standard library and
:mod:`memoplan.diagnostics`, never the parser, resolver or planner.
"""

from __future__ import annotations

from memoplan.runtime.checkpoint import run_checkpointed, run_segmented
from memoplan.runtime.install import (
    InstalledPlan,
    PlanMismatchError,
    Target,
    install,
    installed_plan,
    qualified_type_name,
    uninstall,
)

__all__ = [
    "InstalledPlan",
    "PlanMismatchError",
    "Target",
    "install",
    "installed_plan",
    "qualified_type_name",
    "run_checkpointed",
    "run_segmented",
    "uninstall",
]
