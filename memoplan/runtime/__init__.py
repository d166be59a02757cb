"""Runtime stage: the small, stable layer that generated plan code imports.

Generated modules call exactly these names: :func:`require_abi` (on import: MP424 when
this runtime cannot run the interface the module was generated for), :class:`Target`, :func:`install`,
:func:`uninstall`, :func:`run_checkpointed`, :func:`run_segmented` and
:func:`run_planned` with :class:`RegionOptions` (memoplan's own region: compressed input,
threaded state, temporal chunks), :class:`MemorySettings` (the ``memory`` block),
:func:`run_evictable` and :class:`DtrSettings` (the ``dtr`` block), and from
:mod:`memoplan.runtime.arena` ``ArenaSpec``, ``run``, ``install`` and ``uninstall`` (the
``memonger`` block).  Besides those, ``__all__`` holds what a user of a generated module reads
(docs/reference/api.md): :data:`ABI`, :func:`installed_plan` and :class:`PlanMismatchError`.
Everything else is imported from the submodule that defines it (``tests/runtime/test_runtime_exports.py``
holds ``__all__`` to this).  This package imports only ``torch``, the standard library and
:mod:`memoplan.diagnostics`, never the parser, resolver or planner (the ``dtr`` simulator that
both the planner and ``torch.compile``'s lowering of a ``dtr`` block run is
:mod:`memoplan.runtime.dtr_sim`).
"""

from __future__ import annotations

import importlib
import warnings

from memoplan.runtime.abi import ABI, require_abi
from memoplan.runtime.checkpoint import run_checkpointed, run_segmented
from memoplan.runtime.dtr import DtrSettings
from memoplan.runtime.evictable import run_evictable
from memoplan.runtime.install import PlanMismatchError, Target, install, installed_plan, uninstall
from memoplan.runtime.memory import MemorySettings
from memoplan.runtime.region import RegionOptions, run_planned

__all__ = [
    "ABI",
    "DtrSettings",
    "MemorySettings",
    "PlanMismatchError",
    "RegionOptions",
    "Target",
    "install",
    "installed_plan",
    "require_abi",
    "run_checkpointed",
    "run_evictable",
    "run_planned",
    "run_segmented",
    "uninstall",
]

# Names this package exported before its exports were cut to what generated code imports:
# name -> the module that defines it.  They still resolve, with a DeprecationWarning, for
# one release.
_MOVED = {
    "DtrStats": "memoplan.runtime.dtr",
    "dtr_stats": "memoplan.runtime.dtr",
    "InstalledPlan": "memoplan.runtime.install",
    "qualified_type_name": "memoplan.runtime.install",
    "run_chunked": "memoplan.runtime.region",
    "run_region": "memoplan.runtime.region",
}


def __getattr__(name: str):
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'memoplan.runtime' has no attribute {name!r}")
    warnings.warn(
        f"memoplan.runtime.{name} is deprecated: import it from {module}"
        + (" (or use memoplan.dtr_stats)" if name == "dtr_stats" else ""),
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)
