"""Planner stage: plain-text tables of a :class:`~memoplan.planner.profiling.profile.Profile` for the command line."""

from __future__ import annotations

from memoplan.planner.profiling.schema import Profile

COLUMNS = ("module", "type", "saved", "input", "output", "calls", "forward")


def profile_table(prof: Profile) -> str:
    """One row per module that saves activations, largest saved bytes first (ties: execution order).

    Bytes are exact (``1,048,576``), the forward time is the module's median per step; the
    root module is ``(root)``.  Columns are aligned; no cell holds a space.  The first line says
    how the profile was taken (``method: measured`` or ``method: estimated``) and its peak.
    """
    saving = sorted(
        (m for m in prof.modules if m.saved_bytes > 0),
        key=lambda m: (-m.saved_bytes, m.order if m.order is not None else len(prof.modules)),
    )
    rows = [COLUMNS] + [
        (
            m.name or "(root)",
            m.type.rpartition(".")[2],
            f"{m.saved_bytes:,}",
            f"{m.input_bytes:,}",
            f"{m.output_bytes:,}",
            str(m.calls),
            f"{m.forward_seconds * 1e3:.3f}ms",
        )
        for m in saving
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    right = {2, 3, 4, 5, 6}  # numbers right-aligned
    head = f"method: {prof.method} ({prof.peak_method}), unplanned peak {prof.peak_bytes:,} B"
    if prof.shards > 1:
        head += f" per rank of {prof.shards} FSDP2 ranks"
    if prof.optimizer_state_bytes:
        head += f"; optimizer state {prof.optimizer_state_bytes:,} B per rank between steps"
    head += "".join(f"\n{line}" for line in target_lines(prof))
    return (
        head
        + "\n"
        + "\n".join(
            "  ".join(
                cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))
            ).rstrip()
            for row in rows
        )
    )


def target_lines(prof: Profile) -> list[str]:
    """What a profile says of its target (:mod:`memoplan.planner.profiling.target`): a model built on meta,
    the kernels that stood in for the device's, what the CUDA caching allocator would reserve."""
    lines = []
    if prof.model_device == "meta":
        lines.append("model: built on the meta device (no real step ran: bytes on fake tensors, times from FLOPs)")
    if prof.kernels:
        lines.append(
            f"kernels: {prof.kernels}'s standing in for {prof.device}'s (no such device here); "
            f"storages rounded as {prof.device}'s allocator rounds them"
        )
    if prof.reserved_bytes:
        over = prof.reserved_bytes - prof.peak_bytes
        lines.append(
            f"reserved: the CUDA caching allocator would reserve about {prof.reserved_bytes:,} B at the unplanned peak "
            f"({over:+,} B, {over / max(1, prof.peak_bytes):+.1%} over the allocated peak; segments and fragmentation)"
        )
    return lines
