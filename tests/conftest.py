"""Shared pytest configuration: the golden-file update flag and an isolated code cache."""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="rewrite tests/golden/ from the current code generator instead of comparing with it",
    )


@pytest.fixture
def update_goldens(request) -> bool:
    return bool(request.config.getoption("--update-goldens"))
