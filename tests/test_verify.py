"""memoplan.verify through real plans: exact memory reductions and a verdict that can fail."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _paths import ROOT

import memoplan
from memoplan import runtime
from memoplan.examples import cnn, mlp
from memoplan.specs import Example
from memoplan.verification import render_report, verify

PER_LAYER = "memplan 1\nmodule layers { checkpoint segments = 20 }\n"
# The bundled MLP's 20 layers (a segment each), narrower and on a smaller batch than its default
# (512 wide, batch 1024): the live-storage meter counts bytes exactly at any size, so the figures
# below hold alike, for a fraction of the arithmetic.
WIDTH, BATCH = 64, 1024
ACTIVATION_BYTES = BATCH * WIDTH * 4  # one fp32 (batch, width) activation


def _mlp(activation: str):
    torch.manual_seed(0)
    return mlp.build(activation=activation, width=WIDTH), Example(mlp.example(batch=BATCH, width=WIDTH))


@pytest.mark.slow
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


@pytest.mark.slow
def test_verify_accepts_plan_text_path_and_ast(tmp_path):
    model, example = _mlp("gelu")
    path = tmp_path / "p.memplan"
    path.write_text(PER_LAYER)
    for plan in (PER_LAYER, path, memoplan.parse(PER_LAYER)):
        assert verify(model, plan, example).equivalent


@pytest.mark.slow
def test_plans_with_temporal_chunks_are_held_to_the_chunk_tolerance():
    from memoplan.examples import spiking
    from memoplan.verification import CHUNK_RTOL

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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_verify_on_cuda_is_bit_for_bit_and_compares_the_cuda_rng():
    model = cnn.build()
    report = verify(model, ROOT / "plans" / "cnn_bn_dropout.memplan", Example(cnn.example()), device="cuda")
    assert report.unplanned.method == "cuda-allocator"
    assert report.exact, render_report(report)
    rng = next(c for c in report.checks if c.name == "rng state")
    assert rng.compared == 2  # the CPU generator and the device's
    assert next(model.parameters()).device.type == "cpu"  # the model itself stays where it was


def test_verify_device_runs_copies_there_and_leaves_the_model():
    torch.manual_seed(0)
    model = cnn.build()
    report = verify(model, ROOT / "plans" / "cnn_bn_dropout.memplan", Example(cnn.example()), device="cpu")
    assert report.exact and report.unplanned.device == "cpu" and not report.nondeterministic
    assert [c.compared for c in report.checks if c.name == "rng state"] == [1]


def test_reproducible_mode_sets_and_restores_the_global_switches(monkeypatch):
    """What verify does around the two steps on CUDA; it only sets switches, so it runs here too."""
    import os
    import warnings

    from memoplan import verification as verify_module

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)

    def switches():
        return (
            torch.are_deterministic_algorithms_enabled(),
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.matmul.allow_tf32,
        )

    before = switches()
    with verify_module._reproducible(torch.device("cuda")) as found:  # sets switches only: no GPU needed
        assert switches() == (True, True, False, False)
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        warnings.warn(
            "scatter_add_cuda_kernel does not have a deterministic implementation, but you set x", stacklevel=1
        )
        warnings.warn(
            "scatter_add_cuda_kernel does not have a deterministic implementation, but you set x", stacklevel=1
        )
    assert found == ["scatter_add_cuda_kernel does not have a deterministic implementation"]
    assert switches() == before
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_the_report_names_ops_without_a_deterministic_implementation():
    torch.manual_seed(0)
    model, example = _mlp("relu")
    report = verify(model, PER_LAYER, example)
    note = "scatter_add_cuda_kernel does not have a deterministic implementation"
    text = render_report(dataclasses.replace(report, nondeterministic=(note,)))
    assert f"note: {note} (CUDA)" in text


def test_a_chunked_plan_out_of_tolerance_gets_the_flipped_spike_hint():
    torch.manual_seed(0)
    model, example = _mlp("relu")
    report = verify(model, PER_LAYER, example)
    assert "hint:" not in render_report(report)
    failed = dataclasses.replace(
        report, rtol=5e-5, checks=(dataclasses.replace(report.checks[0], differences=("output[0]: differs",)),)
    )
    assert "flipped spikes" in render_report(failed)


class _Wide(torch.nn.Module):
    """Mostly weights: 4 MiB of them, against a few KiB of activations at batch 8."""

    def __init__(self, edit_weight: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(1024, 512), torch.nn.Linear(512, 1024)
        self.edit_weight = edit_weight

    def forward(self, x):
        if self.edit_weight:
            with torch.no_grad():
                self.fc1.weight.mul_(1.0)  # an in-place write of a weight, inside the forward
        return self.fc2(torch.relu(self.fc1(x)))


def test_verify_on_a_smaller_example_holds_one_copy_of_the_weights():
    """Without the full-size unplanned step, verify's copies share the model's weights:
    its live storage stays under three times the weights (their gradients in the full-size
    planned step, then in the small unplanned and planned steps); full copies held six."""
    from memoplan.measure import LiveStorageMeter

    torch.manual_seed(0)
    model = _Wide()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    plan = "memplan 1\nmodule fc1 { checkpoint }\n"
    with LiveStorageMeter() as meter:
        report = verify(model, plan, Example((torch.randn(8, 1024),)), compare_example=Example((torch.randn(2, 1024),)))
    assert report.exact and report.compared_on is not None
    assert 2 * weights < meter.peak_bytes < 3 * weights, (meter.peak_bytes, weights)
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())  # the model is as it was
    assert all(p.grad is None for p in model.parameters())


def test_a_step_that_writes_a_weight_in_place_is_mp412_when_verify_shares_the_weights():
    torch.manual_seed(0)
    with pytest.raises(memoplan.PlanError) as raised:
        verify(
            _Wide(edit_weight=True),
            "memplan 1\nmodule fc1 { checkpoint }\n",
            Example((torch.randn(8, 1024),)),
            compare_example=Example((torch.randn(2, 1024),)),
        )
    (diagnostic,) = raised.value.diagnostics
    assert diagnostic.code == "MP412" and "`fc1.weight` in place" in diagnostic.message
