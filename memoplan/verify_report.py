"""What ``verify`` reports and how it reads: the report of one step without and one with a plan
(:class:`VerifyReport`), the ``memonger`` arena's check, the estimate of a model no real step of
which runs here; their printed form, and the verdicts of a plan's ``budget`` and ``dtr`` block on
them.  :mod:`memoplan.verification` runs the steps and re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass

from memoplan.compare import Check
from memoplan.diagnostics import Diagnostic, Severity
from memoplan.graphs import Capture
from memoplan.ir import ResolvedPlan
from memoplan.measure import StepMemory
from memoplan.memonger.measure import Allocations
from memoplan.planner.budgets import budget_from_ast, is_hard, mode_word
from memoplan.runtime.dtr import DtrStats
from memoplan.syntax import ast


@dataclass(frozen=True)
class ArenaCheck:
    """The ``memonger`` block's arena against eager: one inference call of each (eval, no grad)
    with the example, after the training step both copies took."""

    outputs: Check  # bit for bit
    ran: bool  # the arena ran the call (not the model's own forward)
    arena_peak: int  # bytes above what was held when the call began, at most (probe.allocated_inside)
    eager_peak: int
    arena_bytes: int  # the arena itself, held between calls (not in arena_peak)
    arena_allocations: Allocations  # fresh storages the call's ops returned
    eager_allocations: Allocations

    @property
    def equal(self) -> bool:
        return self.ran and self.outputs.equal and not self.outputs.within


@dataclass(frozen=True)
class VerifyReport:
    plan: ResolvedPlan
    unplanned: StepMemory
    planned: StepMemory
    checks: tuple[Check, ...]
    rtol: float = 0.0
    #: CUDA ops that ran without a deterministic implementation: differences may be theirs.
    nondeterministic: tuple[str, ...] = ()
    #: Wall time of one more step of each model, unmetered (one step: a rough price of the
    #: plan, not a benchmark).
    unplanned_seconds: float = 0.0
    planned_seconds: float = 0.0
    #: What the ``dtr`` block's tracker did in the planned step (None without one).
    dtr: DtrStats | None = None
    #: The ``memonger`` block's arena inference against eager (None without one).
    arena: ArenaCheck | None = None
    #: When the unplanned step did not fit: the smaller example the equivalence was proven on
    #: (described, ``args[0] 8x64 int64``); the unplanned peak is then estimated on fake tensors
    #: (``unplanned.method == "fake-tensor"``) and the planned one measured at full size.
    compared_on: str | None = None
    full_example: str | None = None
    #: With ``compile``: the backend, and what ``torch.compile`` captured of each model (graphs,
    #: ops, graph breaks), unplanned then planned.
    backend: str | None = None
    captures: tuple[Capture, Capture] | None = None

    @property
    def equivalent(self) -> bool:
        return all(c.equal for c in self.checks) and (self.arena is None or self.arena.equal)

    @property
    def exact(self) -> bool:
        """Equivalent bit for bit, not only within the tolerance."""
        return self.equivalent and not any(c.within for c in self.checks)

    @property
    def saved_bytes(self) -> int:
        return self.unplanned.peak_bytes - self.planned.peak_bytes


@dataclass(frozen=True)
class EstimatedVerify:
    """What `verify` can say of a model no real step of which runs here (``why``): the peaks of
    one step without and one with the plan, on fake tensors; no equivalence."""

    why: str
    unplanned_peak: int
    planned_peak: int
    modules: int

    def render(self) -> str:
        return "\n".join(
            (
                f"no real step runs: {self.why}; the peaks below are estimated on fake tensors",
                f"  unplanned peak on fake tensors: {mib(self.unplanned_peak)} ({self.unplanned_peak} B)",
                f"  planned peak on fake tensors:   {mib(self.planned_peak)} ({self.planned_peak} B)",
                "equivalence: NOT checked (no step ran). Prove it on a smaller real build of the same model "
                "(fewer layers, the same blocks): `memoplan verify PLAN --model FILE.py:small --example ...` "
                "(`memoplan docs meta`)",
            )
        )


def estimated_budget_check(budget: ast.Budget, check: EstimatedVerify) -> tuple[str, Diagnostic | None]:
    """:func:`budget_check` of the estimated peaks."""
    memory = _Peaks(check.unplanned_peak), _Peaks(check.planned_peak)
    return budget_check(budget, _BudgetView(*memory))  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Peaks:
    peak_bytes: int


@dataclass(frozen=True)
class _BudgetView:
    unplanned: _Peaks
    planned: _Peaks


def render_arena(check: ArenaCheck) -> str:
    """The one line ``memoplan verify`` prints for the ``memonger`` block."""
    if not check.ran:
        verdict = (
            "DID NOT RUN: the call ran the model's own forward (the arena runs in eval mode without grad, "
            "on inputs shaped as the plan's `example`; an --example of other shapes never reaches it)"
        )
    elif check.equal:
        verdict = f"outputs equal bit for bit ({check.outputs.compared} compared)"
    else:
        verdict = "outputs DIFFERENT: " + "; ".join(check.outputs.differences[:3])
    a, e = check.arena_allocations, check.eager_allocations
    total = check.arena_peak + check.arena_bytes
    return (
        f"memonger arena (one inference call with the example, eval, no grad) against eager: {verdict}; "
        f"peak {mib(total)} ({total} B: the call's {check.arena_peak} B and the arena's {check.arena_bytes} B), "
        f"eager {mib(check.eager_peak)} ({check.eager_peak} B); allocations {a.count} ({a.bytes} B), "
        f"eager {e.count} ({e.bytes} B)"
    )


def render_report(report: VerifyReport) -> str:

    u, p = report.unplanned, report.planned
    ratio = p.peak_bytes / u.peak_bytes if u.peak_bytes else 1.0
    if report.compared_on is None:
        lines = [
            f"peak memory ({u.method}, {u.device}): unplanned {mib(u.peak_bytes)} ({u.peak_bytes} B), "
            f"planned {mib(p.peak_bytes)} ({p.peak_bytes} B), {ratio:.3f}x, saved {mib(report.saved_bytes)}",
            f"step time (one unmetered step each): unplanned {report.unplanned_seconds * 1e3:.1f} ms, "
            f"planned {report.planned_seconds * 1e3:.1f} ms",
        ]
    else:
        lines = [
            f"peak memory, full example ({report.full_example}): unplanned {mib(u.peak_bytes)} ({u.peak_bytes} B, "
            f"estimated on fake tensors: the unplanned step does not run at this size), planned "
            f"{mib(p.peak_bytes)} ({p.peak_bytes} B, measured: {p.method}, {p.device}), {ratio:.3f}x",
            f"equivalence, smaller example ({report.compared_on}): one step without and one with the plan",
        ]
    if report.captures is not None:
        unplanned, planned = report.captures
        lines.append(
            f"torch.compile (backend {report.backend}): unplanned {unplanned.describe()}; planned {planned.describe()}"
        )
        if u.method == "live-storage":
            lines.append(
                "note: the CPU meter is a dispatch mode, under which torch.compile runs the model eagerly: the "
                "peaks above are eager's; the graphs and step times are compiled (`--device cuda` measures "
                "compiled peaks with the allocator)"
            )
    if report.dtr is not None:
        lines.append(report.dtr.summary())
    if report.arena is not None:
        lines.append(render_arena(report.arena))
    for check in report.checks:
        if not check.equal:
            status = "DIFFERENT"
        elif check.within:
            status = (
                f"equal within {report.rtol:g} x max |unplanned {check.name}| ({len(check.within)} not bit for bit)"
            )
        else:
            status = "equal"
        lines.append(f"  {check.name:<16} {status} ({check.compared} compared)")
        lines.extend(f"      {d}" for d in check.differences[:10])
    if report.rtol:
        lines.append(
            f"tolerance: temporal chunks sum in another order; each tensor within {report.rtol:g} x the largest "
            "unplanned magnitude of its category"
        )
    if report.rtol and not report.equivalent:
        lines.append(
            "hint: time chunks round BatchNorm statistics and sums differently; a threshold (spiking) neuron "
            "after them can turn that into a few flipped spikes, which no tolerance bounds. Chunking only the "
            "neurons (BatchNorm over all steps at once) stays bit for bit"
        )
    for op in report.nondeterministic:
        lines.append(f"note: {op} (CUDA): differences in what it computes may be its own, not the plan's")
    verdict = "EQUIVALENT" if report.equivalent else "NOT EQUIVALENT"
    lines.append(f"verdict: {verdict}")
    return "\n".join(lines)


def budget_check(budget: ast.Budget, report: VerifyReport) -> tuple[str, Diagnostic | None]:
    """The plan's ``budget`` against the measured planned peak: a line for the report, and a
    diagnostic at the ``budget`` line when it is missed (an error for ``hard``, the default;
    a warning for ``hint``)."""
    # The planner's reading of a budget (exact shares: 60% of the peak is 3/5 of it, floored).
    limit = budget_from_ast(budget).limit(report.unplanned.peak_bytes)
    peak = report.planned.peak_bytes
    hard = is_hard(budget)
    mode = mode_word(hard)
    line = f"budget {mib(limit)} ({limit} B, {mode}): planned peak {mib(peak)} ({peak} B), "
    if peak <= limit:
        return line + "met", None
    over = f"the planned peak {mib(peak)} ({peak} B) is over the budget {mib(limit)} ({limit} B) by {peak - limit} B"
    if hard:
        diagnostic = Diagnostic(
            "MP225",
            f"hard budget missed: {over}",
            budget.span,
            "`memoplan plan --budget` writes rules that meet a budget; or mark it `hint` to only report",
        )
    else:
        diagnostic = Diagnostic("MP226", f"budget hint missed: {over}", budget.span, severity=Severity.WARNING)
    return line + f"MISSED ({mode})", diagnostic


def dtr_check(block: ast.ConfigBlock, report: VerifyReport) -> Diagnostic | None:
    """``MP231`` at the ``dtr`` block when its threshold could not be met in the measured step."""
    stats = report.dtr
    if stats is None or not stats.over_threshold:
        return None
    return Diagnostic(
        "MP231",
        f"the dtr eviction_threshold {mib(stats.threshold)} ({stats.threshold} B) was not met "
        f"{stats.over_threshold} time(s): the inputs the candidates keep, and what they may not evict, "
        f"took more (tracked peak {stats.tracked_peak} B)",
        block.span,
        "raise eviction_threshold or lower evictee_minimum_size; `memoplan plan --budget B --dtr` chooses a "
        "threshold that the tracker can meet",
    )


def mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
