"""The command line's target device and models that cannot run here (memoplan.planner.target).

``--device`` (a CUDA device this machine lacks is a target for the commands that estimate),
``--device-memory``, and what ``verify``, ``report`` and the measured paths do with a model
built on the meta device: :mod:`memoplan.cli` calls these.
"""

from __future__ import annotations

from memoplan.diagnostics import Diagnostic, PlanError


def cannot_run(model, device) -> bool:
    """Whether ``model`` has no storage (on the meta device): `verify` estimates, `report` refuses.
    A real model with ``--device`` not here is refused by :func:`device` itself (MP506)."""
    from memoplan.planner.target import is_meta

    return is_meta(model)


def device(text: str | None, *, estimating: bool = False):
    """``--device`` as a torch.device, or None when not given; MP506 when it cannot run here.

    ``estimating``: the command can estimate its steps on fake tensors (``profile``, ``plan``
    without ``--method measured``), so a CUDA device this machine lacks is a target: the steps
    are planned for it (:mod:`memoplan.planner.target`)."""
    import torch

    if text is None:
        return None
    try:
        device = torch.device(text)
    except RuntimeError:
        raise PlanError(
            (Diagnostic("MP506", f"`--device {text}` is not a device", help="e.g. cpu, cuda or cuda:1"),)
        ) from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if estimating and not count:
            return device  # planned for a GPU this machine lacks: estimated, nothing runs on it
        if not count or (device.index or 0) >= count:
            raise PlanError(
                (
                    Diagnostic(
                        "MP506",
                        f"`--device {text}`: {f'only {count} CUDA devices here' if count else 'no CUDA device here'}",
                        help="leave out --device to run on the CPU"
                        + (
                            ""
                            if count
                            else "; `memoplan profile` and `plan` estimate a step for a CUDA device without one"
                        ),
                    ),
                )
            )
    elif device.type != "cpu":
        raise PlanError((Diagnostic("MP506", f"`--device {text}`: only cpu and cuda are supported"),))
    return device


def on_target(model, example, device, args):
    """``model`` and ``example`` moved to ``device`` when a step can run there; the command's
    target set (:data:`memoplan.planner.target.TARGET`) either way.  A model that cannot run
    here (built on the meta device, or for a GPU this machine lacks) stays as it is, and
    ``--method measured`` is refused for it (MP413): its steps are estimated."""
    from memoplan.planner.target import TARGET, not_runnable, target_for

    why = not_runnable(model, device)
    if why is None:
        if device is not None:
            model.to(device)
            example = example.to(device)
    elif args.method == "measured":
        raise PlanError((not_measurable(why, "--method measured"),))
    memory = device_memory(args)
    TARGET.set(target_for(model, device, memory))
    return model, example


def not_measurable(why: str, what: str) -> Diagnostic:
    """MP413: a measured path given a model no real step of which can run here."""
    return Diagnostic(
        "MP413",
        f"{what} runs real training steps, and {why}",
        help="`memoplan profile` and `memoplan plan` estimate its step on fake tensors (`--method estimated`, "
        "what `auto` does for it); to run real steps, build a smaller model for real (`memoplan docs meta`)",
    )


def device_memory(args) -> int | None:
    """``--device-memory SIZE`` in bytes (None when not given); MP509 when it is not a size."""
    return memory_size(getattr(args, "device_memory", None))


def memory_size(text: str | int | None) -> int | None:
    """A device's capacity in bytes from ``SIZE`` text (``80GiB``) or a count of bytes (None: not
    given); MP509 when it is not a positive size.  ``--device-memory`` and the API's ``device_memory``."""
    if text is None:
        return None
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return text
    text = str(text)
    from memoplan.planner.budgets import Bytes
    from memoplan.planner.presets import parse_budget

    try:
        size, _ = parse_budget(text)
    except (ValueError, PlanError):
        size = None
    if not isinstance(size, Bytes) or size.amount <= 0:
        raise PlanError((Diagnostic("MP509", f"`--device-memory {text}` is not a size", help="e.g. `80GiB`"),))
    return size.amount


def runs_nowhere(model) -> str | None:
    """Why no real step of ``model`` runs for this command (its target: ``--device``), or None."""
    from memoplan.planner.target import TARGET, not_runnable

    aim = TARGET.get()
    return not_runnable(model, aim.device if aim is not None else None)


def refuse_dtr(args, model) -> None:
    """MP413 for `plan --dtr` of a model no real step of which runs here (its threshold is measured)."""
    why = runs_nowhere(model) if args.dtr else None
    if why is not None:
        raise PlanError((not_measurable(why, "--dtr"),))


def device_budget_limit(args, model, shards: int, optimizer: str, parsed, note):
    """The bytes of `--budget device [- SIZE]`: the CUDA device's, or ``--device-memory``'s less
    what the model, its optimizer state and its shards hold (memoplan.planner.device_budget)."""
    from memoplan.planner.device_budget import device_budget_bytes

    held = (model, optimizer, shards)  # what the model holds on the device before the step
    target = device(args.device, estimating=True)
    return device_budget_bytes(target, args.budget, parsed, note, device_memory(args), held)
