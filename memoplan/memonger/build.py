"""Memonger stage: the arena plan of a model under a plan's ``memonger`` block.

Selection: the block applies to the whole model — the forward ``model(...)`` runs —
captured with the plan's ``example``.  Used by ``memoplan.apply``, ``memoplan write-module``
and ``memoplan explain``; every failure is a :class:`PlanError` at the block's line.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from memoplan import specs
from memoplan.diagnostics import Diagnostic, PlanError, Span
from memoplan.memonger.capture import capture
from memoplan.memonger.plan import ArenaPlan, lay_out
from memoplan.syntax import ast
from memoplan.syntax.blocks import MemongerConfig, config_of


def block_head(block: ast.ConfigBlock) -> Span:
    """The block's keyword, where its diagnostics point."""
    span = block.span
    return Span(span.file, span.line, span.column, span.line, span.column + len(block.kind.value))


def plan_arena(model: nn.Module, plan: ast.Plan) -> ArenaPlan | None:
    """Capture ``model`` with the plan's example and lay out its arena; None without a ``memonger`` block."""
    block = plan.block(ast.BlockKind.MEMONGER)
    if block is None:
        return None
    config = config_of(block)
    assert isinstance(config, MemongerConfig)  # a memonger block's config (blocks.SCHEMA)
    span = block_head(block)
    try:
        if plan.example is None:
            raise PlanError((missing_example(span),))
        base = Path(plan.file).parent if plan.file and Path(plan.file).is_file() else None
        example = specs.make_example(plan.example, base_dir=base)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        if device.type != "cpu":
            example = example.to(device)
        program = capture(model, example.args, dict(example.kwargs), span=span)
        return lay_out(program, algo=config.algo, ordering=config.ordering, slack=config.peak_slack)
    except PlanError as error:
        if error.source is not None:
            raise
        raise PlanError(error.diagnostics, plan.source) from None


def missing_example(span: Span | None) -> Diagnostic:
    return Diagnostic(
        "MP243",
        "the `memonger` block needs the plan's `example`: the arena is laid out for the shapes it captures",
        span,
        "add an `example` statement, e.g. `example randn(8, 3, 32, 32)`",
    )
