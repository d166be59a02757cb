"""Runtime stage: the small, stable layer that generated plan code imports.

Generated modules call exactly these names: :func:`require_abi` (on import: MP424 when
this runtime cannot run the interface the module was generated for), :class:`Target`, :func:`install`,
:func:`uninstall`, :func:`run_checkpointed`, :func:`run_segmented` and
:func:`run_planned` (memoplan's own region: compressed input, threaded state,
temporal chunks), :func:`run_evictable` and :class:`DtrSettings` (the ``dtr`` block), and
from :mod:`memoplan.runtime.arena` ``ArenaSpec``, ``run``, ``install`` and ``uninstall`` (the
``memonger`` block).  This
package imports only ``torch``, the standard library and
:mod:`memoplan.diagnostics`, never the parser or resolver; of the planner only its ``dtr``
simulator (pure Python), when a ``dtr`` block is traced by ``torch.compile``.
"""

from __future__ import annotations

from memoplan.runtime.abi import ABI, require_abi
from memoplan.runtime.checkpoint import run_checkpointed, run_segmented
from memoplan.runtime.region import RegionOptions, run_chunked, run_planned, run_region
from memoplan.runtime.memory import MemorySettings
from memoplan.runtime.dtr import DtrSettings, DtrStats, dtr_stats
from memoplan.runtime.evictable import run_evictable
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
    "ABI",
    "DtrSettings",
    "DtrStats",
    "InstalledPlan",
    "MemorySettings",
    "PlanMismatchError",
    "RegionOptions",
    "Target",
    "install",
    "installed_plan",
    "qualified_type_name",
    "require_abi",
    "run_checkpointed",
    "dtr_stats",
    "run_chunked",
    "run_evictable",
    "run_planned",
    "run_region",
    "run_segmented",
    "uninstall",
]
