"""Planner stage: the one table of the planner's knobs, the options of ``memoplan plan`` and :func:`memoplan.plan`.

Each :class:`Knob` says once what a planning option is: its name (the keyword of
:func:`memoplan.plan` and the field of :class:`~memoplan.planner.request.PlanRequest`), its
command-line flag, its kind (text, a word among choices, a flag), default, choices and help.
The readers: ``memoplan/cli_parser.py`` builds the ``plan`` command's options from
:data:`KNOBS` (and the sublinear search's group from :data:`SUBLINEAR_KNOBS`), ``cli_plan`` and
:func:`memoplan.plan` copy them into a :class:`~memoplan.planner.request.PlanRequest`, which checks
the choices with :func:`refused_choice` and which :func:`memoplan.planner.pipeline.run` plans, and
``tests/planner/test_knobs.py`` checks that the parser, the signature of :func:`memoplan.plan` and
the request's fields agree with the table.  Pure Python: no torch (the parser reads it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from memoplan.deprecations import BUDGET_WORDS
from memoplan.planner.budgets import COVERAGE_WORDS
from memoplan.planner.config import Planner
from memoplan.planner.presets import PRESETS

__all__ = ["KNOBS", "SUBLINEAR_KNOBS", "Knob", "knob", "refused_choice"]


@dataclass(frozen=True)
class Knob:
    """One option of a planning run.

    ``kind``: ``text`` (a value, parsed later), ``choice`` (one of ``choices``) or ``flag``
    (true when given); ``renames``: old words the command line turns into new ones (MP540);
    ``api``/``request``: a keyword of :func:`memoplan.plan` / a field of ``PlanRequest``
    (``dtr`` is the command line's alone).
    """

    name: str
    kind: str
    help: str | None
    metavar: str | None = None
    choices: Callable[[], tuple[str, ...]] | None = None
    renames: Mapping[str, str] = field(default_factory=dict)
    default: object = None
    api: bool = True
    request: bool = True

    @property
    def flag(self) -> str:
        """The command line's spelling: ``--name`` with ``-`` for ``_``."""
        return "--" + self.name.replace("_", "-")

    def allowed(self) -> tuple[str, ...]:
        """The words accepted (empty: any text)."""
        return self.choices() if self.choices is not None else ()


def _presets_help() -> str:
    return "; ".join(f"{p.name}: {p.summary}" for p in PRESETS.values())


PLAN_METHOD_HELP = (
    "auto (default): profile by measuring (estimating if the step runs out of memory, one timed step), "
    "estimate every trial of the search on fake tensors and check the written plan with one real planned "
    "step (searching again with real steps if it misses a hard budget); measured: real steps for the profile "
    "(3 timed) and for every trial; estimated: the profile estimated too, even when the step fits"
)
METHODS = ("auto", "measured", "estimated")

KNOBS: tuple[Knob, ...] = (
    Knob(
        "budget",
        "text",
        "bytes (`4 GiB`), share of the unplanned peak (`50%%`, `0.5`; of the estimated peak when the "
        "step does not fit), `device` or `device - 2GiB` (CUDA: what the allocator can use, less what the "
        "model holds before the step), optionally `hard` or `hint` (`4 GiB hint`), or a coverage budget "
        f"({', '.join(COVERAGE_WORDS)}: that share of the candidates checkpointed); default: the preset's",
        metavar="B",
        renames=BUDGET_WORDS,
    ),
    Knob(
        "coverage",
        "text",
        "checkpoint a share (`60%%`, `0.6`) or a count (`5`) of the candidate modules, largest "
        "activations first (SpikingJelly's gc_target_budget_ratio / max_gc_wrapped_modules): how many "
        "modules, not a share of the peak; instead of --budget",
        metavar="C",
    ),
    Knob(
        "preset",
        "choice",
        _presets_help() + " (explicit --budget, --planner, --hint override its fields)",
        choices=lambda: tuple(PRESETS),
    ),
    Knob(
        "planner",
        "choice",
        "search for byte budgets (default: the preset's, optimal)",
        choices=lambda: tuple(p.value for p in Planner),
    ),
    Knob("hint", "flag", "the budget is a hint: report, do not fail, when missed", default=False),
    Knob(
        "nested",
        "flag",
        "require the parts of each block among the candidates (the optimal planner offers them, with their "
        "save variants, for every byte budget; an error with another planner or a coverage budget)",
        default=False,
    ),
    Knob(
        "dtr",
        "flag",
        "write a `dtr` block (dynamic eviction at run time) whose threshold meets the byte budget, "
        "instead of checkpoint rules; the simulator's prediction goes in the plan's comments",
        default=False,
        api=False,
    ),
    Knob("method", "choice", PLAN_METHOD_HELP, choices=lambda: METHODS, default="auto"),
)

# The sublinear search's knobs (with --planner sublinear): text read as the `sublinear` block's
# entries, so their types, ranges and defaults are the language's; the command line's alone.
SUBLINEAR_KNOBS: tuple[Knob, ...] = tuple(
    Knob(key, "text", None, metavar=metavar, api=False, request=False)
    for key, metavar in (
        ("thresh_nr_try", "N"),
        ("genetic_nr_iter", "N"),
        ("genetic_pool_size", "N"),
        ("lb_memory", "SIZE"),
        ("num_worker", "N"),
    )
)


def knob(name: str) -> Knob:
    """The row of ``name`` (KeyError: no such knob)."""
    for row in KNOBS + SUBLINEAR_KNOBS:
        if row.name == name:
            return row
    raise KeyError(name)


def refused_choice(name: str, value: object) -> str | None:
    """Why ``value`` is no word of knob ``name`` (None: it is one, or not given)."""
    allowed = knob(name).allowed()
    if value is None or not allowed or value in allowed:
        return None
    return f"no {name} `{value}`: one of {', '.join(allowed)}"
