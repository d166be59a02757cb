"""Report stage: the data behind each plot, as pure functions of plain measurements.

Nothing here runs a model, imports torch or draws: the functions take what
:mod:`memoplan.report.collect` measured (timelines as sample lists with marks,
per-module byte counts, sweep points) and return JSON-serialisable dicts that
:mod:`memoplan.report.draw` turns into pictures and ``--json`` writes next to them.

Marks in a timeline are labels ``"<kind> <module>"`` with kind ``fwd-start``,
``fwd-end`` (the module's forward call) or ``bwd-start`` (the first backward node
of the module's output is about to run; its backward lasts until the next
``bwd-start``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FWD_START = "fwd-start"
FWD_END = "fwd-end"
BWD_START = "bwd-start"

#: Points kept per curve in a plot (each bucket keeps its lowest and highest sample).
MAX_POINTS = 1500


def mark_label(kind: str, module: str) -> str:
    return f"{kind} {module}"


def split_mark(label: str) -> tuple[str, str]:
    kind, _, module = label.partition(" ")
    return kind, module


# ---------------------------------------------------------------- which modules to show


def frontier(names: Sequence[str], planned: Iterable[str]) -> list[str]:
    """The modules a report shows one by one: the root's children, each one that is not planned
    itself but holds a planned module further down replaced by its own children (recursively).

    ``names`` are ``named_modules()`` paths in order (the root ``""`` included or not);
    the result keeps that order.  With ``features.1`` planned in a model ``features``,
    ``pool``, ``classifier``, it is ``features.0 ... features.4, pool, classifier``.  A
    planned module is shown whole even when a rule also names a part of it (its region,
    a time chunk say, runs its parts where their backward cannot be told apart).
    """
    planned = [p for p in planned if p]
    whole = set(planned)
    children: dict[str, list[str]] = {}
    for name in names:
        if name:
            children.setdefault(name.rpartition(".")[0], []).append(name)
    out: list[str] = []

    def expand(parent: str) -> None:
        for child in children.get(parent, []):
            if child not in whole and any(p.startswith(child + ".") for p in planned) and children.get(child):
                expand(child)
            else:
                out.append(child)

    expand("")
    return out


# ---------------------------------------------------------------- memory over one step


def regions(samples_count: int, backward: int, marks: Sequence[tuple[int, str]]) -> list[dict[str, Any]]:
    """Module regions of one timeline: ``{"module", "phase", "start", "end"}`` in sample indices.

    A forward region runs from a module's ``fwd-start`` to its matching ``fwd-end``; a
    backward region from its ``bwd-start`` to the next ``bwd-start`` (or the last sample).
    """
    out: list[dict[str, Any]] = []
    open_: dict[str, list[int]] = {}
    backward_starts: list[tuple[int, str]] = []
    for index, label in marks:
        kind, module = split_mark(label)
        if kind == FWD_START:
            open_.setdefault(module, []).append(index)
        elif kind == FWD_END and open_.get(module):
            start = open_[module].pop()
            out.append({"module": module, "phase": "forward", "start": start, "end": index})
        elif kind == BWD_START and index >= backward:
            backward_starts.append((index, module))
    last = samples_count - 1
    for i, (index, module) in enumerate(backward_starts):
        end = backward_starts[i + 1][0] if i + 1 < len(backward_starts) else last
        out.append({"module": module, "phase": "backward", "start": index, "end": end})
    out.sort(key=lambda r: (r["start"], r["end"]))
    return out


def _key_points(backward: int, count: int, marks: Sequence[tuple[int, str]]) -> tuple[list[int], list[str]]:
    """Indices a timeline is aligned at, and their labels: start, every mark, backward, end."""
    points = [(0, "start")]
    for index, label in marks:
        points.append((index, label))
    points.append((backward, "backward"))
    points.append((count - 1, "end"))
    points.sort(key=lambda p: p[0])  # stable: marks at one index keep their order
    return [p[0] for p in points], [p[1] for p in points]


def aligned_axes(runs: Sequence[Mapping[str, Any]]) -> list[list[float]]:
    """One common x value per sample of every run, so the runs line up on one time axis.

    Each run is ``{"samples": [...], "backward": int, "marks": [(index, label), ...]}``.
    The runs are cut at their key points (start, backward, end, and every mark when all
    runs made the same marks in the same order; else start, backward and end only), and
    each piece gets the width of its longest version: a planned step's recompute stretches
    no other run, and every module starts at one x in all of them.
    """
    keys = [_key_points(r["backward"], len(r["samples"]), r["marks"]) for r in runs]
    if any(labels != keys[0][1] for _, labels in keys):
        keys = [_key_points(r["backward"], len(r["samples"]), []) for r in runs]
    widths = [max(k[0][j + 1] - k[0][j] for k in keys) for j in range(len(keys[0][0]) - 1)]
    starts = [0]
    for w in widths:
        starts.append(starts[-1] + w)
    axes = []
    for (indices, _), run in zip(keys, runs):
        xs: list[float] = []
        segment = 0
        for i in range(len(run["samples"])):
            while segment < len(widths) - 1 and i >= indices[segment + 1]:
                segment += 1
            lo, hi = indices[segment], indices[segment + 1]
            fraction = 0.0 if hi == lo else (i - lo) / (hi - lo)
            xs.append(starts[segment] + fraction * widths[segment])
        axes.append(xs)
    return axes


def envelope(xs: Sequence[float], ys: Sequence[int], limit: int = MAX_POINTS) -> tuple[list[float], list[int]]:
    """At most about ``limit`` points of a curve: per bucket of consecutive samples its lowest
    and its highest one, in order, so the peak and the dips survive."""
    n = len(ys)
    if n <= limit:
        return list(xs), list(ys)
    buckets = max(1, limit // 2)
    out_x: list[float] = []
    out_y: list[int] = []
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if lo >= hi:
            continue
        chunk = range(lo, hi)
        low = min(chunk, key=lambda i: (ys[i], i))
        high = max(chunk, key=lambda i: (ys[i], -i))
        for i in sorted({low, high}):
            out_x.append(xs[i])
            out_y.append(ys[i])
    return out_x, out_y


def peak_holder(samples: Sequence[int], spans: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Where a timeline peaks: its first highest sample and the innermost region around it."""
    peak = max(samples)
    index = samples.index(peak)
    around = [r for r in spans if r["start"] <= index <= r["end"]]
    inner = min(around, key=lambda r: (r["end"] - r["start"], r["start"])) if around else None
    return {
        "index": index,
        "bytes": peak,
        "module": inner["module"] if inner else None,
        "phase": inner["phase"] if inner else None,
    }


