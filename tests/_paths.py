"""Where the tests are: the repository root and the tests folder, for fixtures, scripts and docs."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
