"""memonger: the arena's figures on real models, and planning time on a 1,000-step graph.

    .venv/bin/python benchmarks/memonger.py            # every model, markdown on stdout
    .venv/bin/python benchmarks/memonger.py --quick    # the CNN and a 200-step graph: a check that it runs

For each model (the bundled CNN, transformer and spiking CNN; transformers' GPT-2 with
``use_cache=False`` and BERT, built from configs by ``benchmarks/hf_models.py``), in eval
mode under ``torch.no_grad``:

* capture time (``torch.export`` and the probing run), then for each algo and ordering,
  with the default ``peak_slack = 0.02``: the buffers kept in the arena, the baseline (every
  kept buffer its own allocation), the arena, the lower bound (most bytes live at once),
  the scratch the arena's kernels allocate inside, and the layout's planning time;
* with the default block (``algo = greedy``, ``ordering = topological``) applied by
  ``memoplan.apply``: outputs against eager on three fresh inputs (bit for bit, by
  ``memoplan.compare``), the peak of one call by the CPU meter (``LiveStorageMeter``:
  eager; the arena's first call, which allocates it; a later call plus the resident
  arena), allocations per call after the first (fresh storages the ops return), the same
  two with ``peak_slack = 10`` (every buffer an ``out=`` form can write), and the
  median time of a call (one torch thread unless ``--threads``: with two threads on a
  shared two-core machine, single calls stalled for 8 to 16 ms at random);
* unless ``--no-compile``: ``torch.compile`` (Inductor, which plans its buffers too) of the
  same model, its peak from torch.profiler's memory events (the running sum of their bytes;
  the CPU meter does not see compiled code), eager's and the arena's (plus the resident
  arena) measured the same way, and its time.

The synthetic graph: ``--nodes`` steps, each reading the step before it and, one time in
five, one of the ten before that; buffer sizes drawn from 1 KiB to 1 MiB (seed 0).
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memoplan  # noqa: E402
from memoplan.compare import compare  # noqa: E402
from memoplan.diagnostics import PlanError  # noqa: E402
from memoplan.measure import LiveStorageMeter  # noqa: E402
from memoplan.memonger import Buffer, layout  # noqa: E402
from memoplan.memonger.capture import capture  # noqa: E402
from memoplan.memonger.measure import count_allocations  # noqa: E402
from memoplan.memonger.plan import lay_out  # noqa: E402
from memoplan.runtime.arena import arena_state  # noqa: E402
from memoplan.specs import Example  # noqa: E402

MIB = 2**20
SETTINGS = [(a, o) for a in ("greedy", "dp") for o in ("topological", "longest_path")]


def _models(quick: bool):
    from benchmarks import hf_models
    from memoplan.examples import cnn, spiking, transformer

    def ids():
        return Example((torch.randint(0, 512, (4, 128)),), {"use_cache": False})

    yield "cnn", cnn.build, lambda: Example(cnn.example())
    if quick:
        return
    yield "transformer", transformer.build, lambda: Example(transformer.example())
    yield "spiking", spiking.build, lambda: Example(tuple(spiking.example()))
    yield "gpt2", hf_models.gpt2, ids
    yield "bert", hf_models.bert, lambda: Example((torch.randint(0, 512, (4, 128)),))


def _peak(fn) -> int:
    with LiveStorageMeter() as meter:
        fn()
    return meter.peak_bytes


def profiled_peak(fn) -> int:
    """The peak of ``fn()`` from torch.profiler's memory events: the running sum of their bytes in
    time order (the CPU meter does not see what torch.compile runs)."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    live = peak = 0
    for event in memory:
        live += event["args"]["Bytes"]
        peak = max(peak, live)
    return peak


