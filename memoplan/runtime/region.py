"""Runtime stage: a planned module's forward as memoplan's own regions (what generated code calls).

One call is one region (:mod:`memoplan.runtime.region_function`: the ``autograd.Function``,
compressed input, threaded state) or, with ``temporal_chunk``, one region per time chunk
(:mod:`memoplan.runtime.chunking`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, cast

import torch
from torch import nn

from memoplan.enums import Boundaries
from memoplan.runtime import gradroot
from memoplan.runtime.chunking import run_chunked
from memoplan.runtime.compiled import outside_graph, outside_needed, region_kind
from memoplan.runtime.install import PATH_ATTR
from memoplan.runtime.region_function import Chain, RegionOptions, run_region

__all__ = ["RegionOptions", "run_chunked", "run_planned", "run_region"]


def run_planned(
    module: nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    codec: str = "none",
    validate: str = "sample",
    tolerance: float | None = None,
    preserve_rng: bool = True,
    where: str = "",
    stateful: Sequence[str] = (),
    chunks: int | None = None,
    dim: int = 0,
    chunk_args: Sequence[int | str] = (0,),
    boundaries: str | Boundaries = "keep",
) -> Any:
    """A planned module's forward as memoplan regions (what generated code calls).

    ``stateful`` names the submodules (paths relative to ``module``, ``""`` for itself)
    whose state the region threads; ``chunks`` splits ``chunk_args`` along ``dim``;
    ``boundaries="recompute"`` keeps only the state the first chunk starts from
    (:class:`~memoplan.runtime.recompute.ChunkStarts`).
    """
    if outside_needed():
        return outside_graph(
            run_planned,
            where or module.__dict__.get(PATH_ATTR, ""),
            region_kind(codec, stateful, chunks),
            module,
            args,
            kwargs,
            codec=codec,
            validate=validate,
            tolerance=tolerance,
            preserve_rng=preserve_rng,
            where=where,
            stateful=stateful,
            chunks=chunks,
            dim=dim,
            chunk_args=chunk_args,
            boundaries=boundaries,
        )
    options = RegionOptions(codec, validate, tolerance, preserve_rng, where or module.__dict__.get(PATH_ATTR, ""))
    modules = tuple(module.get_submodule(path) if path else module for path in stateful)
    fn = (
        Chain(cast(nn.Sequential, module))
        if type(module).forward is nn.Sequential.forward
        else partial(type(module).forward, module)
    )
    root_only = gradroot.takes_root_only(module)
    if chunks is not None:
        return run_chunked(
            (module,),
            fn,
            args,
            kwargs,
            options,
            modules,
            chunks=chunks,
            dim=dim,
            chunk_args=chunk_args,
            root_only=root_only,
            recompute_boundaries=Boundaries(boundaries) is Boundaries.RECOMPUTE,
        )
    return run_region((module,), fn, args, kwargs, options, modules)


def _probe_region(site: str, x: torch.Tensor) -> torch.Tensor:
    """The region :func:`gradroot.held_alone`'s probe differentiates through at ``site``."""
    if site == "region":
        return run_region((nn.Module(),), lambda t: t * 2, [x], {}, RegionOptions())
    return run_chunked((nn.Module(),), lambda t: t * 2, [x], {}, RegionOptions(), (), chunks=2, dim=0, chunk_args=(0,))


gradroot.set_probe_region(_probe_region)
