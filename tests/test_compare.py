"""memoplan.compare: structured results compared by their tensors, the first difference named by its path."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from memoplan.compare import compare
from memoplan.specs import Example
from memoplan.verification import render_report, verify


class Layer:
    """A cache layer as transformers writes it: a plain object holding tensors, no __eq__."""

    def __init__(self, keys, values):
        self.keys, self.values = keys, values


class Cache:
    def __init__(self, layers):
        self.layers = layers
        self.is_initialized = True


@dataclass
class Output:
    logits: torch.Tensor
    past: Cache | None = None


def _cache(*tensors):
    return Cache([Layer(t, t * 2) for t in tensors])


def test_equal_tensors_in_distinct_objects_are_equal():
    a = torch.randn(3, 4)
    b = torch.randn(2)
    check = compare(
        "outputs", {"outputs": Output(a, _cache(a, b))}, {"outputs": Output(a.clone(), _cache(a.clone(), b.clone()))}
    )
    assert check.equal and check.exact, check.differences
    assert check.compared == 6  # logits, two keys, two values, is_initialized


def test_the_first_differing_tensor_is_named_by_its_path():
    a, b = torch.randn(3, 4), torch.randn(2, 5)
    other = b.clone()
    other[1, 2] += 1
    check = compare("outputs", {"outputs": Output(a, _cache(a, b))}, {"outputs": Output(a, _cache(a, other))})
    assert [d.split(":")[0] for d in check.differences] == [
        "outputs.past.layers[1].keys",
        "outputs.past.layers[1].values",
    ]
    assert "max abs difference 1" in check.differences[0]


def test_containers_are_named_by_index_key_and_field():
    Pair = namedtuple("Pair", "left right")
    t = torch.ones(2)
    value = {"outputs": (t, [t, {"y": Pair(t, t + 1)}])}
    changed = {"outputs": (t, [t, {"y": Pair(t, t + 2)}])}
    assert compare("outputs", value, changed).differences[0].startswith("outputs[1][1]['y'].right: ")


def test_a_tuple_is_not_a_list_and_a_missing_leaf_is_a_difference():
    t = torch.ones(2)
    assert "builtins.tuple vs builtins.list" in compare("outputs", {"o": (t,)}, {"o": [t]}).differences[0]
    check = compare("outputs", {"o": OrderedDict(a=t)}, {"o": OrderedDict(a=t, b=t)})
    assert check.differences == ("o['b']: only in the planned run",)
    assert compare("outputs", {"o": None}, {"o": t}).differences == ("o: None vs tensor(2,)",)


def test_shape_dtype_and_integer_values():
    check = compare(
        "g", {"w": torch.zeros(2), "n": torch.tensor([1, 2])}, {"w": torch.zeros(3), "n": torch.tensor([1, 3])}
    )
    assert check.differences == ("w: (2,) torch.float32 vs (3,) torch.float32", "n: values differ")
    assert not compare("g", {"w": torch.zeros(2)}, {"w": torch.zeros(2, dtype=torch.float64)}).equal


def test_half_precision_differences_do_not_overflow_and_nan_leaves_the_scale_alone():
    a = torch.tensor([60000.0, float("nan")], dtype=torch.float16)
    b = torch.tensor([-60000.0, float("nan")], dtype=torch.float16)
    assert compare("o", {"o": a}, {"o": b}).differences == ("o: max abs difference 1.2e+05 (2 x max |unplanned o|)",)


def test_tolerance_is_relative_to_the_largest_magnitude_of_the_category():
    big, small = torch.tensor([100.0]), torch.tensor([1.0])
    check = compare("g", {"big": big, "small": small}, {"big": big, "small": small + 1e-3}, rtol=2e-5)
    assert check.equal and not check.exact and check.within[0].startswith("small: max abs difference 0.001")
    assert check.largest == pytest.approx(1e-5, rel=1e-3)
    assert compare("g", {"w": big}, {"w": big}).largest == 0.0
    assert compare("g", {"w": big}, {"w": None}).largest == float("inf")
    assert not compare("g", {"big": big, "small": small}, {"big": big, "small": small + 1e-2}, rtol=2e-5).equal


def test_nan_cycles_and_objects_without_equality():
    class Box:
        pass

    def boxed(t):
        box = Box()
        box.me, box.t, box.fn, box.module = box, t, torch.add, nn.Linear(1, 1)
        return box

    t = torch.tensor([float("nan"), 1.0])
    assert compare("o", {"o": (boxed(t), float("nan"))}, {"o": (boxed(t.clone()), float("nan"))}).exact
    assert not compare("o", {"o": boxed(t)}, {"o": boxed(torch.zeros(2))}).equal


class _ReturnsCache(nn.Module):
    """Returns its activations in a transformers DynamicCache next to the logits (a ModelOutput)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x):
        from transformers import DynamicCache
        from transformers.modeling_outputs import CausalLMOutputWithPast

        cache = DynamicCache()
        for i, block in enumerate(self.blocks):
            x = block(x).tanh()
            cache.update(x[:, None, :, None], x[:, None, :, None] * 2, i)
        return CausalLMOutputWithPast(logits=x, past_key_values=cache)


def test_verify_compares_a_model_output_holding_a_cache_by_its_tensors():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    report = verify(_ReturnsCache(), "memplan 1\nmodule blocks.* { checkpoint }\n", Example((torch.randn(3, 4),)))
    assert report.equivalent, render_report(report)  # was `output[1]: DynamicCache(... vs DynamicCache(...`
    outputs = report.checks[0]
    assert outputs.name == "outputs" and outputs.compared >= 5


def test_a_differing_cache_tensor_is_named_by_its_path():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, x = _ReturnsCache(), torch.randn(3, 4)
    expected = model(x)
    actual = model(x)
    actual.past_key_values.layers[1].keys = actual.past_key_values.layers[1].keys + 1
    check = compare("outputs", {"outputs": expected}, {"outputs": actual})
    assert len(check.differences) == 1
    assert check.differences[0].startswith("outputs.past_key_values.layers[1].keys: max abs difference 1 (")
