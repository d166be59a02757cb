"""Report stage: the plots, drawn with matplotlib from the data of :mod:`memoplan.report.data`.

Each function takes one plot's data dict and returns an inline SVG document (text,
fonts as paths, no external reference), so a report opens with no network.  The
object-oriented API (``matplotlib.figure.Figure``) is used, never ``pyplot``: no global
state, no backend switched for the caller.  Output is deterministic (fixed SVG id
salt, no date).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any

from memoplan.diagnostics import printable

COLORS = {"unplanned": "#7f7f7f", "planned": "#1f77b4"}
SERIES_STYLE = {
    "unplanned": ("#7f7f7f", "s"),
    "chosen": ("#d62728", "*"),
    "memoplan": ("#1f77b4", "o"),
    "memoplan --nested": ("#17becf", "h"),
    "every block": ("#2ca02c", "^"),
    "torch.compile": ("#9467bd", "D"),
    "spikingjelly": ("#8c564b", "v"),
    "transformers checkpointing": ("#ff7f0e", "P"),
}
REGION_SHADES = ("#e8eef7", "#f6f6f6")


def available() -> bool:
    """Whether matplotlib can be imported (the ``report`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def label(text: str) -> str:
    """A module name as matplotlib text: control characters escaped, ``$`` not math."""
    return printable(text).replace("$", r"\$")


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _svg(fig: Any) -> str:
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "memoplan", "svg.fonttype": "path"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # inline: no XML declaration or doctype


def nice_step(top: float, ticks: int = 5) -> float:
    """A round tick spacing (1, 2, 2.5 or 5 times a power of ten) giving at most about ``ticks``
    intervals up to ``top``: 0.2 for 0.57, 0.5 for 2.3, 200 for 870."""
    if top <= 0:
        return 1.0
    raw = top / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw * (1 - 1e-9))


def _bytes_axis(ax: Any, top: float, headroom: float = 1.12) -> None:
    """A bytes axis labelled in MiB at round values (0, 0.2, 0.4, ... MiB), never at round byte counts."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    ax.set_ylim(0, top * headroom if top > 0 else 1)
    step = nice_step(top * headroom / 2**20 if top > 0 else 1)
    ax.yaxis.set_major_locator(MultipleLocator(step * 2**20))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{round(v / 2**20, 9):g}"))
    ax.set_ylabel("live bytes (MiB)")


def memory_svg(plot: Mapping[str, Any]) -> str:
    return _svg(memory_figure(plot))


def memory_figure(plot: Mapping[str, Any]) -> Any:
    """Live bytes over one training step, every run on the common axis; the backward pass and
    the shown modules' regions (of the planned run) shaded, their names in a strip above the
    plot (so that no name crosses a curve or a peak's label); each peak annotated inside the plot."""
    runs = plot["runs"]
    fig = _figure(10, 5.4)
    strip, ax = fig.subplots(2, 1, sharex=True, height_ratios=[1, 4.2])
    top = max((max(r["bytes"]) for r in runs.values() if r["bytes"]), default=0)
    _bytes_axis(ax, top, PEAK_BAND)
    shaded = runs.get("planned") or next(iter(runs.values()))
    end = max(r["end_x"] for r in runs.values())
    _regions(strip, ax, shaded["regions"], end)
    backward = shaded["backward_x"]
    ax.axvline(backward, color="#444444", lw=0.8, ls="--")
    for level, (name, run) in enumerate(runs.items()):
        color = COLORS.get(name, "#ff7f0e")
        ax.plot(run["x"], run["bytes"], color=color, lw=1.2, label=label(f"{name} (peak {mib(run['peak']['bytes'])})"))
        _peak_label(ax, run["peak"], color, top * (1.04 + 0.2 * (level % 2)), right=run["peak"]["x"] < end / 2)
    ax.set_xlim(0, end)
    ax.set_xlabel("one training step, forward | backward (dashed line): " + plot["x_unit"])
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=len(runs), fontsize=8, frameon=False)
    strip.set_title("Memory over one training step", fontsize=11)
    return fig


# The memory plot's y axis reaches PEAK_BAND times the highest peak: the band above every curve
# holds the peaks' labels, one row per run (two rows; a third run shares the first).
PEAK_BAND = 1.45


def _peak_label(ax: Any, peak: Mapping[str, Any], color: str, y: float, *, right: bool) -> None:
    """A peak's bytes and where it is, in the band above every curve, with a line down to it."""
    where = (
        f"{peak['phase']} of {label(peak['module'] or '(root)')}"
        if peak["module"] is not None
        else "outside the shown modules"
    )
    ax.annotate(
        f"{peak['bytes']:,} B, {where}",
        xy=(peak["x"], peak["bytes"]),
        xytext=(peak["x"], y),
        textcoords="data",
        ha="left" if right else "right",
        va="bottom",
        fontsize=8,
        color=color,
        gid="peak-label",
        arrowprops={"arrowstyle": "-", "color": color, "lw": 0.6, "shrinkA": 0},
    )
    ax.plot([peak["x"]], [peak["bytes"]], marker="o", color=color, ms=4)


def _regions(strip: Any, ax: Any, regions: list[Mapping[str, Any]], end: float) -> None:
    """Shade the regions in the plot and the strip; name those wide enough (at most a dozen, widest
    first) in the strip, which has nothing else in it."""
    for i, region in enumerate(sorted(regions, key=lambda r: r["x0"])):
        for axes in (strip, ax):
            axes.axvspan(region["x0"], region["x1"], color=REGION_SHADES[i % 2], lw=0, zorder=0)
    strip.set_ylim(0, 1)
    strip.set_yticks([])
    strip.tick_params(axis="x", which="both", bottom=False, labelbottom=False)
    for side in ("top", "right", "left"):
        strip.spines[side].set_visible(False)
    wide = sorted(regions, key=lambda r: r["x1"] - r["x0"], reverse=True)[:12]
    for region in wide:
        if (region["x1"] - region["x0"]) < end / 40:
            continue
        strip.text(
            (region["x0"] + region["x1"]) / 2,
            0.04,
            label(region["module"] or "(root)"),
            ha="center",
            va="bottom",
            rotation=90,
            fontsize=7,
            color="#555555",
            clip_on=True,
        )


def dtr_svg(plot: Mapping[str, Any]) -> str:
    """The dtr block over one step, on the memory plot's axis: cumulative evictions and
    recomputes (left) and the bytes the tracker holds (right), forward | backward."""
    run = plot["runs"]["planned"]
    series = run["dtr"]
    fig = _figure(10, 3.2)
    ax = fig.add_subplot()
    ax.step(series["x"], series["evictions"], where="post", color="#d62728", lw=1.2, label="evictions (cumulative)")
    ax.step(series["x"], series["recomputes"], where="post", color="#2ca02c", lw=1.2, label="recomputes (cumulative)")
    ax.set_ylabel("count")
    ax.set_ylim(bottom=0)
    held = ax.twinx()
    held.plot(
        series["x"], series["tracked_bytes"], color=COLORS["planned"], lw=0.8, ls=":", label="bytes held by the tracker"
    )
    _bytes_axis(held, max(series["tracked_bytes"], default=0))
    held.set_ylabel("held (MiB)")
    ax.axvline(run["backward_x"], color="#444444", lw=0.8, ls="--")
    ax.set_xlim(0, max(r["end_x"] for r in plot["runs"].values()))
    ax.set_xlabel("one training step, forward | backward (dashed line): the memory plot's axis")
    lines = ax.get_legend_handles_labels()
    more = held.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    ax.set_title("dtr: evictions and recomputes over one training step", fontsize=11)
    return _svg(fig)


def saved_svg(plot: Mapping[str, Any]) -> str:
    """Horizontal bars: saved-activation bytes per module without and with the plan, largest first."""
    rows = plot["rows"]
    fig = _figure(10, max(2.2, 0.32 * len(rows) + 1.2))
    ax = fig.add_subplot()
    ys = list(range(len(rows)))
    height = 0.4
    ax.barh(
        [y - height / 2 for y in ys], [r["before"] for r in rows], height, color=COLORS["unplanned"], label="unplanned"
    )
    ax.barh([y + height / 2 for y in ys], [r["after"] for r in rows], height, color=COLORS["planned"], label="planned")
    ax.set_yticks(ys, [label(r["module"] or "(root)") for r in rows], fontsize=8)
    ax.invert_yaxis()
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    widest = max((max(r["before"], r["after"]) for r in rows), default=0)
    ax.xaxis.set_major_locator(MultipleLocator(nice_step(widest / 2**20 if widest > 0 else 1) * 2**20))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{round(v / 2**20, 9):g}"))
    ax.set_xlabel("saved activation bytes (MiB), the module and everything inside it")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("Saved bytes per module", fontsize=11)
    return _svg(fig)


def sweep_svg(plot: Mapping[str, Any], title: str = "Budget sweep: peak memory against step time") -> str:
    """Peak memory against step time, one marker style per kind of configuration; the chosen
    plan drawn large; budgets labelled; a configuration whose results differ from the
    unplanned step's (``equivalent`` False) drawn hollow."""
    fig = _figure(8, 4.8)
    ax = fig.add_subplot()
    hollow_shown = False
    for kind, points in plot["series"].items():
        color, marker = SERIES_STYLE.get(kind, SERIES_STYLE.get(kind.split(" ")[0], ("#ff7f0e", "x")))
        size = 14 if kind == "chosen" else 6
        for wrong in (False, True):
            chosen = [p for p in points if (p.get("equivalent") is False) == wrong]
            if not chosen:
                continue
            ax.plot(
                [p["step_seconds"] * 1e3 for p in chosen],
                [p["peak_bytes"] / 2**20 for p in chosen],
                marker=marker,
                ms=size,
                ls="none",
                color=color,
                markerfacecolor="none" if wrong else color,
                label=label(kind + (" (results differ)" if wrong else "")),
            )
            hollow_shown |= wrong
        for p in points:
            if p.get("budget") is not None:
                ax.annotate(
                    f"{p['budget']:g}",
                    (p["step_seconds"] * 1e3, p["peak_bytes"] / 2**20),
                    xytext=(4, 3),
                    textcoords="offset points",
                    fontsize=7,
                    color=color,
                )
    ax.set_xlabel("step time (ms, median)")
    ax.set_ylabel("peak memory of one step (MiB)")
    top = max((p["peak_bytes"] for points in plot["series"].values() for p in points), default=0) / 2**20
    ax.set_ylim(0, top * 1.12 if top > 0 else 1)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title, fontsize=11)
    return _svg(fig)


def bars_svg(title: str, labels: list[str], values: list[float], unit: str) -> str:
    """A simple horizontal bar chart (the benchmark summary's plots)."""
    fig = _figure(8, max(2.0, 0.32 * len(labels) + 1.2))
    ax = fig.add_subplot()
    ys = list(range(len(labels)))
    ax.barh(ys, values, color=COLORS["planned"])
    ax.set_yticks(ys, [label(text) for text in labels], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    for y, v in zip(ys, values):
        ax.text(v, y, f" {v:.3g}", va="center", fontsize=7)
    ax.set_title(title, fontsize=11)
    return _svg(fig)
