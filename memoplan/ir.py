"""IR stage: the ResolvedPlan — every decision bound to a real module, frozen, sorted, hashable.

The resolver produces it, the code generator prints it.  Modules appear in
natural path order (``layers.2`` before ``layers.10``) whatever the model's
registration order, so the same plan and model always give the same IR.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import ClassVar, TypeVar, get_args

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
class _ActionBase:
    """What a plan does to a module, bound by one rule (``origin``).  ``kind`` names the action
    as :class:`ModulePlan`'s read-only properties do (``module.checkpoint``)."""

    kind: ClassVar[str]
    origin: Origin

    @property
    def written(self) -> str:
        """The decision as the compiled header and ``memoplan report`` list it."""
        return self.origin.policy


@dataclass(frozen=True)
class CheckpointAction(_ActionBase):
    """Recompute in backward.  ``groups``: child names of each region of an ``nn.Sequential``
    (``segments``); ``None``: the whole module is one region."""

    kind: ClassVar[str] = "checkpoint"
    groups: tuple[tuple[str, ...], ...] | None = None
    preserve_rng: bool = True
    nested: bool = False
    save: tuple[str, ...] = ()  # op families whose outputs the region keeps (`save = [...]`)


@dataclass(frozen=True)
class CompressAction(_ActionBase):
    kind: ClassVar[str] = "compress"
    codec: Codec
    tolerance: float | None = None
    validate: Validate = Validate.SAMPLE


@dataclass(frozen=True)
class TemporalChunkAction(_ActionBase):
    kind: ClassVar[str] = "temporal_chunk"
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
class StateAction(_ActionBase):
    kind: ClassVar[str] = "state"
    mode: StateMode


@dataclass(frozen=True)
class KeepAction(_ActionBase):
    """``keep``: the module's activations are saved as autograd saves them (no region)."""

    kind: ClassVar[str] = "keep"


@dataclass(frozen=True)
class BuffersCommitOnceAction(_ActionBase):
    """``buffers = commit_once``: a recomputed region writes the module's buffers once."""

    kind: ClassVar[str] = "buffers_commit_once"


@dataclass(frozen=True)
class EvictAction(_ActionBase):
    """A candidate of the plan's ``dtr`` block (its line): its saved activations may be evicted."""

    kind: ClassVar[str] = "evict"

    @property
    def written(self) -> str:
        return "dtr (may be evicted)"


Action = (
    CheckpointAction
    | CompressAction
    | TemporalChunkAction
    | StateAction
    | KeepAction
    | BuffersCommitOnceAction
    | EvictAction
)
# The canonical order of a module's actions: the order the compiled header and ``memoplan
# report`` list its decisions in, a ``dtr`` candidate last.
ACTION_TYPES: tuple[type[_ActionBase], ...] = get_args(Action)
_RANK = {t: i for i, t in enumerate(ACTION_TYPES)}
# The actions that change the module's forward (memoplan runs it in a region of its own).
FORWARD_ACTIONS = (CheckpointAction, CompressAction, TemporalChunkAction)
# The actions that open that region (``compress`` acts inside one, it opens none).
REGION_ACTIONS = (CheckpointAction, TemporalChunkAction)

A = TypeVar("A", bound=_ActionBase)


@dataclass(frozen=True)
class ModulePlan:
    """What the plan does to one module: its ``actions``, at most one of each type, kept in the
    canonical order (:data:`ACTION_TYPES`) whatever order they are given in."""

    path: str
    type_name: str  # f"{cls.__module__}.{cls.__qualname__}"
    actions: tuple[Action, ...] = ()
    # Paths, relative to this module ("" for itself), of the `state = functional`
    # modules inside its region, whose state the region threads.
    region_state: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for action in self.actions:
            if type(action) not in _RANK:
                raise TypeError(f"not an IR action: {action!r}")
        ordered = tuple(sorted(self.actions, key=lambda a: _RANK[type(a)]))
        if len({type(a) for a in ordered}) != len(ordered):
            raise ValueError(f"`{self.path}`: two actions of one type: {ordered!r}")
        object.__setattr__(self, "actions", ordered)

    def action(self, kind: type[A]) -> A | None:
        """This module's action of type ``kind``, or None."""
        return next((a for a in self.actions if type(a) is kind), None)

    def with_action(self, action: Action) -> ModulePlan:
        """This plan with ``action`` added (replacing one of its type)."""
        kept = tuple(a for a in self.actions if type(a) is not type(action))
        return replace(self, actions=kept + (action,))

    @property
    def checkpoint(self) -> CheckpointAction | None:
        return self.action(CheckpointAction)

    @property
    def compress(self) -> CompressAction | None:
        return self.action(CompressAction)

    @property
    def temporal_chunk(self) -> TemporalChunkAction | None:
        return self.action(TemporalChunkAction)

    @property
    def state(self) -> StateAction | None:
        return self.action(StateAction)

    @property
    def keep(self) -> KeepAction | None:
        return self.action(KeepAction)

    @property
    def buffers_commit_once(self) -> BuffersCommitOnceAction | None:
        return self.action(BuffersCommitOnceAction)

    @property
    def evict(self) -> EvictAction | None:
        return self.action(EvictAction)

    @property
    def changes_forward(self) -> bool:
        return any(isinstance(a, FORWARD_ACTIONS) for a in self.actions)

    def decisions(self) -> Iterator[tuple[str, Origin]]:
        """(policy as written, its rule) of every decision for this module, in the order the
        compiled header and ``memoplan report`` list them; a ``dtr`` candidate last."""
        for action in self.actions:
            yield action.written, action.origin


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
