"""memoplan.verify through real plans: exact memory reductions and a verdict that can fail."""

from __future__ import annotations

import torch

import memoplan
from memoplan import runtime
from memoplan.examples import mlp
from memoplan.specs import Example
from memoplan.verify import render_report, verify

PER_LAYER = "memplan 1\nmodule layers { checkpoint segments = 20 }\n"
ACTIVATION_BYTES = mlp.BATCH * mlp.WIDTH * 4  # one fp32 (batch, width) activation


def _mlp(activation: str):
    torch.manual_seed(0)
    return mlp.build(activation=activation), Example(mlp.example())


def test_gelu_mlp_saves_exactly_19_activations_under_per_layer_checkpointing():
    model, example = _mlp("gelu")
    report = verify(model, PER_LAYER, example)
    assert report.equivalent, render_report(report)
    # Each of the 20 regions keeps only its input; at the peak (backward of the
    # last region) one GELU input has been recomputed, so 19 are saved.
    assert report.saved_bytes == (mlp.DEPTH - 1) * ACTIVATION_BYTES


def test_relu_mlp_saves_nothing():
    model, example = _mlp("relu")
    report = verify(model, PER_LAYER, example)
    assert report.equivalent
    assert report.saved_bytes == 0  # ReLU saves its output, which the next Linear keeps anyway


def test_verify_reports_a_runtime_that_breaks_equivalence(monkeypatch):
    from memoplan.examples import cnn

    torch.manual_seed(0)
    model, example = cnn.build(), Example(cnn.example())
    plan = "memplan 1\nmodule features.* { checkpoint }\n"
    assert verify(model, plan, example).equivalent

    naive = torch.utils.checkpoint.checkpoint

    def without_guards(module, forward_fn, args, kwargs, *, preserve_rng=True):
        # Plain checkpointing: BatchNorm statistics are updated again in recompute.
        return naive(lambda *a: forward_fn(module, *a, **kwargs), *args, use_reentrant=False)

    monkeypatch.setattr(runtime, "run_checkpointed", without_guards)
    report = verify(model, plan, example)
    assert not report.equivalent
    buffers = next(c for c in report.checks if c.name == "buffers")
    assert any("running_mean" in d for d in buffers.differences)
    assert "verdict: NOT EQUIVALENT" in render_report(report)


def test_verify_accepts_plan_text_path_and_ast(tmp_path):
    model, example = _mlp("gelu")
    path = tmp_path / "p.memplan"
    path.write_text(PER_LAYER)
    for plan in (PER_LAYER, path, memoplan.parse(PER_LAYER)):
        assert verify(model, plan, example).equivalent


def test_plans_with_temporal_chunks_are_held_to_the_chunk_tolerance():
    from memoplan.examples import spiking
    from memoplan.verify import CHUNK_RTOL

    torch.manual_seed(0)
    model, example = spiking.build(), Example(spiking.example(batch=2, size=8))
    plan = (
        "memplan 1\nmodule class LIF { state = functional }\n"
        "module blocks.* { temporal_chunk 4 dim 0; compress input = bit }\n"
    )
    report = verify(model, plan, example)
    assert report.rtol == CHUNK_RTOL and report.equivalent, render_report(report)
    # BatchNorm statistics summed chunk by chunk: not bit for bit, and said so.
    assert not report.exact
    assert "not bit for bit" in render_report(report)
    strict = verify(model, plan, example, rtol=0.0)
    assert not strict.equivalent
    assert "verdict: NOT EQUIVALENT" in render_report(strict)
    # A tolerance never excuses integer buffers: num_batches_tracked must match exactly.
    assert all("num_batches_tracked" not in d for c in report.checks for d in c.within)
