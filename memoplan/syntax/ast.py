"""Syntax stage: the typed, frozen AST of a ``.memplan`` file.

Every node is a frozen dataclass.  Source spans never take part in equality, so
``parse(format_plan(parse(text))) == parse(text)`` holds; comments do take part,
because the formatter must keep them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from memoplan.diagnostics import Span
from memoplan.enums import Boundaries as Boundaries  # values that cross stages: the shared leaf's
from memoplan.enums import Codec as Codec
from memoplan.enums import Validate as Validate

NO_SPAN = Span("<memory>", 0, 0, 0, 0)


def _span():
    return field(default=NO_SPAN, compare=False, repr=False)


@dataclass(frozen=True)
class Comments:
    """Comments attached to a node: whole lines above it and one at the end of its line."""

    leading: tuple[str, ...] = ()
    trailing: str | None = None


NO_COMMENTS = Comments()


# ---------------------------------------------------------------- values


class Unit(enum.Enum):
    """Byte units: binary (KiB = 1024 B) and decimal (KB = 1000 B)."""

    B = ("B", 1)
    KiB = ("KiB", 1024)
    MiB = ("MiB", 1024**2)
    GiB = ("GiB", 1024**3)
    TiB = ("TiB", 1024**4)
    KB = ("KB", 1000)
    MB = ("MB", 1000**2)
    GB = ("GB", 1000**3)
    TB = ("TB", 1000**4)

    @property
    def symbol(self) -> str:
        return self.value[0]

    @property
    def factor(self) -> int:
        return self.value[1]


@dataclass(frozen=True)
class Size:
    amount: int | float
    unit: Unit

    @property
    def bytes(self) -> int:
        return int(round(self.amount * self.unit.factor))


@dataclass(frozen=True)
class Percent:
    value: int | float  # 50 for "50%"

    @property
    def fraction(self) -> float:
        return self.value / 100.0


@dataclass(frozen=True)
class Duration:
    amount: int | float
    unit: str  # "ms" or "s"

    @property
    def seconds(self) -> float:
        return self.amount / 1000.0 if self.unit == "ms" else float(self.amount)


@dataclass(frozen=True)
class Word:
    """A bare identifier used as a value, e.g. ``greedy`` or ``true``."""

    name: str


@dataclass(frozen=True)
class Text:
    """A quoted string value."""

    value: str


@dataclass(frozen=True)
class ValueList:
    items: tuple[Value, ...]


Value = int | float | Size | Percent | Duration | Word | Text | ValueList


# ---------------------------------------------------------------- selectors


@dataclass(frozen=True)
class Name:
    """One literal path segment (a child's name in ``named_modules()``)."""

    text: str


@dataclass(frozen=True)
class Star:
    """``*``: exactly one segment."""


@dataclass(frozen=True)
class DoubleStar:
    """``**``: zero or more segments."""


@dataclass(frozen=True)
class Glob:
    """A segment with wildcards in it, e.g. ``layer*`` or ``1?``: ``*`` stands for any run
    of characters (none too), ``?`` for exactly one; it matches one whole segment, never
    across a ``.``."""

    pattern: str


@dataclass(frozen=True)
class Slice:
    """``[start:stop:step]`` over the integer-named children of the previous segment."""

    start: int | None = None
    stop: int | None = None
    step: int | None = None


@dataclass(frozen=True)
class Index:
    """``[i]`` over the integer-named children of the previous segment (negative counts from the end)."""

    value: int


Segment = Name | Glob | Star | DoubleStar | Slice | Index


@dataclass(frozen=True)
class PathPattern:
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class SelectorTerm:
    """A path pattern, a class filter (short or dotted qualified name), or both."""

    path: PathPattern | None = None
    class_name: str | None = None


@dataclass(frozen=True)
class Selector:
    include: SelectorTerm
    exclude: tuple[SelectorTerm, ...] = ()
    span: Span = _span()


# ---------------------------------------------------------------- policies


class RngMode(enum.Enum):
    PRESERVE = "preserve"  # recompute draws the same random numbers (default)
    OFF = "off"  # skip saving RNG state; refused over random modules


class CheckpointImpl(enum.Enum):
    TORCH = "torch"  # torch.utils.checkpoint, non-reentrant


class StateMode(enum.Enum):
    FUNCTIONAL = "functional"


class BuffersMode(enum.Enum):
    COMMIT_ONCE = "commit_once"


@dataclass(frozen=True)
class Checkpoint:
    segments: int | None = None
    split: tuple[str, ...] | None = None  # children of an nn.Sequential that start a new region
    rng: RngMode | None = None
    impl: CheckpointImpl | None = None
    nested: bool | None = None
    save: tuple[str, ...] | None = None  # ops whose outputs the region keeps (SAVEABLE_OPS), in order
    comments: Comments = NO_COMMENTS
    span: Span = _span()


#: The op families ``checkpoint save = [...]`` names: a region keeps their outputs from the
#: forward and recomputes every other op in backward (memoplan.runtime.saving maps them to aten ops).
SAVEABLE_OPS: tuple[str, ...] = ("attention", "conv", "matmul")


def saved_family(name: str) -> str | None:
    """The family a ``save`` selector names: ``matmul`` (every matmul) and ``matmul_3`` (the
    region's third) are both ``matmul``; None for a name that is neither."""
    if name in SAVEABLE_OPS:
        return name
    family, _, place = name.rpartition("_")
    return family if family in SAVEABLE_OPS and place.isdigit() and place[0] != "0" else None


@dataclass(frozen=True)
class Compress:
    codec: Codec
    lossy: bool = False
    tolerance: float | None = None
    validate: Validate | None = None
    comments: Comments = NO_COMMENTS
    span: Span = _span()


@dataclass(frozen=True)
class TemporalChunk:
    chunks: int
    dim: int
    args: tuple[int | str, ...] | None = None
    allow_nonequivalent: bool | None = None
    boundaries: Boundaries | None = None
    comments: Comments = NO_COMMENTS
    span: Span = _span()


@dataclass(frozen=True)
class Keep:
    comments: Comments = NO_COMMENTS
    span: Span = _span()


@dataclass(frozen=True)
class State:
    mode: StateMode
    comments: Comments = NO_COMMENTS
    span: Span = _span()


@dataclass(frozen=True)
class Buffers:
    mode: BuffersMode
    comments: Comments = NO_COMMENTS
    span: Span = _span()


Policy = Checkpoint | Compress | TemporalChunk | Keep | State | Buffers


# ---------------------------------------------------------------- statements


class TensorFn(enum.Enum):
    RANDN = "randn"
    RAND = "rand"
    RANDINT = "randint"
    ZEROS = "zeros"
    ONES = "ones"


@dataclass(frozen=True)
class TensorSpec:
    """An inline example tensor such as ``randn(4, 3, 32, 32)`` or ``randint(4, 16, high=100)``."""

    fn: TensorFn
    shape: tuple[int, ...]
    low: int | None = None
    high: int | None = None
    dtype: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class ModelStmt:
    spec: str
    comments: Comments = NO_COMMENTS
    span: Span = _span()


@dataclass(frozen=True)
class ExampleStmt:
    """Either an import spec (``"pkg.mod:make_inputs"``) or inline tensor specs."""

    spec: str | None = None
    tensors: tuple[TensorSpec, ...] = ()
    comments: Comments = NO_COMMENTS
    span: Span = _span()


@dataclass(frozen=True)
class ModuleRule:
    selector: Selector
    policies: tuple[Policy, ...]
    comments: Comments = NO_COMMENTS
    closing: tuple[str, ...] = ()  # comment lines just before the closing brace
    span: Span = _span()


class BudgetMode(enum.Enum):
    HARD = "hard"  # verified by measurement; an error when it cannot be met
    HINT = "hint"  # the planner aims for it; exceeding it is reported, not an error


@dataclass(frozen=True)
class Budget:
    amount: Size | Percent | float  # bytes, percentage or fraction of the unplanned peak
    mode: BudgetMode | None = None  # None: the default (hard)
    comments: Comments = NO_COMMENTS
    span: Span = _span()


class BlockKind(enum.Enum):
    DTR = "dtr"
    SUBLINEAR = "sublinear"
    MEMORY = "memory"
    MEMONGER = "memonger"
    STEP = "step"


@dataclass(frozen=True)
class ConfigEntry:
    key: str
    value: Value
    comments: Comments = NO_COMMENTS
    span: Span = _span()


@dataclass(frozen=True)
class ConfigBlock:
    kind: BlockKind
    entries: tuple[ConfigEntry, ...]
    comments: Comments = NO_COMMENTS
    closing: tuple[str, ...] = ()
    span: Span = _span()


Statement = ModelStmt | ExampleStmt | ModuleRule | Budget | ConfigBlock


@dataclass(frozen=True)
class Plan:
    version: int
    statements: tuple[Statement, ...]
    header_comments: Comments = NO_COMMENTS
    trailing: tuple[str, ...] = ()  # comment lines after the last statement
    file: str = field(default="<memory>", compare=False)
    source: str = field(default="", compare=False, repr=False)

    @property
    def rules(self) -> tuple[ModuleRule, ...]:
        return tuple(s for s in self.statements if isinstance(s, ModuleRule))

    @property
    def model(self) -> ModelStmt | None:
        return next((s for s in self.statements if isinstance(s, ModelStmt)), None)

    @property
    def example(self) -> ExampleStmt | None:
        return next((s for s in self.statements if isinstance(s, ExampleStmt)), None)

    @property
    def budget(self) -> Budget | None:
        return next((s for s in self.statements if isinstance(s, Budget)), None)

    def block(self, kind: BlockKind) -> ConfigBlock | None:
        return next((s for s in self.statements if isinstance(s, ConfigBlock) and s.kind is kind), None)