def _median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_model(name, build, example, repeats: int, compiled: bool = False) -> dict:
    torch.manual_seed(0)
    model = build().eval()
    ex = example()
    row: dict = {"model": name}
    start = time.perf_counter()
    try:
        program = capture(model, ex.args, dict(ex.kwargs))
    except PlanError as error:
        row["refused"] = f"{error.errors[0].code}: {error.errors[0].message}"
        return row
    row["capture_s"] = time.perf_counter() - start
    row["steps"] = len(program.steps)
    row["layouts"] = []
    for algo, ordering in SETTINGS:
        start = time.perf_counter()
        plan = lay_out(program, algo=algo, ordering=ordering, slack=0.02)
        elapsed = time.perf_counter() - start
        s = plan.layout.stats
        row["layouts"].append(
            {
                "algo": algo,
                "ordering": ordering,
                "kept": len(plan.arena_buffers),
                "could": len(program.arena_buffers()),
                "slots": len(plan.slots),
                "baseline": plan.baseline_bytes,
                "arena": s.arena_bytes,
                "bound": s.lower_bound_bytes,
                "optimal": s.optimal,
                "plan_ms": elapsed * 1e3,
                "outside": len(plan.outside),
                "outside_bytes": sum(program.buffers[i].size for i in plan.outside),
                "scratch": sum(program.buffers[i].scratch for i in plan.arena_buffers),
                "estimate": plan.arena_peak,
                "eager_estimate": plan.eager_peak,
            }
        )
    reference = copy.deepcopy(model)
    _apply(model, ex)
    state = arena_state(model)
    equal = True
    with torch.no_grad():
        for _ in range(3):
            fresh = example()
            got = model(*fresh.args, **fresh.kwargs)
            expected = reference(*fresh.args, **fresh.kwargs)
            equal &= compare("outputs", {"outputs": expected}, {"outputs": got}).equal
        row["bit_for_bit"] = equal
        state.arena = None  # the first call below allocates it again
        call = lambda: model(*ex.args, **ex.kwargs)  # noqa: E731
        eager = lambda: reference(*ex.args, **ex.kwargs)  # noqa: E731
        row["eager_peak"] = _peak(eager)
        row["arena_first_peak"] = _peak(call)
        row["arena_steady_peak"] = _peak(call) + state.arena.untyped_storage().nbytes()
        row["arena_bytes"] = state.arena.untyped_storage().nbytes()
        row["eager_allocs"] = count_allocations(eager)[0]
        row["arena_allocs"] = count_allocations(call)[0]
        row["eager_ms"] = _median_time(eager, repeats) * 1e3
        row["arena_ms"] = _median_time(call, repeats) * 1e3
        row["eager_profiled_peak"] = profiled_peak(eager)
        row["arena_profiled_peak"] = profiled_peak(call) + row["arena_bytes"]
        every = copy.deepcopy(reference)
        _apply(every, ex, "memonger { peak_slack = 10 }")
        run_every = lambda: every(*ex.args, **ex.kwargs)  # noqa: E731
        run_every()
        row["every_steady_peak"] = _peak(run_every) + arena_state(every).arena.untyped_storage().nbytes()
        row["every_allocs"] = count_allocations(run_every)[0]
        if compiled:
            inductor = torch.compile(copy.deepcopy(reference))
            run = lambda: inductor(*ex.args, **ex.kwargs)  # noqa: E731
            start = time.perf_counter()
            run()
            row["compile_s"] = time.perf_counter() - start
            run()
            row["compiled_peak"] = profiled_peak(run)
            row["compiled_ms"] = _median_time(run, repeats) * 1e3
    row["arena_calls"] = state.arena_calls
    return row


def _apply(model, ex: Example, block: str = "memonger { }") -> None:
    """Apply a plan with a `memonger` block whose example is ``ex`` (a spec loaded from this module)."""
    import importlib

    importlib.import_module("benchmarks.memonger")._EXAMPLE = ex  # this file may run as __main__
    memoplan.apply(model, f'memplan 1\nexample "benchmarks.memonger:current_example"\n{block}\n')


_EXAMPLE: Example | None = None


def current_example() -> Example:
    assert _EXAMPLE is not None
    return _EXAMPLE


def synthetic(nodes: int, seed: int = 0):
    rnd = random.Random(seed)
    deps = []
    for i in range(nodes):
        before = [i - 1] if i else []
        if i > 10 and rnd.random() < 0.2:
            before.append(rnd.randint(i - 11, i - 2))
        deps.append(sorted(set(before)))
    users = [[] for _ in range(nodes)]
    for step, before in enumerate(deps):
        for d in before:
            users[d].append(step)
    buffers = [Buffer(rnd.randint(1024, MIB), i, tuple(users[i])) for i in range(nodes)]
    return deps, buffers


def measure_synthetic(nodes: int) -> list[dict]:
    deps, buffers = synthetic(nodes)
    rows = []
    for algo, ordering in SETTINGS:
        start = time.perf_counter()
        result = layout(deps, buffers, algo=algo, ordering=ordering)
        elapsed = time.perf_counter() - start
        s = result.stats
        rows.append(
            {
                "algo": algo,
                "ordering": ordering,
                "baseline": s.baseline_bytes,
                "arena": s.arena_bytes,
                "bound": s.lower_bound_bytes,
                "optimal": s.optimal,
                "plan_s": elapsed,
            }
        )
    return rows


