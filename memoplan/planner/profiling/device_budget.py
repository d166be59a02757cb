"""`memoplan plan --budget device [- SIZE]`: what the CUDA caching allocator can give a step."""

from __future__ import annotations

from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.planner.budgets import Bytes, DeviceBudget


def device_budget_refused(device, budget: str, memory: int | None = None) -> None:
    """MP509 for `--budget device` where the step does not run on CUDA, or on a CUDA device this
    machine lacks without its size (``--device-memory``)."""
    import torch

    if memory is not None:
        return  # the device's size given: nothing to ask an allocator
    if device is not None and device.type == "cuda" and not torch.cuda.is_available():
        raise PlanError(
            (
                Diagnostic(
                    "MP509",
                    f"`--budget {budget}` for `--device {device}`: no CUDA device here says how much memory it has",
                    help="give the device's size: `--device-memory 80GiB`",
                ),
            )
        )
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


def device_budget_bytes(device, wanted: DeviceBudget, note, memory: int | None = None, held=None) -> Bytes:
    """The bytes `--budget device [- SIZE]` stands for, the model on its CUDA device.

    What the caching allocator may hold (the device's total memory times the process's memory
    fraction, ``torch.cuda.set_per_process_memory_fraction``), less what is allocated before the
    step (parameters, buffers: a step's peak is counted above them), less SIZE.

    With ``memory`` (``--device-memory``: the device need not be here) that size, less what the
    model holds on the device through the step — ``held`` is ``(model, optimizer, shards)``: its
    parameters and buffers, and the optimizer's state, one rank's share of each — less SIZE.
    """
    import torch

    from memoplan.measure import indexed_device

    budget, margin = wanted.text, wanted.margin
    if memory is not None:
        return _sized_budget(device, budget, memory, held, margin, note)
    index = indexed_device(device).index
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda i: 1.0)(index)
    limit = int(total * fraction) - torch.cuda.memory_allocated(index) - margin
    if limit <= 0:
        raise PlanError((Diagnostic("MP509", f"`--budget {budget}` leaves nothing for the step ({limit} B)"),))
    note(f"budget device: {limit} B ({total} B on {device}, x{fraction:g}, less what is allocated and the margin)")
    return Bytes(limit)


def _sized_budget(device, budget: str, memory: int, held, margin: int, note) -> Bytes:
    """`--budget device` of a device of ``memory`` bytes: less what the model holds, less ``margin``."""
    from memoplan.planner.profiling.shard import resident_bytes

    model, optimizer, shards = held
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    resident = resident_bytes(model, optimizer, shards) + buffers
    limit = memory - resident - margin
    if limit <= 0:
        raise PlanError(
            (
                Diagnostic(
                    "MP509",
                    f"`--budget {budget}` leaves nothing for the step ({limit} B): the model holds {resident} B "
                    f"of the {memory} B device before it",
                ),
            )
        )
    where = f" on {device}" if device is not None else ""
    per_rank = f" per rank of {shards}" if shards > 1 else ""
    note(
        f"budget device: {limit} B ({memory} B{where} from --device-memory, less {resident} B of parameters, "
        f"buffers and {optimizer} state{per_rank}, less the margin)"
    )
    return Bytes(limit)
