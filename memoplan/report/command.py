"""Report stage: ``memoplan report`` -- measure, draw and write one self-contained HTML file.

The command line loads the plan, the model and the example as ``check`` and ``verify``
do (the same diagnostics) and hands them to :func:`write_report`, which measures
everything first and writes the files last: a failure writes nothing.  This module
imports neither torch nor matplotlib at import time (the command line builds its
parser without them).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memoplan.diagnostics import Diagnostic, PlanError, nonnegative_float
from memoplan.report import data, page
from memoplan.targets import replace_file

#: Budgets of the sweep, shares of the unplanned peak.
DEFAULT_BUDGETS = (0.9, 0.75, 0.6, 0.5)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ReportOptions:
    json: bool = False  # also write each plot's data as JSON next to the report
    sweep: bool | None = None  # None: when the plan has a budget or came from `memoplan plan`
    budgets: tuple[float, ...] = DEFAULT_BUDGETS
    peers: bool = False  # torch.compile with activation_memory_budget in the sweep
    seed: int = 0
    repeats: int = 5  # timed steps per sweep point (their median)
    command: str = ""  # how the report was made, shown on the page


@dataclass(frozen=True)
class ReportResult:
    path: Path
    written: tuple[Path, ...]
    sections: tuple[str, ...]
    plots: dict[str, Any] = field(default_factory=dict)
    peaks: dict[str, int] = field(default_factory=dict)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``memoplan report`` after PLAN, --model, --example and --device."""
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="PATH", help="the .html file to write")
    parser.add_argument(
        "--json",
        action="store_true",
        help="also write the data behind each plot as JSON next to the report (PATH.<plot>.json)",
    )
    parser.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="plan at several budgets and plot peak against step time "
        "(default: when the plan has a budget or was written by `memoplan plan`)",
    )
    parser.add_argument(
        "--budgets",
        type=nonnegative_float,  # out of (0, 1] is MP512 after
        nargs="+",
        metavar="F",
        help=f"budgets of the sweep, shares of the unplanned peak (default {' '.join(map(str, DEFAULT_BUDGETS))})",
    )
    parser.add_argument(
        "--peers", action="store_true", help="add torch.compile with activation_memory_budget to the sweep"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="RNG seed for building the model and for every step (default 0)"
    )


def command_line(args: argparse.Namespace) -> str:
    """The ``memoplan report`` command that ``args`` came from (for the page's footnote)."""
    import shlex

    words = ["memoplan", "report", str(args.plan)]
    for flag in ("model", "example", "device"):
        if getattr(args, flag, None) is not None:
            words += [f"--{flag}", str(getattr(args, flag))]
    if args.sweep is not None:
        words.append("--sweep" if args.sweep else "--no-sweep")
    if args.budgets:
        words += ["--budgets", *(f"{b:g}" for b in args.budgets)]
    words += ["--peers"] * bool(args.peers) + ["--json"] * bool(args.json)
    if args.seed:
        words += ["--seed", str(args.seed)]
    return shlex.join([*words, "-o", str(args.output)])


def options_from(args: argparse.Namespace) -> ReportOptions:
    """The options given on the command line; MP512 for a budget that is not a share in (0, 1]."""
    command = command_line(args)
    budgets = tuple(args.budgets) if args.budgets else DEFAULT_BUDGETS
    bad = [b for b in budgets if not 0 < b <= 1]
    if bad:
        raise PlanError(
            (
                Diagnostic(
                    "MP512",
                    f"--budgets {bad[0]:g} is not a share of the unplanned peak",
                    help="give values in (0, 1], e.g. 0.75 0.5",
                ),
            )
        )
    return ReportOptions(
        json=args.json, sweep=args.sweep, budgets=budgets, peers=args.peers, seed=args.seed, command=command
    )


