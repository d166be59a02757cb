"""Editor stage: the words of the language in each place, read from the parser's own types.

Completion offers what the parser accepts where the cursor is: statements at the
top, policies inside a rule, each policy's options (the fields of its AST class)
and their values (the enum the field holds, or ``true``/``false``), each config
block's keys and choices (``memoplan.syntax.blocks.SCHEMA``).  Nothing is listed
twice, so a new option of the language reaches the editor by itself.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from functools import cache

from memoplan.syntax import ast
from memoplan.syntax.blocks import SCHEMA
from memoplan.syntax.build import DTYPES, POLICY_NAMES, STATEMENT_NAMES

# The AST class of each policy word.
POLICY_CLASSES: dict[str, type] = {
    "checkpoint": ast.Checkpoint,
    "compress": ast.Compress,
    "temporal_chunk": ast.TemporalChunk,
    "keep": ast.Keep,
    "state": ast.State,
    "buffers": ast.Buffers,
}

# Fields of a policy's class that its syntax spells without `key = value` (or not at all).
_NOT_OPTIONS = {"comments", "span", "codec", "lossy", "chunks", "dim", "mode"}

BLOCK_NAMES = tuple(kind.value for kind in ast.BlockKind)
BUDGET_MODES = tuple(mode.value for mode in ast.BudgetMode)
TENSOR_FUNCTIONS = tuple(fn.value for fn in ast.TensorFn)
TENSOR_KEYWORDS = ("low", "high", "dtype")
# `state = functional`, `buffers = commit_once`: a policy written as one assignment.
POLICY_ASSIGNMENTS = {"state": ast.StateMode, "buffers": ast.BuffersMode}
STATEMENTS = STATEMENT_NAMES
POLICIES = POLICY_NAMES
__all__ = [
    "BLOCK_NAMES",
    "BUDGET_MODES",
    "CODECS",  # noqa: F822 (module __getattr__: follows the registry)
    "DTYPES",
    "POLICIES",
    "STATEMENTS",
    "TENSOR_FUNCTIONS",
    "block_keys",
    "key_values",
    "option_values",
    "policy_options",
]


@cache
def policy_options(policy: str) -> tuple[str, ...]:
    """The ``key = value`` options of a policy, in the order of its AST fields."""
    cls = POLICY_CLASSES.get(policy)
    if cls is None:
        return ()
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in _NOT_OPTIONS)


def _words_of(annotation) -> tuple[str, ...]:
    """The words a field of this type takes: an enum's values, or ``true``/``false``."""
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, enum.Enum):
            return tuple(member.value for member in arg)
        if arg is bool:
            return ("true", "false")
    return ()


def __getattr__(name: str) -> tuple[str, ...]:
    # The codecs come from the registry (memoplan.enums) when asked: one registered later counts.
    if name == "CODECS":
        return tuple(codec.value for codec in ast.Codec)
    if name == "LOSSY_CODECS":
        return tuple(codec.value for codec in ast.Codec if codec.lossy)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def option_values(policy: str, option: str) -> tuple[str, ...]:
    """The words an option takes (empty for numbers and lists)."""
    if policy == "compress" and option == "input":
        return __getattr__("CODECS")
    return _option_words(policy, option)


@cache
def _option_words(policy: str, option: str) -> tuple[str, ...]:
    if option == "=" and policy in POLICY_ASSIGNMENTS:
        return tuple(member.value for member in POLICY_ASSIGNMENTS[policy])
    cls = POLICY_CLASSES.get(policy)
    if cls is None or option not in policy_options(policy):
        return ()
    return _words_of(typing.get_type_hints(cls)[option])


def block_keys(block: str) -> tuple[str, ...]:
    """The keys of a config block, as ``SCHEMA`` lists them."""
    try:
        return tuple(SCHEMA[ast.BlockKind(block)][1])
    except ValueError:
        return ()


def key_values(block: str, key: str) -> tuple[str, ...]:
    """The values a config key takes when it is a choice (as written in a plan)."""
    try:
        spec = SCHEMA[ast.BlockKind(block)][1].get(key)
    except ValueError:
        return ()
    if spec is None or spec.kind != "choice":
        return ()
    return tuple(str(choice) for choice in spec.choices)
