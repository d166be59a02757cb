"""Typed budgets of the planner: bytes, a share of the unplanned peak, a share of the candidates.

Also the byte and duration formats that budgets, results and plan comments print.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from fractions import Fraction

from memoplan.diagnostics import printable
from memoplan.syntax import ast

__all__ = [
    "Asked",
    "AskedBudget",
    "Budget",
    "ByteBudget",
    "Bytes",
    "COVERAGE_WORDS",
    "Coverage",
    "DeviceBudget",
    "FractionOfPeak",
    "LeastPeak",
    "Preset",
    "budget_from_ast",
    "budget_statement",
    "byte_limit",
    "format_duration",
    "format_size",
    "is_hard",
    "mode_line",
    "mode_of",
    "mode_word",
    "parse_coverage",
    "read_budget",
]


# ---------------------------------------------------------------- budgets


def _exact_fraction(value) -> Fraction:
    """A number as an exact fraction; floats are read as the decimal they print as (0.6 -> 3/5)."""
    if isinstance(value, bool):
        raise TypeError("a budget amount is a number, not a bool")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float) and math.isfinite(value):
        return Fraction(repr(value))
    raise TypeError(f"not a finite number: {value!r}")


def _share(value, what: str) -> Fraction:
    """``value`` as an exact fraction in (0, 1], or ValueError naming ``what`` it is."""
    exact = _exact_fraction(value)
    if not 0 < exact <= 1:
        shown = f"{float(value):g}" if isinstance(value, Fraction) else repr(value)  # not `Fraction(-1, 1)`
        raise ValueError(f"{what} is in (0, 1], got {shown}")
    return exact


def _percent(share: Fraction) -> str:
    """``share`` as a percentage: whole numbers exactly, others as ``%g`` prints them."""
    pct = share * 100
    return str(pct.numerator) if pct.denominator == 1 else f"{float(pct):g}"


def format_size(n: int) -> str:
    """Bytes for people: ``12.0 MiB``."""
    if n < 1024:
        return f"{n} B"
    for unit, factor in (("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3)):
        if n < 1024 * factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n / 1024**4:.1f} TiB"


def format_duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} us"


@dataclass(frozen=True)
class Bytes:
    """A byte budget: the estimated peak must be at most ``amount`` bytes."""

    amount: int

    def __post_init__(self) -> None:
        if isinstance(self.amount, bool) or not isinstance(self.amount, int) or self.amount < 0:
            raise ValueError(f"a byte budget is an integer >= 0, got {self.amount!r}")

    def limit(self, unplanned_peak: int) -> int:
        return self.amount

    def describe(self, unplanned_peak: int) -> str:
        return f"{format_size(self.amount)} ({self.amount} B)"


@dataclass(frozen=True)
class FractionOfPeak:
    """A share of the unplanned estimated peak, in (0, 1]: ``budget 60%`` or ``budget 0.6``.

    The limit is ``floor(fraction * unplanned)`` bytes, computed exactly (0.6 is 3/5, not the
    binary float just below it).
    """

    fraction: Fraction

    def __post_init__(self) -> None:
        object.__setattr__(self, "fraction", _share(self.fraction, "a fraction of the unplanned peak"))

    @classmethod
    def percent(cls, value: int | float | Fraction) -> FractionOfPeak:
        return cls(_exact_fraction(value) / 100)

    def limit(self, unplanned_peak: int) -> int:
        return math.floor(unplanned_peak * self.fraction)

    def describe(self, unplanned_peak: int) -> str:
        return f"{_percent(self.fraction)}% of the unplanned peak = {format_size(self.limit(unplanned_peak))}"


@dataclass(frozen=True)
class Coverage:
    """A share of the candidates, in (0, 1], taken largest ``saved_bytes`` first.

    ``count(n) = ceil(share * n)``: at least that share of the candidates is covered.
    """

    share: Fraction
    #: A count instead of a share (SpikingJelly's ``max_gc_wrapped_modules``): at most this many
    #: candidates, largest first; ``share`` is then 1.
    modules: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "share", _share(self.share, "a coverage share"))
        count = self.modules
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise ValueError(f"a coverage count is an integer >= 1, got {count!r}")

    @classmethod
    def of_modules(cls, count: int) -> Coverage:
        """At most ``count`` candidates, largest ``saved_bytes`` first."""
        return cls(Fraction(1), count)

    def count(self, candidates: int) -> int:
        if self.modules is not None:
            return min(candidates, self.modules)
        return math.ceil(candidates * self.share)

    def describe(self, unplanned_peak: int) -> str:
        if self.modules is not None:
            return f"{self.modules} of the candidates at most, largest activations first"
        return f"{_percent(self.share)}% of the candidates, largest activations first"


class Preset(enum.Enum):
    """SpikingJelly's selective budgets: the share of candidates checkpointed."""

    SPEED = Fraction(1, 2)
    BALANCED = Fraction(3, 4)
    MEMORY = Fraction(1)

    @property
    def coverage(self) -> Coverage:
        return Coverage(self.value)

    @property
    def word(self) -> str:
        """Its ``--budget`` word (:data:`COVERAGE_WORDS`)."""
        return next(word for word, preset in COVERAGE_WORDS.items() if preset is self)


