"""Planner stage: MegEngine's ``MGB_SUBLINEAR_MEMORY_*`` environment variables as the sublinear search's defaults.

Users moving from MegEngine set its sublinear search through the environment
(``MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITER=50``...).  memoplan reads each of them as the default
of the matching key of the language's ``sublinear`` block: a plan's block and the command
line's options override them, key by key, and the command says which it read.  A variable
with that prefix that memoplan does not know is refused (``MP201``), and a value is checked as
the block's entry would be (``MP202``, ``MP203``): none is ignored.

=============================================  ======================  ==========================
variable                                       ``sublinear`` key       value
=============================================  ======================  ==========================
``MGB_SUBLINEAR_MEMORY_THRESH_NR_TRY``          ``thresh_nr_try``       an integer
``MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITER``        ``genetic_nr_iter``     an integer
``MGB_SUBLINEAR_MEMORY_GENETIC_POOL_SIZE``      ``genetic_pool_size``   an integer
``MGB_SUBLINEAR_MEMORY_LOWER_BOUND_MB``         ``lb_memory``           MiB, as MegEngine reads it
``MGB_SUBLINEAR_MEMORY_WORKERS``                ``num_worker``          an integer
=============================================  ======================  ==========================
"""

from __future__ import annotations

from collections.abc import Mapping

from memoplan.diagnostics import Diagnostic, PlanError, did_you_mean

__all__ = ["PREFIX", "VARIABLES", "sublinear_env"]

PREFIX = "MGB_SUBLINEAR_MEMORY_"

#: variable suffix -> (the `sublinear` block's key, how its value is written in the block)
VARIABLES: dict[str, tuple[str, str]] = {
    "THRESH_NR_TRY": ("thresh_nr_try", "{}"),
    "GENETIC_NR_ITER": ("genetic_nr_iter", "{}"),
    "GENETIC_POOL_SIZE": ("genetic_pool_size", "{}"),
    "LOWER_BOUND_MB": ("lb_memory", "{} MiB"),  # MegEngine multiplies by 1024 * 1024
    "WORKERS": ("num_worker", "{}"),
}


def sublinear_env(environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """The ``sublinear`` block entries the environment sets: key -> (variable, value as the block writes it).

    Raises :class:`PlanError` (``MP201``) for an ``MGB_SUBLINEAR_MEMORY_*`` variable memoplan does
    not know and (``MP202``) for a value that is not one word; the caller parses the entries as a
    block, so a value of the wrong type or out of range is that block's diagnostic.
    """
    found: dict[str, tuple[str, str]] = {}
    problems = []
    for name in sorted(environ):
        if not name.startswith(PREFIX):
            continue
        suffix = name[len(PREFIX) :]
        value = environ[name].strip()
        if suffix not in VARIABLES:
            close = did_you_mean(name, [PREFIX + v for v in VARIABLES])
            problems.append(
                Diagnostic(
                    "MP201",
                    f"unknown environment variable `{name}`",
                    help=(f"{close} " if close else "")
                    + f"memoplan reads {', '.join(PREFIX + v for v in VARIABLES)}; unset it",
                )
            )
            continue
        if not value or any(c.isspace() or c in ";{}#=\\\"'" for c in value):
            problems.append(Diagnostic("MP202", f"`{name}={environ[name]}` is not one value"))
            continue
        key, form = VARIABLES[suffix]
        found[key] = (name, form.format(value))
    if problems:
        raise PlanError(tuple(problems))
    return found
