"""`temporal_chunk ... boundaries = recompute`: the states time chunks start from, recomputed in backward.

The chunks replay the forward exactly, so every test compares `recompute` with `keep`
bit for bit (and `keep` is held to the unplanned model elsewhere); the memory test
takes exact differences on the live-storage meter.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import memoplan
from memoplan.diagnostics import PlanError
from memoplan.measure import LiveStorageMeter
from memoplan.neurons import LIF, reset
from memoplan.runtime import region_function

STEPS, BATCH, WIDTH = 8, 4, 256  # one time step of a layer's state: 4 KiB in float32


class Layer(nn.Module):
    """Linear over (T, B, F), then a LIF neuron over time."""

    def __init__(self, dropout: float = 0.0, norm: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.BatchNorm1d(WIDTH) if norm else nn.Identity()
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.lif = LIF(threshold=0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.fc(x).flatten(0, 1)).unflatten(0, x.shape[:2])
        return self.lif(self.drop(h))


def _net(layers: int = 3, **kwargs) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(Layer(**kwargs) for _ in range(layers)))


def _plan(chunks: int, boundaries: str, extra: str = "") -> str:
    return (
        "memplan 1\nmodule class LIF { state = functional }\n"
        f"module * : Layer {{ temporal_chunk {chunks} dim 0 boundaries = {boundaries}{extra} }}\n"
    )


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.rand(STEPS, BATCH, WIDTH, generator=g) * 2, torch.randn(STEPS, BATCH, WIDTH, generator=g)


def _step(net: nn.Module, *, seed: int = 0, backwards: int = 1) -> dict:
    x, weight = _inputs()
    reset(net)
    net.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    x = x.requires_grad_()
    y = net(x)
    loss = (y * weight).sum()
    for k in range(backwards):
        loss.backward(retain_graph=k + 1 < backwards)
    return {
        "out": y.detach(),
        "x": x.grad,
        "grads": {n: p.grad for n, p in net.named_parameters()},
        "buffers": {n: b.clone() for n, b in net.named_buffers()},
        "state": [m.v.clone() for m in net.modules() if isinstance(m, LIF)],
        "rng": torch.get_rng_state(),
    }


def _same(a: dict, b: dict) -> None:
    assert torch.equal(a["out"], b["out"])
    assert torch.equal(a["x"], b["x"])
    assert a["grads"].keys() == b["grads"].keys()
    for name in a["grads"]:
        assert torch.equal(a["grads"][name], b["grads"][name]), name
    for name in a["buffers"]:
        assert torch.equal(a["buffers"][name], b["buffers"][name]), name
    assert all(torch.equal(u, v) for u, v in zip(a["state"], b["state"]))
    assert torch.equal(a["rng"], b["rng"])


@pytest.mark.parametrize("chunks", [2, 3, 8])
def test_recompute_equals_keep_bit_for_bit(chunks):
    base = _net()
    keep = memoplan.apply(copy.deepcopy(base), _plan(chunks, "keep"))
    recompute = memoplan.apply(copy.deepcopy(base), _plan(chunks, "recompute"))
    _same(_step(keep), _step(recompute))


def test_recompute_with_batchnorm_statistics_passes_equals_keep():
    """BatchNorm over all time steps inside the chunks: the replays normalise with the same statistics."""
    base = _net(norm=True)
    keep = memoplan.apply(copy.deepcopy(base), _plan(4, "keep"))
    recompute = memoplan.apply(copy.deepcopy(base), _plan(4, "recompute"))
    a, b = _step(keep), _step(recompute)
    _same(a, b)
    assert int(b["buffers"]["0.norm.num_batches_tracked"]) == 1  # committed once, replays or not


def test_replays_draw_the_chunks_own_dropout_masks():
    base = _net(dropout=0.3)
    extra = " allow_nonequivalent = true"
    keep = memoplan.apply(copy.deepcopy(base), _plan(4, "keep", extra))
    recompute = memoplan.apply(copy.deepcopy(base), _plan(4, "recompute", extra))
    a, b = _step(keep, seed=7), _step(recompute, seed=7)
    _same(a, b)  # the same masks, and the global RNG state advanced as in one forward
    assert not torch.equal(a["rng"], _step(keep, seed=8)["rng"])  # the seed matters: the check can fail


def test_a_second_backward_with_retained_graph_replays_again():
    base = _net()
    keep = memoplan.apply(copy.deepcopy(base), _plan(4, "keep"))
    recompute = memoplan.apply(copy.deepcopy(base), _plan(4, "recompute"))
    a, b = _step(keep, backwards=2), _step(recompute, backwards=2)
    _same(a, b)
    once = _step(memoplan.apply(copy.deepcopy(base), _plan(4, "recompute")))
    assert torch.equal(b["x"], 2 * once["x"])


def test_only_the_first_chunk_keeps_its_state_through_the_step():
    """After the forward, keep holds (chunks - 1) states per layer more than recompute: exactly."""
    layers, chunks = 3, 4
    base = _net(layers)
    x, weight = _inputs()
    live = {}
    for mode in ("keep", "recompute"):
        net = memoplan.apply(copy.deepcopy(base), _plan(chunks, mode))
        reset(net)
        with LiveStorageMeter() as meter:
            y = net(x.clone().requires_grad_())
            live[mode] = meter.current_bytes
            (y * weight).sum().backward()
    state = BATCH * WIDTH * 4  # one LIF potential
    assert live["keep"] - live["recompute"] == layers * (chunks - 1) * state


def test_without_state_the_option_is_a_warning():
    plan = memoplan.parse("memplan 1\nmodule fc { temporal_chunk 2 dim 0 boundaries = recompute }\n")
    model = nn.Sequential()
    model.add_module("fc", nn.Linear(3, 3))
    resolved = memoplan.resolve(plan, model)
    assert [d.code for d in resolved.warnings] == ["MP321"]
    assert "no module inside carries state" in resolved.warnings[0].message
    assert (resolved.warnings[0].span.line, resolved.warnings[0].span.column) == (2, 13)  # at `temporal_chunk`


def test_an_unknown_value_is_refused_with_a_caret():
    with pytest.raises(PlanError) as caught:
        memoplan.apply(_net(1), _plan(2, "recomputed"))
    assert caught.value.codes == ["MP204"]
    assert "did you mean `recompute`" in str(caught.value)
    assert "^" in str(caught.value)


def test_a_state_reached_by_an_earlier_chunks_backward_is_kept_for_the_later_one():
    """If chunk k's backward came before chunk k + 1's, the state it recomputed serves k + 1 (no replay)."""

    class Node:  # stands for a chunk's autograd node; replaying one would fail
        pass

    nodes = [Node(), Node(), Node()]
    boundaries = region_function._Boundaries("layer")
    assert [boundaries.add(n) for n in nodes] == [0, 1, 2]
    state = [torch.ones(2)]
    boundaries.reached(2, state)  # the last chunk: nothing follows it
    assert boundaries.known == {}
    boundaries.reached(0, state)  # chunk 1's backward is still to come
    assert torch.equal(boundaries.state(1)[0], state[0])
    assert boundaries.known == {}  # handed over, not kept twice
    boundaries.reached(1, state)  # chunk 2 is done: nothing to keep
    assert boundaries.known == {}
