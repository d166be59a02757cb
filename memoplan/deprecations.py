"""Shared leaf: the names memoplan renamed, each still accepted for one release with a warning.

A renamed name keeps working: the command line prints ``MP540`` (a warning) and runs the new
name; the Python API raises a :class:`DeprecationWarning` (``memoplan.compile``, the package's
``_DEPRECATED``; a ``budget`` word, :func:`budget_word`).  This table is where an old name is
declared once; drop its entry one release after the rename.
"""

from __future__ import annotations

import warnings

from memoplan.diagnostics import Diagnostic, Severity

#: ``--budget`` (and ``memoplan.plan(budget=...)``) words of the coverage budgets: old -> new.
#: The old words collided with the presets' names (``--budget memory`` checkpoints every
#: candidate, ``--preset memory`` seeks the least peak; preset ``safe`` used budget ``speed``).
BUDGET_WORDS = {
    "speed": "checkpoint-half",
    "balanced": "checkpoint-three-quarters",
    "memory": "checkpoint-all",
}

#: ``memoplan COMMAND``: old -> new (``compile`` sounded like ``torch.compile``; it writes a module).
COMMANDS = {"compile": "write-module"}


def renamed(what: str, old: str, new: str) -> Diagnostic:
    """The ``MP540`` warning for an old name the command line was given."""
    return Diagnostic(
        "MP540",
        f"{what} `{old}` is deprecated (it is removed in a later release): write `{new}`",
        severity=Severity.WARNING,
    )


def budget_word(text: str, *, stacklevel: int = 3) -> str:
    """``text`` with an old coverage word replaced by its new one (a DeprecationWarning says so)."""
    word = text.strip().lower()
    new = BUDGET_WORDS.get(word)
    if new is None:
        return text
    warnings.warn(
        f"the budget word {word!r} is deprecated: write {new!r} (a share of the candidates checkpointed)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return new


#: Planner modules moved into the planner's subpackages (``profiling``, ``search``, ``dtr``):
#: old dotted path -> new.  ``import`` of an old path still works, with a DeprecationWarning
#: (:func:`moved_module`, through the finder :mod:`memoplan.planner` installs).
PLANNER_MODULES = {
    "memoplan.planner.aim": "memoplan.planner.profiling.aim",
    "memoplan.planner.anatomy": "memoplan.planner.profiling.anatomy",
    "memoplan.planner.calibrate": "memoplan.planner.search.calibrate",
    "memoplan.planner.chain": "memoplan.planner.search.chain",
    "memoplan.planner.choice": "memoplan.planner.search.choice",
    "memoplan.planner.copies": "memoplan.planner.profiling.copies",
    "memoplan.planner.cuda_allocator": "memoplan.planner.profiling.cuda_allocator",
    "memoplan.planner.device_budget": "memoplan.planner.profiling.device_budget",
    "memoplan.planner.dtr_plan": "memoplan.planner.dtr.plan",
    "memoplan.planner.dtr_sim": "memoplan.planner.dtr.sim",
    "memoplan.planner.estimate": "memoplan.planner.profiling.estimate",
    "memoplan.planner.exact": "memoplan.planner.search.exact",
    "memoplan.planner.fake_step": "memoplan.planner.profiling.fake_step",
    "memoplan.planner.greedy": "memoplan.planner.search.greedy",
    "memoplan.planner.mgb_env": "memoplan.planner.search.mgb_env",
    "memoplan.planner.module_hooks": "memoplan.planner.profiling.module_hooks",
    "memoplan.planner.opsave": "memoplan.planner.search.opsave",
    "memoplan.planner.optimal": "memoplan.planner.search.optimal",
    "memoplan.planner.profile": "memoplan.planner.profiling.profile",
    "memoplan.planner.refine": "memoplan.planner.search.refine",
    "memoplan.planner.regioncost": "memoplan.planner.profiling.regioncost",
    "memoplan.planner.report": "memoplan.planner.profiling.report",
    "memoplan.planner.schema": "memoplan.planner.profiling.schema",
    "memoplan.planner.segments": "memoplan.planner.search.segments",
    "memoplan.planner.shard": "memoplan.planner.profiling.shard",
    "memoplan.planner.shrink": "memoplan.planner.profiling.shrink",
    "memoplan.planner.snapshot": "memoplan.planner.profiling.snapshot",
    "memoplan.planner.stamp": "memoplan.planner.profiling.stamp",
    "memoplan.planner.sublinear": "memoplan.planner.search.sublinear",
    "memoplan.planner.target": "memoplan.planner.profiling.target",
    "memoplan.planner.write": "memoplan.planner.search.write",
}


def moved_module(name: str, *, stacklevel: int = 2) -> str | None:
    """The new path of a moved module ``name`` (a DeprecationWarning says so), else None."""
    new = PLANNER_MODULES.get(name)
    if new is not None:
        warnings.warn(
            f"{name} moved to {new}: import it from there (the old path is removed in a later release)",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
    return new
