"""Runtime stage: the checkpoint core that generated policy forwards call.

Every region runs under non-reentrant ``torch.utils.checkpoint``: unlike the
reentrant variant it gives frozen inputs and parameters their gradients
(huggingface/transformers#23170), supports keyword and non-tensor arguments and
does not mark DDP parameters ready twice (pytorch/pytorch#24005).  On top of it:

* buffers are committed once and recomputed with the values the forward saw
  (:mod:`memoplan.runtime.buffers`, pytorch/pytorch#96136);
* with ``preserve_rng`` the recompute replays the forward's RNG state, so dropout
  draws the same masks (allenai/OLMo-core#828), and the global RNG state after
  backward is what it would have been without the plan (checkpoint forks it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils.checkpoint import checkpoint

from memoplan.runtime import inplace
from memoplan.runtime.argstate import ArgumentGuard, combined, warn_cache_in_training
from memoplan.runtime.buffers import BufferGuard
from memoplan.runtime.compiled import eager_fallback, outside_graph, outside_needed, region_kind
from memoplan.runtime.install import PATH_ATTR
from memoplan.runtime.recompute import recomputing
from memoplan.runtime.region import RegionOptions, run_region
from memoplan.runtime.saving import saving_contexts

__all__ = ["run_checkpointed", "run_segmented"]


def run_checkpointed(
    module: nn.Module,
    forward_fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    preserve_rng: bool = True,
    save: Sequence[str] = (),
) -> Any:
    """``forward_fn(module, *args, **kwargs)`` as one checkpointed region.

    ``save``: op families whose outputs the region keeps (:mod:`memoplan.runtime.saving`)."""
    if not torch.is_grad_enabled():
        # Nothing will be saved for backward, so there is nothing to recompute.
        return forward_fn(module, *args, **kwargs)
    where = module.__dict__.get(PATH_ATTR, "")
    return _region(partial(forward_fn, module), (module,), args, kwargs, preserve_rng, where, tuple(save))


def run_segmented(
    module: nn.Module,
    groups: Sequence[Sequence[str]],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    preserve_rng: bool = True,
    region: RegionOptions | None = None,
    stateful: Sequence[str] = (),
    save: Sequence[str] = (),
) -> Any:
    """An ``nn.Sequential``'s forward with each group of children as its own checkpointed region.

    ``groups`` holds the children's names, contiguous and in order, covering them all;
    the output of one group is the input of the next.  With ``region`` options each
    group runs as memoplan's own region with the ``stateful`` modules (paths relative
    to ``module``) threaded; the first group's input is encoded with the region's
    codec, later groups' inputs with ``auto`` (unless the codec is ``none``).
    """
    if region is not None and outside_needed():
        what = f"segments with {region_kind(region.codec, stateful)}"
        return outside_graph(
            run_segmented,
            module.__dict__.get(PATH_ATTR, ""),
            what,
            module,
            groups,
            args,
            kwargs,
            preserve_rng=preserve_rng,
            region=region,
            stateful=stateful,
        )
    if type(module).forward is not nn.Sequential.forward:
        raise TypeError(
            f"memoplan: segments need an nn.Sequential forward, but {type(module).__qualname__} defines its own"
        )
    x = _sequential_input(args, kwargs)
    if not torch.is_grad_enabled():
        return _chain(tuple(module._modules.values()), x)  # what nn.Sequential.forward does
    names = tuple(name for group in groups for name in group)
    if names != tuple(module._modules):
        raise RuntimeError(
            f"memoplan: segments {[list(g) for g in groups]} do not cover the children "
            f"{list(module._modules)} in order; the model changed since the plan was compiled"
        )
    where = module.__dict__.get(PATH_ATTR, "")
    for index, group in enumerate(groups):
        children = tuple(module.get_submodule(name) for name in group)
        if region is None:
            part = f"{where}[{group[0]}..{group[-1]}]"
            x = _region(partial(_chain, children), children, (x,), {}, preserve_rng, part, tuple(save))
            continue
        options = replace(region, preserve_rng=preserve_rng, where=f"{where}[{group[0]}..{group[-1]}]")
        if index > 0 and region.codec != "none":
            # Only the first region reads the module's own input; the others read
            # intermediate activations, which get the smallest lossless codec they allow.
            options = replace(options, codec="auto", tolerance=None)
        inside = tuple(module.get_submodule(p) for p in stateful if p.split(".")[0] in group)
        x = run_region(children, partial(_chain, children), (x,), {}, options, inside)
    return x


def _chain(children: Sequence[nn.Module | None], x: Any) -> Any:
    for child in children:
        if child is not None:
            x = child(x)
    return x


def _sequential_input(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """The one input ``nn.Sequential.forward(self, input)`` accepts, positional or by name."""
    if len(args) == 1 and not kwargs:
        return args[0]
    if not args and set(kwargs) == {"input"}:
        return kwargs["input"]
    raise TypeError("nn.Sequential.forward takes exactly one argument, `input`")


def _contexts(buffers: BufferGuard, arguments: ArgumentGuard, save: tuple[str, ...] = ()):
    if save:  # the saving contexts innermost: they see the ops the others' contexts let run
        return combined(buffers.contexts(), arguments.contexts(), saving_contexts(save))
    return combined(buffers.contexts(), arguments.contexts())


def _region(
    fn: Callable[..., Any],
    roots: Sequence[nn.Module],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    preserve_rng: bool,
    where: str = "",
    save: tuple[str, ...] = (),
) -> Any:
    """Run ``fn(*args, **kwargs)`` under non-reentrant checkpoint, guarding ``roots``' buffers.

    ``where`` (the module path) names the region in messages; ``save`` the op families whose
    outputs it keeps (selective checkpointing, :mod:`memoplan.runtime.saving`)."""
    # Hand checkpoint every tensor as a top-level positional argument: it then saves
    # them with version checks (an in-place change before backward is an error, not a
    # silent wrong recompute) and sees their devices for RNG stashing.  The user's
    # keyword arguments travel inside the flat list, never as checkpoint's own keyword
    # arguments, so a user kwarg named `use_reentrant` or `context_fn` reaches the module.
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))

    def call(*flat: Any) -> Any:
        call_args, call_kwargs = pytree.tree_unflatten(list(flat), spec)
        return fn(*call_args, **call_kwargs)

    if torch.compiler.is_compiling():
        # A compiled graph is functionalized: buffers mutate once, when the graph's
        # outputs are written back, and checkpoint only accepts dispatch-mode contexts.
        extra: dict[str, Any] = {"context_fn": partial(saving_contexts, save)} if save else {}
        return checkpoint(
            _traced(call, roots, where), *leaves, use_reentrant=False, preserve_rng_state=preserve_rng, **extra
        )
    calls = [0]

    def counted(*flat: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:  # the forward; any later call is checkpoint's recompute in backward
            return call(*flat)
        with recomputing(where, "a checkpointed region"):  # an error there names the module
            return call(*flat)

    before = inplace.versions(leaves)
    out = checkpoint(
        counted,
        *leaves,
        use_reentrant=False,
        preserve_rng_state=preserve_rng,
        # Buffers and argument objects (a transformers cache) as the forward saw them.
        context_fn=partial(_contexts, BufferGuard(roots), ArgumentGuard(leaves), save),
    )
    # An input overwritten in place would be recomputed from in backward (MP407).
    inplace.unchanged(leaves, before, roots, where)
    warn_cache_in_training(leaves, roots, where)  # MP416, once
    return out


def _traced(call: Callable[..., Any], roots: Sequence[nn.Module], where: str) -> Callable[..., Any]:
    """The region's body for the checkpoint op Dynamo traces.

    Traced, it may update argument objects (a transformers cache): the update is applied
    once, as in eager mode.  If Dynamo could not trace it, torch's checkpoint runs it
    eagerly instead, and the eager guards and a located warning (MP415) take over."""
    from torch._dynamo.utils import _disable_side_effect_safety_checks_for_current_subtracer as allow

    fallback = eager_fallback(call, roots, where)

    def inner(*flat: Any) -> Any:
        if torch.compiler.is_compiling():
            return allow(call, *flat)
        return fallback(*flat)

    return inner
