"""A recomputed chain's chunked last module: no joined output, input gradients in place — and only when safe.

See memoplan.runtime.gradroot.  Every test compares against the unplanned model
bit for bit; the memory tests take exact differences on the live-storage meter.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import memoplan
from memoplan.measure import LiveStorageMeter
from memoplan.neurons import LIF, reset
from memoplan.runtime import gradroot

STEPS, WIDTH = 8, 2048  # one step of the sequence is 8 KiB in float32

PLAN = """memplan 1
module class LIF { state = functional }
module body { checkpoint }
module body.1 { temporal_chunk 4 dim 0 }
"""
# The same chunks outside a recompute: a real joined output, whose gradient may still take
# the chunks' input gradients (tests/runtime/test_chunk_inplace.py).
JOINED_PLAN = PLAN.replace("module body { checkpoint }\n", "")


class Gain(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class Net(nn.Module):
    """A checkpointed chain whose last module, a LIF neuron, runs in time chunks."""

    def __init__(self, neuron: nn.Module | None = None) -> None:
        super().__init__()
        self.body = nn.Sequential(Gain(WIDTH), neuron or LIF(threshold=0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(STEPS, WIDTH, generator=g) * 1.5
    weight = torch.randn(STEPS, WIDTH, generator=g)
    return x, weight


def _pair(neuron: nn.Module | None = None, plan: str = PLAN) -> tuple[Net, Net]:
    plain = Net(neuron)
    planned = memoplan.apply(copy.deepcopy(plain), plan)
    return plain, planned


def _step(net: Net, x: torch.Tensor, weight: torch.Tensor, *, meter: bool = False):
    """(backward peak bytes or None, input gradient, weight gradient)."""
    reset(net)
    net.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    y = net(x)
    loss = (y * weight).sum()
    if meter:
        with LiveStorageMeter() as m:
            loss.backward()
        peak = m.peak_bytes
    else:
        loss.backward()
        peak = None
    return peak, x.grad, net.body[0].weight.grad


class Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Chain(nn.Module):
    """A region (``compress input = none`` makes it memoplan's own) over a chain ending in a chunked module."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Identity(), Double())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


CHAIN_PLAN = """memplan 1
module body {
    checkpoint
    compress input = none
}
module body.1 { temporal_chunk 4 dim 0 }
"""


def _backward_peak(net: nn.Module, x: torch.Tensor, weight: torch.Tensor) -> tuple[int, torch.Tensor]:
    x = x.clone().requires_grad_()
    loss = (net(x) * weight).sum()
    with LiveStorageMeter() as meter:
        loss.backward()
    return meter.peak_bytes, x.grad


def test_the_chunks_input_gradients_go_into_the_incoming_gradient(monkeypatch):
    """Backward holds the incoming gradient and one chunk's, not every chunk's plus their concatenation."""
    net = memoplan.apply(Chain(), CHAIN_PLAN)
    x, weight = _inputs()
    sequence = x.nbytes  # 64 KiB; a chunk of 2 steps is 16 KiB
    peak, grad = _backward_peak(net, x, weight)
    assert torch.equal(grad, 2 * weight)
    seed = 4  # the loss's own gradient, one float
    # The incoming gradient, and one chunk's recomputed output or input gradient.
    assert peak == seed + sequence + sequence // 4

    monkeypatch.setattr(gradroot, "held_alone", lambda grads, site="region": [])
    concatenated, grad = _backward_peak(net, x, weight)
    assert torch.equal(grad, 2 * weight)
    # The incoming gradient, the four chunks' input gradients and their concatenation.
    assert concatenated == seed + 3 * sequence


def test_a_recompute_does_not_join_its_last_modules_chunks(monkeypatch):
    """The chunks' outputs are not copied into a joined output that nobody reads: it holds no memory."""
    net = memoplan.apply(Chain(), CHAIN_PLAN)
    x, weight = _inputs()
    made = []
    original = gradroot.Mark.forward

    def forward(ctx, *args):
        out = original(ctx, *args)
        made.append(out.untyped_storage().nbytes())
        return out

    monkeypatch.setattr(gradroot.Mark, "forward", staticmethod(forward))
    _, grad = _backward_peak(net, x, weight)
    assert torch.equal(grad, 2 * weight)
    assert made == [4, 4, 4, 4]  # one float of the process's, expanded: never the 64 KiB of the output

    made.clear()
    monkeypatch.setattr(gradroot, "result_unread", lambda module: False)
    _, grad = _backward_peak(net, x, weight)
    assert torch.equal(grad, 2 * weight) and made == []


@pytest.mark.parametrize("reshaped", [False, True], ids=["own", "reshaped"])
def test_a_neuron_chunked_in_a_recompute_is_exact_and_holds_less(monkeypatch, reshaped):
    """The incoming gradient may be a tensor of its own or, behind a view's backward, a reshape of one."""
    plain, planned = _pair()
    x, weight = _inputs()
    if reshaped:
        planned.forward = lambda x: Net.forward(planned, x).flatten()
        plain.forward = lambda x: Net.forward(plain, x).flatten()
        weight = weight.flatten()
    _, dx, dw = _step(plain, x, weight)
    peak, planned_dx, planned_dw = _step(planned, x, weight, meter=True)
    assert torch.equal(planned_dx, dx) and torch.equal(planned_dw, dw)
    monkeypatch.setattr(gradroot, "held_alone", lambda grads, site="region": [])
    kept_peak, kept_dx, kept_dw = _step(planned, x, weight, meter=True)
    assert torch.equal(kept_dx, dx) and torch.equal(kept_dw, dw)
    assert peak < kept_peak


WHERE = pytest.mark.parametrize("plan", [PLAN, JOINED_PLAN], ids=["recompute", "joined"])


@WHERE
def test_a_gradient_another_input_shares_is_not_written_over(plan):
    """``y + other``: both get the same gradient tensor, so the chunks must not write into it."""
    plain, planned = _pair(plan=plan)
    x, weight = _inputs()
    results = []
    for net in (plain, planned):
        reset(net)
        leaf = torch.zeros(STEPS, WIDTH, requires_grad=True)
        other = leaf * 1  # made first, so its backward runs after the region's
        xg = x.clone().requires_grad_()
        ((net(xg) + other) * weight).sum().backward()
        results.append((xg.grad, leaf.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[1][1], weight)


@WHERE
@pytest.mark.parametrize("keep", [lambda g: g, lambda g: g[1:], lambda g: g.detach()], ids=["tensor", "view", "alias"])
def test_a_gradient_a_hook_kept_is_not_written_over(keep, plan):
    plain, planned = _pair(plan=plan)
    x, weight = _inputs()
    for net in (plain, planned):
        reset(net)
        kept = []
        y = net(x.clone().requires_grad_())
        y.register_hook(lambda g, kept=kept: kept.append(keep(g)))
        (y * weight).sum().backward()
        assert torch.equal(kept[0], keep(weight))


@WHERE
def test_a_gradient_the_caller_passed_is_not_written_over(plan):
    plain, planned = _pair(plan=plan)
    x, weight = _inputs()
    for net in (plain, planned):
        reset(net)
        given = weight.clone()
        net(x.clone().requires_grad_()).backward(given)
        assert torch.equal(given, weight)


class Watched(LIF):
    """A neuron whose forward keeps the gradient of its output, as gradient logging does."""

    def __init__(self) -> None:
        super().__init__(threshold=0.5)
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        if y.requires_grad:
            y.register_hook(self.kept.append)
        return y


def test_a_chunks_gradient_kept_inside_the_chunk_is_not_written_over():
    plain, planned = _pair(Watched())
    x, weight = _inputs()
    _, dx, dw = _step(plain, x, weight)
    _, planned_dx, planned_dw = _step(planned, x, weight)
    assert torch.equal(planned_dx, dx) and torch.equal(planned_dw, dw)
    kept = planned.body[1].kept
    assert len(kept) == 4  # each chunk's recompute, in reverse order
    assert torch.equal(torch.cat(kept[::-1]), weight)


def test_a_last_module_with_a_forward_hook_returns_its_real_output():
    plain, planned = _pair(LIF(threshold=0.5))
    seen = []
    planned.body[1].register_forward_hook(lambda module, args, out: seen.append(out.detach().clone()))
    x, weight = _inputs()
    _, dx, dw = _step(plain, x, weight)
    _, planned_dx, planned_dw = _step(planned, x, weight)
    assert torch.equal(planned_dx, dx) and torch.equal(planned_dw, dw)
    assert len(seen) == 2  # the forward, then the recompute: the same spikes
    assert torch.equal(seen[0], seen[1])


def test_only_a_gradient_held_alone_is_vouched_for():
    x = torch.ones(3)
    with torch.no_grad():
        assert gradroot.held_alone((None,)) == []
        assert gradroot.held_alone((x.expand(2, 3),)) == []  # not contiguous
    with torch.enable_grad():  # building a graph of the backward
        assert gradroot.held_alone((x,)) == []
