"""Hypothesis profiles: how many examples each property test draws.

``MEMOPLAN_HYPOTHESIS=ci`` (the default, and what ``make test`` runs) draws each test's own
count, written next to it as ``n_examples(n)``; ``MEMOPLAN_HYPOTHESIS=dev`` (``make test-fast``)
draws at most ``DEV_EXAMPLES`` per test, for a quick loop while editing.  The profile is
loaded by ``tests/conftest.py``; a property test writes ``@settings(max_examples=n_examples(300))``
so that its count follows the profile (a hard-coded ``max_examples`` would override it).
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILES = ("ci", "dev")
DEV_EXAMPLES = 10

PROFILE = os.environ.get("MEMOPLAN_HYPOTHESIS", "ci")
if PROFILE not in PROFILES:
    raise ValueError(f"MEMOPLAN_HYPOTHESIS={PROFILE!r}: expected one of {', '.join(PROFILES)}")

settings.register_profile("ci", deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=DEV_EXAMPLES)


def n_examples(n: int) -> int:
    """A test's example count under the loaded profile: ``n`` under ``ci``, fewer under ``dev``."""
    return n if PROFILE == "ci" else min(n, DEV_EXAMPLES)
