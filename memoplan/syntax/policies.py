"""Syntax stage: every policy once — its name, its AST node and its ``key = value`` options.

The builder reads a policy's options from its :class:`PolicySpec` (unknown, repeated,
mistyped and out-of-range options are reported from the table), the formatter writes them in
the table's order, the resolver fills the options left out with :attr:`Option.default`, and
the language server completes and explains them from it; ``tests/syntax/test_policy_specs.py``
checks the reference's option tables (``grammar/README.md``) against it.  This is the model of
``syntax/blocks.py``'s ``SCHEMA`` for config blocks.

Adding an option to a policy: a field on its AST node (``syntax/ast.py``, named as the key,
``None`` when left out) and an :class:`Option` here; a row in the reference's table.  Options
of kind ``list`` are read and written by the policy's own code (``split``, ``args``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from memoplan.enums import Aspect, Boundaries, Validate
from memoplan.syntax import ast

__all__ = ["POLICIES", "Option", "PolicySpec", "policy_names", "spec_of", "with_defaults"]


@dataclass(frozen=True)
class Option:
    """One ``key = value`` option of a policy.

    ``kind``: ``int`` (an integer >= ``minimum``), ``float`` (a number > 0), ``bool``
    (``true``/``false``), ``choice`` (a word of the enum ``choices``) or ``list`` (read by
    the policy's own code).  ``default``: the value the resolver reads when the option is left
    out (``None``: it stays unset); ``default_text``: the reference's default column.
    """

    key: str
    kind: str
    minimum: int | None = None
    choices: type[enum.Enum] | None = None
    default: object = None
    default_text: str = ""

    @property
    def words(self) -> tuple[str, ...]:
        """The words the option takes (empty for numbers and lists)."""
        if self.choices is not None:
            return tuple(member.value for member in self.choices)
        return ("true", "false") if self.kind == "bool" else ()

    @property
    def values_text(self) -> str:
        """What the reference's values column says, for options that take words."""
        return ", ".join(f"`{word}`" for word in self.words)


@dataclass(frozen=True)
class PolicySpec:
    """A policy: its keyword, the AST node it builds, what about a module it decides (per module
    and aspect the most specific rule wins) and its options, in the order written."""

    name: str
    node: type
    aspect: Aspect
    options: tuple[Option, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(option.key for option in self.options)

    def option(self, key: str) -> Option | None:
        return next((option for option in self.options if option.key == key), None)


def _boolean(key: str) -> Option:
    return Option(key, "bool", default=False, default_text="`false`")


#: Every policy, in the reference's order (section 4).
POLICIES: dict[str, PolicySpec] = {
    "checkpoint": PolicySpec(
        "checkpoint",
        ast.Checkpoint,
        Aspect.RECOMPUTE,
        (
            Option("segments", "int", minimum=1, default_text="none: one region"),
            Option("split", "list", default_text="none: one region"),
            Option("rng", "choice", choices=ast.RngMode, default=ast.RngMode.PRESERVE, default_text="`preserve`"),
            # Left out, memoplan chooses the implementation; as a decision it reads as `torch`.
            Option(
                "impl", "choice", choices=ast.CheckpointImpl, default=ast.CheckpointImpl.TORCH, default_text="chosen"
            ),
            _boolean("nested"),
            # The op families whose outputs a region keeps (ast.SAVEABLE_OPS); read by the builder.
            Option("save", "list", default=(), default_text="none: recompute every op"),
        ),
    ),
    "compress": PolicySpec(
        "compress",
        ast.Compress,
        Aspect.COMPRESS,
        (
            Option("tolerance", "float", default_text="required for a lossy codec"),
            Option("validate", "choice", choices=Validate, default=Validate.SAMPLE, default_text="`sample`"),
        ),
    ),
    "temporal_chunk": PolicySpec(
        "temporal_chunk",
        ast.TemporalChunk,
        Aspect.CHUNK,
        (
            Option("args", "list", default=(0,), default_text="`[0]`"),
            _boolean("allow_nonequivalent"),
            Option("boundaries", "choice", choices=Boundaries, default=Boundaries.KEEP, default_text="`keep`"),
        ),
    ),
    "keep": PolicySpec("keep", ast.Keep, Aspect.RECOMPUTE),
    "state": PolicySpec("state", ast.State, Aspect.STATE),
    "buffers": PolicySpec("buffers", ast.Buffers, Aspect.BUFFERS),
}


def policy_names() -> tuple[str, ...]:
    return tuple(POLICIES)


def spec_of(policy: object) -> PolicySpec:
    """The spec of a policy node (of its class, or of the class it derives from)."""
    for spec in POLICIES.values():
        if isinstance(policy, spec.node):
            return spec
    raise TypeError(f"not a policy: {policy!r}")


def with_defaults(policy: object) -> dict[str, object]:
    """The options left out of ``policy`` that have a default, as ``{key: default}``."""
    return {
        option.key: option.default
        for option in spec_of(policy).options
        if option.default is not None and getattr(policy, option.key) is None
    }