def memory_plot(runs: Mapping[str, Mapping[str, Any]], shown: Sequence[str], limit: int = MAX_POINTS) -> dict[str, Any]:
    """The data of the memory-over-one-step plot.

    ``runs`` maps a name (``"unplanned"``, ``"planned"``) to a timeline dict (``samples``,
    ``backward``, ``marks``); ``shown`` are the modules whose regions are marked.  Returns
    the aligned, thinned curves, each run's regions on the common axis, where the backward
    pass starts, and each run's peak (bytes, x, module and phase that hold it).
    """
    names = list(runs)
    axes = aligned_axes([runs[n] for n in names])
    out: dict[str, Any] = {"x_unit": "allocation and free events, runs aligned at module boundaries", "runs": {}}
    wanted = set(shown)
    for name, xs in zip(names, axes):
        run = runs[name]
        samples = list(run["samples"])
        spans = [r for r in regions(len(samples), run["backward"], run["marks"]) if r["module"] in wanted]
        holder = peak_holder(samples, spans)
        cx, cy = envelope(xs, samples, limit)
        out["runs"][name] = {
            "x": cx,
            "bytes": cy,
            "events": len(samples) - 1,
            "backward_x": xs[run["backward"]],
            "end_x": xs[-1],
            "regions": [
                {"module": r["module"], "phase": r["phase"], "x0": xs[r["start"]], "x1": xs[r["end"]]} for r in spans
            ],
            "peak": {**holder, "x": xs[holder["index"]]},
        }
        if run.get("dtr"):
            # (sample index, evictions, recomputes, bytes held) at every module boundary: cumulative counts
            out["runs"][name]["dtr"] = {
                "x": [xs[row[0]] for row in run["dtr"]],
                "evictions": [row[1] for row in run["dtr"]],
                "recomputes": [row[2] for row in run["dtr"]],
                "tracked_bytes": [row[3] for row in run["dtr"]],
            }
    return out


