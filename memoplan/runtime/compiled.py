"""Runtime stage: a checkpointed region under ``torch.compile`` that Dynamo could not trace.

A region compiles as one ``torch.utils.checkpoint`` higher-order op inside the model's
graph (:mod:`memoplan.runtime.checkpoint`).  When Dynamo cannot trace something inside
it (data-dependent Python control flow, an unsupported call, a side effect it refuses),
it breaks the graph at the checkpoint call and torch's checkpoint runs eagerly, without
the ``context_fn`` memoplan gives it in eager mode.  :func:`eager_fallback` is what then
runs the region's forward and its recompute:

* the buffer and argument guards are entered by hand (the first call is the forward,
  later ones are recomputes), so a BatchNorm commits once and a ``DynamicCache`` is
  updated once, as in eager mode;
* a located warning (MP415), once per region and process: the module's path, the reason
  Dynamo gave, and for a model in training whose region updates a transformers cache,
  that ``use_cache=False`` removes the update.  Never silent.

memoplan's own region (``compress``, ``state = functional``, ``temporal_chunk``, and
``segments``/``split`` holding those) is an ``autograd.Function`` that encodes its input,
threads state and stashes RNG state: Dynamo cannot trace it.  :func:`outside_graph` runs it
outside the graph (the region's own frame skipped, the module's forward compiled on its own)
and warns once per region (MP417).

Dynamo cannot resume after a graph break inside a loop: where regions are called in a loop
over layers (every transformer), the loop's function then runs eagerly and the modules it
calls compile one by one.  docs/compile.md has the table of what compiles whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from memoplan.diagnostics import warn
from memoplan.runtime.argstate import ArgumentGuard, combined, is_cache
from memoplan.runtime.buffers import BufferGuard

__all__ = ["eager_fallback", "outside_graph", "outside_needed", "region_kind", "warned_regions"]

_LOOP = (
    "where the region is called in a loop (over layers), Dynamo runs that loop's function eagerly and "
    "compiles the modules it calls one by one"
)

#: Regions already warned about (by path): the warning is given once per process.
_WARNED: set[str] = set()
#: memoplan's own regions already warned about under compile (MP417), by path.
_OUTSIDE: set[str] = set()
#: How many of memoplan's own regions are running outside the graph now (nested calls stay outside).
_DEPTH: list[int] = [0]
#: Dynamo's graph-break reasons already reported, with their counts then.
_REPORTED: dict[str, int] = {}


def warned_regions() -> frozenset[str]:
    """The paths of the regions MP415 was given for in this process."""
    return frozenset(_WARNED)


def eager_fallback(call: Callable[..., Any], roots: Sequence[nn.Module], where: str) -> Callable[..., Any]:
    """``call`` for torch's checkpoint running eagerly after Dynamo broke the graph at a region.

    The returned function is called once for the forward, then once per recompute."""
    recompute: list[contextlib.AbstractContextManager[None]] = []

    def run(*flat: Any) -> Any:
        if recompute:
            with recompute[0]:
                return call(*flat)
        _warn(where, flat, roots)
        forward, again = combined(BufferGuard(roots).contexts(), ArgumentGuard(flat).contexts())
        recompute.append(again)
        with forward:
            return call(*flat)

    return run


def outside_graph(fn: Callable[..., Any], where: str, what: str, /, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` for memoplan's own region under ``torch.compile``: run eagerly, outside the graph.

    The region (an ``autograd.Function`` that encodes its input, threads state, stashes RNG
    state, chunks time) is not traceable by Dynamo; rather than breaking the graph at each
    of its steps, it breaks once around the whole region, which then runs eagerly with the
    same results as without compile, and warns once per region (MP417)."""
    if "temporal_chunk" in what:
        return _all_eager(fn, where, what, *args, **kwargs)
    return _eager(fn, where, what, *args, **kwargs)


def region_kind(codec: str, stateful: Sequence[Any], chunks: int | None = None) -> str:
    """What makes a region memoplan's own, for MP417: ``compress input = bit, state = functional``."""
    parts = [f"compress input = {codec}"] if codec != "none" else []
    if stateful:
        parts.append("state = functional")
    if chunks is not None:
        parts.append(f"temporal_chunk {chunks}")
    return ", ".join(parts) or "memoplan's region"


