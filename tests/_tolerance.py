"""Test helper: ``memoplan verify``'s chunk tolerance, for tests that compare tensors themselves.

Where a plan changes the arithmetic (a layer run on fewer rows per time chunk may take
another BLAS or oneDNN kernel; sums and BatchNorm statistics taken chunk by chunk round
differently), results agree within memoplan.verification.CHUNK_RTOL times the largest unplanned
magnitude of their category (outputs, gradients, states), as ``memoplan verify`` judges
them.  Per category, not per tensor: a gradient that is zero in exact arithmetic (the bias
of a Linear right before BatchNorm) is rounding noise in both runs.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from memoplan.verification import CHUNK_RTOL


def assert_within_chunk_tolerance(
    ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor], names: Iterable[str] | None = None
) -> None:
    """Each tensor of ``names`` (default: all) within CHUNK_RTOL times the largest magnitude in ``ref``."""
    assert ref.keys() == got.keys()
    scale = max(t.abs().max().item() for t in ref.values() if t.numel())
    for name in ref if names is None else names:
        a, b = ref[name], got[name]
        assert a.shape == b.shape and a.dtype == b.dtype, name
        diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        assert diff <= CHUNK_RTOL * scale, (
            f"{name}: max |difference| {diff:.3g}, {diff / scale if scale else float('inf'):.2g} x the largest"
        )
