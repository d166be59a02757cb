"""Measured refinement (split, temporal, narrow, unwrap) and the typed planner presets.

Every level must keep an edit that lowers the measured peak and revert one that does not,
the refined plan must stay ordinary plan text, and the user's model -- parameters, buffers,
neuron state, modes -- and the RNG states must be exactly as they were afterwards.
Models are tiny: each measured trial is one training step under the CPU meter.
"""

from __future__ import annotations

import dataclasses
import io
import random

import pytest
import torch
from torch import nn

import memoplan
from memoplan.examples import spiking
from memoplan.planner import search
from memoplan.planner.plan import make_plan
from memoplan.planner.presets import (
    ALL_LEVELS,
    DEFAULT,
    PRESETS,
    Level,
    Planner,
    PlannerPreset,
    RefineOptions,
)
from memoplan.planner.profiling.profile import profile
from memoplan.planner.search.refine import measure_plan, refine
from memoplan.runtime.state import get_state, is_stateful
from memoplan.specs import Example
from memoplan.verification import verify

W = 32


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    """Generated plan modules go to a fresh cache (set before the module-scoped runs below)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


class Tail(nn.Sequential):
    """A Sequential of its own class, so the split level tries it on its own."""


class Mlp(nn.Module):
    """body: 6 x (Linear, GELU); BatchNorm and Dropout (buffers, RNG); tail: (Linear, Identity); head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(*[layer for _ in range(6) for layer in (nn.Linear(W, W), nn.GELU())])
        self.norm = nn.BatchNorm1d(W)
        self.drop = nn.Dropout(0.1)
        self.tail = Tail(nn.Linear(W, W), nn.Identity())
        self.head = nn.Linear(W, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.tail(self.drop(self.norm(self.body(x)))))


def _plan(*rules: str) -> memoplan.syntax.ast.Plan:
    return memoplan.parse("memplan 1\n" + "".join(f"{rule}\n" for rule in rules))


