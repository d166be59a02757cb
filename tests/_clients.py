"""Real clients the tests drive (a browser, Neovim, VS Code's npm packages): skipped on a
developer's machine that lacks one, but a failure under ``CI=true``, where the Makefile's set-up
installs them (``make clients``), so that these tests never silently stop running in CI."""

from __future__ import annotations

import os

import pytest


def on_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(present: bool, what: str, how: str) -> None:
    """Skip (or, under ``CI=true``, fail) saying ``what`` is missing and ``how`` to install it."""
    if present:
        return
    message = f"missing: {what}; install: {how}"
    if on_ci():
        pytest.fail(f"{message} (CI=true: the set-up, `make clients`, installs it)")
    pytest.skip(message)