# ---------------------------------------------------------------- saved bytes per module


def saved_rows(
    shown: Sequence[str],
    before: Mapping[str, int],
    after: Mapping[str, int],
    classes: Mapping[str, str],
    limit: int = 20,
) -> dict[str, Any]:
    """Saved-activation bytes of each shown module (its whole subtree) without and with the plan,
    largest first (ties: model order); beyond ``limit`` rows the rest is one ``(others)`` row."""
    order = {name: i for i, name in enumerate(shown)}
    rows: list[dict[str, Any]] = [
        {
            "module": name,
            "class": classes.get(name, ""),
            "before": int(before.get(name, 0)),
            "after": int(after.get(name, 0)),
        }
        for name in shown
    ]
    rows = [r for r in rows if r["before"] or r["after"]]
    rows.sort(key=lambda r: (-r["before"], -r["after"], order[r["module"]]))
    if len(rows) > limit:
        rest = rows[limit - 1 :]
        rows = rows[: limit - 1] + [
            {
                "module": f"({len(rest)} others)",
                "class": "",
                "before": sum(r["before"] for r in rest),
                "after": sum(r["after"] for r in rest),
            }
        ]
    return {
        "rows": rows,
        "total_before": sum(int(before.get(n, 0)) for n in shown),
        "total_after": sum(int(after.get(n, 0)) for n in shown),
    }


# ---------------------------------------------------------------- budget sweep


def sweep_plot(points: Sequence[Mapping[str, Any]], unplanned_bytes: int) -> dict[str, Any]:
    """The budget sweep: one point per configuration that ran (peak bytes, step seconds),
    grouped into series by ``kind``; the ``chosen`` point is the plan being reported.

    Points that failed (``peak_bytes`` None) are listed under ``failed`` with their reason.
    """
    series: dict[str, list[dict[str, Any]]] = {}
    failed = []
    chosen = None
    for p in points:
        if p.get("peak_bytes") is None or p.get("step_seconds") is None:
            failed.append({"label": p["label"], "kind": p["kind"], "error": p.get("error", "")})
            continue
        point = {
            "label": p["label"],
            "peak_bytes": int(p["peak_bytes"]),
            "step_seconds": float(p["step_seconds"]),
            "ratio": p["peak_bytes"] / unplanned_bytes if unplanned_bytes else None,
            "budget": p.get("budget"),
            "budget_met": p.get("budget_met"),
            "equivalent": p.get("equivalent"),
        }
        if p.get("chosen"):
            chosen = point
        series.setdefault(p["kind"], []).append(point)
    for values in series.values():
        values.sort(key=lambda q: (q["peak_bytes"], q["step_seconds"]))
    return {"unplanned_bytes": unplanned_bytes, "series": series, "chosen": chosen, "failed": failed}


# ---------------------------------------------------------------- checks


def figures(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every leaf of a JSON-like value with its path: for checking that a report's figures
    are numbers (``bool`` and ``None`` are not)."""
    if isinstance(value, Mapping):
        return [leaf for key, item in value.items() for leaf in figures(item, f"{path}.{key}" if path else str(key))]
    if isinstance(value, (list, tuple)):
        return [leaf for i, item in enumerate(value) for leaf in figures(item, f"{path}[{i}]")]
    return [(path, value)]
