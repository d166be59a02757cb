"""The Python API plans and profiles for the device and step the command line takes:
``memoplan.plan(..., device=, device_memory=, step=)`` and ``memoplan.profile(...)`` with the
command line's checks and diagnostics (memoplan.planner.profiling.aim, memoplan.planner.profiling.target)."""

from __future__ import annotations

import sys

import pytest
import torch
from _paths import TESTS
from torch import nn

import memoplan
from memoplan.diagnostics import PlanError
from memoplan.syntax import ast
from memoplan.syntax.blocks import StepConfig

sys.path.insert(0, str(TESTS))
import meta_models  # noqa: E402

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="planning for a CUDA device this machine lacks")


def _codes(call) -> list[str]:
    with pytest.raises(PlanError) as caught:
        call()
    return [d.code for d in caught.value.diagnostics]


@NO_GPU
@pytest.mark.slow
def test_plan_and_profile_for_a_gpu_not_here_from_a_meta_model(capsys, tmp_path):
    from memoplan.planner.profiling.estimate import estimate

    model, example = meta_models.meta(), meta_models.example()
    prof = memoplan.profile(model, example, device="cuda")
    assert prof.method == "estimated" and prof.device == "cuda" and prof.kernels == "cpu"
    assert prof.peak_bytes == estimate(model, example, device="cuda", progress=False).peak_bytes
    assert prof.peak_bytes % 512 == 0 and prof.reserved_bytes >= prof.peak_bytes  # the caching allocator's
    assert memoplan.profile(model, example).peak_bytes < prof.peak_bytes  # the CPU's: no rounding
    held = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    size = 6 * 2**20
    result = memoplan.plan(model, example, "device", device="cuda", device_memory="6MiB")
    assert result.limit == size - held and result.met
    text = memoplan.format_plan(result.plan)
    assert "# device: cuda" in text and "# kernels: cpu's standing in for cuda's" in text
    from memoplan.planner.profiling.target import memory_size

    assert memory_size(size) == memory_size("6MiB") == size  # a count of bytes, or a size's text
    # the command line's plan for the same device and capacity: the same budget
    from _cli import run

    spec = ["--model", f"{TESTS / 'meta_models.py'}:meta", "--example", f"{TESTS / 'meta_models.py'}:example"]
    out = tmp_path / "p.memplan"
    code, _, err = run(
        capsys, "plan", *spec, "--device", "cuda", "--device-memory", "6MiB", "--budget", "device", "-o", out
    )
    assert code == 0, err
    assert f"budget {size - held} B" in out.read_text()
    assert all(p.is_meta for p in model.parameters())  # left as it was


def test_bad_devices_capacities_and_steps_are_the_command_lines_diagnostics(monkeypatch):
    model, example = nn.Linear(4, 4), torch.randn(2, 4)
    assert _codes(lambda: memoplan.plan(model, example, "50%", device="tpu")) == ["MP506"]
    assert _codes(lambda: memoplan.profile(model, example, device="tpu")) == ["MP506"]
    assert _codes(lambda: memoplan.plan(model, example, "device", device_memory="lots")) == ["MP509"]
    assert _codes(lambda: memoplan.plan(model, example, "device", device_memory=0)) == ["MP509"]
    meta = nn.Linear(4, 4, device="meta")
    assert _codes(lambda: memoplan.profile(meta, example, method="measured")) == ["MP413"]
    assert _codes(lambda: memoplan.plan(meta, example, "50%", method="measured")) == ["MP413"]
    mixed = StepConfig(mixed_precision="bf16")
    assert _codes(lambda: memoplan.profile(model, example, step=mixed)) == ["MP250"]
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    autocast = StepConfig(autocast="bf16")
    assert _codes(lambda: memoplan.profile(model, example, step=autocast)) == ["MP253"]
    assert _codes(lambda: memoplan.plan(model, example, "50%", step=autocast)) == ["MP253"]
    assert _codes(lambda: memoplan.verify(model, "memplan 1\n", example, device="tpu")) == ["MP506"]
    assert _codes(lambda: memoplan.verify(meta, "memplan 1\n", example)) == ["MP413"]
    if not torch.cuda.is_available():
        assert _codes(lambda: memoplan.verify(model, "memplan 1\n", example, device="cuda")) == ["MP506"]
        # a model that could run here, for a GPU that is not: MP506 for a measured profile, as `--device cuda`
        assert _codes(lambda: memoplan.profile(model, example, device="cuda", method="measured")) == ["MP506"]
        assert _codes(lambda: memoplan.plan(model, example, "device", device="cuda")) == ["MP509"]


@pytest.mark.slow
def test_the_api_records_the_step_and_leaves_the_model_as_it_was():
    model, example = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4)), torch.randn(64, 16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step = StepConfig(loss="sum", autocast="bf16", optimizer="adamw")
    result = memoplan.plan(model, example, "80% hint", device="cpu", step=step, method="estimated")
    block = result.plan.block(ast.BlockKind.STEP)
    assert block is not None and {e.key for e in block.entries} == {"loss", "autocast", "optimizer"}
    prof = memoplan.profile(model, example, device="cpu", step=step, method="measured", repeats=1)
    plain = memoplan.profile(model, example, device="cpu", method="measured", repeats=1)
    assert prof.method == "measured" and prof.peak_bytes != plain.peak_bytes  # bf16 activations
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_estimated_verify_is_what_verify_says_of_a_meta_model():
    """``memoplan.estimated_verify`` (named by verify's MP413): the plan's text resolved against a
    meta model and both peaks on fake tensors, the planned one lower; a plan naming a module the
    model lacks is the resolver's diagnostic, as on the command line."""
    from memoplan.specs import Example

    model, example = meta_models.meta(), Example(meta_models.example())
    plan = "memplan 1\nmodule model.layers.* { checkpoint }\n"
    check = memoplan.estimated_verify(model, plan, example)
    assert check.modules == 2 and check.why.startswith("the model")
    assert 0 < check.planned_peak < check.unplanned_peak
    assert "equivalence: NOT checked" in check.render()
    assert _codes(lambda: memoplan.estimated_verify(model, "memplan 1\nmodule nowhere { checkpoint }\n", example))
    assert all(p.is_meta for p in model.parameters())
