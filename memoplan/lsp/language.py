"""Editor stage: the words of the language in each place, read from the parser's own types.

Completion offers what the parser accepts where the cursor is: statements at the
top, policies inside a rule, each policy's options and their values (its spec in
``memoplan.syntax.policies``), the codecs (``memoplan.enums``' registry), each config
block's keys and choices (``memoplan.syntax.blocks.SCHEMA``).  Nothing is listed
twice, so a new option of the language reaches the editor by itself.
"""

from __future__ import annotations

from memoplan.syntax import ast
from memoplan.syntax.blocks import SCHEMA
from memoplan.syntax.build import DTYPES, POLICY_NAMES, STATEMENT_NAMES
from memoplan.syntax.policies import POLICIES as POLICY_SPECS

# The AST class of each policy word.
POLICY_CLASSES: dict[str, type] = {name: spec.node for name, spec in POLICY_SPECS.items()}

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


def policy_options(policy: str) -> tuple[str, ...]:
    """The ``key = value`` options of a policy, in the order of its spec (syntax/policies.py)."""
    spec = POLICY_SPECS.get(policy)
    return () if spec is None else spec.keys


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


def _option_words(policy: str, option: str) -> tuple[str, ...]:
    if option == "=" and policy in POLICY_ASSIGNMENTS:
        return tuple(member.value for member in POLICY_ASSIGNMENTS[policy])
    spec = POLICY_SPECS.get(policy)
    found = None if spec is None else spec.option(option)
    return () if found is None else found.words


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
