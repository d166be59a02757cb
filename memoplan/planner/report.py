"""Planner stage: plain-text tables of a :class:`~memoplan.planner.profile.Profile` for the command line."""

from __future__ import annotations

from memoplan.planner.schema import Profile

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
