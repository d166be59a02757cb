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
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from memoplan.runtime.argstate import ArgumentGuard, combined, is_cache
from memoplan.runtime.buffers import BufferGuard

__all__ = ["eager_fallback", "warned_regions"]

#: Regions already warned about (by path): the warning is given once per process.
_WARNED: set[str] = set()
#: Dynamo's graph-break reasons already reported, with their counts then.
_REPORTED: dict[str, int] = {}


def warned_regions() -> frozenset[str]:
    """The paths of the regions MP415 was given for in this process."""
    return frozenset(_WARNED)


def eager_fallback(
    call: Callable[..., Any], roots: Sequence[nn.Module], where: str
) -> Callable[..., Any]:
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


def _warn(where: str, flat: Sequence[Any], roots: Sequence[nn.Module]) -> None:
    if where in _WARNED:
        return
    _WARNED.add(where)
    reasons = _new_breaks()
    because = f": {'; '.join(reasons)}" if reasons else " (no reason recorded: see TORCH_LOGS=graph_breaks)"
    hint = "; the rest of the model stays compiled, this region runs eagerly with the same results"
    training = any(root.training for root in roots)
    if training and any(is_cache(obj) for obj in flat):
        hint = (
            "; the region updates a transformers cache (`use_cache=True`): in training, "
            "load the model with `use_cache=False` (or call it with `use_cache=False`), as Hugging Face's "
            "own gradient checkpointing does, so nothing inside the region writes to it" + hint
        )
    warnings.warn(
        f"memoplan: MP415: {where or 'a region'}: torch.compile could not trace inside the checkpointed "
        f"region, so the graph breaks there{because}{hint}",
        RuntimeWarning,
        stacklevel=2,
    )


def _new_breaks() -> list[str]:
    """The first lines of the graph-break reasons Dynamo recorded since the last report."""
    from torch._dynamo.utils import counters

    found = []
    for reason, count in counters["graph_break"].items():
        if _REPORTED.get(reason, 0) < count:
            _REPORTED[reason] = count
            found.append(_first_line(reason))
    return list(dict.fromkeys(found))[:3]


def _first_line(reason: str) -> str:
    lines = [line.strip() for line in str(reason).splitlines() if line.strip()]
    explanation = next((line for line in lines if line.startswith("Explanation:")), "")
    head = lines[0] if lines else str(reason)
    return f"{head} ({explanation.removeprefix('Explanation:').strip()})" if explanation else head
