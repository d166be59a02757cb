"""A time-chunked module's input gradient goes in place, over its output's gradient — and only when safe.

Outside a recompute, a chunked module's output is a real joined tensor; its incoming
gradient reaches the last chunk's placement first (memoplan.runtime.chunking._Place),
which hands it to the chunks' sink when nothing else holds it.  Each chunk then
writes its input gradient over its own slice, and the statistics passes of a
chunked BatchNorm add theirs there (memoplan.runtime.gradroot.Sink).  Every test
compares with the same plan with nothing in place (``held_alone`` answering "no"),
bit for bit; the memory tests take differences on the live-storage meter.  The
gradients that must not be written over (kept by a hook, shared with another input,
passed by the caller) are tested for both paths in tests/runtime/test_gradroot.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import memoplan
from memoplan.measure import LiveStorageMeter
from memoplan.neurons import LIF, reset
from memoplan.runtime import gradroot, recompute, region_function

STEPS, BATCH, WIDTH = 8, 64, 32  # one time step: 8 KiB in float32; the sequence 64 KiB


class Layer(nn.Module):
    """Linear over (T, B, F), optionally BatchNorm over every step, then a LIF neuron over time."""

    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.BatchNorm1d(WIDTH) if norm else nn.Identity()
        self.lif = LIF(threshold=0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.fc(x).flatten(0, 1)).unflatten(0, x.shape[:2])
        return self.lif(h)


@pytest.fixture(autouse=True)
def _fresh_probe(monkeypatch):
    """The placement probe is measured once per process, by the first backward that asks; here it is
    measured in each test's own context, whatever another test in this worker ran before it (in one
    CI run's order nothing went in place in these tests, and no order tried since reproduced it)."""
    monkeypatch.setattr(gradroot, "_ALONE", {})


def _planned(norm: bool = False, layers: int = 2, chunks: int = 4) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(*(Layer(norm) for _ in range(layers)))
    plan = (
        f"memplan 1\nmodule class LIF {{ state = functional }}\nmodule * : Layer {{ temporal_chunk {chunks} dim 0 }}\n"
    )
    return memoplan.apply(net, plan)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.rand(STEPS, BATCH, WIDTH, generator=g) * 2, torch.randn(STEPS, BATCH, WIDTH, generator=g)


def _step(net: nn.Module, *, meter: bool = False, backwards: int = 1):
    """(backward peak bytes or None, input gradient, parameter gradients)."""
    x, weight = _inputs()
    reset(net)
    net.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    x = x.requires_grad_()
    loss = (net(x) * weight).sum()
    peak = None
    for n in range(backwards):
        if meter:
            with LiveStorageMeter() as m:
                loss.backward(retain_graph=n + 1 < backwards)
            peak = m.peak_bytes
        else:
            loss.backward(retain_graph=n + 1 < backwards)
    return peak, x.grad, {name: p.grad for name, p in net.named_parameters()}


def _nothing_in_place(monkeypatch) -> None:
    monkeypatch.setattr(gradroot, "held_alone", lambda grads, site="region": [])


def _assert_same(a, b) -> None:
    assert torch.equal(a[1], b[1])
    assert a[2].keys() == b[2].keys()
    for name in a[2]:
        assert torch.equal(a[2][name], b[2][name]), name


@pytest.mark.parametrize("norm", [False, True], ids=["lif", "batchnorm"])
def test_in_place_input_gradients_are_bit_for_bit_and_hold_less(monkeypatch, norm):
    net = _planned(norm)
    in_place = _step(net, meter=True)
    _nothing_in_place(monkeypatch)
    kept = _step(net, meter=True)
    _assert_same(in_place, kept)
    # The peak is the last layer's first chunk's backward: besides the incoming
    # gradient, the other three chunks' input gradients wait for their concatenation,
    # unless they went into the incoming gradient's slices.
    sequence = STEPS * BATCH * WIDTH * 4
    assert kept[0] - in_place[0] == 3 * sequence // 4


def test_batchnorm_statistics_passes_add_into_the_slices(monkeypatch):
    """Every chunk's input gradient is the main pass's and the statistics pass's, summed in the slice."""
    filled, added = [], []
    fill, add_into = gradroot.Sink.fill, gradroot.Sink.add_into
    monkeypatch.setattr(gradroot.Sink, "fill", lambda self, slot, g, k: filled.append(k) or fill(self, slot, g, k))
    monkeypatch.setattr(gradroot.Sink, "add_into", lambda self, k, g: add_into(self, k, g) and not added.append(k))
    net = _planned(norm=True, layers=1)
    _step(net)
    # One chunked layer: each of its four chunks fills its slice, and the statistics pass adds into each.
    assert sorted(filled) == [0, 1, 2, 3]
    assert sorted(added) == [0, 1, 2, 3]


def test_a_chunked_batchnorm_as_a_recomputes_last_module_adds_into_the_slices_too(monkeypatch):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Sequential(nn.Identity(), Layer(norm=True)))
    plan = (
        "memplan 1\nmodule class LIF { state = functional }\n"
        "module 0 {\n    checkpoint\n    compress input = none\n}\nmodule 0.1 { temporal_chunk 4 dim 0 }\n"
    )
    net = memoplan.apply(net, plan)
    added = []
    add_into = gradroot.Sink.add_into
    monkeypatch.setattr(gradroot.Sink, "add_into", lambda self, k, g: add_into(self, k, g) and not added.append(k))
    in_place = _step(net)
    assert sorted(added) == [0, 1, 2, 3]
    _nothing_in_place(monkeypatch)
    _assert_same(in_place, _step(net))
    assert sorted(added) == [0, 1, 2, 3]  # nothing went in place the second time


def test_a_second_backward_with_retained_graph_goes_in_place_again(monkeypatch):
    net = _planned(norm=True)
    twice = _step(net, backwards=2)
    _nothing_in_place(monkeypatch)
    kept = _step(net, backwards=2)
    _assert_same(twice, kept)


def test_the_placement_probe_vouches_only_for_a_gradient_held_alone():
    assert len(gradroot._alone_counts("place")) == 2  # a gradient of its own, and a reshape of one
    x = torch.ones(3)
    with torch.no_grad():
        assert gradroot.held_alone((x,), "place") == []  # this frame holds it too


def test_recompute_boundaries_keep_about_twice_the_square_root_of_the_chunks(monkeypatch):
    """Backward over 8 chunks in order: 11 chunk replays, never more than 2 states kept besides the one handed out."""

    class Node:
        pass

    replays: list[int] = []
    monkeypatch.setattr(
        recompute, "_replay", lambda ctx, state, where: replays.append(ctx.i) or [torch.tensor(ctx.i + 1.0)]
    )
    nodes = [Node() for _ in range(8)]
    boundaries = region_function._Boundaries("layer")
    for i, node in enumerate(nodes):
        node.i = i
        boundaries.add(node)
    assert boundaries.stride == 3
    most = 0
    for k in range(7, 0, -1):
        (state,) = boundaries.state(k)
        assert state.item() == k  # the state chunk k starts from
        most = max(most, len(boundaries.known))
        boundaries.reached(k, [state])
    assert most == 2
    # chunk 7 replays 0..6 (keeping 3 and 6); chunk 5 replays 3, 4 (keeping 4); chunk 2 replays 0, 1 (keeping 1)
    assert replays == [0, 1, 2, 3, 4, 5, 6, 3, 4, 0, 1]
