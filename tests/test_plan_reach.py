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
from memoplan.planner.segments import least_peak_split, segment_starts, split_cost, sqrt_split
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


# ---------------------------------------------------------------- chains without blocks


def _brute_least(saved, inputs) -> int:
    from itertools import combinations

    n, best = len(saved), None
    for k in range(n):
        for cut in combinations(range(1, n), k):
            cost = split_cost(saved, inputs, (0, *cut)).cost
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_least_peak_split_is_least_by_brute_force(seed):
    import random

    rng = random.Random(seed)
    n = rng.randint(1, 9)
    saved = [rng.randint(0, 50) for _ in range(n)]
    inputs = [rng.randint(0, 20) for _ in range(n)]
    found = least_peak_split(saved, inputs)
    assert found.starts[0] == 0 and found == split_cost(saved, inputs, found.starts)
    assert found.cost == _brute_least(saved, inputs)


def test_sqrt_split_cuts_where_segments_cuts():
    assert sqrt_split(96) == segment_starts(96, 10) and len(sqrt_split(96)) == 10
    assert segment_starts(10, 3) == (0, 4, 7)  # the first n % k runs one longer
    assert sqrt_split(1) == (0,)
    with pytest.raises(ValueError):
        split_cost([1, 2], [1, 1], (1,))


class _Flat(nn.Module):
    """48 x (Linear(256, 256), GELU) in one nn.Sequential: no block to checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(48) for m in (nn.Linear(256, 256), nn.GELU())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@pytest.mark.slow
def test_flat_chain_is_met_at_a_hard_35_percent():
    torch.manual_seed(0)
    model = _Flat()
    example = Example((torch.randn(2048, 256, generator=torch.Generator().manual_seed(1)),))
    prof = profile(model, example, repeats=1, progress=False)
    result = make_plan(model, example, search.FractionOfPeak(Fraction(35, 100)), prof=prof, progress=False)
    assert result.met and result.measured_after <= 0.35 * result.measured_before
    text = format_plan(result.plan)
    assert "module layers { checkpoint segments = 10 }" in text or "checkpoint split = [" in text
    assert measure_plan(model, example, parse(text, "generated.memplan")) == result.measured_after
    report = verify(model, result.plan, example)
    assert report.equivalent and report.exact, report.checks