def require_matplotlib() -> None:
    """MP510 when matplotlib (the ``report`` extra) is missing: checked before any work."""
    from memoplan.report.draw import available

    if not available():
        raise PlanError(
            (
                Diagnostic(
                    "MP510",
                    "`memoplan report` draws with matplotlib, which is not installed",
                    help="pip install 'memoplan[report]' (in a checkout of memoplan, `make demo` sets up everything)",
                ),
            )
        )


def came_from_planner(plan: Any) -> bool:
    """Whether ``plan``'s header says `memoplan plan` wrote it."""
    return any("generated by:" in line and "memoplan plan" in line for line in plan.header_comments.leading)


def json_paths(path: Path, plots: Sequence[str]) -> dict[str, Path]:
    return {name: path.with_name(f"{path.stem}.{name}.json") for name in plots}


# ---------------------------------------------------------------- the report


def write_report(
    plan: Any,
    resolved: Any,
    model: Any,
    example: Any,
    path: Path,
    options: ReportOptions = ReportOptions(),
    *,
    device: Any = None,
    progress: Progress = lambda message: None,
) -> ReportResult:
    """Measure ``model`` without and with ``resolved`` (the plan ``plan`` resolved against it),
    draw the plots and write ``path`` (and, with ``options.json``, each plot's data next to it).

    Nothing is written until everything is measured and drawn.
    """
    import copy

    from memoplan.report import collect
    from memoplan.verification import budget_check, render_report, verify

    require_matplotlib()
    cpu = device is None or getattr(device, "type", str(device)) == "cpu"
    if not cpu:
        model = copy.deepcopy(model).to(device)
        example = example.to(device)

    progress("verifying: one training step without and one with the plan")
    report = verify(model, resolved, example, seed=options.seed)
    budget_line = None
    if plan.budget is not None:
        budget_line, _ = budget_check(plan.budget, report)

    names = [name for name, _ in model.named_modules()]
    planned_paths = [m.path for m in resolved.modules]
    shown = data.frontier(names, planned_paths)
    plots: dict[str, Any] = {}
    peaks = {"verify_unplanned": report.unplanned.peak_bytes, "verify_planned": report.planned.peak_bytes}

    if cpu:
        progress("measuring memory over one step, without and with the plan")
        runs = collect.timelines(model, resolved, example, shown, seed=options.seed)
        plots["memory"] = data.memory_plot(runs, shown)
        plots["memory"]["verify_peak_bytes"] = {
            "unplanned": report.unplanned.peak_bytes,
            "planned": report.planned.peak_bytes,
        }
        peaks.update(timeline_unplanned=runs["unplanned"]["peak_bytes"], timeline_planned=runs["planned"]["peak_bytes"])

    progress("profiling saved bytes per module, without and with the plan")
    before, after, classes, prof = collect.saved_bytes(model, resolved, example, shown)
    plots["saved"] = data.saved_rows(shown, before, after, classes)

    run_sweep = options.sweep if options.sweep is not None else (plan.budget is not None or came_from_planner(plan))
    if run_sweep:
        chosen = {"label": f"this plan ({resolved.file})", "plan": resolved}
        points = collect.sweep(
            model,
            example,
            prof,
            chosen,
            options.budgets,
            peers=options.peers,
            seed=options.seed,
            repeats=options.repeats,
            progress=progress,
        )
        plots["sweep"] = data.sweep_plot(points, report.unplanned.peak_bytes)

    dtr = collect.dtr_statistics(model, resolved, example, options.seed)

    progress("drawing")
    sections = _sections(resolved, report, render_report(report), budget_line, plots, _svgs(plots), dtr)
    text = _page(resolved, report, options, sections)
    written = write_page(path, text, plots, options.json)
    return ReportResult(path, tuple(written), tuple(s.id for s in sections), plots, peaks)


def _svgs(plots: dict[str, Any]) -> dict[str, str | None]:
    """Each plot drawn as SVG (None where the plot was not measured)."""
    from memoplan.report import draw

    return {
        "memory": draw.memory_svg(plots["memory"]) if "memory" in plots else None,
        "saved": draw.saved_svg(plots["saved"]),
        "sweep": draw.sweep_svg(plots["sweep"]) if "sweep" in plots else None,
        "dtr": draw.dtr_svg(plots["memory"])
        if "memory" in plots and "dtr" in plots["memory"]["runs"]["planned"]
        else None,
    }