def _snapshot(model: nn.Module) -> dict:
    """Everything refinement must leave as it was, by value and by identity."""
    return {
        "state_dict": {k: v.clone() for k, v in model.state_dict().items()},
        "parameters": list(model.parameters()),
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "states": [(m, get_state(m)) for m in model.modules() if is_stateful(m)],
        "training": [m.training for m in model.modules()],
        "rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }


def _assert_same(before: dict, after: dict) -> None:
    assert after["state_dict"].keys() == before["state_dict"].keys()
    for key, value in before["state_dict"].items():
        assert torch.equal(after["state_dict"][key], value), key  # parameters, buffers (BatchNorm statistics)
    assert all(a is b for a, b in zip(after["parameters"], before["parameters"], strict=True))
    for grad, grad0 in zip(after["grads"], before["grads"], strict=True):
        assert (grad is None) == (grad0 is None) and (grad is None or torch.equal(grad, grad0))
    for (m, state), (m0, state0) in zip(after["states"], before["states"], strict=True):
        assert m is m0 and state.keys() == state0.keys()
        assert all(state[k] is state0[k] for k in state)  # the very same potential tensor
    assert after["training"] == before["training"]
    assert torch.equal(after["rng"], before["rng"])
    assert after["python_rng"] == before["python_rng"]


def _refine(model, example, plan, options, weights):
    """Refine, with snapshots of the model and the RNG taken just before and just after."""
    log = io.StringIO()
    before = _snapshot(model)
    result = refine(model, example, plan, options, weights=weights, stream=log)
    after = _snapshot(model)
    return {"model": model, "example": example, "result": result, "log": log.getvalue(), "snapshots": (before, after)}


@pytest.fixture(scope="module")
def mlp_run():
    """split and unwrap over an MLP whose body gains from segments and whose tail and head do not."""
    torch.manual_seed(0)
    model = Mlp()
    example = (torch.randn(64, W),)
    model(*example)  # moves the BatchNorm running statistics away from their defaults
    model.head.weight.grad = torch.ones_like(model.head.weight)
    plan = _plan("module body { checkpoint }", "module tail { checkpoint }", "module head { checkpoint }")
    options = RefineOptions(levels=(Level.SPLIT, Level.UNWRAP), segments=(2,))
    return _refine(model, example, plan, options, {"body": 100, "tail": 10, "head": 1})


@pytest.fixture(scope="module")
def spiking_run():
    """temporal over a small spiking CNN whose blocks gain from time chunks."""
    torch.manual_seed(0)
    model = spiking.SpikingCNN(channels=(4, 4))
    example = spiking.example(steps=4, batch=1, size=4)
    model(*example)  # leaves membrane potentials with autograd history, BatchNorm statistics moved
    plan = _plan(
        "module class LIF { state = functional }", "module blocks.0 { checkpoint }", "module blocks.1 { checkpoint }"
    )
    options = RefineOptions(levels=(Level.TEMPORAL,), max_trials=4, chunks=(2, 4))
    return _refine(model, example, plan, options, {"blocks.0": 30, "blocks.1": 20})


def _trials(run, level):
    return [t for t in run["result"].trials if t.level is level]


# ---------------------------------------------------------------- the levels


@pytest.mark.slow
def test_split_keeps_segments_that_lower_the_peak_and_reverts_one_that_does_not(mlp_run):
    body, tail = _trials(mlp_run, Level.SPLIT)
    assert (body.modules, body.edit, body.kept) == (("body",), "segments = 2", True)
    assert body.after < body.before
    assert (tail.modules, tail.kept) == (("tail",), False) and tail.after >= tail.before
    text = memoplan.format_plan(mlp_run["result"].plan)
    assert "# refine: segments = 2 lowered the measured peak" in text
    assert "module body { checkpoint segments = 2 }" in text


def test_unwrap_drops_checkpoints_that_do_not_lower_the_peak_and_keeps_the_rest(mlp_run):
    trials = _trials(mlp_run, Level.UNWRAP)
    assert [(t.modules, t.kept) for t in trials] == [(("head",), True), (("tail",), True), (("body",), False)]
    assert all(t.after <= t.before for t in trials if t.kept)
    assert trials[-1].after > trials[-1].before  # without the body's checkpoint the peak rises
    text = memoplan.format_plan(mlp_run["result"].plan)
    assert "module tail" not in text and "module head" not in text and "module body" in text
    assert "# refine: dropped the checkpoint of head:" in text


@pytest.mark.slow
def test_narrow_moves_a_checkpoint_to_its_heaviest_child_where_the_peak_allows_it():
    """The last block's checkpoint narrows to its GELU, the first's cannot.

    The last region is recomputed as soon as backward starts, while everything the forward kept
    is still held: whether its activations are recomputed or kept, the peak is the same.  The
    first block's activations, kept, would be held through that moment too.
    """
    torch.manual_seed(0)

    def block() -> nn.Sequential:
        return nn.Sequential(nn.Linear(W, 4 * W), nn.GELU(), nn.Linear(4 * W, W))

    model = nn.Sequential(block(), block(), nn.Linear(W, 4))
    example = (torch.randn(64, W),)
    plan = _plan("module 0 { checkpoint }", "module 1 { checkpoint }")
    prof = profile(model, example, repeats=1, progress=False)
    weights = {name: prof.subtree_saved_bytes(name) for name in prof.names}
    assert weights["1.1"] == weights["1.2"] > weights["1.0"]  # GELU first among equals
    run = _refine(model, example, plan, RefineOptions(levels=(Level.NARROW,)), weights)
    late, early = _trials(run, Level.NARROW)
    assert (late.modules, late.edit, late.kept) == (("1",), "narrow to 1.1", True) and late.after == late.before
    assert (early.modules, early.edit, early.kept) == (("0",), "narrow to 0.1", False) and early.after > early.before
    text = memoplan.format_plan(run["result"].plan)
    assert "module 1.1 { checkpoint }" in text and "module 0 { checkpoint }" in text and "module 1 {" not in text
    assert "# refine: narrowed from 1: measured peak" in text
    _assert_same(*run["snapshots"])
    report = verify(model, run["result"].plan, Example(example))
    assert report.equivalent and report.planned.peak_bytes == late.after


@pytest.mark.slow
def test_temporal_keeps_chunks_that_lower_the_peak_and_reverts_one_that_does_not(spiking_run):
    trials = _trials(spiking_run, Level.TEMPORAL)
    group = ("blocks.0", "blocks.1")
    assert [(t.modules, t.edit, t.kept) for t in trials] == [
        (group, "temporal_chunk 2 dim 0", True),  # identical blocks are tried together first
        (group, "temporal_chunk 4 dim 0", True),
        (("blocks.0",), "temporal_chunk 2 dim 0", True),  # then one region at a time
        (("blocks.0",), "temporal_chunk 4 dim 0", False),  # back to 4 chunks: higher again
    ]
    assert all(t.after < t.before for t in trials[:3])
    assert trials[3].after >= trials[3].before
    text = memoplan.format_plan(spiking_run["result"].plan)
    assert "module blocks.0 { temporal_chunk 2 dim 0 }" in text
    assert "module blocks.1 { temporal_chunk 4 dim 0 }" in text
    assert "# refine: temporal_chunk 2 dim 0 lowered the measured peak" in text
    assert "# refine: temporal_chunk 4 dim 0 lowered the measured peak" in text


def test_temporal_skips_chunks_the_resolver_refuses_without_measuring():
    model = spiking.SpikingCNN(channels=(4, 4))
    model.blocks[1].add_module("drop", nn.Dropout(0.1))  # dropout inside a chunk: MP304
    plan = _plan("module class LIF { state = functional }", "module blocks.1 { checkpoint }")
    log = io.StringIO()
    # A made-up baseline: any measurement would replace it with a real peak.
    result = refine(
        model,
        spiking.example(2, 1, 4),
        plan,
        RefineOptions(levels=(Level.TEMPORAL,)),
        baseline=123,
        weights={},
        stream=log,
    )
    assert [(t.edit, t.after, t.kept) for t in result.trials] == [
        ("temporal_chunk 2 dim 0", None, False),
        ("temporal_chunk 4 dim 0", None, False),
    ]
    assert all("MP304" in t.note for t in result.trials)
    assert result.plan == plan and result.before == result.after == 123
    assert "refused (MP304), skipped" in log.getvalue()


# ---------------------------------------------------------------- the result, and the model left alone


@pytest.mark.parametrize("run", ["mlp_run", "spiking_run"])
def test_refinement_leaves_parameters_buffers_neuron_state_and_rng_as_they_were(run, request):
    _assert_same(*request.getfixturevalue(run)["snapshots"])


@pytest.mark.parametrize("run", ["mlp_run", "spiking_run"])
def test_the_refined_plan_is_ordinary_text_and_its_peak_is_the_measured_one(run, request):
    run = request.getfixturevalue(run)
    result = run["result"]
    text = memoplan.format_plan(result.plan)
    assert memoplan.format_plan(memoplan.parse(text)) == text
    assert result.after < result.before
    assert result.after == min(t.after for t in result.trials if t.kept)
    before = _snapshot(run["model"])
    assert measure_plan(run["model"], run["example"], memoplan.parse(text)) == result.after
    _assert_same(before, _snapshot(run["model"]))
    # One progress line per measured trial, like the rest of the CLI's progress.
    lines = [line for line in run["log"].splitlines() if line.startswith("memoplan: refine ") and "[" in line]
    assert len(lines) == sum(t.after is not None for t in result.trials)
    assert all(line.endswith(("kept", "reverted")) for line in lines)


@pytest.mark.slow
def test_make_plan_refines_and_verifies_a_hard_budget_by_measurement():
    torch.manual_seed(0)
    block = lambda: nn.Sequential(nn.Linear(W, W), nn.GELU(), nn.Linear(W, W), nn.GELU())  # noqa: E731
    model = nn.Sequential(*(block() for _ in range(4)))  # the chain: four blocks
    example = Example((torch.randn(64, W),))
    prof = profile(model, example, repeats=1, progress=False)
    before = _snapshot(model)
    result = make_plan(
        model,
        example,
        search.FractionOfPeak.percent(70),
        hard=True,
        prof=prof,
        progress=False,
        refine=RefineOptions(levels=(Level.UNWRAP,), max_trials=2),
        preset="balanced",
    )
    _assert_same(before, _snapshot(model))
    assert result.refinement is not None and len(result.refinement.trials) == 2
    assert result.met and result.measured_after <= result.limit
    assert result.measured_after == measure_plan(model, example, result.plan) <= result.refinement.before
    text = memoplan.format_plan(result.plan)
    assert "# preset: balanced" in text and "# refinement: unwrap: " in text
    assert f"# measured peak after: {result.measured_after} B" in text
    memoplan.resolve(memoplan.parse(text), model)


# ---------------------------------------------------------------- presets


def test_presets_are_typed_frozen_configs_in_a_registry():
    assert list(PRESETS) == ["safe", "balanced", "memory", "exhaustive"]
    for name, preset in PRESETS.items():
        assert isinstance(preset, PlannerPreset) and preset.name == name and preset.summary
        assert isinstance(preset.planner, Planner) and isinstance(preset.refine, RefineOptions)
        assert all(isinstance(level, Level) for level in preset.levels)
        with pytest.raises(dataclasses.FrozenInstanceError):
            preset.planner = Planner.GREEDY  # type: ignore[misc]
    safe, balanced, memory, exhaustive = PRESETS.values()
    assert DEFAULT is safe and safe.levels == ()
    assert balanced.levels == (Level.NARROW, Level.UNWRAP)
    assert memory.levels == exhaustive.levels == ALL_LEVELS
    assert exhaustive.refine.max_trials is None and memory.refine.max_trials is not None
    assert set(memory.refine.chunks) < set(exhaustive.refine.chunks)
    assert set(memory.refine.segments) < set(exhaustive.refine.segments)
    # Default budgets are the coverage budgets named alike (search.Preset); memory and
    # exhaustive plan for the least peak the planner reaches.
    assert (safe.budget, balanced.budget) == (search.Preset.SPEED, search.Preset.BALANCED)
    assert memory.budget == exhaustive.budget == search.LeastPeak()


def test_preset_fields_are_checked():
    with pytest.raises(TypeError):
        PlannerPreset("x", "y", planner="optimal")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        PlannerPreset("x", "y", budget="50%")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RefineOptions(levels=("split",))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RefineOptions(levels=(Level.SPLIT, Level.SPLIT))
    with pytest.raises(ValueError):
        RefineOptions(max_trials=0)
    with pytest.raises(ValueError):
        RefineOptions(chunks=(1,))


def test_explicit_options_override_preset_fields():
    memory = PRESETS["memory"]
    assert memory.with_overrides() is memory
    changed = memory.with_overrides(planner=Planner.GREEDY, budget=search.Bytes(4096), hard=False)
    assert (changed.planner, changed.budget, changed.hard) == (Planner.GREEDY, search.Bytes(4096), False)
    assert changed.refine == memory.refine and changed.name == "memory"
    assert memory.planner is Planner.OPTIMAL and memory.hard  # the registry is untouched


def test_budget_text_is_parsed_to_typed_budgets():
    from memoplan.planner.budgets import AskedBudget, read_budget

    assert read_budget("4 GiB hard") == AskedBudget(search.Bytes(4 * 2**30), True)
    assert read_budget("50% hint") == AskedBudget(search.FractionOfPeak.percent(50), False)
    assert read_budget("0.5") == AskedBudget(search.FractionOfPeak(0.5), None)
    assert read_budget("Memory") == AskedBudget(search.Preset.MEMORY, None)
    with pytest.raises(memoplan.PlanError):
        read_budget("lots")


def test_a_trial_whose_step_raises_is_reverted_and_its_message_printed(monkeypatch, capsys):
    import memoplan.planner.search.refine as refine_module

    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(W, W), nn.GELU(), nn.Linear(W, W)), nn.Linear(W, 4))
    example = (torch.randn(8, W),)

    def broken(*args, **kwargs):
        raise RuntimeError("the edited step broke\nand a second line")

    monkeypatch.setattr(refine_module, "measure_plan", broken)
    run = refine(model, example, _plan("module 0 { checkpoint }"), RefineOptions(levels=(Level.NARROW,)), baseline=1)
    err = capsys.readouterr().err
    assert "failed (RuntimeError: the edited step broke)" in err and "second line" not in err
    assert not any(t.kept for t in run.trials) and run.plan == _plan("module 0 { checkpoint }")
