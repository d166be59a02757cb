"""Estimated profiles (fake tensors): the bytes a real profile measures, without running the step.

Every model is profiled both ways: the estimate's peak must be within 5% of the measured one
(it is exact to the byte on all of these: the same meter watches storages of the same sizes),
and every per-module byte figure, call count, order and binary flag must be the measured ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from _paths import TESTS

from memoplan.examples import cnn, mlp, spiking, transformer
from memoplan.planner.profiling.estimate import estimate, take_profile
from memoplan.planner.profiling.profile import Profile, profile
from memoplan.planner.profiling.report import profile_table
from memoplan.planner.profiling.shrink import (
    StepOutOfMemory,
    is_out_of_memory,
    out_of_memory_as,
    shrink,
    wanted_bytes,
)
from memoplan.specs import Example

sys.path.insert(0, str(TESTS))
import real_models  # noqa: E402

EXACT = ("calls", "order", "input_binary")
BYTES = ("saved_bytes", "input_bytes", "output_bytes", "kept_bytes", "packed_input_bytes")


def _ids(batch: int = real_models.BATCH) -> torch.Tensor:
    return torch.randint(0, real_models.VOCAB, (batch, real_models.SEQ))


CASES = {
    "mlp": (lambda: mlp.build(depth=4, width=64), lambda: Example(mlp.example(batch=32, width=64))),
    "cnn": (cnn.build, lambda: Example(cnn.example(batch=4))),
    "transformer": (transformer.build, lambda: Example(transformer.example())),
    "transformer-mask": (transformer.build, transformer.example_with_mask),
    "spiking": (spiking.build, lambda: Example(spiking.example(steps=2, batch=2, size=16))),
    "gpt2": (real_models.gpt2, lambda: Example((_ids(),))),
    "gpt2-no-cache": (real_models.gpt2, lambda: Example((_ids(),), {"use_cache": False})),
    "bert": (real_models.bert, lambda: Example((_ids(),))),
    "llama": (real_models.llama, lambda: Example((_ids(),))),
    "llama-no-cache": (real_models.llama, lambda: Example((_ids(),), {"use_cache": False})),
    "spikingjelly": (real_models.spiking, lambda: Example((torch.rand(4, 2, 1, 8, 8),))),
}


FAST = ("mlp", "spiking")


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in CASES])
def test_estimate_matches_measurement(name: str) -> None:
    build, make_example = CASES[name]
    torch.manual_seed(0)
    model, example = build(), make_example()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    measured = profile(model, example, repeats=1, progress=False)
    estimated = estimate(model, example, repeats=1, progress=False)
    assert measured.method == "measured" and estimated.method == "estimated"
    assert abs(estimated.peak_bytes - measured.peak_bytes) <= 0.05 * measured.peak_bytes
    assert estimated.peak_bytes == measured.peak_bytes  # shape arithmetic: exact on these models
    assert estimated.names == measured.names
    for m, e in zip(measured.modules, estimated.modules):
        assert [getattr(e, f) for f in EXACT] == [getattr(m, f) for f in EXACT], m.name
        for f in BYTES:  # transformers materialises a causal mask it would skip for real data: a few bytes
            assert abs(getattr(e, f) - getattr(m, f)) <= 0.05 * max(getattr(m, f), 1024), (m.name, f)
    assert estimated.parameter_bytes == measured.parameter_bytes
    assert estimated.unattributed_saved_bytes == measured.unattributed_saved_bytes
    assert estimated.inputs == measured.inputs
    assert estimated.step_seconds > 0
    # The model is left exactly as it was: real parameters and buffers, same values, no grads.
    after = model.state_dict()
    assert all(not isinstance(v, torch._subclasses.fake_tensor.FakeTensor) for v in after.values())
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())


def test_spiking_binary_inputs_come_from_the_calibration() -> None:
    """Spikes are values: the fake step cannot see them, the smaller real run does."""
    torch.manual_seed(0)
    model, example = spiking.build(), Example(spiking.example(steps=2, batch=4, size=16))
    estimated = estimate(model, example, repeats=1, progress=False)
    assert any(m.input_binary for m in estimated.modules)
    assert any(m.packed_input_bytes < m.input_bytes for m in estimated.modules)


def test_method_in_json_and_table(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, example = mlp.build(depth=2, width=16), Example(mlp.example(batch=8, width=16))
    estimated = take_profile(model, example, method="estimated", repeats=1, progress=False)
    path = tmp_path / "p.json"
    estimated.save(path)
    assert json.loads(path.read_text())["method"] == "estimated"
    assert Profile.load(path) == estimated
    assert profile_table(estimated).splitlines()[0].startswith("method: estimated (fake-tensor)")
    # A profile written before the field existed reads as measured.
    data = json.loads(path.read_text())
    del data["method"]
    assert Profile.from_dict(data).method == "measured"
    with pytest.raises(ValueError, match="method must be"):
        take_profile(model, example, method="guessed")


class _Hungry(torch.nn.Module):
    """Runs out of memory (as the CPU allocator says it) when its batch is above ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch._subclasses.fake_tensor.FakeTensor) and x.shape[0] > self.limit:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8388608 bytes.")
        return torch.relu(self.linear(x))


