"""Memonger stage: linearize a captured graph — the order its steps run in.

Pure functions of a dependency list (``deps[i]``: the steps that must run before
step ``i``), so they are tested on random graphs without torch.  Two orderings,
named as in Caffe2's memonger:

* ``topological``: the captured program order, kept wherever the dependencies allow
  (Kahn's algorithm, taking the ready step that came first in the capture).
* ``longest_path``: list scheduling by critical path: among the ready steps, the one
  with the longest chain of steps still depending on it runs first (ties: capture
  order).  A long branch is started early and short side branches are finished
  when their results are needed, which changes which buffers live together.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

ORDERINGS = ("topological", "longest_path")


def linearize(deps: Sequence[Sequence[int]], ordering: str = "topological") -> tuple[int, ...]:
    """Every step once, each after all of its dependencies; ``ValueError`` on a cycle."""
    if ordering not in ORDERINGS:
        raise ValueError(f"unknown ordering {ordering!r}; expected one of {ORDERINGS}")
    n = len(deps)
    users: list[list[int]] = [[] for _ in range(n)]
    waiting = [0] * n
    for step, before in enumerate(deps):
        for dep in set(before):
            if not 0 <= dep < n or dep == step:
                raise ValueError(f"step {step} depends on {dep}, which is not another step")
            users[dep].append(step)
            waiting[step] += 1
    rank = critical_path(users) if ordering == "longest_path" else [0] * n
    ready = [(-rank[i], i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, step = heapq.heappop(ready)
        order.append(step)
        for user in users[step]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (-rank[user], user))
    if len(order) != n:
        raise ValueError("the dependencies have a cycle")
    return tuple(order)


def critical_path(users: Sequence[Sequence[int]]) -> list[int]:
    """For each step, the number of steps on the longest chain that starts at it (itself included)."""
    n = len(users)
    length = [0] * n
    # Iterative post-order (a 1,000-step chain would overflow Python's recursion).
    for root in range(n):
        if length[root]:
            continue
        stack = [(root, False)]
        while stack:
            step, done = stack.pop()
            if done:
                length[step] = 1 + max((length[u] for u in users[step]), default=0)
                continue
            if length[step]:
                continue
            stack.append((step, True))
            stack.extend((u, False) for u in users[step] if not length[u])
    return length


def is_linearization(order: Sequence[int], deps: Sequence[Sequence[int]]) -> bool:
    """Whether ``order`` runs every step exactly once and each after its dependencies."""
    if sorted(order) != list(range(len(deps))):
        return False
    position = {step: i for i, step in enumerate(order)}
    return all(position[d] < position[s] for s, before in enumerate(deps) for d in before)
