"""Planner stage: the ``dtr`` simulator's candidates from a profile, and a threshold for a budget.

The simulation itself (:func:`simulate`, :class:`Candidate`, :class:`Simulation`: one training
step replayed under the run-time tracker's rules) lives in :mod:`memoplan.runtime.dtr_sim`,
below both stages, since the runtime runs it too (under ``torch.compile``); it is re-exported
here for the planner's callers.

Each candidate's bytes come from the profile (:class:`ChainLink`):

* kept: its input (``input_bytes``) and the CPU RNG state its recompute replays;
* evictable: its saved bytes less what its output keeps (``kept_bytes``, the next
  candidate's input) and less its own input when it saved that (when the candidate
  before it did not already keep it);
* its backward's own working set (``grad_bytes``): the gradients of its output and input
  (``output_bytes + input_bytes``).

:func:`threshold_for` finds the largest threshold whose predicted peak fits a byte limit (the
largest threshold evicts least).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from memoplan.planner.profiling.schema import ChainLink
from memoplan.runtime.dtr_sim import Candidate, Simulation, simulate

__all__ = ["Candidate", "Simulation", "candidates_from_chain", "parameter_bytes", "simulate", "threshold_for"]


def candidates_from_chain(
    links: Sequence[ChainLink], params: Mapping[str, int] | None = None, rng_bytes: int | None = None
) -> list[Candidate]:
    """The simulator's candidates from a profile's chain (execution order); ``params``: the
    bytes of each candidate's trainable parameters (:func:`parameter_bytes`)."""
    rng = torch.get_rng_state().numel() if rng_bytes is None else rng_bytes
    out = []
    before_kept = 0
    for link in links:
        own_input = max(link.input_bytes - before_kept, 0)
        evictable = max(link.saved_bytes - link.kept_bytes - own_input, 0)
        grads = link.output_bytes + link.input_bytes
        weights = (params or {}).get(link.name, 0)
        out.append(Candidate(link.name, evictable, link.input_bytes + rng, link.forward_seconds, grads, weights))
        before_kept = link.kept_bytes
    return out


def parameter_bytes(model: nn.Module, names: Sequence[str]) -> tuple[dict[str, int], int]:
    """Bytes of the trainable parameters of each named module, and of those outside them all."""
    own = {name: _bytes(model.get_submodule(name).parameters()) for name in names}
    return own, max(_bytes(model.parameters()) - sum(own.values()), 0)


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params if p.requires_grad)


def threshold_for(
    calls: Sequence[Candidate], unplanned_peak: int, limit: int, *, minimum: int = 0, outside_grads: int = 0
) -> tuple[int, Simulation] | None:
    """The largest threshold whose predicted step peak is at most ``limit``, with its simulation.

    None when even evicting everything (the smallest useful threshold) is predicted over ``limit``.
    """
    everything = sum(c.kept_bytes + c.evictable_bytes for c in calls)
    kept = sum(c.kept_bytes for c in calls)

    def fits(threshold: int) -> Simulation | None:
        sim = simulate(calls, threshold, minimum=minimum, outside_grads=outside_grads)
        return sim if sim.predicted_peak(unplanned_peak) <= limit and not sim.over_threshold else None

    top = fits(everything)
    if top is not None:
        return everything, top
    lo, hi = max(kept, 1), everything  # fits(lo) decides; fits(hi) does not
    best = fits(lo)
    if best is None:
        return None
    while hi - lo > max(1, everything // 4096):
        mid = (lo + hi) // 2
        sim = fits(mid)
        if sim is None:
            hi = mid
        else:
            lo, best = mid, sim
    return lo, best
