"""The runtime interface that generated plan modules are written against.

``memoplan write-module`` writes ``RUNTIME_ABI = N`` into every plan module, and the module calls
:func:`require_abi` when it is imported: silence when this runtime can run interface ``N``,
else ``MP424`` naming both numbers and what to do, before anything is installed.  The number
changes only when generated code and ``memoplan.runtime`` stop fitting each other (a name
generated code calls is removed or changes meaning), not with every release, so a memoplan
upgrade that generates the same code leaves committed plan modules and ``write-module --check``
alone.
"""

from __future__ import annotations

from memoplan.diagnostics import Diagnostic, PlanError

ABI = 1  # the interface this memoplan generates
SUPPORTED_ABIS = frozenset({1})  # the interfaces this runtime runs


def require_abi(abi: object, source: str = "") -> None:
    """Return when this runtime runs plan modules of interface ``abi``; raise PlanError (MP424) else."""
    if isinstance(abi, int) and abi in SUPPORTED_ABIS:
        return
    from memoplan.version import __version__

    newer = isinstance(abi, int) and abi > max(SUPPORTED_ABIS)
    runs = ", ".join(str(n) for n in sorted(SUPPORTED_ABIS))
    raise PlanError(
        (
            Diagnostic(
                "MP424",
                f"the plan module for `{source}` was generated for runtime interface {abi!r}; this memoplan "
                f"({__version__}) runs interface {runs}",
                help=("upgrade memoplan to the release that generated the module, or " if newer else "")
                + "regenerate the module with this memoplan: memoplan write-module PLAN -o FILE.py",
            ),
        )
    )
