"""`memoplan plan --budget device [- SIZE]`: what the CUDA caching allocator can give a step."""

from __future__ import annotations

import re

from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.planner.budgets import Bytes

_DEVICE_BUDGET = re.compile(
    r"^\s*device\s*(?:-\s*([0-9][^a-z]*\s*[a-z]*?))?\s*((?:\s+(?:hard|hint))?)\s*$", re.IGNORECASE
)


def device_budget_text(text: str | None):
    """``--budget device [- SIZE] [hard|hint]`` as (SIZE or None, " hard"/" hint"/""); None for other budgets."""
    if text is None or not text.strip().lower().startswith("device"):
        return None
    match = _DEVICE_BUDGET.match(text)
    if match is None:
        raise PlanError(
            (
                Diagnostic(
                    "MP509", f"`--budget {text}` is not a device budget", help="write `device`, or `device - 2GiB`"
                ),
            )
        )
    return match.group(1), match.group(2)


def device_budget_refused(device, budget: str) -> None:
    """MP509 for `--budget device` where the step does not run on CUDA."""
    if device is None or device.type != "cuda":
        raise PlanError(
            (
                Diagnostic(
                    "MP509",
                    f"`--budget {budget}` needs a CUDA device: on the CPU no allocator says how much it can use",
                    help="plan on CUDA (`--device cuda`), or give the budget in bytes (`--budget 8GiB`)",
                ),
            )
        )


def device_budget_bytes(device, budget: str, parsed, note) -> Bytes:
    """The bytes `--budget device [- SIZE]` stands for, the model on its CUDA device.

    What the caching allocator may hold (the device's total memory times the process's memory
    fraction, ``torch.cuda.set_per_process_memory_fraction``), less what is allocated before the
    step (parameters, buffers: a step's peak is counted above them), less SIZE.
    """
    import torch

    from memoplan.measure import indexed_device
    from memoplan.planner.presets import parse_budget

    index = indexed_device(device).index
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda i: 1.0)(index)
    margin = 0
    if parsed[0]:
        size, _ = parse_budget(parsed[0])
        if not isinstance(size, Bytes):
            raise PlanError((Diagnostic("MP509", f"`--budget {budget}`: the margin is a size, such as `2GiB`"),))
        margin = size.amount
    limit = int(total * fraction) - torch.cuda.memory_allocated(index) - margin
    if limit <= 0:
        raise PlanError((Diagnostic("MP509", f"`--budget {budget}` leaves nothing for the step ({limit} B)"),))
    note(f"budget device: {limit} B ({total} B on {device}, x{fraction:g}, less what is allocated and the margin)")
    return Bytes(limit)
