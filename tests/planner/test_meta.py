"""Models built on the meta device, and steps planned for a device that is not here
(memoplan.planner.profiling.target, memoplan.planner.profiling.cuda_allocator; docs/meta.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
from _cli import run
from _paths import TESTS
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(TESTS))
import meta_models  # noqa: E402

from memoplan.measure import measure_step  # noqa: E402
from memoplan.planner.profiling.cuda_allocator import Simulator, block_bytes  # noqa: E402
from memoplan.planner.profiling.estimate import estimate, fake_step  # noqa: E402
from memoplan.planner.profiling.target import Target, is_meta, not_runnable, target_for  # noqa: E402
from memoplan.specs import Example  # noqa: E402

MODELS = TESTS / "meta_models.py"
SPEC = ["--model", f"{MODELS}:meta", "--example", f"{MODELS}:example"]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="planning for a CUDA device this machine lacks")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.slow
def test_a_meta_model_is_estimated_to_the_byte_of_the_same_model_built_for_real():
    """Parameters and buffers become fake CPU tensors with their own dtypes (bfloat16 here), the
    inputs follow from the CPU or from meta, and SDPA takes the CPU flash kernel, not meta's math
    path that saves the attention matrix: the estimate is the real build's measured peak."""
    model, real = meta_models.meta(), meta_models.real()
    assert is_meta(model) and not is_meta(real)
    measured = measure_step(real, meta_models.example()).peak_bytes
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no data pointer of a fake tensor read, nothing else
        from_cpu = estimate(model, meta_models.example(), progress=False)
    from_meta = estimate(model, meta_models.meta_example(), progress=False)
    assert from_cpu.peak_bytes == from_meta.peak_bytes == measured
    assert from_cpu.model_device == "meta" and from_cpu.method == "estimated" and from_cpu.device == "cpu"
    assert all(p.is_meta for p in model.parameters())  # left as it was
    # On the meta device itself SDPA takes the math path: far more saved (the attention matrices).
    on_meta = fake_step(model, Example(meta_models.meta_example()), torch.device("meta")).peak_bytes
    assert on_meta > measured


@NO_GPU
@pytest.mark.slow
def test_a_cuda_target_without_a_gpu_runs_cpu_kernels_and_rounds_as_the_caching_allocator():
    model = meta_models.meta()
    aim = target_for(model, "cuda")
    assert aim == Target(torch.device("cuda"), torch.device("cpu")) and aim.stand_in
    assert not_runnable(meta_models.real(), "cuda") == "no CUDA device here"
    prof = estimate(model, meta_models.example(), device="cuda", progress=False)
    cpu = estimate(model, meta_models.example(), progress=False)
    assert prof.device == "cuda" and prof.kernels == "cpu"
    assert cpu.peak_bytes < prof.peak_bytes <= cpu.peak_bytes + 512 * 400  # each storage up to 511 B more
    assert prof.peak_bytes % 512 == 0 and prof.reserved_bytes >= prof.peak_bytes
    assert cpu.reserved_bytes == 0


@pytest.mark.slow
def test_the_cli_profiles_plans_verifies_and_compiles_a_meta_model(capsys, tmp_path):
    code, out, err = run(capsys, "profile", *SPEC, "-o", tmp_path / "p.json")
    assert code == 0, err
    assert "model: built on the meta device" in out and "no real step runs" in err
    assert json.loads((tmp_path / "p.json").read_text())["model_device"] == "meta"
    plan = tmp_path / "meta.memplan"
    code, out, err = run(capsys, "plan", *SPEC, "--budget", "70%", "--shards", "2", "--optimizer", "adamw", "-o", plan)
    assert code == 0, err
    text = plan.read_text()
    assert "# model: built on the meta device" in text and "checkpoint" in text
    assert "# planned peak per rank on fake tensors:" in text
    plan1 = tmp_path / "one.memplan"
    code, out, err = run(capsys, "plan", *SPEC, "--budget", "70%", "-o", plan1)
    assert code == 0, err
    text = plan1.read_text()
    assert "# not run: estimated, not checked by a real step: the model has no storage" in text
    assert "# budget mode: hard (verified on fake tensors)" in text and "measured peak after" not in text
    code, out, err = run(capsys, "verify", plan1)
    assert code == 0, err
    assert "equivalence: NOT checked" in out and "warning[MP414]" in err and "planned peak on fake tensors" in out
    assert run(capsys, "check", plan1)[0] == 0
    assert run(capsys, "explain", plan1)[0] == 0
    assert run(capsys, "compile", plan1, "-o", tmp_path / "plan_module.py")[0] == 0


@pytest.mark.slow
def test_measured_paths_refuse_a_meta_model_naming_the_estimate(capsys, tmp_path):
    code, out, err = run(capsys, "profile", *SPEC, "--method", "measured", "-o", tmp_path / "p.json")
    assert code == 1 and "error[MP413]" in err and "--method estimated" in err
    assert not (tmp_path / "p.json").exists()
    code, out, err = run(capsys, "plan", *SPEC, "--budget", "8MiB", "--dtr", "-o", tmp_path / "d.memplan")
    assert code == 1 and "error[MP413]" in err and "--dtr" in err
    assert not (tmp_path / "d.memplan").exists()