#: The coverage budgets' ``--budget`` words: word -> budget.  They say what the budget does, so
#: none is also a ``--preset`` name (their old words, ``speed``, ``balanced`` and ``memory``, are
#: deprecated: :data:`memoplan.deprecations.BUDGET_WORDS`).
COVERAGE_WORDS: dict[str, Preset] = {
    "checkpoint-half": Preset.SPEED,
    "checkpoint-three-quarters": Preset.BALANCED,
    "checkpoint-all": Preset.MEMORY,
}


@dataclass(frozen=True)
class LeastPeak:
    """No limit: the least peak the planner reaches (``--preset memory``'s default).

    Every search the planner has for a budget it cannot meet is run and measured (the least-peak
    set of whole candidates, refined; runs of a chain's children; time chunks of stateful regions;
    parts of blocks with split regions), and the plan with the least measured peak is kept, so no
    byte budget's plan measures lower on the same model and profile.
    """

    def describe(self, unplanned_peak: int) -> str:
        return "the least peak the planner reaches (every search measured, the lowest kept)"


@dataclass(frozen=True)
class DeviceBudget:
    """``device [- SIZE]`` (``memoplan plan --budget``): what the CUDA device can give one step,
    less ``margin`` bytes (SIZE).  It is bytes only once the model is on the device
    (:func:`memoplan.planner.profiling.device_budget.device_budget_bytes`); ``text``: as written, for messages."""

    text: str
    margin: int = 0


ByteBudget = Bytes | FractionOfPeak
Budget = Bytes | FractionOfPeak | Coverage
#: What a budget's text can ask for: bytes, a share of the peak, of the candidates, or the device's.
Asked = Bytes | FractionOfPeak | Coverage | Preset | DeviceBudget


@dataclass(frozen=True)
class AskedBudget:
    """A budget as a planning run is asked for it (``--budget``, ``--coverage``, ``budget=``, or the
    ``budget`` statement of the plan completed), read once: the typed ``amount`` and its mode,
    ``hard`` (True: ``hard``, False: ``hint``, None: neither written, so the preset's)."""

    amount: Asked
    hard: bool | None = None


def budget_from_ast(budget: ast.Budget) -> ByteBudget:
    """The typed budget of a plan's ``budget`` statement (its hard/hint mode is the caller's)."""
    amount = budget.amount
    if isinstance(amount, ast.Size):
        return Bytes(amount.bytes)
    if isinstance(amount, ast.Percent):
        return FractionOfPeak.percent(amount.value)
    return FractionOfPeak(amount)  # type: ignore[arg-type]  # __post_init__ reads any finite number exactly


def budget_statement(text: str, origin: str) -> ast.Budget:
    """``text`` read as the language reads a ``budget`` statement's value (``4 GiB``, ``50% hint``,
    ``0.5``), its diagnostics (MP100, MP203, MP204) at ``origin`` (``--budget``, ``--device-memory``):
    the one place a budget's text meets the grammar."""
    from memoplan.syntax import parse

    stmt = parse(f"memplan 1\nbudget {text}\n", origin).budget
    assert stmt is not None, "parse raises PlanError on a budget it cannot read"
    return stmt


