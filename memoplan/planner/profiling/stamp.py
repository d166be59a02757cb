"""Planner stage: the step a profile was taken for, recorded in it (:func:`stamped`), and the check
that a profile given to ``memoplan plan --profile`` was taken for the step being planned (MP604).

A profile's bytes are those of one step: its loss, its autocast, the model's parameter and the
example's dtypes, its FSDP2 shards and optimizer, the device it ran (or was estimated) on.  A plan
searched over another step's figures would be checked against peaks its own step never has.
Profiles written before the record existed (``step`` empty) are not checked.
"""

from __future__ import annotations

from dataclasses import fields, replace

import torch
from torch import nn

from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.planner.profiling.schema import Profile
from memoplan.syntax.blocks import StepConfig


def step_record(config: StepConfig | None) -> str:
    """Every key of the step ``config`` (None: the default step), as ``key value`` pairs."""
    config = config or StepConfig()
    return ", ".join(f"{f.name} {getattr(config, f.name)}" for f in fields(config))


def parameter_dtypes(model: nn.Module) -> str:
    """The dtypes of ``model``'s parameters, sorted and comma-separated (``bfloat16,float32``)."""
    return ",".join(sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()}))


def stamped(prof: Profile, model: nn.Module, config: StepConfig | None) -> Profile:
    """``prof`` with the step it was taken for recorded (the step ``config`` and the parameters' dtypes)."""
    return replace(prof, step=step_record(config), parameter_dtypes=parameter_dtypes(model))


def differences(prof: Profile, model: nn.Module, config: StepConfig | None, example_dtypes, device) -> list[str]:
    """What differs between the step ``prof`` was taken for and the one planned, in words; empty
    when they agree or ``prof`` records no step.  ``example_dtypes``: name -> dtype of the
    example's tensors; ``device``: where the planned step runs (its type is compared)."""
    if not prof.step:
        return []
    found = []
    planned = step_record(config)
    if prof.step != planned:
        theirs = dict(part.split(" ", 1) for part in prof.step.split(", ") if " " in part)
        ours = dict(part.split(" ", 1) for part in planned.split(", "))
        for key, value in ours.items():
            if theirs.get(key) != value:
                found.append(f"{key}: the profile's {theirs.get(key, '(none)')}, the plan's {value}")
    dtypes = parameter_dtypes(model)
    if prof.parameter_dtypes and prof.parameter_dtypes != dtypes:
        found.append(f"parameter dtypes: the profile's {prof.parameter_dtypes}, the model's {dtypes}")
    for meta in prof.inputs:
        given = example_dtypes.get(meta.name)
        if given is not None and given != meta.dtype:
            found.append(f"example {meta.name}: the profile's {meta.dtype}, the example's {given}")
    profiled = {torch.device(d).type for d in prof.device.split(",") if d}
    if device is not None and profiled and profiled != {torch.device(device).type}:
        found.append(f"device: the profile's {prof.device}, the plan's {torch.device(device).type}")
    return found


def check_same_step(prof: Profile, model: nn.Module, config: StepConfig | None, example, device, name: str) -> None:
    """MP604 when ``prof`` (read from ``name``) was taken for another step than the one planned."""
    from memoplan.planner.profiling.profile import input_metas

    dtypes = {meta.name: meta.dtype for meta in input_metas(example)}
    found = differences(prof, model, config, dtypes, device)
    if found:
        raise PlanError(
            (
                Diagnostic(
                    "MP604",
                    f"{name} was taken for another step than the one planned: " + "; ".join(found),
                    help="profile the step you plan (`memoplan profile` with the same --loss, --autocast, "
                    "--optimizer, --shards and --device), or plan without --profile",
                ),
            )
        )
