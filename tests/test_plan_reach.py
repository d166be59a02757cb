"""The planner reaches what hand-written plans reach: spiking networks, flat chains.

A SpikingJelly CNN whose first block sets the peak (checkpoints alone cannot lower it) is met at
a hard 40% by chunking the blocks' time axis, with its binary inputs bit-packed and its neurons'
state threaded; the bundled spiking CNN's generated plan reaches plans/spiking_blocks.memplan.
Every generated plan is checked equivalent by ``memoplan verify``'s rules.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import torch
from torch import nn

from memoplan.examples import spiking
from memoplan.planner import search
from memoplan.planner.plan import make_plan
from memoplan.planner.profile import profile
from memoplan.planner.refine import measure_plan
from memoplan.specs import Example
from memoplan.syntax import format_plan, parse
from memoplan.verify import verify

PLANS = Path(__file__).resolve().parent.parent / "plans"


class _SJCNN(nn.Module):
    """4 blocks of SpikingJelly layer.Conv2d -> neuron.LIFNode -> layer.MaxPool2d, multi-step, then a head."""

    def __init__(self, size: int, channels=(16, 32, 32, 64), classes: int = 10) -> None:
        super().__init__()
        from spikingjelly.activation_based import functional, layer, neuron, surrogate

        blocks, cin = [], 2
        for c in channels:
            blocks.append(
                nn.Sequential(
                    layer.Conv2d(cin, c, 3, padding=1, bias=False),
                    neuron.LIFNode(surrogate_function=surrogate.ATan(), detach_reset=True),
                    layer.MaxPool2d(2),
                )
            )
            cin = c
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(layer.Flatten(), layer.Linear(cin * (size // 16) ** 2, classes))
        functional.set_step_mode(self, "m")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x)).mean(0)


def _spikingjelly_cnn(size: int = 48, batch: int = 2) -> tuple[nn.Module, Example]:
    pytest.importorskip("spikingjelly.activation_based.neuron")
    torch.manual_seed(0)
    model = _SJCNN(size)
    g = torch.Generator().manual_seed(1)
    return model, Example(((torch.rand(8, batch, 2, size, size, generator=g) < 0.2).float(),))


@pytest.mark.slow
def test_spikingjelly_cnn_is_met_at_a_hard_40_percent():
    model, example = _spikingjelly_cnn()
    prof = profile(model, example, repeats=1, progress=False)
    # Checkpoints alone cannot reach it: the first block's recompute alone is over the limit.
    result = make_plan(model, example, search.FractionOfPeak(Fraction(2, 5)), prof=prof, progress=False)
    assert result.met and result.measured_after <= 0.4 * result.measured_before
    text = format_plan(result.plan)
    assert "temporal_chunk" in text and "compress input = bit" in text
    for i in range(4):  # every SpikingJelly neuron is threaded
        assert f"module blocks.{i}.1 {{ state = functional }}" in text
    assert measure_plan(model, example, parse(text, "generated.memplan")) == result.measured_after
    report = verify(model, result.plan, example)
    assert report.equivalent, report.checks


@pytest.mark.slow
def test_binary_inputs_of_checkpoints_are_bit_packed():
    model, example = spiking.build(), Example(spiking.example())
    prof = profile(model, example, repeats=1, progress=False)
    hand = parse((PLANS / "spiking_blocks.memplan").read_text(), "spiking_blocks.memplan")
    hand_peak = measure_plan(model, example, hand)
    # The bundled spiking CNN: checkpoints with bit-packed inputs are what the hand plan writes.
    result = make_plan(model, example, search.Bytes(hand_peak), prof=prof, progress=False)
    assert result.met and result.measured_after <= hand_peak
    text = format_plan(result.plan)
    assert "compress input = bit" in text and "state = functional" in text
    report = verify(model, result.plan, example)
    assert report.equivalent and report.exact, report.checks