def _page(resolved: Any, report: Any, options: ReportOptions, sections: list[page.Section]) -> str:
    """The whole HTML page: title, the plan's one-line summary and the sections."""
    title = f"memoplan report: {resolved.file}"
    intro = [
        page.paragraph(
            f"Plan {resolved.file}, {len(resolved.modules)} planned module{'s' if len(resolved.modules) != 1 else ''}; "
            f"meter: {report.unplanned.method} ({report.unplanned.device}); seed {options.seed}."
        )
    ]
    if options.command:
        intro.append(page.paragraph(f"Made by: {options.command}", "note"))
    return page.render(title, intro, sections)


def write_page(path: Path, text: str, plots: dict[str, Any], with_json: bool) -> list[Path]:
    """Write the page (and, with ``with_json``, each plot's data next to it); the paths written."""
    written = []
    if with_json:
        for name, target in json_paths(path, list(plots)).items():
            replace_file(target, json.dumps(plots[name], indent=1, sort_keys=True) + "\n")
            written.append(target)
    replace_file(path, text)
    written.append(path)
    return written


def plan_rows(resolved: Any) -> list[tuple[str, str, str, str]]:
    """The report's plan table: module, class, policy, rule, for every decision the compiled
    header lists (:meth:`memoplan.ir.ModulePlan.decisions`, ``dtr`` candidates included)."""
    return [
        (m.path or "(root)", m.type_name.rpartition(".")[2], policy, f"{origin.file}:{origin.line}")
        for m in resolved.modules
        for policy, origin in m.decisions()
    ]


def rules_table(resolved: Any) -> str:
    """The plan section's table of the module rules (:func:`plan_rows`), or a note when there are none."""
    rows = plan_rows(resolved)
    if rows:
        return page.table(("module", "class", "policy", "rule"), rows)
    return page.paragraph("No module rules: the plan acts through its blocks only.", "note")


def _sections(resolved, report, verify_text, budget_line, plots, svgs, dtr) -> list[page.Section]:
    sections = [
        _plan_section(resolved, report, verify_text, budget_line),
        _memory_section(report, plots, svgs),
        _saved_section(resolved, plots, svgs),
    ]
    if "sweep" in plots:
        sections.append(_sweep_section(plots, svgs))
    if dtr is not None:
        sections.append(_dtr_section(svgs, dtr))
    return sections


def _plan_section(resolved, report, verify_text: str, budget_line: str | None) -> page.Section:
    plan_section = page.Section("plan", "Resolved plan and verification")
    plan_section.add(rules_table(resolved))
    plan_section.add(
        "<p>verdict: "
        + page.verdict("EQUIVALENT" if report.equivalent else "NOT EQUIVALENT", report.equivalent)
        + f" peak {report.unplanned.peak_bytes:,} B unplanned, {report.planned.peak_bytes:,} B planned</p>"
    )
    plan_section.add(page.preformatted(verify_text + (f"\n{budget_line}" if budget_line else "")))
    return plan_section


