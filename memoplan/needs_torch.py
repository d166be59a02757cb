"""PyTorch is an extra: the syntax tools install and run without it, the rest says how to get it.

``pip install memoplan`` brings the parser, the formatter, the rule reference and the language
server's syntax features (lark, jinja2; pygls with the ``lsp`` extra): what the pre-commit hooks
and an editor need, in a few megabytes.  Every command that builds or runs a model needs torch:
``pip install 'memoplan[torch]'`` installs the release memoplan is tested with
(:data:`TORCH_RANGE`, the ``torch`` extra in ``pyproject.toml``), or install torch first, the
build you want (CPU, CUDA), as PyTorch's own instructions say.

Without torch, such a command stops with ``MP550`` (the CLI) or a ``ModuleNotFoundError`` that
says the same (the Python API); this module imports nothing heavy.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from memoplan.diagnostics import Diagnostic, PlanError

# The torch releases memoplan is tested with: the `torch` extra (tests/test_packaging.py checks
# that pyproject.toml says the same).  memoplan uses a few private torch APIs (dispatch modes,
# checkpoint internals), so a release outside the range may not work.
TORCH_RANGE = ">=2.13,<2.14"
INSTALL = "pip install 'memoplan[torch]'"


def torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


def is_missing_torch(exc: BaseException) -> bool:
    """Whether ``exc`` is the failed import of torch (or of one of its modules) because torch is not installed.

    A torch module missing from an installed torch (another release) is not: that error stays as it is."""
    if not isinstance(exc, ModuleNotFoundError) or (exc.name or "").split(".")[0] != "torch":
        return False
    return not torch_installed()


def hint(what: str) -> str:
    """``what`` needs PyTorch, which is not installed, and how to install it."""
    return (
        f"{what} needs PyTorch, which is not installed (memoplan installs without it): "
        f"{INSTALL} (torch{TORCH_RANGE}, the releases memoplan is tested with), "
        "or install the torch build you want first"
    )


def missing_torch_error(command: str) -> PlanError:
    """``MP550`` for ``memoplan COMMAND`` run where torch cannot be imported."""
    return PlanError(
        (
            Diagnostic(
                "MP550",
                hint(f"`memoplan {command}`"),
                help="`memoplan check --syntax-only`, `fmt`, `rule` and the language server's syntax "
                "checks work without it",
            ),
        )
    )


def run(args: Any) -> int:
    """``args.run(args)``, a parsed ``memoplan`` command; where it needs torch and torch is not
    installed, ``MP550`` (a PlanError the command line reports like any other) says how to get it."""
    try:
        return args.run(args)
    except ModuleNotFoundError as exc:
        if not is_missing_torch(exc):
            raise
        raise missing_torch_error(args.command) from exc
