"""Runtime stage: replay one training step of ``dtr`` candidates under the tracker's eviction rules.

:func:`simulate` replays one training step of the candidates with the run-time tracker's rules
(:mod:`memoplan.runtime.dtr`): candidates in execution order, each adding its evictable bytes
and the bytes it keeps; making room before a candidate runs (from its size, known from the
previous step) and fitting after it, the lowest ``score`` first (the room for a candidate's
first call is the largest size seen before it, as on a first step); backward in reverse order,
recomputing an evicted candidate and fitting again with it kept.  It predicts the tracked peak,
the peak with the running region, the evictions, recomputes and recompute seconds.

In backward, a candidate's own working set is the gradients of its output and input
(``grad_bytes``), and the gradients of every parameter whose backward has run (the candidates'
from the last to it, and those outside the candidates).  :meth:`Simulation.predicted_peak` is
the step's peak: the measured unplanned peak, less the same replay's peak without eviction,
plus the simulated peak (what runs outside the candidates is taken from the measurement).

Two stages use it, so it lives here, below both: the planner
(:mod:`memoplan.planner.dtr.sim`: candidates from a profile, a threshold for a budget) and the
runtime (:mod:`memoplan.runtime.evictable`: the static choice under ``torch.compile``, from
what the tracker measured).  Pure Python: no torch, nothing of memoplan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Candidate", "Simulation", "simulate"]


@dataclass(frozen=True)
class Candidate:
    """One candidate call, as the simulator sees it."""

    name: str
    evictable_bytes: int
    kept_bytes: int
    seconds: float
    grad_bytes: int = 0  # its backward's own working set: the gradients of its output and input
    param_bytes: int = 0  # its trainable parameters: their gradients appear in its backward


@dataclass(frozen=True)
class Simulation:
    threshold: int
    tracked_peak: int  # the enforced total, at candidate boundaries
    working_peak: int  # with the candidate running (recomputed) then
    evictions: int
    recomputes: int
    recompute_seconds: float
    over_threshold: int
    unplanned_working: int  # the same replay with nothing evicted
    evicted: tuple[str, ...] = ()  # the candidates evicted at least once (forward or backward), in call order

    def predicted_peak(self, unplanned_peak: int) -> int:
        """The step's peak: the unplanned peak, less the replay's peak without eviction, plus this one's."""
        return max(unplanned_peak - self.unplanned_working + self.working_peak, 0)


class _Replay:
    """The tracker's state while :func:`simulate` replays one step: which calls are alive (their
    outputs still needed), which resident (not evicted), when each was last touched."""

    def __init__(
        self, calls: Sequence[Candidate], threshold: int, minimum: int, memory_factor: float, time_factor: float
    ):
        self.calls, self.threshold, self.minimum = calls, threshold, minimum
        self.memory_factor, self.time_factor = memory_factor, time_factor
        n = len(calls)
        self.resident = [False] * n
        self.ever = [False] * n  # evicted at least once
        self.alive = [False] * n
        self.last = [0] * n
        self.clock = 0
        self.evictions = self.tracked = self.working = self.over = 0

    def total(self) -> int:
        calls, resident = self.calls, self.resident
        return sum(
            c.kept_bytes + (c.evictable_bytes if resident[i] else 0) for i, c in enumerate(calls) if self.alive[i]
        )

    def touch(self, i: int) -> None:
        self.clock += 1
        self.last[i] = self.clock

    def _victims(self, keep: int | None) -> list[tuple[float, int, int]]:
        """Resident calls that may be evicted, cheapest (seconds per byte, by staleness) first."""
        calls, last, clock = self.calls, self.last, self.clock
        return sorted(
            (
                max(calls[i].seconds, 1e-9) ** self.time_factor
                / (calls[i].evictable_bytes ** self.memory_factor * max(clock - last[i], 1)),
                last[i],
                i,
            )
            for i in range(len(calls))
            if self.alive[i]
            and self.resident[i]
            and i != keep
            and calls[i].evictable_bytes
            and calls[i].evictable_bytes >= self.minimum
        )

    def fit(self, room: int, keep: int | None) -> None:
        """Evict until ``room`` more bytes fit under the threshold (never ``keep``)."""
        calls = self.calls
        limit = self.threshold - room
        now = self.total()
        if now > limit:
            for _, _, i in self._victims(keep):
                if now <= limit:
                    break
                self.resident[i] = False
                self.ever[i] = True
                self.evictions += 1
                now -= calls[i].evictable_bytes
        running = calls[keep].evictable_bytes if keep is not None and self.resident[keep] else 0
        self.tracked = max(self.tracked, now - running)
        self.working = max(self.working, now)
        if room == 0 and now - running > limit:
            self.over += 1

    def forward(self) -> None:
        seen: dict[str, int] = {}
        for i, call in enumerate(self.calls):
            self.touch(i)
            # The room the tracker makes: this candidate's size on its previous call, on its first
            # the largest seen so far (the simulation is of a first step, as `memoplan plan` measures).
            self.fit(seen.get(call.name, max(seen.values(), default=0)), None)
            seen[call.name] = call.evictable_bytes
            self.alive[i] = self.resident[i] = True
            self.working = max(self.working, self.total())
            self.fit(0, None)

    def backward(self, outside_grads: int) -> tuple[int, float]:
        """Replay the backward (recomputing what was evicted); the recomputes and their seconds."""
        calls = self.calls
        recomputes, seconds = 0, 0.0
        for i in reversed(range(len(calls))):
            self.touch(i)
            if not self.resident[i] and calls[i].evictable_bytes:
                self.resident[i] = True
                recomputes += 1
                seconds += calls[i].seconds
                self.fit(0, i)
            grads = outside_grads + sum(c.param_bytes for c in calls[i:])
            self.working = max(self.working, self.total() + calls[i].grad_bytes + grads)
            self.alive[i] = False
        return recomputes, seconds


def simulate(
    calls: Sequence[Candidate],
    threshold: int,
    *,
    minimum: int = 0,
    memory_factor: float = 1.0,
    time_factor: float = 1.0,
    outside_grads: int = 0,
) -> Simulation:
    """One training step of ``calls`` under a tracker with these settings (see the module docstring).

    ``outside_grads``: the gradients of parameters outside every candidate, there before the
    candidates' backward starts."""
    replay = _Replay(calls, threshold, minimum, memory_factor, time_factor)
    replay.forward()
    recomputes, seconds = replay.backward(outside_grads)
    return Simulation(
        threshold,
        replay.tracked,
        replay.working,
        replay.evictions,
        recomputes,
        seconds,
        replay.over,
        _unplanned_working(calls, outside_grads),
        tuple(c.name for i, c in enumerate(calls) if replay.ever[i]),
    )


def _unplanned_working(calls: Sequence[Candidate], outside_grads: int) -> int:
    """The replay's peak with every candidate resident until its backward."""
    held = [c.kept_bytes + c.evictable_bytes for c in calls]
    peak = sum(held)
    for i in reversed(range(len(calls))):
        grads = outside_grads + sum(c.param_bytes for c in calls[i:])
        peak = max(peak, sum(held[: i + 1]) + calls[i].grad_bytes + grads)
    return peak