def read_budget(text: str) -> AskedBudget:
    """A budget's text (``--budget``, ``budget=``) as the typed value it asks for: ``4 GiB``,
    ``50% hint``, ``0.5`` (the language's ``budget`` statement), a coverage word
    (:data:`COVERAGE_WORDS`; an old one with a DeprecationWarning) or ``device [- SIZE] [hard|hint]``
    (:class:`DeviceBudget`).  Raises :class:`memoplan.PlanError` for text that is not a budget."""
    from memoplan.deprecations import budget_word

    device = _device_form(text)
    if device is not None:
        return device
    word = budget_word(text)
    coverage = COVERAGE_WORDS.get(word.strip().lower())
    if coverage is not None:
        return AskedBudget(coverage)
    stmt = budget_statement(word, "--budget")
    return AskedBudget(budget_from_ast(stmt), None if stmt.mode is None else is_hard(stmt))


def _device_form(text: str) -> AskedBudget | None:
    """``device [- SIZE] [hard|hint]`` (None for other text): what the CUDA device can give a step,
    less SIZE (a size, as the language reads one); MP509 when it is malformed."""
    from memoplan.diagnostics import Diagnostic, PlanError

    head = text.strip()
    if head[:6].lower() != "device":
        return None
    words = head[6:].replace("-", " - ", 1).split()
    hard = None
    if words and words[-1].lower() in {mode.value for mode in ast.BudgetMode}:
        hard = words.pop().lower() == ast.BudgetMode.HARD.value
    margin = None
    if words[:1] == ["-"] and len(words) in (2, 3) and words[1][:1].isdigit():
        margin = budget_statement(" ".join(words[1:]), "--budget")
    if (words and margin is None) or (margin is not None and margin.mode is not None) or head[6:7].isalnum():
        raise PlanError(
            (
                Diagnostic(
                    "MP509", f"`--budget {text}` is not a device budget", help="write `device`, or `device - 2GiB`"
                ),
            )
        )
    amount = budget_from_ast(margin) if margin is not None else Bytes(0)
    if not isinstance(amount, Bytes):
        raise PlanError((Diagnostic("MP509", f"`--budget {text}`: the margin is a size, such as `2GiB`"),))
    return AskedBudget(DeviceBudget(text, amount.amount), hard)


# ---------------------------------------------------------------- hard or hint: one reading, one wording


def is_hard(budget: ast.Budget) -> bool:
    """Whether a plan's ``budget`` statement is hard: ``hard``, or no mode written (the default)."""
    return budget.mode is not ast.BudgetMode.HINT


def mode_of(hard: bool) -> ast.BudgetMode:
    """The statement's mode for ``hard``, as a written plan states it."""
    return ast.BudgetMode.HARD if hard else ast.BudgetMode.HINT


def mode_word(hard: bool) -> str:
    """``hard`` or ``hint``, the language's words (what ``verify`` prints beside a budget)."""
    return mode_of(hard).value


def mode_line(hard: bool, *, estimated: bool = False) -> str:
    """The plan header's ``budget mode``: a hint, or a hard budget verified by measurement (by the
    estimate on fake tensors, ``estimated``, where no real step of the planned model runs here)."""
    if not hard:
        return mode_word(False)
    return f"{mode_word(True)} (verified {'on fake tensors' if estimated else 'by measurement'})"


def parse_coverage(text: str) -> Coverage:
    """``--coverage``: a share of the candidates (``60%``, ``0.6``) or a count (``5``).

    SpikingJelly's ``gc_target_budget_ratio`` and ``max_gc_wrapped_modules``: how many of the
    candidate modules to checkpoint, largest activations first -- not a share of the peak.
    """
    word = text.strip()
    try:
        if word.endswith("%"):
            return Coverage(_exact_fraction(float(word[:-1])) / 100)
        if word.isdigit():
            return Coverage.of_modules(int(word))
        return Coverage(_exact_fraction(float(word)))
    except (TypeError, ValueError) as exc:
        reason = {"in (0, 1]": ": a share is in (0, 1]", ">= 1": ": a count is at least 1"}
        reason_ = next((why for key, why in reason.items() if key in str(exc)), "")
        raise ValueError(
            f"--coverage takes a share of the candidates (`60%`, `0.6`) or a count (`5`), got `{printable(text)}`"
            + reason_
        ) from None


def byte_limit(budget: ByteBudget, unplanned: int) -> int:
    if not isinstance(budget, (Bytes, FractionOfPeak)):
        raise TypeError(f"this planner needs a byte budget (Bytes or FractionOfPeak), got {type(budget).__name__}")
    return budget.limit(unplanned)
