"""`memoplan report --peers`: torch.compile's peer runs the step the plan records (its loss and
autocast, memoplan.step), not the sum of the outputs (memoplan.report.peers)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from memoplan.report.peers import compile_step, compiled_step, eager_step
from memoplan.specs import Example
from memoplan.step import make_step, running
from memoplan.syntax.blocks import StepConfig


class Net(nn.Module):
    """Its output carries its own loss when given labels, as a Hugging Face model's does."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
        self.head = nn.Linear(16, 10)

    def forward(self, x, labels=None):
        logits = self.head(self.body(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.float(), labels)
        return out


def _losses(config: StepConfig, model: nn.Module, example: Example) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss of one eager and of one compiled step (budget 1.0) of copies of ``model``, in ``config``'s step."""
    with running(make_step(config)):
        eager = eager_step(copy.deepcopy(model), example)().detach()
        compiled_model = copy.deepcopy(model)
        fn = compile_step(compiled_model, "cpu", f"test {config}")
        compiled = compiled_step(compiled_model, fn, example, 1.0)().detach()
    return eager, compiled


@pytest.mark.slow
def test_the_compiled_peer_takes_the_plans_loss_and_autocast(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = Net()
    g = torch.Generator().manual_seed(0)
    example = Example((torch.randn(32, 16, generator=g),), {"labels": torch.randint(0, 10, (32,), generator=g)})
    own = model(*example.args, **example.kwargs)["loss"].detach()
    out = model(*example.args, **example.kwargs)
    summed = (out["logits"].float().sum() + out["loss"].float().sum()).detach()

    eager, compiled = _losses(StepConfig(), model, example)  # auto: the model's own loss
    assert torch.allclose(compiled, own) and torch.allclose(eager, own)
    eager, compiled = _losses(StepConfig(loss="sum"), model, example)
    assert torch.allclose(compiled, summed, rtol=1e-5) and torch.allclose(eager, summed, rtol=1e-5)

    (tmp_path / "losses.py").write_text("def mean(output):\n    return output['logits'].float().mean()\n")
    monkeypatch.chdir(tmp_path)
    eager, compiled = _losses(StepConfig(loss="losses.py:mean"), model, example)
    mean = out["logits"].float().mean().detach()
    assert torch.allclose(compiled, mean) and torch.allclose(eager, mean)

    eager, compiled = _losses(StepConfig(autocast="bf16"), model, example)  # the forward in bfloat16
    assert not torch.equal(compiled, own) and not torch.equal(eager, own)
    assert torch.allclose(compiled, eager, rtol=2e-2) and torch.allclose(compiled, own, rtol=5e-2)
