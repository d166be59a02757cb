"""Planning with the `dtr` block: the simulator (memoplan.planner.dtr.sim) and `memoplan plan --dtr`.

The simulator replays a profile under the tracker's rules.  Its predicted step peak is
compared with the measured peak on the bundled transformer and CNN; the error stated in
docs/planner.md is what these tests allow: the transformer within 10%, the CNN within 30%
(its first block's backward holds more gradient buffers than the simulator counts).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import types
import warnings

import pytest
import torch

import memoplan
from memoplan import cli
from memoplan.diagnostics import PlanError
from memoplan.examples import cnn, transformer
from memoplan.measure import default_loss
from memoplan.planner.budgets import Bytes, Coverage, FractionOfPeak
from memoplan.planner.dtr.plan import dtr_candidates, make_dtr_plan
from memoplan.planner.dtr.sim import Candidate, candidates_from_chain, parameter_bytes, simulate, threshold_for
from memoplan.planner.profiling.profile import profile
from memoplan.planner.profiling.schema import chain
from memoplan.planner.search.refine import measure_plan
from memoplan.runtime import dtr as dtr_runtime
from memoplan.specs import Example

CALLS = [Candidate(f"b{i}", 1000, 100, 0.01 * (i + 1), grad_bytes=50, param_bytes=10) for i in range(5)]


def test_a_threshold_above_everything_evicts_nothing():
    sim = simulate(CALLS, 10**9)
    assert (sim.evictions, sim.recomputes, sim.over_threshold) == (0, 0, 0)
    assert sim.working_peak == sim.unplanned_working
    assert sim.predicted_peak(123456) == 123456


def test_the_smallest_threshold_evicts_every_candidate_and_recomputes_each_once():
    kept = sum(c.kept_bytes for c in CALLS)
    sim = simulate(CALLS, kept)
    assert sim.recomputes == len(CALLS) and sim.over_threshold == 0
    assert sim.tracked_peak <= kept
    assert sim.recompute_seconds == pytest.approx(sum(c.seconds for c in CALLS))


def test_a_threshold_below_the_kept_bytes_is_counted_as_missed():
    assert simulate(CALLS, 1).over_threshold > 0


def test_lower_thresholds_never_predict_more_memory():
    peaks = [simulate(CALLS, t).working_peak for t in range(500, 6000, 250)]
    assert peaks == sorted(peaks)


def test_candidates_below_the_minimum_size_are_never_evicted():
    sim = simulate(CALLS, 1, minimum=2000)
    assert sim.evictions == 0 and sim.over_threshold > 0


def test_threshold_for_finds_the_largest_threshold_that_fits():
    unplanned = 10_000
    limit = unplanned - 2000
    threshold, sim = threshold_for(CALLS, unplanned, limit)
    assert sim.predicted_peak(unplanned) <= limit
    assert simulate(CALLS, threshold + 100).predicted_peak(unplanned) > limit
    assert threshold_for(CALLS, unplanned, 10) is None


def _example(module) -> Example:
    ex = module.example()
    return ex if isinstance(ex, Example) else Example((ex,) if isinstance(ex, torch.Tensor) else tuple(ex))


@pytest.mark.parametrize("module,error", [(transformer, 0.10), (cnn, 0.30)])
def test_the_simulator_predicts_the_measured_peak_within_the_stated_error(module, error, monkeypatch):
    # The tracker ranks candidates by their measured forward seconds: on a loaded machine
    # those are noise, and the order of evictions (so the peak) with them.  This test is
    # about the bytes, so both sides get the same cost: every candidate's call takes one
    # tick of a clock that advances one tick a reading.
    ticks = itertools.count()
    monkeypatch.setattr(dtr_runtime, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    model, example = module.build(), _example(module)
    prof = profile(model, example, progress=False)
    names = dtr_candidates(model)
    own, outside = parameter_bytes(model, names)
    calls = [dataclasses.replace(c, seconds=1.0) for c in candidates_from_chain(chain(prof, names), own)]
    everything = sum(c.kept_bytes + c.evictable_bytes for c in calls)
    for share in (0.7, 0.5, 0.3):
        threshold = int(everything * share)
        sim = simulate(calls, threshold, outside_grads=outside)
        plan = f"memplan 1\ndtr {{ eviction_threshold = {threshold} B; evictee_minimum_size = 0 B }}\n"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            measured = measure_plan(model, example, memoplan.parse(plan))
        predicted = sim.predicted_peak(prof.peak_bytes)
        assert abs(predicted - measured) <= error * measured, (share, predicted, measured)
        assert measured < prof.peak_bytes


def test_make_dtr_plan_meets_the_budget_by_measurement():
    model, example = transformer.build(), _example(transformer)
    result = make_dtr_plan(model, example, FractionOfPeak.percent(60), progress=False)
    assert result.met and result.measured_after <= result.limit < result.measured_before
    assert abs(result.predicted_after - result.measured_after) <= 0.10 * result.measured_after
    (block,) = result.plan.statements
    assert block.kind.value == "dtr" and block.entries[0].value.bytes == result.threshold
    assert any("simulated: peak" in line for line in result.plan.header_comments.leading)


def test_dtr_plans_need_a_byte_budget_and_a_reachable_one():
    model, example = transformer.build(), _example(transformer)
    with pytest.raises(PlanError) as caught:
        make_dtr_plan(model, example, Coverage(0.5), progress=False)
    assert caught.value.errors[0].code == "MP602"
    with pytest.raises(PlanError) as caught:
        make_dtr_plan(model, example, Bytes(1024), progress=False)
    assert caught.value.errors[0].code == "MP602" and "cannot be met" in caught.value.errors[0].message
    hint = make_dtr_plan(model, example, Bytes(1024), hard=False, progress=False)  # the least it reaches, reported
    assert not hint.met and hint.measured_after < hint.measured_before


@pytest.mark.slow
def test_plan_dtr_cli_writes_a_plan_that_verifies(tmp_path, capsys):
    out = tmp_path / "dtr.memplan"
    spec = ["--model", "memoplan.examples.transformer:build", "--example", "memoplan.examples.transformer:example"]
    # 75%, not nearer the least this model meets: which tensors the tracker evicts depends on the
    # ops' measured times, and on a loaded machine the least met budget moves (66% was seen)
    assert cli.main(["plan", *spec, "--budget", "75%", "--dtr", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "dtr threshold" in said and "budget met" in said
    text = out.read_text()
    assert "dtr {" in text and "eviction_threshold" in text and "# simulated: peak" in text
    assert cli.main(["verify", str(out)]) == 0
    verified = capsys.readouterr().out
    assert "verdict: EQUIVALENT" in verified and "dtr: " in verified


# ---------------------------------------------------------------- the budget by an independent meter


def _profiler_peak(model, args, loss_fn) -> int:
    """One training step's peak by torch.profiler's memory events, not memoplan's meter: every
    allocation and free the CPU allocator reports, in time order, summed; the running maximum
    above what was live at the start."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model.zero_grad(set_to_none=True)
    with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        output = model(*args)
        loss_fn(output).backward()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def _gpt2_4x128():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=512, n_positions=128)
    config.use_cache = False
    torch.manual_seed(0)
    ids = torch.randint(0, 512, (4, 128), generator=torch.Generator().manual_seed(0))
    return transformers.GPT2LMHeadModel(config), Example((ids,))