def _run_eagerly(fn: Callable[..., Any], where: str, what: str, /, *args: Any, **kwargs: Any) -> Any:
    if where not in _OUTSIDE:
        _OUTSIDE.add(where)
        warn(
            f"memoplan: MP417: {where or 'a region'}: under torch.compile, memoplan's own region ({what}) is not "
            f"traced into the model's graph: the graph breaks at it, {_inside(what)}, "
            f"and {_LOOP}; the results are the same. A plain `checkpoint` (no compress, state or "
            "temporal_chunk) compiles with the model",
            RuntimeWarning,
        )
    _DEPTH[0] += 1
    try:
        return fn(*args, **kwargs)  # its frames, the module's forward among them, are compiled on their own
    finally:
        _DEPTH[0] -= 1


def _inside(what: str) -> str:
    if "temporal_chunk" in what:
        return "its module runs eagerly"
    return "its module's forward is compiled on its own"


def outside_needed() -> bool:
    """Whether memoplan's own region must leave the graph now: compiling, and not already outside it."""
    return torch.compiler.is_compiling() and not _DEPTH[0]


def _warn(where: str, flat: Sequence[Any], roots: Sequence[nn.Module]) -> None:
    if where in _WARNED:
        return
    _WARNED.add(where)
    reasons = _new_breaks()
    because = (
        f"; Dynamo's graph-break reasons since the last report: {'; '.join(reasons)}"
        if reasons
        else " (no reason recorded: see TORCH_LOGS=graph_breaks)"
    )
    hint = f"; the region runs outside the graph with the same results, and {_LOOP}"
    training = any(root.training for root in roots)
    if training and any(is_cache(obj) for obj in flat):
        hint = (
            "; the region updates a transformers cache (`use_cache=True`): in training, "
            "load the model with `use_cache=False` (or call it with `use_cache=False`), as Hugging Face's "
            "own gradient checkpointing does, so nothing inside the region writes to it" + hint
        )
    warn(
        f"memoplan: MP415: {where or 'a region'}: torch.compile could not trace inside the checkpointed "
        f"region, so the graph breaks there{because}{hint}",
        RuntimeWarning,
    )


def _new_breaks() -> list[str]:
    """The first lines of the graph-break reasons Dynamo recorded since the last report."""
    from torch._dynamo.utils import counters

    found = []
    for reason, count in counters["graph_break"].items():
        if _REPORTED.get(reason, 0) != count:  # more since the last report, or counters cleared since
            _REPORTED[reason] = count
            found.append(_first_line(reason))
    return list(dict.fromkeys(found))[:3]


def _first_line(reason: str) -> str:
    lines = [line.strip() for line in str(reason).splitlines() if line.strip()]
    explanation = next((line for line in lines if line.startswith("Explanation:")), "")
    head = lines[0] if lines else str(reason)
    return f"{head} ({explanation.removeprefix('Explanation:').strip()})" if explanation else head


# torch._disable_dynamo is torch._dynamo.disable that imports Dynamo on the first call rather than now:
# importing Dynamo costs more than the rest of torch (a second of CPU), and a command or script that
# never compiles never calls these.  Its wrapper lives in a module Dynamo skips, so under compile the
# call runs outside the graph, as the disabled function itself would.
#: Only this frame is skipped: the frames it calls (the region's, the module's forward) are compiled on their own.
_eager = torch._disable_dynamo(_run_eagerly, recursive=False)


def _run_wholly_eagerly(fn: Callable[..., Any], where: str, what: str, /, *args: Any, **kwargs: Any) -> Any:
    """:func:`_run_eagerly`, by a function of its own: torch._disable_dynamo keeps the wrapper it makes
    on the function, so one function cannot have both a recursive and a non-recursive one."""
    return _run_eagerly(fn, where, what, *args, **kwargs)


#: Every frame skipped: the region and its module run eagerly.  For time chunks: with the chunks'
#: frames compiled one by one (BatchNorm's whole-batch statistics measured chunk by chunk), the
#: gradients came out wrong (input gradients off by more than their own magnitude on the bundled
#: spiking CNN, tests/runtime/test_compile_policies.py), so chunked regions run wholly eagerly.
_all_eager = torch._disable_dynamo(_run_wholly_eagerly, recursive=True)
