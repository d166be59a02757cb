"""Lowering a checked :class:`~memoplan.resolver.resolution.Resolution` to the IR: an action per
module and aspect's winning rule (``_ACTIONS``), the ``dtr`` block's evictions, the blocks' configs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from memoplan import ir
from memoplan.enums import Boundaries, Validate
from memoplan.resolver.resolution import Candidate, Resolution, in_order, region_state
from memoplan.runtime.install import qualified_type_name
from memoplan.syntax import ast
from memoplan.syntax.blocks import config_of
from memoplan.syntax.formatter import format_policy, format_selector
from memoplan.syntax.policies import spec_of


def _origin(res: Resolution, candidate: Candidate) -> ir.Origin:
    return ir.Origin(
        res.plan.file,
        candidate.policy.span.line,
        format_selector(candidate.rule.selector),
        format_policy(candidate.policy),
    )


def checkpoint_groups(module: nn.Module, policy: ast.Checkpoint) -> tuple[tuple[str, ...], ...] | None:
    if policy.segments:
        return _groups(module, policy.segments)
    if policy.split:
        names = [n for n, child in module._modules.items() if child is not None]
        cuts = [0] + [names.index(n) for n in policy.split] + [len(names)]
        return tuple(tuple(names[a:b]) for a, b in zip(cuts, cuts[1:]))
    return None


def _groups(module: nn.Module, segments: int) -> tuple[tuple[str, ...], ...]:
    names = [n for n, child in module._modules.items() if child is not None]
    if not names:
        return ()  # an empty nn.Sequential: nothing to split (MP307 said so)
    k = min(segments, len(names))
    size, extra = divmod(len(names), k)
    groups, start = [], 0
    for g in range(k):
        stop = start + size + (1 if g < extra else 0)
        groups.append(tuple(names[start:stop]))
        start = stop
    return tuple(groups)


def _checkpoint_action(origin: ir.Origin, policy: ast.Checkpoint, module: nn.Module) -> ir.CheckpointAction:
    return ir.CheckpointAction(
        origin,
        groups=checkpoint_groups(module, policy),
        preserve_rng=policy.rng is not ast.RngMode.OFF,
        nested=bool(policy.nested),
        save=policy.save or (),
    )


def _compress_action(origin: ir.Origin, policy: ast.Compress, module: nn.Module) -> ir.CompressAction:
    return ir.CompressAction(origin, policy.codec, policy.tolerance, policy.validate or Validate.SAMPLE)


def _temporal_chunk_action(origin: ir.Origin, policy: ast.TemporalChunk, module: nn.Module) -> ir.TemporalChunkAction:
    return ir.TemporalChunkAction(
        origin,
        policy.chunks,
        policy.dim,
        policy.args or (0,),
        bool(policy.allow_nonequivalent),
        policy.boundaries or Boundaries.KEEP,
    )


# A winning policy, by its spec's name (syntax/policies.py) -> the IR action it binds to its module.
_ACTIONS: dict[str, Callable[[ir.Origin, Any, nn.Module], ir.Action]] = {
    "checkpoint": _checkpoint_action,
    "compress": _compress_action,
    "temporal_chunk": _temporal_chunk_action,
    "keep": lambda origin, policy, module: ir.KeepAction(origin),
    "state": lambda origin, policy, module: ir.StateAction(origin, policy.mode),
    "buffers": lambda origin, policy, module: ir.BuffersCommitOnceAction(origin),
}


def _module_plan(res: Resolution, path: str, evict: ir.EvictAction | None) -> ir.ModulePlan:
    """The IR of one module: an action per aspect's winning rule, and ``evict`` (a ``dtr``
    candidate, alone or beside a ``state`` or ``buffers`` rule)."""
    module = res.index.module(path)
    actions: list[ir.Action] = []
    for decision in res.decisions.get(path, {}).values():
        policy = decision.winner.policy
        actions.append(_ACTIONS[spec_of(policy).name](_origin(res, decision.winner), policy, module))
    if evict is not None:
        actions.append(evict)
    region = any(isinstance(a, ir.REGION_ACTIONS) for a in actions)
    return ir.ModulePlan(
        path,
        qualified_type_name(type(module)),
        tuple(actions),
        region_state=region_state(res, path, module) if region else (),
    )


def to_ir(res: Resolution) -> ir.ResolvedPlan:
    plan = res.plan
    dtr_block = plan.block(ast.BlockKind.DTR)
    evict = None if dtr_block is None else ir.EvictAction(ir.Origin(plan.file, dtr_block.span.line, "dtr", "dtr"))
    paths = dict.fromkeys([*res.decisions, *res.evictable])
    modules = [
        _module_plan(res, path, evict if path in res.evictable else None) for path in sorted(paths, key=ir.path_key)
    ]
    blocks = {kind: plan.block(kind) for kind in ast.BlockKind}
    return ir.ResolvedPlan(
        file=plan.file,
        modules=tuple(modules),
        budget=plan.budget,
        dtr=_config(blocks[ast.BlockKind.DTR]),
        sublinear=_config(blocks[ast.BlockKind.SUBLINEAR]),
        memory=_config(blocks[ast.BlockKind.MEMORY]),
        memonger=_config(blocks[ast.BlockKind.MEMONGER]),
        warnings=tuple(in_order(d for d in res.diagnostics if not d.is_error)),
    )


def _config(block):
    return None if block is None else config_of(block)
