"""BatchNorm inside temporal chunks normalises with the whole batch's statistics.

A chunked module that folds time into the batch runs one statistics pass per
training-mode BatchNorm call, then the main pass (memoplan/runtime/batchnorm.py).
Against the unplanned step: in float64 the gradients agree to rounding (a check of
the algebra); in float32 within memoplan.verification.CHUNK_RTOL (the documented
tolerance); ``num_batches_tracked``, RNG state and ``state_dict`` keys exactly.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import memoplan
from memoplan.examples import spiking
from memoplan.measure import measured_step
from memoplan.neurons import LIF, reset
from memoplan.verification import CHUNK_RTOL

F = 6
STATE = "memplan 1\nmodule class LIF { state = functional }\n"


class TimeNorm(nn.Module):
    """(T, B, F...) -> fold time into the batch -> BatchNorm -> unfold."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x):
        return self.norm(x.flatten(0, 1)).unflatten(0, x.shape[:2])


class TimeLinear(nn.Linear):
    def forward(self, x):
        return super().forward(x.flatten(0, 1)).unflatten(0, x.shape[:2])


def block(norm: nn.Module) -> nn.Sequential:
    return nn.Sequential(TimeLinear(F, F), TimeNorm(norm), LIF(threshold=0.3))


class Net(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(F, 3)

    def forward(self, x):
        return self.head(self.body(x).mean(0))


def step(model: nn.Module, x: torch.Tensor, weight: torch.Tensor):
    reset(model)
    torch.manual_seed(5)
    x = x.clone().requires_grad_()
    out = model(x)
    (out * weight).sum().backward()
    states = [m.v.detach().clone() for m in model.modules() if isinstance(m, LIF)]
    grads = {n: p.grad for n, p in model.named_parameters()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    return out.detach(), x.grad, grads, buffers, states, torch.get_rng_state()


def assert_close(a: dict, b: dict, rtol: float, what: str) -> None:
    """Every tensor of a category within ``rtol`` times the category's largest unplanned magnitude.

    (Per category, not per tensor: a gradient that is zero in exact arithmetic, like
    the bias of a layer right before BatchNorm, is rounding noise in both runs.)
    """
    assert a.keys() == b.keys(), what
    scale = max((t.abs().max().item() for t in a.values() if t is not None and t.is_floating_point()), default=0.0)
    for name in a:
        x, y = a[name], b[name]
        assert (x is None) == (y is None), f"{what} {name}"
        if x is None:
            continue
        if not x.is_floating_point():
            assert torch.equal(x, y), f"{what} {name}"
        else:
            diff = (x - y).abs().max().item()
            assert diff <= rtol * scale, f"{what} {name}: {diff} vs {scale}"


def compare(model: nn.Module, plan: str, x: torch.Tensor, rtol: float, steps: int = 2) -> None:
    reference, planned = copy.deepcopy(model), copy.deepcopy(model)
    memoplan.apply(planned, plan)
    weight = torch.randn(x.shape[1], 3, dtype=x.dtype, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):  # twice: the second step starts from updated running statistics
        a, b = step(reference, x, weight), step(planned, x, weight)
        assert_close({"": a[0]}, {"": b[0]}, rtol, "output")
        assert_close({"": a[1]}, {"": b[1]}, rtol, "input gradient")
        assert_close(a[2], b[2], rtol, "gradient")
        assert_close(a[3], b[3], rtol, "buffer")
        assert_close(dict(enumerate(a[4])), dict(enumerate(b[4])), rtol, "LIF state")
        assert torch.equal(a[5], b[5]), "RNG state"
    assert list(reference.state_dict()) == list(planned.state_dict())


def spikes(steps: int, batch: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    return (torch.rand(steps, batch, F, generator=torch.Generator().manual_seed(seed)) < 0.5).to(dtype)


NORMS = {
    "default": lambda: nn.BatchNorm1d(F),
    "cumulative": lambda: nn.BatchNorm1d(F, momentum=None),
    "no-affine": lambda: nn.BatchNorm1d(F, affine=False),
    "untracked": lambda: nn.BatchNorm1d(F, track_running_stats=False),
}


@pytest.mark.parametrize("kind", sorted(NORMS))
@pytest.mark.parametrize("chunks", [1, 3, 7])
def test_float64_gradients_match_to_rounding(kind: str, chunks: int) -> None:
    torch.manual_seed(0)
    model = Net(block(NORMS[kind]())).double()
    plan = STATE + f"module body {{ temporal_chunk {chunks} dim 0; compress input = bit }}\n"
    compare(model, plan, spikes(7, 3, torch.float64), rtol=1e-10)


@pytest.mark.parametrize("chunks", [2, 5])
def test_float32_within_the_documented_tolerance(chunks: int) -> None:
    torch.manual_seed(1)
    model = Net(block(nn.BatchNorm1d(F)))
    plan = STATE + f"module body {{ temporal_chunk {chunks} dim 0; compress input = bit }}\n"
    compare(model, plan, spikes(6, 4), rtol=CHUNK_RTOL)


def test_a_nested_region_without_batchnorm_inside_the_chunks_matches_to_rounding() -> None:
    """`checkpoint nested = true` on the linear layer of a chunked block with BatchNorm: the
    inner region holds no BatchNorm (the resolver refuses one that does, MP320)."""
    torch.manual_seed(0)
    model = Net(block(nn.BatchNorm1d(F))).double()
    plan = (
        STATE
        + "module body { temporal_chunk 3 dim 0; compress input = bit }\nmodule body.0 { checkpoint nested = true }\n"
    )
    compare(model, plan, spikes(7, 3, torch.float64), rtol=1e-10)


def test_two_batchnorms_and_a_shared_one_take_one_pass_each() -> None:
    """BN -> LIF -> BN (needs the first's statistics and the neuron's state) and one BN called twice."""
    torch.manual_seed(2)
    shared = TimeNorm(nn.BatchNorm1d(F))
    body = nn.Sequential(
        TimeLinear(F, F), TimeNorm(nn.BatchNorm1d(F)), LIF(threshold=0.3), TimeLinear(F, F), shared, nn.Tanh(), shared
    )
    model = Net(body).double()
    calls = []
    model.body[0].register_forward_pre_hook(lambda m, a: calls.append(a[0].shape[0]))
    compare(model, STATE + "module body { temporal_chunk 3 dim 0 }\n", spikes(6, 3, torch.float64), rtol=1e-10, steps=1)
    # Unplanned: one call.  Planned: 3 statistics passes (one per batch_norm call) + the main
    # pass, 3 chunks each, plus backward's recompute of each pass's chunks.
    assert calls[0] == 6 and calls[1:] == [2] * (3 * 4 * 2)


def test_eval_mode_runs_no_statistics_pass() -> None:
    torch.manual_seed(3)
    model = Net(block(nn.BatchNorm1d(F)))
    model.body[1].norm.running_mean.uniform_(-0.5, 0.5)
    model.eval()
    calls = []
    compare(model, STATE + "module body { temporal_chunk 3 dim 0 }\n", spikes(6, 2), rtol=CHUNK_RTOL)
    planned = copy.deepcopy(model)
    memoplan.apply(planned, STATE + "module body { temporal_chunk 3 dim 0 }\n")
    planned.body[0].register_forward_pre_hook(lambda m, a: calls.append(a[0].shape[0]))
    step(planned, spikes(6, 2), torch.ones(2, 3))
    assert calls == [2, 2, 2] * 2  # forward and recompute, no statistics pass


def test_too_few_values_per_channel_is_the_same_error_as_without_a_plan() -> None:
    model = Net(block(nn.BatchNorm1d(F)))
    planned = copy.deepcopy(model)
    memoplan.apply(planned, STATE + "module body { temporal_chunk 2 dim 0 }\n")
    x = spikes(1, 1)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        model(x)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        planned(x)


def test_the_bundled_spiking_cnn_chunks_its_blocks_for_less_memory() -> None:
    """Whole blocks (conv, BatchNorm, LIF) in 4 time chunks: lower peak than checkpointing them."""
    torch.manual_seed(0)
    model = spiking.build()
    (x,) = spiking.example(batch=2, size=16)

    def peak(text: str) -> int:
        planned = copy.deepcopy(model)
        memoplan.apply(planned, text)
        spiking.reset(planned)
        memory, _, _ = measured_step(planned, (x,), {})
        return memory.peak_bytes

    checkpointed = peak(STATE + "module blocks.* { checkpoint; compress input = bit }\n")
    chunked = peak(STATE + "module blocks.* { temporal_chunk 4 dim 0; compress input = bit }\n")
    assert chunked < 0.85 * checkpointed
