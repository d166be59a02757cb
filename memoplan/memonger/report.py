"""Memonger stage: an arena plan as text — its figures and the assignment table (``memoplan explain``)."""

from __future__ import annotations

from memoplan.diagnostics import printable
from memoplan.memonger.plan import ArenaPlan


def _mib(n: int) -> str:
    return f"{n:,} B ({n / 2**20:.2f} MiB)"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def slot_table(plan: ArenaPlan) -> list[str]:
    """The assignment as aligned rows: slot, offset, bytes, dtype, shape, live positions, and the
    values it holds (``a > b``: the op making ``b`` writes it over ``a``)."""
    program = plan.program
    rows = [("slot", "offset", "bytes", "dtype", "shape", "live", "value")]
    for slot, held in enumerate(plan.slots):
        info = program.buffers[held[0]]
        live = plan.layout.ranges[slot]
        rows.append(
            (
                str(slot),
                str(plan.layout.assignment.offsets[slot]),
                str(info.size),
                info.dtype,
                "x".join(map(str, info.shape)) or "scalar",
                f"{live.start}..{live.end}",
                printable(" > ".join(program.names[program.buffers[i].value] for i in held)),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def describe(plan: ArenaPlan) -> str:
    """The figures of the arena plan, the results left outside it by reason, and the slot table."""
    stats = plan.layout.stats
    program = plan.program
    optimal = "optimal: " + ("yes" if stats.optimal else "not proven") if plan.algo == "dp" or stats.optimal else ""
    lines = [
        f"memonger: inference of the whole model ({printable(program.model_class)}) on one arena, "
        f"captured with the plan's example on {program.device}",
        f"  ordering {plan.ordering}, algo {plan.algo}, {len(program.steps)} steps",
        f"  baseline     {_mib(plan.baseline_bytes)} in {_count(len(plan.arena_buffers), 'buffer')} (each its own "
        f"allocation), {_count(len(plan.slots), 'slot')}",
        f"  arena        {_mib(stats.arena_bytes)}" + (f" ({optimal})" if optimal else ""),
        f"  lower bound  {_mib(stats.lower_bound_bytes)} (the most bytes its slots hold at once)",
        f"  a call's estimated peak: {_mib(plan.arena_peak)} with the arena, {_mib(plan.eager_peak)} in eager",
        f"    with what ops allocate and free inside: {_mib(plan.arena_peak_inside)} with the arena, "
        f"{_mib(plan.eager_peak_inside)} in eager",
    ]
    if plan.slack is not None:
        could = len(plan.arena_buffers) + len(plan.left_out)
        lines.append(
            f"  peak_slack {plan.slack:g}: {len(plan.arena_buffers)} of the {could} buffers an out= form can write "
            f"are in the arena; {len(plan.left_out)} left out to keep both peaks within {plan.slack * 100:g}% of eager's"
        )
    scratch = sum(program.buffers[i].scratch for i in plan.arena_buffers)
    if scratch:
        lines.append(f"  scratch the arena's kernels allocate inside: {_mib(scratch)} a call")
    reasons: dict[str, list[int]] = {}
    for index in plan.outside:
        reasons.setdefault(_reason(plan.note(index)), []).append(program.buffers[index].size)
    if reasons:
        total = sum(sum(sizes) for sizes in reasons.values())
        count = sum(len(sizes) for sizes in reasons.values())
        lines.append(f"  outside the arena, allocated by their ops on every call: {count} results, {_mib(total)}")
        for reason in sorted(reasons):
            lines.append(f"    {len(reasons[reason]):4d}  {printable(reason)}")
    lines.append("")
    if plan.arena_buffers:
        lines.extend("  " + row for row in slot_table(plan))
    else:
        lines.append("  no buffer is in the arena: every result is allocated by its op, as in eager")
    return "\n".join(lines)


def _reason(note: str) -> str:
    """The kind of reason: the op's own name is left out, so equal reasons are counted together."""
    if " has no out= variant" in note:
        return "no out= variant (" + note.split(" has no", 1)[0] + ")"
    if note.startswith("left out of the arena"):
        return "left out of the arena to keep the peak (peak_slack)"
    if note.startswith("its out= variant allocates "):
        return "its out= variant allocates inside (the op's result, then a copy)"
    return note.removesuffix(": allocated by the op")
