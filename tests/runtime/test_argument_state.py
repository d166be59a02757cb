"""A checkpoint recompute sees argument objects as the forward saw them and leaves them as it found them.

transformers' ``DynamicCache`` (GPT-2, Llama with ``use_cache=True``) is passed to every
block, which appends its keys and values; recomputing a block in backward appended them a
second time (the returned cache held every position twice).  memoplan.runtime.argstate.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import memoplan
from memoplan.compare import compare


class Store:
    """A cache as transformers writes it: a plain object whose method rebinds its attributes."""

    def __init__(self):
        self.entries = []
        self.total = None

    def update(self, x):
        self.entries.append(x)
        self.total = x if self.total is None else torch.cat([self.total, x])
        return self.total


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, store):
        seen = store.update(self.fc(x))  # the output depends on what the store held before
        return x + seen.sum(0).tanh()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        store = Store()
        for block in self.blocks:
            x = block(x, store)
        return x, store


def _step(model, x):
    out, store = model(x)
    out.square().sum().backward()
    return {"outputs": (out, store), "grads": {n: p.grad for n, p in model.named_parameters()}}


def test_recompute_sees_and_leaves_the_argument_object_as_the_forward_did():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 4)
    planned = memoplan.apply(copy.deepcopy(model), "memplan 1\nmodule blocks.* { checkpoint }\n")
    expected, actual = _step(model, x), _step(planned, x)
    assert len(actual["outputs"][1].entries) == 3  # was 6: every recompute appended again
    assert compare("outputs", {"o": expected["outputs"]}, {"o": actual["outputs"]}).exact
    assert compare("gradients", expected["grads"], actual["grads"]).exact  # the recompute saw 1, 2, 3 entries


def test_gpt2_cache_after_a_planned_step_holds_each_position_once():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=8, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 64, (2, 8))
    planned = memoplan.apply(copy.deepcopy(model), "memplan 1\nmodule transformer.h.* { checkpoint }\n")
    outputs = []
    for m in (model, planned):
        torch.manual_seed(1)  # the same dropout masks
        outputs.append(m(ids))
        outputs[-1].logits.sum().backward()
    expected, actual = outputs
    assert actual.past_key_values.layers[0].keys.shape[-2] == 8  # was 16
    check = compare("outputs", {"outputs": expected}, {"outputs": actual})
    assert check.exact, check.differences


def test_cache_bytes_of_fake_tensors_reads_no_data_pointer_and_counts_a_shared_storage_once():
    """The estimate measures a planned step on fake tensors, where a cache holds fake keys and
    values: their bytes are counted by storage identity (a fake storage has no data pointer, and
    torch warns that reading it is undefined behaviour)."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    from memoplan.runtime.argstate import cache_bytes

    class DynamicCache:  # counted only as a container of tensors here
        pass

    with FakeTensorMode():
        keys = torch.empty(2, 8, 16)
        values = torch.empty(2, 8, 16)
    cache = DynamicCache()
    cache.layers = [{"keys": keys, "values": values, "view": keys[0]}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache_bytes(cache) == 2 * 2 * 8 * 16 * 4
