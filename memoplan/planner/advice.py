"""Planner stage: what else would lower the peak, for a plan that missed its budget or barely met it.

:func:`recommendation` is the last line of a generated plan's header when the measured peak is
over the limit, or within :data:`MARGIN` of it: the other tools memoplan has, each with the
estimated peak it would reach by the profile's cost model (the same estimates the planners
use, so a measurement can differ).  Only what applies to the model is listed:

* ``--nested`` -- the parts of every block as candidates: the least estimated peak of the
  nested candidates, against that of whole candidates;
* ``temporal_chunk`` -- for regions holding stateful modules (spiking neurons, recurrent
  cells): chunking time in 4 divides the largest region's replay (the transient) by about 4;
* ``compress input`` -- candidates whose inputs the profile saw binary and that no rule
  compresses: their inputs bit-packed;
* ``checkpoint segments`` -- runs of a flat ``nn.Sequential``'s children (Chen et al.);
* ``--dtr`` -- eviction at run time, bounded by a threshold instead of a fixed set of regions.

Pure Python over a profile: no measurement.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from memoplan.planner import search
from memoplan.planner.budgets import format_size
from memoplan.planner.profiling.schema import Profile, chain, default_candidates, nested_candidates
from memoplan.planner.search import segments
from memoplan.runtime.state import is_stateful

__all__ = ["MARGIN", "recommendation"]

#: A measured peak within this share below the limit is "barely met".
MARGIN = 0.05


def recommendation(
    prof: Profile, model: nn.Module, regions: Sequence[str], limit: int | None, measured: int, *, nested: bool
) -> str | None:
    """One header line of what else would lower the peak, or None when the budget is met with room."""
    if limit is None or measured <= limit * (1 - MARGIN):
        return None
    state = "missed" if measured > limit else f"met within {MARGIN:.0%} of the limit"
    ideas = [idea for idea in _ideas(prof, model, regions, nested) if idea]
    if not ideas:
        return f"budget {state}; nothing else memoplan has lowers this model's estimated peak: raise the budget"
    return f"budget {state}; to lower the peak further: " + "; ".join(ideas)


def _ideas(prof: Profile, model: nn.Module, regions: Sequence[str], nested: bool):
    whole = chain(prof)
    items = [search.Item(link.name, link.saved_bytes, link.input_bytes, link.forward_seconds) for link in whole]
    base = search.unplanned_base(prof.peak_bytes, items)
    least_whole = search.minimum_peak(items, base_bytes=base)[0] if items else prof.peak_bytes
    if not nested:
        parts = chain(prof, nested_candidates(prof), nested=True)
        inner = [search.Item(link.name, link.saved_bytes, link.input_bytes, link.forward_seconds) for link in parts]
        least = search.minimum_peak(inner, base_bytes=base)[0] if inner else least_whole
        if least < least_whole:
            yield f"`--nested` (parts of blocks) estimated {_gain(least_whole, least)}"
    stateful = [link for link in whole if _holds_state(model, link.name)]
    if stateful:
        transient = max(link.saved_bytes for link in stateful)
        yield f"`temporal_chunk 4 dim 0` on the stateful regions estimated {_gain(transient, transient // 4)}"
    binary = [
        link
        for link in whole
        if link.input_binary and link.packed_input_bytes < link.input_bytes and link.name not in regions
    ]
    if binary:
        saved = sum(link.input_bytes - link.packed_input_bytes for link in binary)
        yield f"`compress input = bit` on {len(binary)} more checkpointed modules with binary inputs saves up to {format_size(saved)}"
    yield _segments_idea(prof, model, least_whole)
    yield "`--dtr` (eviction at run time under a threshold) where checkpoint regions cannot reach the limit"


def _segments_idea(prof: Profile, model: nn.Module, least_whole: int) -> str | None:
    """Runs of the candidates' ``nn.Sequential`` parent, when their least-peak split estimates lower."""
    names = default_candidates(prof)
    parent = names[0].rpartition(".")[0] if names else ""
    if not parent or type(model.get_submodule(parent)).forward is not nn.Sequential.forward:
        return None
    links = chain(prof, names)
    if len(links) < 3:
        return None
    saved = [link.saved_bytes for link in links]
    split = segments.least_peak_split(saved, [link.input_bytes for link in links])
    estimate = prof.peak_bytes - sum(saved) + split.cost
    if estimate >= least_whole:
        return None
    return f"`checkpoint split` on {parent} ({split.runs} regions) estimated {_gain(least_whole, estimate)}"


def _holds_state(model: nn.Module, name: str) -> bool:
    try:
        return any(is_stateful(m) for m in model.get_submodule(name).modules())
    except AttributeError:
        return False


def _gain(before: int, after: int) -> str:
    return f"{format_size(max(0, before - after))} lower"
