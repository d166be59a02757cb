"""What the planner's searches say while they run, in plain words (:data:`memoplan.progress.REPORTER`):
a line a person can read at the default verbosity, the figures in bytes as details (``-v``)."""

from __future__ import annotations

from memoplan.progress import REPORTER, size

# The two splits of a chain (memoplan.planner.chainruns.segmented), in plain words.
_RUNS = {
    "least-peak split": "the split with the least estimated peak",
    "Chen et al.'s sqrt(n) segments": "runs of equal length",
}


def widened(peak: int, limit: int, offered: str, detail: str, *, tried: str = "whole blocks") -> None:
    """No set of the ``tried`` candidates measures within the limit: the search tries ``offered``."""
    what = offered.removesuffix(" offered")
    REPORTER.say(
        f"no plan of {tried} fits the budget ({size(peak)} at the least, the limit {size(limit)}): trying {what}"
    )
    REPORTER.detail(f"{detail}; searching again")


def split_measured(what: str, shown: str, runs: int, peak: int) -> None:
    """One split of a chain's children into checkpointed runs, measured."""
    REPORTER.say(f"checkpointing {shown} in {runs} runs of its children ({_RUNS.get(what, what)}): peak {size(peak)}")
    REPORTER.detail(f"{what} of {shown}: {runs} regions, measured peak {peak} B")