@pytest.mark.slow
def test_auto_estimates_when_the_step_runs_out_of_memory() -> None:
    model, example = _Hungry(limit=2), Example((torch.randn(8, 4),))
    notes: list[str] = []
    result = take_profile(model, example, note=notes.append, repeats=1, progress=False)
    assert result.method == "estimated" and "ran out of memory" in notes[0]
    assert result.inputs[0].shape == (8, 4)  # the full-size example, not the calibration's
    with pytest.raises(RuntimeError, match="can't allocate"):
        take_profile(model, example, method="measured", repeats=1, progress=False)
    other = _Hungry(limit=2)
    other.forward = lambda x: (_ for _ in ()).throw(ValueError("not memory"))  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="not memory"):
        take_profile(other, example, repeats=1, progress=False)


def test_out_of_memory_errors() -> None:
    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate 8388608 bytes."
    )
    cuda = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79 GiB"
    )
    assert is_out_of_memory(cpu) and is_out_of_memory(cuda) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shape mismatch")) and not is_out_of_memory(ValueError("x"))
    assert wanted_bytes(cpu) == 8388608 and wanted_bytes(cuda) == 20 * 2**20
    assert wanted_bytes(RuntimeError("x")) is None
    with pytest.raises(StepOutOfMemory) as caught:
        with out_of_memory_as("planned"):
            raise cpu
    assert caught.value.step == "planned" and caught.value.wanted == 8388608
    with pytest.raises(ValueError):
        with out_of_memory_as("planned"):
            raise ValueError("not memory")


def test_shrink_halves_the_batch_of_every_paired_tensor() -> None:
    ids, mask = torch.randint(0, 9, (5, 3)), torch.ones(5, 3, dtype=torch.bool)
    small = shrink(Example((ids,), {"attention_mask": mask, "other": torch.ones(2), "flag": True}))
    assert small is not None
    assert small.args[0].shape == (3, 3) and torch.equal(small.args[0], ids[:3])
    assert small.kwargs["attention_mask"].shape == (3, 3)
    assert small.kwargs["other"].shape == (2,) and small.kwargs["flag"] is True
    assert shrink(Example((torch.ones(1, 4),))) is None
    assert shrink(Example((3,))) is None


def test_shrinking_tries_the_smallest_batch_it_reaches() -> None:
    """Batch 2 cut "to a quarter" is batch 1, which is tried; batch 1 itself has nothing smaller."""
    from memoplan.planner.profiling.shrink import shrinking

    seen: list[int] = []
    used, result = shrinking(
        Example((torch.ones(2, 3),)), lambda ex: seen.append(ex.args[0].shape[0]) or "ran", first=2
    )
    assert seen == [1] and used.args[0].shape == (1, 3) and result == "ran"

    def hungry(ex: Example) -> str:
        seen.append(ex.args[0].shape[0])
        if ex.args[0].shape[0] > 2:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 64 bytes.")
        return "ran"

    seen.clear()
    used, _ = shrinking(Example((torch.ones(16, 3),)), hungry, first=2)
    assert seen == [4, 2] and used.args[0].shape == (2, 3)
    with pytest.raises(torch.OutOfMemoryError, match="batch 1"):
        shrinking(Example((torch.ones(1, 3),)), hungry)
