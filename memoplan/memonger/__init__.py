"""Memonger stage: static buffer sharing for inference graphs (Caffe2 memonger, for PyTorch).

capture (``torch.export`` of the model with the plan's example, run once) →
order (``linearize``) → live ranges → assignment (``greedy`` or ``dp``) →
``verify_assignments`` → statistics; ``memoplan.codegen.arena`` prints the result as
an arena-backed forward.  Each step is a small function of plain data; only
``capture`` touches torch.
"""

from __future__ import annotations

from memoplan.memonger.assign import (
    ALGOS,
    ALIGNMENT,
    Assignment,
    assign,
    assign_dp,
    assign_greedy,
    lower_bound,
    verify_assignments,
)
from memoplan.memonger.order import ORDERINGS, linearize
from memoplan.memonger.ranges import Buffer, LiveRange, interference, live_ranges
from memoplan.memonger.stats import Layout, Stats, layout, stats_of

__all__ = [
    "ALGOS",
    "ALIGNMENT",
    "ORDERINGS",
    "Assignment",
    "Buffer",
    "Layout",
    "LiveRange",
    "Stats",
    "assign",
    "assign_dp",
    "assign_greedy",
    "interference",
    "layout",
    "linearize",
    "live_ranges",
    "lower_bound",
    "stats_of",
    "verify_assignments",
]
