"""benchmarks/frontier.py's settled time verdict: paired rounds, the median ratio and its interval."""

from __future__ import annotations

import runpy

import pytest
from _paths import ROOT

pytestmark = pytest.mark.bench

settle_verdict = runpy.run_path(str(ROOT / "benchmarks" / "frontier.py"))["settle_verdict"]

# the peer's step drifts with the load from round to round; the pair shares the drift
DRIFT = [1.00, 1.06, 0.97, 1.10, 1.02, 0.95, 1.08, 1.01, 0.99, 1.05, 1.03, 0.96, 1.07, 1.00, 1.04]


def test_clearly_slower_is_slower() -> None:
    v = settle_verdict(DRIFT, [t * 1.08 for t in DRIFT], noise=0.01)
    assert v["verdict"] == "slower" and v["median"] == pytest.approx(1.08) and v["low"] > 1.01


def test_noisy_tie_is_a_tie_within_noise() -> None:
    jitter = [1.03, 0.98, 1.02, 0.99, 1.04, 0.97, 1.01, 1.00, 1.02, 0.98, 1.03, 0.99, 1.00, 1.01, 0.97]
    v = settle_verdict(DRIFT, [t * j for t, j in zip(DRIFT, jitter, strict=True)], noise=0.01)
    assert v["verdict"] == "tie within noise" and v["low"] <= 1.0 <= v["high"] and v["rounds"] == 15


def test_clearly_faster_is_no_slower() -> None:
    v = settle_verdict(DRIFT, [t * 0.93 for t in DRIFT], noise=0.01)
    assert v["verdict"] == "no slower" and v["high"] < 1


def test_drift_alone_does_not_decide() -> None:
    # unpaired, the plan's times look 5% slower (the drift); paired, they are the peer's own
    v = settle_verdict(DRIFT[:8], DRIFT[:8], noise=0.0)
    assert v["verdict"] == "no slower" and v["median"] == 1.0


def test_unequal_rounds_refused() -> None:
    with pytest.raises(ValueError, match="as many"):
        settle_verdict([1.0, 1.0], [1.0])
