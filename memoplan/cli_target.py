"""The command line's target device and models that cannot run here (memoplan.planner.profiling.target).

``--device`` (a CUDA device this machine lacks is a target for the commands that estimate),
``--device-memory``, and what ``verify``, ``report`` and the measured paths do with a model
built on the meta device: :mod:`memoplan.cli` calls these.
"""

from __future__ import annotations

from memoplan.diagnostics import Diagnostic, PlanError


def cannot_run(model, device) -> bool:
    """Whether ``model`` has no storage (on the meta device): `verify` estimates, `report` refuses.
    A real model with ``--device`` not here is refused by :func:`device` itself (MP506)."""
    from memoplan.planner.profiling.target import is_meta

    return is_meta(model)


def estimated_only(model, text: str | None) -> bool:
    """Whether ``model`` cannot run here (:func:`cannot_run`) and its steps are only estimated, on
    ``--device`` ``text``; for a model that can run, MP506 where that device is not here."""
    if cannot_run(model, text):
        return True
    device(text)  # MP506: a real step needs the device here
    return False


def device(text: str | None, *, estimating: bool = False):
    """``--device`` as a torch.device, or None when not given; MP506 when it cannot run here
    (:func:`memoplan.planner.profiling.target.parse_device`, which the Python API's ``device`` takes too)."""
    from memoplan.planner.profiling.target import parse_device

    return parse_device(text, estimating=estimating)


def on_target(model, example, device, args):
    """``model`` and ``example`` moved to ``device`` when a step can run there; the command's
    target set (:data:`memoplan.planner.profiling.target.TARGET`) either way.  A model that cannot run
    here (built on the meta device, or for a GPU this machine lacks) stays as it is, and
    ``--method measured`` is refused for it (MP413): its steps are estimated."""
    from memoplan.planner.profiling.target import TARGET, not_runnable, target_for

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
    from memoplan.planner.profiling.target import not_measurable

    return not_measurable(why, what)


def device_memory(args) -> int | None:
    """``--device-memory SIZE`` in bytes (None when not given); MP509 when it is not a size."""
    from memoplan.planner.profiling.target import memory_size

    return memory_size(getattr(args, "device_memory", None))


def runs_nowhere(model) -> str | None:
    """Why no real step of ``model`` runs for this command (its target: ``--device``), or None."""
    from memoplan.planner.profiling.target import TARGET, not_runnable

    aim = TARGET.get()
    return not_runnable(model, aim.device if aim is not None else None)


def refuse_dtr(args, model) -> None:
    """MP413 for `plan --dtr` of a model no real step of which runs here (its threshold is measured)."""
    why = runs_nowhere(model) if args.dtr else None
    if why is not None:
        raise PlanError((not_measurable(why, "--dtr"),))
