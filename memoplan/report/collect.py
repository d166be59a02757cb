"""Report stage: the measurements behind a report, as plain data.

Each function runs steps of deep copies of the model (the model, its buffers and the
RNG state are left as they were) and returns JSON-serialisable values for
:mod:`memoplan.report.data`:

* :func:`timelines` -- one training step without and one with the plan under the
  recording live-storage meter, seeded as ``memoplan verify`` seeds its steps, so the
  peaks are the ones ``verify`` prints, to the byte (with a ``dtr`` block, the tracker's
  evictions, recomputes and held bytes at every module boundary too);
* :func:`saved_bytes` -- the profiler's saved-activation bytes per module, of the
  model and of the planned copy;
* :func:`sweep` -- memoplan's planner at several budgets, checkpointing every block,
  and (``peers``) ``torch.compile`` with ``activation_memory_budget``: peak and step
  time of each;
* :func:`dtr_statistics` -- the ``dtr`` block's evictions and recomputes, where the
  runtime provides them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from memoplan import api
from memoplan.diagnostics import PlanError
from memoplan.ir import ResolvedPlan
from memoplan.measure import measure_step, timeline_step, training_step
from memoplan.planner.budgets import FractionOfPeak
from memoplan.planner.config import Planner
from memoplan.planner.plan import make_plan
from memoplan.planner.profiling.profile import Snapshot, profile
from memoplan.planner.profiling.schema import Profile, default_candidates
from memoplan.report import data
from memoplan.report import peers as compile_peers
from memoplan.runtime.dtr import dtr_stats
from memoplan.specs import Example
from memoplan.syntax import ast

Progress = Callable[[str], None]


def _quiet(message: str) -> None:
    pass


# ---------------------------------------------------------------- memory over one step


@contextlib.contextmanager
def module_marks(model: nn.Module, shown: Sequence[str], mark: Callable[[str], None]) -> Iterator[None]:
    """Hooks that mark where each shown module's forward starts and ends, and where its backward
    starts (a pre-hook on the backward node of its output), while a step runs.

    Forward calls are marked only before backward begins (the root output's backward node
    runs first), so a recompute in backward does not mark a second forward.
    """
    modules = dict(model.named_modules())
    state = {"forward": True}
    handles: list[Any] = []

    def first_node(output: Any) -> Any:
        for leaf in pytree.tree_leaves(output):
            if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None:
                return leaf.grad_fn
        return None

    def on_backward(label: str | None) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            state["forward"] = False
            if label is not None:
                mark(label)

        return hook

    def pre(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            if state["forward"]:
                mark(data.mark_label(data.FWD_START, name))

        return hook

    def post(name: str | None) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not state["forward"]:
                return
            if name is not None:
                mark(data.mark_label(data.FWD_END, name))
            node = first_node(output)
            if node is not None:
                node.register_prehook(on_backward(None if name is None else data.mark_label(data.BWD_START, name)))

        return hook

    try:
        handles.append(model.register_forward_hook(post(None)))
        for name in shown:
            module = modules[name]
            handles.append(module.register_forward_pre_hook(pre(name)))
            handles.append(module.register_forward_hook(post(name)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def timelines(
    model: nn.Module, resolved: ResolvedPlan, example: Example, shown: Sequence[str], *, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """``{"unplanned": ..., "planned": ...}``: each ``{"samples", "backward", "marks", "peak_bytes"}``.

    Each run is a deep copy of ``model`` stepped after ``torch.manual_seed(seed)`` (as
    ``memoplan verify`` runs its steps); the RNG is restored afterwards.
    """
    out: dict[str, dict[str, Any]] = {}
    stats_of = dtr_stats if resolved.dtr is not None else None
    with torch.random.fork_rng(devices=[]):
        for name in ("unplanned", "planned"):
            copied = copy.deepcopy(model)
            if name == "planned":
                copied = api.apply(copied, resolved, warn=False)
            counts: list[list[int]] = []
            counting = stats_of if name == "planned" else None

            def marks(
                mark: Callable[[str], None],
                m: nn.Module = copied,
                counting: Callable[[nn.Module], Any] | None = counting,
                counts: list[list[int]] = counts,
            ) -> Any:
                if counting is None:
                    return module_marks(m, shown, mark)

                tally = counting

                def counted(label: str) -> None:  # the dtr block's counters at every module boundary
                    mark(label)
                    stats = tally(m)
                    counts.append([stats.evictions, stats.recomputes, stats.tracked_now])

                return module_marks(m, shown, counted)

            torch.manual_seed(seed)
            memory, timeline = timeline_step(copied, example.args, example.kwargs, marks=marks)
            out[name] = {
                "samples": list(timeline.samples),
                "backward": timeline.backward,
                "marks": [list(m) for m in timeline.marks],
                "peak_bytes": memory.peak_bytes,
            }
            if counting is not None:
                end = counting(copied)
                out[name]["dtr"] = [[index, *c] for (index, _), c in zip(timeline.marks, counts)] + [
                    [len(timeline.samples) - 1, end.evictions, end.recomputes, end.tracked_now]
                ]
            del copied
    return out


# ---------------------------------------------------------------- saved bytes per module


def saved_bytes(
    model: nn.Module, resolved: ResolvedPlan, example: Example, shown: Sequence[str]
) -> tuple[dict[str, int], dict[str, int], dict[str, str], Profile]:
    """Saved-activation bytes of each shown module's subtree (the profiler's attribution),
    without and with the plan; their class names; and the unplanned profile."""
    before = profile(model, example, repeats=1, progress=False)
    planned = api.apply(copy.deepcopy(model), resolved, warn=False)
    after = profile(planned, example, repeats=1, progress=False)
    classes = {m.name: m.type.rpartition(".")[2] for m in before.modules}
    return (
        {n: before.subtree_saved_bytes(n) for n in shown if n in before},
        {n: after.subtree_saved_bytes(n) for n in shown if n in after},
        classes,
        before,
    )


# ---------------------------------------------------------------- budget sweep


def step_seconds(model: nn.Module, example: Example, repeats: int, step: Callable[[], Any] | None = None) -> float:
    """Median wall time of ``repeats`` unmetered training steps after one warm-up step.

    Every step starts from the state the model had before the first (buffers, neuron
    state, RNG: :class:`memoplan.planner.profiling.profile.Snapshot`), as a fresh step would.
    """
    run = step or (lambda: training_step(model, example.args, example.kwargs))
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    times = []
    with Snapshot(model, example, device) as snapshot:
        for i in range(repeats + 1):
            snapshot.restore()
            compile_peers.sync(device.type)
            start = time.perf_counter()
            run()
            compile_peers.sync(device.type)
            if i:
                times.append(time.perf_counter() - start)
    return statistics.median(times)


def _planned_point(
    model: nn.Module, plan: Any, example: Example, seed: int, repeats: int, **entry: Any
) -> dict[str, Any]:
    planned = api.apply(copy.deepcopy(model), plan, warn=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peak = measure_step(copy.deepcopy(planned), example.args, example.kwargs).peak_bytes
    return {**entry, "peak_bytes": peak, "step_seconds": step_seconds(planned, example, repeats)}


def every_block_plan(prof: Profile) -> tuple[ast.Plan, str]:
    """``module <block> { checkpoint }`` for each block of the default chain, and how to say it."""
    blocks = default_candidates(prof)
    rules = tuple(
        ast.ModuleRule(
            selector=ast.Selector(ast.SelectorTerm(path=ast.PathPattern(tuple(ast.Name(p) for p in name.split("."))))),
            policies=(ast.Checkpoint(),),
        )
        for name in blocks
    )
    parent = blocks[0].rpartition(".")[0] if blocks else ""
    return ast.Plan(
        version=1, statements=rules
    ), f"checkpoint every block ({parent + '.*' if parent else 'root children'})"


def sweep(
    model: nn.Module,
    example: Example,
    prof: Profile,
    chosen: dict[str, Any],
    budgets: Sequence[float],
    *,
    peers: bool = False,
    seed: int = 0,
    repeats: int = 5,
    progress: Progress = _quiet,
) -> list[dict[str, Any]]:
    """Peak memory and step time of: the unplanned step, the chosen plan (``chosen``: its
    label and its ``plan``), memoplan's optimal planner at each hard budget (a share of the
    unplanned peak; where it is out of reach, the least-peak plan it writes as a hint),
    checkpointing every block and, with ``peers``, ``torch.compile`` at ``activation_memory_budget``
    1.0 and each budget.  A configuration that fails is a point with its error."""
    total = 3 + len(budgets) + (1 + len(budgets) + uses_spikingjelly(model) if peers else 0)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        progress(f"sweep {done}/{total}: {label}")

    points: list[dict[str, Any]] = []
    tick("unplanned")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        unplanned = measure_step(copy.deepcopy(model), example.args, example.kwargs).peak_bytes
    points.append(
        {
            "label": "unplanned",
            "kind": "unplanned",
            "peak_bytes": unplanned,
            "step_seconds": step_seconds(copy.deepcopy(model), example, repeats),
        }
    )
    tick(chosen["label"])
    points.append(
        _planned_point(model, chosen["plan"], example, seed, repeats, label=chosen["label"], kind="chosen", chosen=True)
    )
    for fraction in budgets:
        label = f"memoplan optimal, budget {fraction:g}"
        tick(label)
        points.append(_budget_point(model, example, prof, fraction, label, seed, repeats))
    every, label = every_block_plan(prof)
    tick(label)
    points.append(_planned_point(model, every, example, seed, repeats, label=label, kind="every block"))
    if peers and uses_spikingjelly(model):
        tick("SpikingJelly optimize_memory level 1")
        points.append(spikingjelly_point(model, example, prof, seed, repeats))
    if peers:
        for fraction in dict.fromkeys([1.0, *budgets]):
            tick(f"torch.compile, activation_memory_budget {fraction:g} (compiling)")
            points.append(compile_point(model, example, fraction, seed, repeats))
    return points


def _budget_point(
    model: nn.Module, example: Example, prof: Profile, fraction: float, label: str, seed: int, repeats: int
) -> dict[str, Any]:
    """The optimal planner's plan at a hard ``fraction`` of the unplanned peak, measured; out of
    reach, the least-peak plan it writes as a hint stands in (or the point carries the error)."""
    budget = FractionOfPeak(Fraction(str(fraction)))
    met = True
    try:
        result = make_plan(model, example, budget, planner=Planner.OPTIMAL, hard=True, prof=prof, progress=False)
    except PlanError:
        # Out of reach: the least-peak plan the planner writes for it (as a hint) stands in.
        met = False
        label += " (out of reach: least-peak plan)"
        try:
            result = make_plan(model, example, budget, planner=Planner.OPTIMAL, hard=False, prof=prof, progress=False)
        except PlanError as error:
            return {"label": label, "kind": "memoplan", "budget": fraction, "error": str(error).splitlines()[0]}
    return _planned_point(
        model,
        result.plan,
        example,
        seed,
        repeats,
        label=label,
        kind="memoplan",
        budget=fraction,
        regions=result.regions,
        budget_met=met,
    )


def uses_spikingjelly(model: nn.Module) -> bool:
    """Whether ``model`` holds SpikingJelly modules (its ``MemoryModule``s), so its memory optimiser applies."""
    try:
        from spikingjelly.activation_based.base import MemoryModule
    except ImportError:
        return False
    return any(isinstance(m, MemoryModule) for m in model.modules())


def spikingjelly_point(model: nn.Module, example: Example, prof: Profile, seed: int, repeats: int) -> dict[str, Any]:
    """SpikingJelly's ``optimize_memory`` at level 1 (a checkpoint per block, compressed binary
    inputs) with the classes of the default chain's blocks as targets, on a copy: its peak and step time."""
    label = "SpikingJelly optimize_memory level 1"
    entry: dict[str, Any] = {"label": label, "kind": "spikingjelly"}
    try:
        from spikingjelly.activation_based import functional
        from spikingjelly.activation_based.memopt import optimize_memory

        modules = dict(model.named_modules())
        targets = tuple(dict.fromkeys(type(modules[name]) for name in default_candidates(prof)))
        copied = copy.deepcopy(model)
        with torch.random.fork_rng(devices=[]):
            optimize_memory(
                copied,
                targets=targets,
                example_forward=lambda m: m(*example.args, **example.kwargs),
                level=1,
                checkpoint_budget="memory",
                compress=True,
            )
            functional.reset_net(copied)
            torch.manual_seed(seed)
            peak = measure_step(copy.deepcopy(copied), example.args, example.kwargs).peak_bytes
        seconds = step_seconds(copied, example, repeats)
    except Exception as error:  # noqa: BLE001 - a peer that fails is a point with its reason
        entry["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        return entry
    return {**entry, "peak_bytes": peak, "step_seconds": seconds, "targets": [t.__qualname__ for t in targets]}


def compile_point(model: nn.Module, example: Example, fraction: float, seed: int, repeats: int) -> dict[str, Any]:
    """``torch.compile`` of model and loss with ``activation_memory_budget = fraction`` on a copy:
    its peak (metered inside the compiled graphs on the CPU, see :mod:`memoplan.report.peers`)
    and step time, or the error that stopped it."""
    label = f"torch.compile, activation_memory_budget {fraction:g}"
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    device = next((p.device for p in model.parameters()), torch.device("cpu")).type
    copied = copy.deepcopy(model)
    entry: dict[str, Any] = {"label": label, "kind": "torch.compile", "budget": fraction}
    try:
        with (
            inductor_config.patch(fallback_random=True, fx_graph_cache=False),
            functorch_config.patch(enable_autograd_cache=False),
            torch.random.fork_rng(devices=[]),
        ):
            fn = compile_peers.compile_step(copied, device, f"report budget {fraction:g}")
            step = compile_peers.compiled_step(copied, fn, example, fraction)
            torch.manual_seed(seed)
            step()  # compiles
            peak, _ = compile_peers.compiled_peak(step, copied, device, seed)
            seconds = step_seconds(copied, example, repeats, step)
    except Exception as error:  # noqa: BLE001 - a peer that fails is a point with its reason, not the end
        entry["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        return entry
    return {**entry, "peak_bytes": peak, "step_seconds": seconds}


# ---------------------------------------------------------------- dtr


def dtr_statistics(model: nn.Module, resolved: ResolvedPlan, example: Example, seed: int = 0) -> dict[str, Any] | None:
    """Evictions and recomputes of the plan's ``dtr`` block over one step (``memoplan.dtr_stats``),
    or None when the plan has no ``dtr`` block."""
    if resolved.dtr is None:
        return None
    planned = api.apply(copy.deepcopy(model), resolved, warn=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        training_step(planned, example.args, example.kwargs)
    as_dict = dataclasses.asdict(dtr_stats(planned))
    return {"statistics": {str(k): v for k, v in as_dict.items()}}
