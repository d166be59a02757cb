"""What ``torch.compile`` captured of a model: graphs, graph breaks and ops, for tests and ``verify --compile``.

:class:`CountingBackend` is a ``torch.compile`` backend that counts before it hands each
graph to another backend (``aot_eager`` by default, or ``inductor``):

* ``graphs``: the graphs Dynamo produced (one for a model that compiles whole);
* ``ops``: the operations in them (calls of functions, methods and modules; not
  ``getitem``), counting those inside higher-order-op subgraphs (a checkpointed region is
  one ``torch.ops.higher_order.tag_activation_checkpoint`` node whose body is a subgraph: its
  ops are counted, the node itself is not);
* ``breaks``: the graph-break reasons Dynamo recorded while this backend was counting,
  first line of each, with how many times.

Compare ``ops`` of a planned model with the unplanned model's: a plan that keeps the
model compiled captures at least as many (recompute adds none to the forward graph).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from memoplan.diagnostics import printable

__all__ = ["Capture", "CountingBackend", "backend_problem", "count_ops", "first_line"]

_OPS = ("call_function", "call_method", "call_module")


@dataclass
class Capture:
    """What was compiled: graphs, ops in them (subgraphs included) and graph breaks by reason."""

    graphs: int = 0
    ops: int = 0
    breaks: Counter[str] = field(default_factory=Counter)

    @property
    def break_count(self) -> int:
        return sum(self.breaks.values())

    def describe(self) -> str:
        text = f"{self.graphs} graph{'s' if self.graphs != 1 else ''}, {self.ops} ops, {self.break_count} graph breaks"
        if self.breaks:
            text += " (" + "; ".join(f"{n}x {r}" for r, n in self.breaks.most_common(3)) + ")"
        return text


def count_ops(gm: torch.fx.GraphModule) -> int:
    """Operations in ``gm``, and in the subgraphs of its higher-order ops (recursively), not the HOP nodes."""
    total = 0
    for node in gm.graph.nodes:
        if node.op not in _OPS:
            continue
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            continue  # its body is a submodule, counted below
        if node.target is operator.getitem:
            continue  # taking an element of a tuple the graph already has
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), torch.fx.GraphModule):
            continue
        total += 1
    for _, sub in gm.named_children():
        if isinstance(sub, torch.fx.GraphModule):
            total += count_ops(sub)
    return total


def first_line(reason: str) -> str:
    """A graph-break reason's first line, without Dynamo's hints."""
    lines = [line.strip() for line in str(reason).splitlines() if line.strip()]
    return lines[0] if lines else str(reason)


def backend_problem(name: str) -> str | None:
    """Why ``torch.compile`` has no backend ``name`` (with the names it has), or None when it has one."""
    from torch._dynamo import list_backends
    from torch._dynamo.backends.registry import lookup_backend

    try:
        lookup_backend(name)
    except Exception:  # torch's InvalidBackend, or an entry point that fails to load
        known = sorted(list_backends(exclude_tags=()))
        return f"torch.compile has no backend `{printable(name)}` (it has: {', '.join(known)})"
    return None


class CountingBackend:
    """A ``torch.compile`` backend that counts graphs, ops and breaks, then runs ``inner``'s compiled graph.

    ``with backend:`` counts the graph breaks Dynamo records inside the block (its counters are
    process-wide, so read them around the calls that compile)."""

    def __init__(self, inner: str | Callable[..., Any] = "aot_eager") -> None:
        self.inner = inner
        # What torch.compile's errors call this backend (``backend='inductor' raised``): the inner one's name.
        self.__name__ = inner if isinstance(inner, str) else getattr(inner, "__name__", type(inner).__name__)
        self.capture = Capture()
        self._before: Counter[str] = Counter()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.capture.graphs += 1
        self.capture.ops += count_ops(gm)
        if callable(self.inner):
            return self.inner(gm, example_inputs)
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(self.inner)(gm, example_inputs)

    def __enter__(self) -> CountingBackend:
        from torch._dynamo.utils import counters

        self._before = Counter(counters["graph_break"])
        return self

    def __exit__(self, *exc: object) -> None:
        from torch._dynamo.utils import counters

        for reason, count in counters["graph_break"].items():
            more = count - self._before.get(reason, 0)
            if more > 0:
                self.capture.breaks[first_line(reason)] += more
