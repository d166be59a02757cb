"""Planner stage: measured profiles in, ordinary plan ASTs out (``memoplan.planner.search``).

The planner's modules are in layers (docs/design.md, "Inside `planner/`"): the planner's data
(``budgets``, ``config``, ``tell``), ``profiling/`` (the estimate and the measurement),
``search/`` (what to checkpoint), ``dtr/`` (the ``dtr`` block), and the pipeline
(``pipeline.run``, ``plan``, ``presets``, ...).  A module's old path from before the subpackages
(``memoplan.planner.profile``, ``memoplan.planner.estimate``, ...) still imports, with a
DeprecationWarning (:data:`memoplan.deprecations.PLANNER_MODULES`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old planner path as the module it moved to (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        from memoplan.deprecations import PLANNER_MODULES

        if fullname not in PLANNER_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        from memoplan.deprecations import moved_module

        new = moved_module(spec.name, stacklevel=3)  # past the import machinery, which warnings skips
        assert new is not None  # find_spec answered for moved names only
        return importlib.import_module(new)

    def exec_module(self, module):
        """Nothing to run: the module is the new path's, already run."""


def __getattr__(name: str):
    """``from memoplan.planner import profile`` (an old module path): the moved module, with a warning."""
    from memoplan.deprecations import moved_module

    new = moved_module(f"{__name__}.{name}", stacklevel=3)  # past this function: the importer
    if new is not None:
        module = globals()[name] = importlib.import_module(new)  # warned once: found here from now on
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
