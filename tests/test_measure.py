"""Measure stage tests: the live-storage meter is exact, deterministic and sees what plans save."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from memoplan import runtime as rt
from memoplan.measure import LiveStorageMeter, StepMemory, default_loss, indexed_device, measure_step, training_step
from memoplan.runtime.install import qualified_type_name

MIB = 1024 * 1024

# The 20-layer MLP of ANCHORS.md: 20 x (Linear(512, 512) -> activation), batch 1024.
DEPTH, WIDTH, BATCH = 20, 512, 1024
FLOAT = 4  # bytes per float32
ACTIVATION = BATCH * WIDTH * FLOAT  # one (batch, width) activation: 2 MiB
WEIGHT = WIDTH * WIDTH * FLOAT  # one weight (or weight gradient): 1 MiB


def _mlp(activation: type[nn.Module]) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), activation()]
    return nn.Sequential(*layers)


def _per_layer_checkpointing(model: nn.Sequential) -> nn.Sequential:
    """Each (Linear, activation) pair its own checkpoint region, as generated code does it."""
    groups = tuple((str(2 * i), str(2 * i + 1)) for i in range(DEPTH))

    def _policy_segments(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return rt.run_segmented(self, groups, args, kwargs, preserve_rng=True)

    planned = copy.deepcopy(model)
    rt.install(
        nn.ModuleDict({"mlp": planned}),  # a parent, since the root itself is never a target
        [rt.Target("mlp", qualified_type_name(nn.Sequential), _policy_segments)],
        plan_id="per-layer",
    )
    return planned


def test_meter_counts_new_storages_once_and_not_views() -> None:
    before = torch.zeros(256)  # existed before the meter: never counted, nor its views
    with LiveStorageMeter() as meter:
        a = torch.ones(1000)  # 4000 bytes
        views = (a.view(10, 100), a[10:], a.t(), before.view(16, 16), before[:3])
        a.add_(1)  # in place: same storage
        assert meter.current_bytes == 4000
        b = a * 2  # a new storage
        assert meter.current_bytes == 8000
        del a
        assert meter.current_bytes == 8000  # the views keep a's storage alive
        del views
        assert meter.current_bytes == 4000
        del b
        assert meter.current_bytes == 0
        assert meter.peak_bytes == 8000
        meter.reset_peak()
        assert meter.peak_bytes == 0


def test_meter_follows_out_arguments_that_grow() -> None:
    with LiveStorageMeter() as meter:
        out = torch.empty(0)  # 0 bytes
        ones = torch.ones(10)  # 40 bytes
        torch.add(ones, 1, out=out)  # resizes `out`'s storage in place to 40 bytes
        assert meter.current_bytes == 80
        del ones
        assert meter.current_bytes == 40
        assert meter.peak_bytes == 80
    assert out.numel() == 10


def test_measure_step_is_deterministic() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.GELU(), nn.Dropout(0.1), nn.Linear(128, 8))
    x = torch.randn(32, 64)
    readings = [measure_step(model, (x,)) for _ in range(3)]
    assert readings[0] == readings[1] == readings[2]
    assert readings[0].method == "live-storage" and readings[0].device == "cpu"


def test_measure_step_counts_gradients() -> None:
    torch.manual_seed(0)
    model = nn.Linear(WIDTH, WIDTH)
    x = torch.randn(BATCH, WIDTH)  # needs no grad: backward makes only the weight and bias grads
    memory = measure_step(model, (x,))
    bias = WIDTH * FLOAT
    # The output stays alive through backward (the step returns it), plus the two gradients;
    # the rest is a few scalars (the loss and its gradient).
    assert ACTIVATION + WEIGHT + bias <= memory.peak_bytes < ACTIVATION + WEIGHT + bias + 64
    assert model.weight.grad is not None


def test_measure_step_with_kwargs_and_loss_fn() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, *, scale: float) -> dict[str, Any]:
            y = self.lin(x) * scale
            return {"y": y, "steps": torch.tensor([1, 2]), "pair": (y.sum(), "tag")}

    model = Scaled()
    x = torch.randn(2, 4)
    memory = measure_step(model, (x,), {"scale": 2.0}, loss_fn=lambda out: out["y"].pow(2).mean())
    assert memory.peak_bytes > 0
    output, loss = training_step(model, (x,), {"scale": 2.0}, None)
    assert torch.equal(loss, default_loss(output))  # integer tensors and strings are skipped
    assert torch.equal(loss, output["y"].sum() + output["pair"][0])


def test_step_memory_mib() -> None:
    assert StepMemory(peak_bytes=3 * MIB, device="cpu", method="live-storage").peak_mib == 3.0


@pytest.mark.slow
def test_mlp_gelu_saves_and_relu_saves_nothing_under_per_layer_checkpointing() -> None:
    """The ANCHORS.md planner case, with the saving derived from the shapes.

    GELU saves its input h_i = Linear(a_{i-1}) for backward, and the next Linear
    saves a_i = GELU(h_i): two activations per layer.  Checkpointing each pair keeps
    only the pair's input, so the 20 h_i are gone from the forward; but at the peak
    (backward of the last pair) its recompute has re-materialised one of them.  So
    the saving is (DEPTH - 1) activations.  ReLU saves its *output*, which is the
    next Linear's input anyway: one activation per layer, nothing to drop, and
    checkpointing then saves exactly 0 bytes.  The checkpointed GELU MLP therefore
    peaks exactly where the unplanned ReLU MLP does.
    """
    x = torch.randn(BATCH, WIDTH)
    gelu, relu = _mlp(nn.GELU), _mlp(nn.ReLU)
    gelu_plain = measure_step(gelu, (x,))
    gelu_planned = measure_step(_per_layer_checkpointing(gelu), (x,))
    relu_plain = measure_step(relu, (x,))
    relu_planned = measure_step(_per_layer_checkpointing(relu), (x,))

    assert gelu_plain.peak_bytes - gelu_planned.peak_bytes == (DEPTH - 1) * ACTIVATION
    assert relu_plain.peak_bytes - relu_planned.peak_bytes == 0
    assert gelu_planned.peak_bytes == relu_plain.peak_bytes
    # Unplanned GELU peak (backward of the last Linear): 2 * DEPTH activations alive less the
    # freed h_20, plus the two activation-sized gradients and the weight gradient, plus the
    # bias gradient and a few scalars.
    extra = gelu_plain.peak_bytes - ((2 * DEPTH + 1) * ACTIVATION + WEIGHT)
    assert WIDTH * FLOAT <= extra < WIDTH * FLOAT + 64


def test_indexed_device_gives_a_cuda_device_its_index_and_leaves_others_as_they_are(monkeypatch):
    assert indexed_device("cpu") == torch.device("cpu")
    assert indexed_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)  # no GPU needed: only the index is read
    assert indexed_device("cuda") == torch.device("cuda", 3)
