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