@pytest.mark.slow
@pytest.mark.parametrize("name,share", [("transformer", 70), ("transformer", 50), ("gpt2", 50), ("gpt2", 40)])
def test_dtr_plans_hold_their_budget_by_the_profilers_memory_events(name, share):
    from memoplan.planner.dtr.plan import mean_square_loss

    model, example = (transformer.build(), _example(transformer)) if name == "transformer" else _gpt2_4x128()
    result = make_dtr_plan(model, example, FractionOfPeak.percent(share), progress=False)
    assert result.met
    planned = memoplan.apply(copy.deepcopy(model), result.plan)
    # The meter agrees with memoplan's on the unplanned step (so the limit means the same bytes) ...
    unplanned = _profiler_peak(model, example.args, default_loss)
    assert abs(unplanned - result.measured_before) <= 0.01 * result.measured_before
    # ... and the planned step, with a loss that allocates, stays within the limit.
    peak = _profiler_peak(planned, example.args, mean_square_loss)
    assert peak <= result.limit, (peak, result.limit, peak / result.limit)


@pytest.mark.slow
def test_a_loss_larger_than_the_budget_is_refused_not_reported_met():
    """A GPT-2 whose logits (4 x 128 x 4096 floats) dwarf its blocks: a mean-square loss's temporaries
    alone exceed 70% of the sum-loss peak.  Measured with the sum only, this plan was reported met
    while torch.profiler put the mean-square step at 2.3 x the limit; now it is MP602, and the
    hint's plan says the peak it really reaches."""
    from memoplan.planner.dtr.plan import mean_square_loss

    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=4, n_embd=64, n_head=2, vocab_size=4096, n_positions=128)
    config.use_cache = False
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    example = Example((torch.randint(0, 4096, (4, 128), generator=torch.Generator().manual_seed(0)),))
    prof = profile(model, example, repeats=1, progress=False)
    with pytest.raises(PlanError) as caught:
        make_dtr_plan(model, example, FractionOfPeak.percent(70), prof=prof, progress=False)
    assert caught.value.errors[0].code == "MP602" and "mean-square" in caught.value.errors[0].message
    hint = make_dtr_plan(model, example, FractionOfPeak.percent(70), hard=False, prof=prof, progress=False)
    assert not hint.met
    planned = memoplan.apply(copy.deepcopy(model), hint.plan)
    assert _profiler_peak(planned, example.args, mean_square_loss) > hint.limit  # what `met = False` says
