"""Report stage: ``memoplan report`` of a model no real step of which runs here -- the page drawn
from the fake-tensor estimate.

A model built on the meta device (or under a ``FakeTensorMode``) has no storage: no step of it
runs, so nothing can be measured and equivalence cannot be checked.  What the estimate gives is
drawn instead: the peaks of one step without and one with the plan
(:func:`memoplan.verification.estimated_verify`, what ``memoplan verify`` says of such a model)
and the saved-activation bytes of each module (the estimated profiles of the model and of a
planned copy, :func:`memoplan.planner.profiling.estimate.estimate`).  The page says on top that its figures
are estimates and that equivalence was not checked; each section that needs real steps (the
memory timeline, the budget sweep, the ``dtr`` tracker) is kept as a sentence that says why it
is not drawn.  As for a real model, nothing is written unless everything succeeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memoplan.report import data, page
from memoplan.report.command import Progress, ReportOptions, ReportResult, came_from_planner, rules_table, saved_table

__all__ = ["not_checked", "write_estimated_report"]


def write_estimated_report(
    plan: Any,
    resolved: Any,
    model: Any,
    example: Any,
    path: Path,
    options: ReportOptions | None = None,
    *,
    device: Any = None,
    progress: Progress = lambda message: None,
) -> ReportResult:
    """Estimate ``model`` without and with ``resolved`` (``plan`` resolved against it) on fake
    tensors of the target device, draw what the estimate gives and write ``path`` (and, with
    ``options.json``, the data of each plot next to it).  ``ReportResult.peaks`` holds the
    estimated peaks (``estimated_unplanned``, ``estimated_planned``)."""
    from memoplan.report.command import require_matplotlib, write_page
    from memoplan.verification import estimated_budget_check, estimated_verify

    require_matplotlib()
    options = options or ReportOptions()
    progress("estimating one training step without and one with the plan on fake tensors")
    check = estimated_verify(model, plan, example, device)
    budget_line = estimated_budget_check(plan.budget, check)[0] if plan.budget is not None else None
    shown = data.frontier([name for name, _ in model.named_modules()], [m.path for m in resolved.modules])
    progress("estimating saved bytes per module, without and with the plan, on fake tensors")
    before, after, kernels = _estimated_profiles(model, resolved, example, device)
    classes = {m.name: m.type.rpartition(".")[2] for m in before.modules}
    plots = {
        "saved": data.saved_rows(
            shown,
            {n: before.subtree_saved_bytes(n) for n in shown if n in before},
            {n: after.subtree_saved_bytes(n) for n in shown if n in after},
            classes,
        )
    }
    plots["saved"]["estimated"] = True
    progress("drawing")
    sweep = options.sweep if options.sweep is not None else (plan.budget is not None or came_from_planner(plan))
    sections = _sections(resolved, check, budget_line, before, kernels, plots, sweep=sweep)
    text = _page(resolved, check, kernels, options, sections)
    written = write_page(path, text, plots, options.json)
    peaks = {"estimated_unplanned": check.unplanned_peak, "estimated_planned": check.planned_peak}
    return ReportResult(path, tuple(written), tuple(s.id for s in sections), plots, peaks)


def not_checked(plan_path: Any, model: Any):
    """MP414, a warning: the report of ``model`` (``plan_path``'s) is drawn from the estimate."""
    from memoplan.diagnostics import Diagnostic, Severity
    from memoplan.planner.profiling.target import not_runnable

    why = not_runnable(model) or "no real step runs here"
    return Diagnostic(
        "MP414",
        f"`{plan_path}`: the report's figures are estimates on fake tensors and equivalence was not checked: {why}",
        help="verify the plan on a smaller real build of the model (`memoplan docs meta`)",
        severity=Severity.WARNING,
    )


def _estimated_profiles(model: Any, resolved: Any, example: Any, device: Any) -> tuple[Any, Any, str]:
    """The estimated profiles of ``model`` and of a planned copy (sharing its parameters), on the
    target device; and what ran the fake steps (``Target.kernels_text``)."""
    from memoplan import api
    from memoplan.planner.profiling.copies import estimate_copy
    from memoplan.planner.profiling.estimate import estimate
    from memoplan.planner.profiling.target import TARGET, target_for

    aim = target_for(model, device)
    token = TARGET.set(aim)
    try:
        before = estimate(model, example, device=aim.device, repeats=1, progress=False)
        planned = api.apply(estimate_copy(model), resolved, warn=False)
        after = estimate(planned, example, device=aim.device, repeats=1, progress=False)
    finally:
        TARGET.reset(token)
    return before, after, aim.kernels_text()


def _page(resolved: Any, check: Any, kernels: str, options: ReportOptions, sections: list[page.Section]) -> str:
    title = f"memoplan report: {resolved.file} (estimated)"
    count = len(resolved.modules)
    intro = [
        page.paragraph(
            f"Plan {resolved.file}, {count} planned module{'s' if count != 1 else ''}; seed {options.seed}."
        ),
        page.paragraph(
            f"Every figure on this page is an ESTIMATE on fake tensors ({kernels}): no training step ran, "
            f"because {check.why}. Equivalence was NOT checked: verify the plan on a smaller real build of "
            "the same model (`memoplan docs meta`).",
            "note",
        ),
    ]
    if options.command:
        intro.append(page.paragraph(f"Made by: {options.command}", "note"))
    return page.render(title, intro, sections)


def _sections(resolved, check, budget_line, before, kernels, plots, *, sweep: bool) -> list[page.Section]:
    sections = [
        _plan_section(resolved, check, budget_line),
        _memory_section(check, before, kernels),
        _saved_section(plots),
    ]
    if sweep:
        sections.append(
            page.Section("sweep", "Budget sweep").add(
                page.paragraph(
                    "Not drawn: the sweep measures the peak and times a real step of a plan at each budget, and "
                    f"no step runs here: {check.why}. `memoplan plan --budget B` estimates a plan for any budget.",
                    "note",
                )
            )
        )
    if resolved.dtr is not None:
        sections.append(
            page.Section("dtr", "Dynamic tensor rematerialisation").add(
                page.paragraph(
                    "Not drawn: the dtr block's tracker evicts and recomputes while a real step runs, and no step "
                    f"runs here: {check.why}.",
                    "note",
                )
            )
        )
    return sections


def _plan_section(resolved, check, budget_line: str | None) -> page.Section:
    section = page.Section("plan", "Resolved plan and estimate")
    section.add(rules_table(resolved))
    section.add(
        "<p>verdict: "
        + page.verdict("NOT CHECKED (estimated)", False)
        + f" peak {check.unplanned_peak:,} B unplanned, {check.planned_peak:,} B planned, on fake tensors</p>"
    )
    section.add(page.preformatted(check.render() + (f"\n{budget_line}" if budget_line else "")))
    return section


def _memory_section(check, before, kernels: str) -> page.Section:
    section = page.Section("memory", "Memory over one training step (estimated)")
    section.add(
        page.paragraph(
            "The timeline is not drawn: it follows every allocation and free of a real step, and no step runs "
            f"here: {check.why}. The estimate gives the peaks:",
            "note",
        )
    )
    rows = [
        ("unplanned peak", f"{check.unplanned_peak:,}", _mib(check.unplanned_peak)),
        ("planned peak", f"{check.planned_peak:,}", _mib(check.planned_peak)),
        ("parameters", f"{before.parameter_bytes:,}", _mib(before.parameter_bytes)),
    ]
    if before.reserved_bytes:
        rows.append(
            ("reserved by the caching allocator, unplanned", f"{before.reserved_bytes:,}", _mib(before.reserved_bytes))
        )
    section.add(page.table(("estimated on fake tensors", "bytes", "MiB"), rows, numeric=(1, 2)))
    section.add(page.paragraph(f"Kernels: {kernels}.", "note"))
    return section


def _saved_section(plots) -> page.Section:
    from memoplan.report import draw

    section = page.Section("saved", "Saved bytes per module (estimated)")
    s = plots["saved"]
    section.add(
        page.figure(
            "saved",
            draw.saved_svg(s),
            "Activation bytes saved for backward by each module and everything inside it, estimated on fake "
            f"tensors, largest first: {s['total_before']:,} B unplanned, {s['total_after']:,} B planned.",
        )
    )
    section.add(saved_table(s["rows"]))
    return section


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"
