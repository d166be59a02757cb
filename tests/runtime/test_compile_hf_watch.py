"""The MP322 watch (``memoplan.runtime.hfcheck``) under ``torch.compile``: a planned model with
Hugging Face's ``gradient_checkpointing`` switch compiles once, and the watch still looks.

The watch marks itself done after its first training forward; read inside a compiled forward,
that flag became a guard, and every planned HF model recompiled at its second call.  With the
switch on, the look runs eagerly (``torch.compiler.disable``) and warns once, not at every call.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import memoplan


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class WithSwitch(nn.Module):
    """A model with Hugging Face's switch (the attribute the watch looks for)."""

    def __init__(self, on: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.gradient_checkpointing = False
        self.on = on

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _train(model: nn.Module, steps: int) -> list[warnings.WarningMessage]:
    run = torch.compile(model, backend="aot_eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
            run(x).sum().backward()
    return [w for w in caught if issubclass(w.category, memoplan.MemoplanWarning)]


def test_a_watched_planned_model_compiles_once_over_three_steps():
    torch.manual_seed(0)
    model = memoplan.apply(WithSwitch(on=False), "memplan 1\nmodule blocks.* { checkpoint }\n")
    assert "_memoplan_hf_watch" in model.__dict__  # the watch is on
    assert _train(model, 3) == []
    assert counters["stats"]["unique_graphs"] == 1  # no recompile at the second call


def test_the_watch_still_warns_when_the_switch_was_turned_on_before_compiling():
    torch.manual_seed(0)
    model = memoplan.apply(WithSwitch(on=True), "memplan 1\nmodule blocks.* { checkpoint }\n")
    model.gradient_checkpointing = True  # turned on after the plan, as the HF Trainer does
    caught = _train(model, 3)
    assert [w.message.code for w in caught] == ["MP322"]  # once, not at every compiled call
