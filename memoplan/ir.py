"""IR stage: the ResolvedPlan — every decision bound to a real module, frozen, sorted, hashable.

The resolver produces it, the code generator prints it.  Modules appear in
natural path order (``layers.2`` before ``layers.10``) whatever the model's
registration order, so the same plan and model always give the same IR.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from memoplan.diagnostics import Diagnostic
from memoplan.enums import Boundaries, Codec, Validate
from memoplan.syntax.ast import Budget, Size, StateMode
from memoplan.syntax.blocks import DtrConfig, MemongerConfig, MemoryConfig, SublinearConfig


@dataclass(frozen=True)
class Origin:
    """The plan rule behind a decision: its line, its selector and the policy as written."""

    file: str
    line: int
    selector: str
    policy: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class CheckpointAction:
    """Recompute in backward.  ``groups``: child names of each region of an ``nn.Sequential``
    (``segments``); ``None``: the whole module is one region."""

    origin: Origin
    groups: tuple[tuple[str, ...], ...] | None = None
    preserve_rng: bool = True
    nested: bool = False
    save: tuple[str, ...] = ()  # op families whose outputs the region keeps (`save = [...]`)


@dataclass(frozen=True)
class CompressAction:
    origin: Origin
    codec: Codec
    tolerance: float | None = None
    validate: Validate = Validate.SAMPLE


@dataclass(frozen=True)
class TemporalChunkAction:
    origin: Origin
    chunks: int
    dim: int
    args: tuple[int | str, ...] = (0,)
    allow_nonequivalent: bool = False
    boundaries: Boundaries = Boundaries.KEEP

    @property
    def recompute_boundaries(self) -> bool:
        """Whether the states chunks start from are recomputed in backward (``boundaries = recompute``)."""
        return self.boundaries is Boundaries.RECOMPUTE


@dataclass(frozen=True)
class StateAction:
    origin: Origin
    mode: StateMode


@dataclass(frozen=True)
class ModulePlan:
    """What the plan does to one module (at least one field is set)."""

    path: str
    type_name: str  # f"{cls.__module__}.{cls.__qualname__}"
    checkpoint: CheckpointAction | None = None
    keep: Origin | None = None
    compress: CompressAction | None = None
    temporal_chunk: TemporalChunkAction | None = None
    state: StateAction | None = None
    buffers_commit_once: Origin | None = None
    # Paths, relative to this module ("" for itself), of the `state = functional`
    # modules inside its region, whose state the region threads.
    region_state: tuple[str, ...] = ()
    # A candidate of the plan's `dtr` block (its line): its saved activations may be evicted.
    evict: Origin | None = None

    @property
    def changes_forward(self) -> bool:
        return any((self.checkpoint, self.compress, self.temporal_chunk))

    def decisions(self) -> Iterator[tuple[str, Origin]]:
        """(policy as written, its rule) of every decision for this module, in the order the
        compiled header and ``memoplan report`` list them; a ``dtr`` candidate last."""
        for action in (self.checkpoint, self.compress, self.temporal_chunk, self.state):
            if action is not None:
                yield action.origin.policy, action.origin
        for origin in (self.keep, self.buffers_commit_once):
            if origin is not None:
                yield origin.policy, origin
        if self.evict is not None:
            yield "dtr (may be evicted)", self.evict


@dataclass(frozen=True)
class ResolvedPlan:
    file: str
    modules: tuple[ModulePlan, ...]
    budget: Budget | None = None
    dtr: DtrConfig | None = None
    sublinear: SublinearConfig | None = None
    memory: MemoryConfig | None = None
    memonger: MemongerConfig | None = None
    warnings: tuple[Diagnostic, ...] = ()

    def module(self, path: str) -> ModulePlan | None:
        return next((m for m in self.modules if m.path == path), None)

    @property
    def digest(self) -> str:
        """A stable identity of the decisions (not of comments or line numbers)."""
        rows = []
        for m in self.modules:
            rows.append(
                repr(
                    (
                        m.path,
                        m.type_name,
                        _strip(m.checkpoint),
                        m.keep is not None,
                        _strip(m.compress),
                        _strip(m.temporal_chunk),
                        _strip(m.state),
                        m.buffers_commit_once is not None,
                        m.region_state,
                    )
                )
            )
        if self.memory is not None:  # left out without a memory block, so earlier plan ids stay
            rows.append(repr(("memory", self.memory, self.reserve_bytes)))
        if self.memonger is not None:  # the same: left out without a memonger block
            rows.append(repr(("memonger", self.memonger)))
        if self.dtr is not None:  # the same: left out without a dtr block
            rows.append(repr(("dtr", self.dtr, tuple(m.path for m in self.modules if m.evict is not None))))
        return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]

    @property
    def reserve_bytes(self) -> int | None:
        """The budget in bytes, which ``static_memory_policy`` 2 and 4 reserve; None for a share."""
        if self.budget is not None and isinstance(self.budget.amount, Size):
            return self.budget.amount.bytes
        return None


# Fields added after plan ids were first committed, with their defaults: left out of the
# digest while at the default, so a plan that does not use them keeps its id.
_LATER_FIELDS = {"boundaries": Boundaries.KEEP, "save": ()}
# Fields hashed in the form they had when plan ids were first committed: name -> that form.
_HASHED_AS = {"boundaries": lambda v: ("recompute_boundaries", v is Boundaries.RECOMPUTE)}


def _strip(action) -> tuple | None:
    if action is None:
        return None
    return tuple(
        _HASHED_AS[k](v) if k in _HASHED_AS else (k, v)
        for k, v in vars(action).items()
        if k != "origin" and not (k in _LATER_FIELDS and v == _LATER_FIELDS[k])
    )


def path_key(path: str) -> tuple:
    """Natural sort key: ``layers.2`` < ``layers.10``; numbers sort before names."""
    key = []
    for segment in path.split("."):
        # ASCII digits only: "²".isdigit() is true but int("²") fails.  The segment itself
        # breaks ties ("1" vs "01"), so the order never depends on registration order.
        # Compared as digit strings, not via int(), which refuses more than 4300 digits.
        if segment.isascii() and segment.isdigit():
            digits = segment.lstrip("0")
            key.append((0, len(digits), digits, segment))
        else:
            key.append((1, 0, segment, ""))
    return tuple(key)
