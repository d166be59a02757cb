"""The command line's training step: the plan's `step` block with ``--loss``, ``--autocast``, ... over it.

``profile``, ``plan``, ``verify`` and ``report`` take the same options (``memoplan.cli_parser``'s
``shard_options``); each command builds its step here once (:func:`command_step`), checks it
against the device (``MP253``) and runs inside :func:`stepping`, so every training step it runs —
the profile, the estimate, each trial, the verification — is that step (:mod:`memoplan.step`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memoplan.diagnostics import PlanError
from memoplan.step import OPTIONS, Step, check_precision, make_step, merged, running, step_block

__all__ = ["checked", "command_step", "given_options", "sharded_step", "stepping"]


def given_options(args: Any, shards: int | None = None) -> dict[str, Any]:
    """The step's options given on the command line (None: not given); ``shards`` as ``_shards`` found it."""
    given = {key: getattr(args, key, None) for key in OPTIONS}
    if shards is not None and (given["shards"] is not None or shards > 1):
        given["shards"] = shards  # WORLD_SIZE under torchrun counts as given
    return given


def command_step(args: Any, plan=None, path: Path | None = None, *, shards: int | None = None) -> Step:
    """The step a command runs: the plan's `step` block (if any) with the options given over it;
    MP254 where they disagree, MP250 for mixed precision without shards.  A loss spec written in
    the plan is found from the plan's folder, one given as ``--loss`` from the current one."""
    written, spans = step_block(plan)
    source = None if plan is None else plan.source
    config = merged(written, spans, given_options(args, shards), source)
    from_plan = getattr(args, "loss", None) is None and written is not None
    if from_plan and path is not None and ":" in config.loss:  # from here on, as if given from here
        from dataclasses import replace

        from memoplan.planner.write import relative_spec

        config = replace(config, loss=relative_spec(config.loss, ".", path.parent))
    try:
        return make_step(config, spans=spans if from_plan else None)
    except PlanError as error:
        if error.source is None and from_plan and source is not None:
            raise PlanError(error.diagnostics, source) from None
        raise


def sharded_step(args: Any, plan=None, path: Path | None = None, *, shards: int) -> Step:
    """The step of ``profile`` and ``plan``; MP603 when it is sharded (``--shards``, WORLD_SIZE or
    the plan's `step` block) and ``--method measured``: a sharded step runs only under torch.distributed."""
    from memoplan.diagnostics import Diagnostic

    step = command_step(args, plan, path, shards=shards)
    if step.config.shards > 1 and args.method == "measured":
        raise PlanError(
            (
                Diagnostic(
                    "MP603",
                    f"--method measured with {step.config.shards} shards: a sharded step runs only under torch.distributed",
                    help="leave out --method measured (one rank's step is estimated on fake tensors), or use --shards 1",
                ),
            )
        )
    return step


def checked(step: Step, model, device, plan=None) -> Step:
    """``step`` after MP253's check of its precision on ``device`` (the model's, when None)."""
    import torch

    from memoplan.measure import step_device

    where = torch.device(device) if device is not None else step_device(model)
    _, spans = step_block(plan)
    try:
        check_precision(step, model, where, spans)
    except PlanError as error:
        raise PlanError(error.diagnostics, None if plan is None else plan.source) from None
    return step


@contextlib.contextmanager
def stepping(step: Step, plan=None) -> Iterator[Step]:
    """Run every training step inside as ``step``; a diagnostic at the plan's `step` block shows its line."""
    try:
        with running(step):
            yield step
    except PlanError as error:
        if error.source is None and plan is not None and any(d.span is not None for d in error.diagnostics):
            raise PlanError(error.diagnostics, plan.source) from None
        raise