def _mib(n: int) -> str:
    return f"{n / MIB:.2f}"


def render(models: list[dict], graph: list[dict], nodes: int) -> str:
    out = [
        "### Arena against the lower bound (`peak_slack = 0.02`, the default)",
        "",
        "| model | steps | algo | ordering | buffers in the arena | slots | baseline MiB | arena MiB | lower bound MiB | arena / bound | outside the arena | scratch B a call | estimated peak / eager's | plan ms |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for row in models:
        if "refused" in row:
            out.append(f"| {row['model']} | refused: {row['refused']} | | | | | | | | | | | | |")
            continue
        for lay in row["layouts"]:
            ratio = lay["arena"] / lay["bound"] if lay["bound"] else 1.0
            out.append(
                f"| {row['model']} | {row['steps']} | {lay['algo']} | {lay['ordering']} | {lay['kept']} of {lay['could']} | "
                f"{lay['slots']} | {_mib(lay['baseline'])} | {_mib(lay['arena'])} | {_mib(lay['bound'])} | {ratio:.3f} | "
                f"{lay['outside']} results, {_mib(lay['outside_bytes'])} MiB | {lay['scratch']} | "
                f"{lay['estimate'] / lay['eager_estimate']:.3f} | {lay['plan_ms']:.1f} |"
            )
    out += [
        "",
        "### One inference call (CPU meter, `algo = greedy`, `ordering = topological`)",
        "",
        "| model | capture s | bit for bit | eager peak MiB | arena: first call MiB | arena: later call + arena MiB | arena / eager | arena / eager, profiler | allocations per call (eager → arena) | every buffer (`peak_slack = 10`): later call + arena MiB | its allocations per call | eager ms | arena ms |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: |",
    ]
    for row in models:
        if "refused" in row:
            continue
        out.append(
            f"| {row['model']} | {row['capture_s']:.1f} | {'yes' if row['bit_for_bit'] else 'NO'} | "
            f"{_mib(row['eager_peak'])} | {_mib(row['arena_first_peak'])} | {_mib(row['arena_steady_peak'])} | "
            f"{row['arena_steady_peak'] / row['eager_peak']:.3f} | "
            f"{row['arena_profiled_peak'] / row['eager_profiled_peak']:.3f} | "
            f"{row['eager_allocs'].count} ({_mib(row['eager_allocs'].bytes)} MiB) → {row['arena_allocs'].count} "
            f"({_mib(row['arena_allocs'].bytes)} MiB) | {_mib(row['every_steady_peak'])} | "
            f"{row['every_allocs'].count} ({_mib(row['every_allocs'].bytes)} MiB) | "
            f"{row['eager_ms']:.2f} | {row['arena_ms']:.2f} |"
        )
    if any("compiled_peak" in row for row in models):
        out += [
            "",
            "### Against torch.compile (Inductor), peaks from torch.profiler's memory events",
            "",
            "| model | eager peak MiB | torch.compile peak MiB | arena: later call + arena MiB | arena / torch.compile | compile s | compiled ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in models:
            if "compiled_peak" in row:
                out.append(
                    f"| {row['model']} | {_mib(row['eager_profiled_peak'])} | {_mib(row['compiled_peak'])} | "
                    f"{_mib(row['arena_profiled_peak'])} | {row['arena_profiled_peak'] / row['compiled_peak']:.3f} | "
                    f"{row['compile_s']:.1f} | {row['compiled_ms']:.2f} |"
                )
    out += [
        "",
        f"### Planning a {nodes:,}-step synthetic graph",
        "",
        "| algo | ordering | baseline MiB | arena MiB | lower bound MiB | arena / bound | optimal | plan s |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for lay in graph:
        out.append(
            f"| {lay['algo']} | {lay['ordering']} | {_mib(lay['baseline'])} | {_mib(lay['arena'])} | "
            f"{_mib(lay['bound'])} | {lay['arena'] / lay['bound']:.3f} | {'yes' if lay['optimal'] else 'not proven'} | "
            f"{lay['plan_s']:.3f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the CNN only, and a 200-step graph")
    parser.add_argument("--nodes", type=int, default=None, help="steps of the synthetic graph (default 1000)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per model (median)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile comparison (minutes)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: times that a busy machine does not scatter)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    nodes = args.nodes or (200 if args.quick else 1000)
    compiled = not (args.quick or args.no_compile)
    models = [
        measure_model(name, build, ex, 3 if args.quick else args.repeats, compiled)
        for name, build, ex in _models(args.quick)
    ]
    print(render(models, measure_synthetic(nodes), nodes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
