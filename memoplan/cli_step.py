"""The command line's training step: the plan's `step` block with ``--loss``, ``--autocast``, ... over it.

``profile``, ``plan``, ``verify`` and ``report`` take the same options (``memoplan.cli_parser``'s
``shard_options``); each command builds its step here once (:func:`command_step`), checks it
against the device (``MP253``) and runs inside :func:`stepping`, so every training step it runs —
the profile, the estimate, each trial, the verification — is that step (:mod:`memoplan.step`).
A first step that fails is a diagnostic, not a traceback (:func:`first_step`: MP411 out of
memory, MP504 otherwise, its help naming the estimate when the fake step is what failed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from memoplan.diagnostics import Diagnostic, PlanError

if TYPE_CHECKING:
    from memoplan.step import Step

# memoplan.step imports torch: each function imports it when called, so that the commands that
# need no torch (`check --syntax-only`, `fmt`, `rule`, `--help`) do not pay for it.

__all__ = ["MEASURED", "checked", "command_step", "first_step", "given_options", "sharded_step", "stepping"]


def given_options(args: Any, shards: int | None = None) -> dict[str, Any]:
    """The step's options given on the command line (None: not given); ``shards`` as ``_shards`` found it."""
    from memoplan.step import OPTIONS

    given = {key: getattr(args, key, None) for key in OPTIONS}
    if shards is not None and (given["shards"] is not None or shards > 1):
        given["shards"] = shards  # WORLD_SIZE under torchrun counts as given
    return given


def command_step(args: Any, plan=None, path: Path | None = None, *, shards: int | None = None) -> Step:
    """The step a command runs: the plan's `step` block (if any) with the options given over it;
    MP254 where they disagree, MP250 for mixed precision without shards.  A loss spec written in
    the plan is found from the plan's folder, one given as ``--loss`` from the current one."""
    from memoplan.step import make_step, merged, step_block

    written, spans = step_block(plan)
    source = None if plan is None else plan.source
    config = merged(written, spans, given_options(args, shards), source)
    from_plan = getattr(args, "loss", None) is None and written is not None
    if from_plan and path is not None and ":" in config.loss:  # from here on, as if given from here
        from dataclasses import replace

        from memoplan.planner.search.write import relative_spec

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
    from memoplan.step import check_precision, step_block

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
    from memoplan.step import running

    try:
        with running(step):
            yield step
    except PlanError as error:
        if error.source is None and plan is not None and any(d.span is not None for d in error.diagnostics):
            raise PlanError(error.diagnostics, plan.source) from None
        raise


MEASURED = "`--method measured` runs the step for real"


def first_step(run, step: str = "unplanned", *, only_oom: bool = False, instead: str = MEASURED):
    """``run()``, the first training step of the user's model; MP411 when a step runs out of
    memory (the step named by the error, else ``step``), MP504 (as `verify` says it) when it
    raises anything else but KeyboardInterrupt (``SystemExit`` too); ``only_oom``: other errors
    pass as they are.  A step estimated on fake tensors that failed is MP504 whose help names the
    estimate and ``instead``, what runs the step for real (:func:`_estimate_failed`)."""
    from memoplan.planner.profiling.estimate import FakeStepFailed
    from memoplan.planner.profiling.shrink import StepOutOfMemory, is_out_of_memory, wanted_bytes
    from memoplan.specs import describe_exception

    try:
        return run()
    except PlanError:
        raise
    except FakeStepFailed as exc:
        raise PlanError((_estimate_failed(exc, instead),)) from None
    except StepOutOfMemory as exc:
        oom = (exc.step, exc.wanted, exc.message)
    except BaseException as exc:  # the user's model or example failed: a diagnostic, not a traceback
        if isinstance(exc, KeyboardInterrupt) or (only_oom and not is_out_of_memory(exc)):
            raise
        if not is_out_of_memory(exc):
            message = describe_exception(exc).split("\n", 1)[0]
            raise PlanError(
                (
                    Diagnostic(
                        "MP504",
                        f"running one training step raised {message}",
                        help="check that the example input fits the model (`--example`)",
                    ),
                )
            ) from None
        text = str(exc).strip()
        oom = (step, wanted_bytes(exc), text.splitlines()[0] if text else type(exc).__name__)
    raise PlanError((_out_of_memory(*oom),))


def _estimate_failed(exc, instead: str) -> Diagnostic:
    """MP504 for a training step that could not run on fake tensors (memoplan's estimate): the
    help names the estimate, not the example, unless the operator's real kernel refused too."""
    if exc.data_dependent:
        help = (
            "the estimate runs the step on fake tensors, which have no values, and the model reads some "
            f"(`.item()`, `.tolist()`, `nonzero`, a branch on data): {instead}"
        )
    elif exc.real_kernel_refused:
        help = f"{exc.operator} refuses these inputs when run for real too: check that the example input fits the model (`--example`)"
    else:
        help = (
            f"the estimate runs the step on fake tensors, and this failed there: {instead}; "
            "if that fails too, check that the example input fits the model (`--example`)"
        )
    return Diagnostic("MP504", str(exc), help=help)


# What to do when a step runs out of memory, by the step that did.
_OOM_HELP = {
    "unplanned": "the unplanned step does not fit: `memoplan profile` and `memoplan plan` estimate it "
    "(leave out `--method measured`), and `memoplan plan --budget B` writes a plan that fits",
    "profile": "profile with `--method estimated` (fake tensors: nothing of the step is allocated), "
    "or give a smaller `--example`",
    "planned": "the planned step does not fit either: lower the budget (`memoplan plan --budget B`, "
    "`--nested`), or give a smaller `--example`",
}


def _out_of_memory(step: str, wanted: int | None, message: str) -> Diagnostic:
    """MP411: a step ran out of memory; what it asked for, which step, what to do."""
    asked = f"the allocator could not give {wanted:,} B ({wanted / 2**20:.2f} MiB)" if wanted else message
    return Diagnostic(
        "MP411",
        f"the {step} training step ran out of memory: {asked}",
        help=_OOM_HELP.get(step, _OOM_HELP["planned"]),
    )


_T = TypeVar("_T")


def present(value: _T | None) -> _T:
    """``value``, where a command's flow guarantees one (an invariant, checked; for the type checker)."""
    assert value is not None
    return value
