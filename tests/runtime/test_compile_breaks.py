"""A region Dynamo cannot trace under ``torch.compile``: located warning MP415, once, and the same results.

When something inside a checkpointed region cannot be traced, Dynamo breaks the graph at the
region and torch's checkpoint runs eagerly; memoplan then enters its buffer and argument guards
by hand (a BatchNorm commits once, a transformers cache is updated once) and warns once per
region with its path and Dynamo's reason, and, for a model in training whose region updates a
transformers cache, that ``use_cache=False`` removes the update.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import memoplan
from memoplan.runtime import compiled

F = 4


class DataDependent(nn.Module):
    """Python control flow on a tensor's value: Dynamo cannot trace it (``Tensor.item``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(F, F)
        self.bn = nn.BatchNorm1d(F)

    def forward(self, x):
        y = self.bn(self.fc(x))
        if y.sum().item() > 0:
            y = y * 2
        return torch.tanh(y)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = DataDependent()
        self.head = nn.Linear(F, 2)

    def forward(self, x):
        return self.head(self.block(x))


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(compiled, "_WARNED", set())
    monkeypatch.setattr(compiled, "_REPORTED", {})
    counters.clear()  # the reasons reported are those Dynamo recorded since the last report
    yield
    torch._dynamo.reset()


def train(model: nn.Module, backend: str | None, steps: int = 2) -> list[list[torch.Tensor]]:
    run = model if backend is None else torch.compile(model, backend=backend)
    record = []
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        x = torch.randn(5, F, generator=torch.Generator().manual_seed(step), requires_grad=True)
        run(x).square().sum().backward()
        record.append([x.grad] + [p.grad.clone() for p in model.parameters()] + [b.clone() for b in model.buffers()])
    return record


def memoplan_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "memoplan: MP" in str(w.message)]


def test_untraceable_region_warns_once_with_path_and_reason_and_trains_as_eager():
    torch.manual_seed(0)
    net = Net()
    ref = train(copy.deepcopy(net), None)
    planned = memoplan.apply(copy.deepcopy(net), "memplan 1\nmodule block { checkpoint }\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = train(planned, "aot_eager")
    (message,) = memoplan_warnings(caught)  # once, over two steps
    assert message.startswith("memoplan: MP415: block: torch.compile could not trace inside")
    assert "Tensor.item()" in message
    # at the line that ran the compiled model (train's), not in torch/_dynamo
    assert {w.filename for w in caught if "MP415" in str(w.message)} == {__file__}
    assert "use_cache" not in message  # no transformers cache here
    for a_step, b_step in zip(ref, got):
        for a, b in zip(a_step, b_step):
            assert torch.equal(a, b)
    assert int(planned.block.bn.num_batches_tracked) == 2  # committed once per step, though recomputed


def test_traceable_region_gives_no_warning():
    torch.manual_seed(0)
    planned = memoplan.apply(
        nn.Sequential(nn.Linear(F, F), nn.Tanh(), nn.Linear(F, 2)), "memplan 1\nmodule 0 { checkpoint }\n"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(planned, "aot_eager", steps=1)
    assert memoplan_warnings(caught) == []


class CacheBlock(nn.Module):
    """Updates a transformers ``DynamicCache`` (as a GPT-2 block does) and branches on a value."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(F, F)

    def forward(self, x, cache):
        y = self.fc(x)
        keys, _ = cache.update(y[None, None], y[None, None], 0)
        if keys.sum().item() > 0:
            y = y + 1
        return y


class CacheNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = CacheBlock()

    def forward(self, x):
        from transformers import DynamicCache

        cache = DynamicCache()
        y = self.block(x, cache)
        return y, cache


def test_untraceable_region_updating_a_cache_in_training_says_use_cache_false():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    net = CacheNet()
    ref_out, ref_cache = copy.deepcopy(net)(torch.ones(3, F))
    planned = memoplan.apply(copy.deepcopy(net), "memplan 1\nmodule block { checkpoint }\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.ones(3, F, requires_grad=True)
        out, cache = torch.compile(planned, backend="aot_eager")(x)
        out.sum().backward()
    (message,) = memoplan_warnings(caught)
    assert message.startswith("memoplan: MP415: block:")
    assert "use_cache=False" in message
    assert torch.equal(out, ref_out)
    # The cache holds the forward's keys once: the recompute's update was undone.
    assert torch.equal(cache.layers[0].keys, ref_cache.layers[0].keys)