def _memory_section(report, plots, svgs) -> page.Section:
    memory = page.Section("memory", "Memory over one training step")
    if "memory" in plots:
        runs = plots["memory"]["runs"]
        u, p = runs["unplanned"]["peak"], runs["planned"]["peak"]

        def where(peak: dict) -> str:
            return (
                f"{peak['phase']} of {peak['module'] or '(root)'}"
                if peak["module"] is not None
                else "outside the shown modules"
            )

        memory.add(
            page.figure(
                "memory",
                svgs["memory"],
                f"Live bytes after every allocation and free (CPU live-storage meter), forward then backward. "
                f"Unplanned peak {u['bytes']:,} B in the {where(u)}; planned peak {p['bytes']:,} B in the {where(p)}. "
                f"Shaded: the regions of the planned step's modules.",
            )
        )
        memory.add(
            page.table(
                ("run", "peak (B)", "peak (MiB)", "held in", "allocation and free events"),
                [
                    (
                        name,
                        f"{r['peak']['bytes']:,}",
                        draw_mib(r["peak"]["bytes"]),
                        where(r["peak"]),
                        f"{r['events']:,}",
                    )
                    for name, r in runs.items()
                ],
                numeric=(1, 2, 4),
            )
        )
    else:
        memory.add(
            page.paragraph(
                "The timeline is measured with the CPU live-storage meter; on this device the report shows the "
                f"allocator's peaks only: unplanned {report.unplanned.peak_bytes:,} B, planned {report.planned.peak_bytes:,} B.",
                "note",
            )
        )
    return memory


def _saved_section(resolved, plots, svgs) -> page.Section:
    saved = page.Section("saved", "Saved bytes per module")
    s = plots["saved"]
    saved.add(
        page.figure(
            "saved",
            svgs["saved"],
            f"Activation bytes saved for backward by each module and everything inside it (the profiler's attribution), "
            f"largest first: {s['total_before']:,} B unplanned, {s['total_after']:,} B planned."
            + (
                " The dtr block's tracker saves activations through hooks of its own, which the profiler does "
                "not see: what it holds over the step is in the dtr section."
                if resolved.dtr is not None
                else ""
            ),
        )
    )
    saved.add(saved_table(s["rows"]))
    return saved


def saved_table(rows: Sequence[dict[str, Any]]) -> str:
    """The saved-bytes section's table: a module's bytes without and with the plan."""
    return page.table(
        ("module", "class", "unplanned (B)", "planned (B)"),
        [(r["module"] or "(root)", r["class"], f"{r['before']:,}", f"{r['after']:,}") for r in rows],
        numeric=(2, 3),
    )


def _sweep_section(plots, svgs) -> page.Section:
    sweep = page.Section("sweep", "Budget sweep")
    sw = plots["sweep"]
    sweep.add(
        page.figure(
            "sweep",
            svgs["sweep"],
            "Peak memory of one step against the median step time: memoplan's optimal planner at each budget "
            "(a hard budget, a share of the unplanned peak; where it is out of reach, the least-peak plan), checkpointing every block, the unplanned step and this plan"
            + (
                ", and torch.compile at each activation_memory_budget."
                if any(k == "torch.compile" for k in sw["series"])
                else "."
            ),
        )
    )
    rows = [
        (q["label"], kind, f"{q['peak_bytes']:,}", f"{q['ratio']:.3f}", f"{q['step_seconds'] * 1e3:.1f}")
        for kind, points in sw["series"].items()
        for q in points
    ]
    rows += [(f["label"], f["kind"], "-", "-", f"failed: {f['error']}") for f in sw["failed"]]
    sweep.add(page.table(("configuration", "kind", "peak (B)", "x unplanned", "step (ms)"), rows, numeric=(2, 3, 4)))
    return sweep


def _dtr_section(svgs, dtr) -> page.Section:
    section = page.Section("dtr", "Dynamic tensor rematerialisation")
    if svgs.get("dtr"):
        section.add(
            page.figure(
                "dtr",
                svgs["dtr"],
                "The dtr block's tracker at every module boundary of the planned step above (memoplan.dtr_stats): "
                "evictions and recomputes so far, and the bytes it holds.",
            )
        )
    section.add(
        page.paragraph(
            "What the dtr block's tracker did over one training step of a planned copy (memoplan.dtr_stats):"
        )
    )
    section.add(
        page.table(
            ("statistic", "value"),
            [
                (k, f"{v:,}" if isinstance(v, int) else f"{v:.6g}" if isinstance(v, float) else v)
                for k, v in sorted(dtr["statistics"].items())
            ],
            numeric=(1,),
        )
    )
    return section


def draw_mib(n: int) -> str:
    return f"{n / 2**20:.2f}"
