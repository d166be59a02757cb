"""When the training step cannot run on fake tensors (the estimate), what memoplan does and says.

* An operator whose fake kernel refuses inputs its real kernel takes (``aten._grouped_mm``'s wants
  bfloat16, as on CUDA; the CPU's kernel takes float32: Mixtral's experts) runs for real on zeros:
  the estimate is still the measured peak to the byte, torch's logged traceback is not printed, and
  a note names the operator.
* A model that reads tensor values (``.item()``, ``.tolist()``, ``nonzero``) cannot be estimated:
  MP504 names the estimate and ``--method measured``, not the example; ``auto`` measures instead
  and says so.
* An operator whose real kernel refuses the inputs too: MP504 says to check the example.
* A constant of the model's code (``torch.tensor(...)``) counts as the CPU's meter counts it.
"""

from __future__ import annotations

import logging
import textwrap

import pytest
import torch
from _cli import run, write
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from memoplan.measure import measure_step
from memoplan.planner.profiling.estimate import FakeStepFailed, fake_step, take_profile
from memoplan.specs import Example

CPU = torch.device("cpu")


class Experts(nn.Module):
    """Two experts of a mixture applied by one grouped matrix product, as Mixtral's are."""

    def __init__(self, width: int = 16, experts: int = 2) -> None:
        super().__init__()
        self.up = nn.Parameter(torch.randn(experts, width, width) / width)
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        offsets = torch.tensor([rows // 2, rows], dtype=torch.int32)
        return self.head(torch.relu(torch._grouped_mm(x, self.up, offs=offsets)))


class Scaled(nn.Module):
    """A constant made in forward (``torch.tensor``), returned with the output: live at the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = torch.tensor([1.5, 2.0, 0.5, 1.0, 1.0, 3.0, 0.25, 2.0])
        return torch.tanh(self.lin(x) * scale), scale


def _grouped_mm_refused_on_fake_tensors() -> bool:
    """Whether torch's fake kernel of ``_grouped_mm`` refuses float32 (what this test is about)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode():
            torch._grouped_mm(torch.randn(4, 8), torch.randn(2, 8, 8), offs=torch.tensor([2, 4], dtype=torch.int32))
    except RuntimeError:
        return True
    return False


def test_an_operator_without_a_fake_kernel_runs_on_zeros_and_the_estimate_stays_exact(caplog):
    if not _grouped_mm_refused_on_fake_tensors():
        pytest.skip("this torch's fake kernel of _grouped_mm takes float32: nothing falls back")
    torch.manual_seed(0)
    model, example = Experts(), Example((torch.randn(32, 16),))
    measured = measure_step(model, example.args).peak_bytes
    before = [(p, p.grad) for p in model.parameters()]
    caplog.clear()  # the probe above logged torch's traceback
    with caplog.at_level(logging.DEBUG):
        fake = fake_step(model, example, CPU)
    assert fake.peak_bytes == measured
    assert [operator for operator, _ in fake.fallbacks] == ["aten._grouped_mm.default"]
    assert "BF16" in fake.fallbacks[0][1]
    assert not [r for r in caplog.records if "attempting to run meta" in r.getMessage()]
    # The model is as it was: the same real parameters and gradients.
    after = list(model.parameters())
    assert all(p is q and p.grad is grad for (p, grad), q in zip(before, after, strict=True))
    assert not any(isinstance(p, FakeTensor) or isinstance(p.grad, FakeTensor) for p in after)

    notes: list[str] = []
    prof = take_profile(model, example, method="estimated", note=notes.append, progress=False, repeats=1)
    assert prof.peak_bytes == measured
    assert any("aten._grouped_mm.default has no fake kernel" in n and "zeros" in n for n in notes), notes


def test_a_constant_of_the_models_code_counts_as_the_cpu_meter_counts_it():
    torch.manual_seed(0)
    model, example = Scaled(), Example((torch.randn(4, 8),))
    assert fake_step(model, example, CPU).peak_bytes == measure_step(model, example.args).peak_bytes


MODELS = """
import torch
from torch import nn


class Item(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y * y.abs().max().item()


class ToList(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y * len([v for v in y.sum(1).tolist() if v > 0])


class NonZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y[y.nonzero(as_tuple=True)]


class Narrow(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return torch.mm(x, self.weight)
"""


@pytest.mark.parametrize(
    ("name", "operator"), [("Item", "_local_scalar_dense"), ("ToList", "_local_scalar_dense"), ("NonZero", "nonzero")]
)
def test_a_model_that_reads_values_is_not_estimated_and_the_help_names_the_estimate(tmp_path, capsys, name, operator):
    models = write(tmp_path, "models.py", textwrap.dedent(MODELS))
    spec = ("--model", f"{models}:{name}", "--example", "randn(4, 8)")
    out = tmp_path / "p.memplan"
    code, _, err = run(capsys, "plan", *spec, "--method", "estimated", "--budget", "50%", "-o", out)
    assert code == 1 and not out.exists()
    assert "error[MP504]: estimating one training step on fake tensors raised" in err, err
    assert operator in err
    assert "`--method measured`" in err and "fits the model" not in err, err
    assert "attempting to run meta" not in err

    code, _, err = run(capsys, "profile", *spec, "--method", "estimated", "-o", tmp_path / "p.json")
    assert code == 1 and "`--method measured`" in err and "fits the model" not in err, err


@pytest.mark.slow
def test_auto_measures_a_model_the_estimate_cannot_run_and_says_so(tmp_path, capsys):
    models = write(tmp_path, "models.py", textwrap.dedent(MODELS))
    out = tmp_path / "p.memplan"
    code, _, err = run(
        capsys, "plan", "--model", f"{models}:Item", "--example", "randn(4, 8)", "--budget", "50%", "--hint", "-o", out
    )
    assert code == 0 and out.exists(), err
    assert "raised DataDependentOutputException" in err and "measuring the peak with real steps instead" in err, err


def test_inputs_the_real_kernel_refuses_too_point_at_the_example(tmp_path, capsys):
    models = write(tmp_path, "models.py", textwrap.dedent(MODELS))
    spec = ("--model", f"{models}:Narrow", "--example", "randn(4, 6)")  # 6 columns for an 8-row weight
    code, _, err = run(capsys, "profile", *spec, "--method", "estimated", "-o", tmp_path / "p.json")
    assert code == 1
    assert "error[MP504]: estimating one training step on fake tensors raised RuntimeError" in err, err
    assert "aten.mm.default refuses these inputs when run for real too" in err
    assert "check that the example input fits the model" in err


def test_fake_step_failed_keeps_its_cause():
    failure = FakeStepFailed(ValueError("bad\nsecond line"), "aten.mm.default")
    assert str(failure) == "estimating one training step on fake tensors raised ValueError: bad in aten.mm.default"
    assert isinstance(failure.cause, ValueError) and not failure.data_dependent and not failure.real_kernel_refused


def test_a_cache_on_fake_tensors_is_counted_without_reading_an_address():
    """An estimated trial of a plan over a transformers cache counts the cache's storages (MP416):
    a fake storage has no address to read (torch warns that reading it is a bug)."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    from memoplan.runtime.argstate import cache_bytes

    class DynamicCache:  # what memoplan takes for a transformers cache: its class's module and name
        __module__ = "transformers.cache_utils"

        def __init__(self, *tensors):
            self.layers = list(tensors)

    with FakeTensorMode():
        keys = torch.empty(2, 8)
        cache = DynamicCache(keys, keys[1:], torch.empty(3))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert cache_bytes(cache) == 2 * 8 * 4 + 3 * 4