def test_a_factory_that_runs_out_of_memory_is_mp411_with_the_meta_device_advice(capsys, tmp_path):
    code, out, err = run(
        capsys, "profile", "--model", f"{MODELS}:too_big", "--example", f"{MODELS}:example", "-o", tmp_path / "p.json"
    )
    assert code == 1 and "error[MP411]" in err and "MP504" not in err
    assert "137,438,953,472 B" in err and "meta device" in err


@NO_GPU
@pytest.mark.slow
def test_budget_device_with_device_memory_plans_for_a_gpu_not_here(capsys, tmp_path):
    out_plan = tmp_path / "cuda.memplan"
    code, out, err = run(capsys, "plan", *SPEC, "--device", "cuda", "--budget", "device", "-o", out_plan)
    assert code == 1 and "error[MP509]" in err and "--device-memory" in err
    model = meta_models.meta()
    held = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    size = 6 * 2**20
    code, out, err = run(
        capsys, "plan", *SPEC, "--device", "cuda", "--device-memory", "6MiB", "--budget", "device", "-o", out_plan
    )
    assert code == 0, err
    assert f"budget device: {size - held} B ({size} B on cuda from --device-memory" in err
    text = out_plan.read_text()
    assert "# device: cuda" in text and "# kernels: cpu's standing in for cuda's" in text
    assert "# reserved: the CUDA caching allocator would reserve about" in text
    code, out, err = run(capsys, "plan", *SPEC, "--device-memory", "lots", "--budget", "device", "-o", out_plan)
    assert code == 1 and "error[MP509]" in err
    code, out, err = run(capsys, "verify", out_plan, "--device", "cuda")  # a meta model: estimated there
    assert code == 0 and "warning[MP414]" in err


@pytest.mark.slow
def test_a_model_built_under_its_own_fake_mode_plans_without_crashing(tmp_path):
    """The abort (``corrupted double-linked list``, or a segmentation fault) of planning a Llama
    built under a FakeTensorMode: each estimated trial deep-copied the model, and torch's
    ``Tensor.__deepcopy__`` of a fake tensor reads its data pointer (undefined behaviour, warned);
    1 layer, 64 wide, 8 tokens and one estimated trial were enough.  The trials now share the
    parameters and storage-less buffers (copies.estimate_copy), and fake tensors of another mode
    are made anew, never converted (target.fake_like).  In a child: a crash is its exit status."""
    script = f"""
import sys, warnings
sys.path.insert(0, {str(TESTS)!r})
import torch, meta_models
from memoplan.planner.profiling.estimate import estimate_plan
from memoplan.specs import Example
from memoplan.syntax import parse
warnings.simplefilter("error")
model = meta_models.fake()
example = Example((torch.zeros(1, 8, dtype=torch.long),))
plan = parse("memplan 1\\nmodule model.layers.0 {{ checkpoint }}\\n", "t")
print(estimate_plan(model, example, plan) > 0)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"


# ---------------------------------------------------------------- the caching allocator


def test_small_blocks_share_a_two_mib_segment_and_large_ones_get_their_own():
    sim = Simulator()
    sim.allocate(1, 100)  # 512 B of a new 2 MiB segment
    sim.allocate(2, 1000)  # 1024 B of the same segment
    assert (sim.allocated, sim.reserved) == (512 + 1024, 2 << 20)
    sim.allocate(3, 3 << 20)  # under 10 MiB: a 20 MiB segment
    assert sim.reserved == (2 << 20) + (20 << 20)
    sim.allocate(4, 4 << 20)  # fits the rest of that segment
    assert sim.reserved == (22 << 20)
    sim.allocate(5, (11 << 20) + 1)  # best fit: the 13 MiB left of the 20 MiB segment
    assert sim.reserved == (22 << 20)
    sim.allocate(7, (14 << 20) + 1)  # 10 MiB and over, fitting no free block: rounded up to 2 MiB
    assert sim.reserved == (22 << 20) + (16 << 20)
    sim.free(5)
    sim.free(3)
    sim.free(4)
    sim.allocate(6, 19 << 20)  # the freed blocks merged back into one 20 MiB block
    assert sim.reserved == (38 << 20) and sim.peak_reserved == 38 << 20
    assert block_bytes(0) == 0 and block_bytes(1) == 512 and block_bytes(513) == 1024


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 24 << 20)), max_size=60))
def test_the_simulator_reserves_at_least_what_is_allocated_and_frees_it_all(ops):
    sim, live = Simulator(), []
    for i, (alloc, size) in enumerate(ops):
        if alloc or not live:
            sim.allocate(i, size)
            live.append((i, block_bytes(size)))
        else:
            key, _ = live.pop(size % len(live))
            sim.free(key)
        # A block is at least the request rounded to 512 B; a large one keeps a remainder of at most
        # 1 MiB it was not split from (the allocator counts it as allocated too).
        blocks = sum(b for _, b in live)
        assert blocks <= sim.allocated <= blocks + len(live) * (1 << 20)
        assert sim.allocated <= sim.reserved <= sim.peak_reserved
    for key, _ in live:
        sim.free(key)
    assert sim.allocated == 0
