"""Runtime and resolver defects found on real models (issue 16): each case failed before its fix.

* a failed install is rolled back and reported (``MP406``);
* a planned model pickles (``torch.save``/``torch.load``, also in a fresh process) and deep-copies;
* `state = functional` on a container means the stateful modules inside it;
* a checkpointed module that changes its input in place (``ReLU(inplace=True)``) is refused
  by the resolver (``MP323``) or, when only the run shows it, named at run time (``MP407``);
* a plan that checkpoints a model whose HF gradient checkpointing is on gets ``MP322``;
* `temporal_chunk ... dim d` past the input's dimensions names the rule, module and shape (``MP408``).
"""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import memoplan
from memoplan import runtime as rt
from memoplan.diagnostics import PlanError


def plan(text: str) -> str:
    return "memplan 1\n" + textwrap.dedent(text).lstrip("\n")


def step(model: nn.Module, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One seeded forward and backward: the output and every parameter's gradient."""
    torch.manual_seed(1)
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    out.float().square().sum().backward()
    return out.detach(), [p.grad for p in model.parameters()]


def assert_same_step(reference: nn.Module, planned: nn.Module, *inputs: torch.Tensor) -> None:
    out_a, grads_a = step(reference, *inputs)
    out_b, grads_b = step(planned, *inputs)
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


# ---------------------------------------------------------------- a small ResNet (no torchvision)


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: one in-place ReLU module, called twice."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(channels), BasicBlock(channels))
        self.fc = nn.Linear(channels, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer1(self.relu(self.bn1(self.conv1(x))))
        return self.fc(x.mean((2, 3)))


def resnet() -> ResNet:
    torch.manual_seed(0)
    return ResNet()


IMAGES = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(3))


# ---------------------------------------------------------------- 13: a failed install is undone


class NoForward(nn.Linear):
    """A module whose __setattr__ refuses an instance `forward`."""

    def __setattr__(self, name, value):
        if name == "forward":
            raise AttributeError("NoForward keeps its forward")
        super().__setattr__(name, value)


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = NoForward(4, 4)

    def forward(self, x):
        return self.b(self.a(x))


def test_a_failed_install_restores_every_module_and_names_the_one_that_refused():
    model = TwoLayers()
    before = {name: dict(vars(m)) for name, m in model.named_modules()}
    with pytest.raises(PlanError) as caught:
        memoplan.apply(model, plan("module a { checkpoint }\nmodule b { checkpoint }\n"))
    assert caught.value.codes == ["MP406"]
    assert "`b`" in str(caught.value) and "NoForward keeps its forward" in str(caught.value)
    assert {name: dict(vars(m)) for name, m in model.named_modules()} == before
    assert rt.installed_plan(model) is None
    memoplan.apply(model, plan("module a { checkpoint }\n"))  # nothing was left half-installed
    assert rt.installed_plan(model) is not None


# ---------------------------------------------------------------- 9: pickling and deep copies


def test_a_planned_model_pickles_and_loads_planned():
    planned = memoplan.apply(resnet(), plan("module layer1.* { checkpoint }\n"))
    plan_id = rt.installed_plan(planned)
    buffer = io.BytesIO()
    torch.save(planned, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert rt.installed_plan(loaded) == plan_id
    block = loaded.layer1[0]
    assert block.forward.__self__ is block and "forward" in vars(block)
    assert_same_step(resnet(), loaded, IMAGES)
    memoplan.remove(loaded)
    assert "forward" not in vars(block) and rt.installed_plan(loaded) is None
    assert rt.installed_plan(planned) == plan_id  # the original is untouched


def test_a_planned_model_loads_planned_in_a_fresh_process(tmp_path):
    """The generated module apply() imported from its cache is not importable there: its source travels."""
    from memoplan.examples import cnn

    torch.manual_seed(0)
    planned = memoplan.apply(cnn.build(), plan("module features.* { checkpoint; compress input = bit }\n"))
    torch.save(planned, tmp_path / "model.pt")
    script = textwrap.dedent(
        """
        import sys, torch
        from memoplan import runtime as rt
        model = torch.load(sys.argv[1], weights_only=False)
        print(rt.installed_plan(model), type(model.features[0].forward.__self__).__name__)
        """
    )
    env = {**os.environ, "MEMOPLAN_CACHE_DIR": str(tmp_path / "empty-cache")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "model.pt")], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [rt.installed_plan(planned), "ConvBlock"]


def test_a_deep_copy_of_a_planned_model_is_planned_equivalent_and_independent():
    original = memoplan.apply(resnet(), plan("module layer1.* { checkpoint }\n"))
    clone = copy.deepcopy(original)
    assert rt.installed_plan(clone) == rt.installed_plan(original)
    assert clone.layer1[1].forward.__self__ is clone.layer1[1]
    assert_same_step(resnet(), clone, IMAGES)
    assert all(p.grad is None for p in original.parameters())
    memoplan.remove(clone)
    assert "forward" in vars(original.layer1[0]) and "forward" not in vars(clone.layer1[0])
