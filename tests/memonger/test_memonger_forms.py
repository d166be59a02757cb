"""The arena module's own forms (memoplan.runtime.arena_into): each gives its op's bits, writing
into the tensor it is given, and allocates nothing inside; capture uses them, and numbers given
for tensors become tensors made once.  A pointwise op writes over its input's slot where it
reads it last."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import memoplan
from memoplan.memonger.build import plan_arena
from memoplan.memonger.capture import capture
from memoplan.memonger.measure import count_allocations
from memoplan.memonger.plan import lay_out
from memoplan.memonger.program import ScalarTensor
from memoplan.runtime import arena_into
from memoplan.runtime.arena import arena_state
from memoplan.syntax import parse

aten = torch.ops.aten


def _allocated(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _bn():
    bn = nn.BatchNorm2d(6).eval()
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.normal_()
    return bn


def _cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 8, 8, generator=g)
    a = torch.randn(3, 5, 16, generator=g)
    w = torch.randn(7, 16, generator=g)
    b = torch.randn(7, generator=g)
    q = torch.randn(2, 3, 5, 4, generator=g)
    k = torch.randn(2, 3, 4, 6, generator=g)
    table = torch.randn(11, 4, generator=g)
    ids = torch.randint(0, 11, (3, 5), generator=g)
    mask = torch.rand(3, 5, 16, generator=g) > 0.5
    bn = _bn()
    ints = torch.randint(0, 8, (3, 5), generator=g)
    t = torch.randn(5, 3, generator=g).t()  # strides no view of shape (15,) can have
    return {
        "relu": (aten.relu.default, (x,), {}),
        "linear": (aten.linear.default, (a, w, b), {}),
        "linear without bias": (aten.linear.default, (a, w), {}),
        "matmul, a matrix on the right": (aten.matmul.default, (a, w.t()), {}),
        "matmul, batched": (aten.matmul.default, (q, k), {}),
        "embedding": (aten.embedding.default, (table, ids), {}),
        "masked_fill": (aten.masked_fill.Scalar, (a, mask, float("-inf")), {}),
        "reshape that copies": (aten.reshape.default, (t, [15]), {}),
        "clone": (aten.clone.default, (t,), {}),
        "contiguous": (aten.contiguous.default, (t,), {}),
        "to_copy": (aten._to_copy.default, (a,), {"dtype": torch.float64}),
        "batch_norm": (
            aten.batch_norm.default,
            (x, bn.weight, bn.bias, bn.running_mean, bn.running_var, False, 0.1, 1e-5, False),
            {},
        ),
        "adaptive_avg_pool2d": (aten.adaptive_avg_pool2d.default, (x, [1, 1]), {}),
        "and": (aten.__and__.Tensor, (ints, ints.flip(0)), {}),
        "or": (aten.__or__.Tensor, (ints, ints.flip(1)), {}),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_each_form_gives_its_ops_bits_into_the_given_tensor_without_allocating(case):
    op, args, kwargs = _cases()[case]
    form = arena_into.FORMS[f"aten.{op.__name__}"]
    with torch.no_grad():
        expected = op(*args, **kwargs)
        out = torch.empty_strided(expected.shape, expected.stride(), dtype=expected.dtype)
        form(*args, **kwargs, out=out)  # once outside the profiler: lazy set-up is not the call's
        out.fill_(7)
        assert _allocated(lambda: form(*args, **kwargs, out=out)) < expected.untyped_storage().nbytes() // 8
    assert torch.equal(_bits(out), _bits(expected))


def test_scalars_are_made_once_and_negative_zero_is_its_own():
    assert arena_into.scalar(0.5, torch.float32) is arena_into.scalar(0.5, torch.float32)
    zero, negative = arena_into.scalar(0.0, torch.float32), arena_into.scalar(-0.0, torch.float32)
    assert zero is not negative and torch.signbit(negative) and not torch.signbit(zero)
    assert arena_into.scalar(1, torch.int64) is not arena_into.scalar(True, torch.int64)


def test_a_form_refuses_what_it_does_not_cover():
    with torch.no_grad():
        broadcast = (torch.randn(2, 3, 4), torch.randn(1, 4, 5))
        with pytest.raises(ValueError):
            arena_into.matmul(*broadcast, out=torch.empty(2, 3, 5))
        x = torch.randn(6, 4).t()  # a linear over a transposed input: no view flattens it
        with pytest.raises(RuntimeError):
            arena_into.linear(x.unsqueeze(0).expand(2, 4, 6), torch.randn(3, 6), out=torch.empty(2, 4, 3))


class Attention(nn.Module):
    """What transformers do around attention: embedding, linear, a scaled product, a mask, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.qk = nn.Linear(16, 32)
        self.out = nn.Linear(16, 8)

    def forward(self, ids, mask):
        h = self.embed(ids)
        q, k = self.qk(h).chunk(2, dim=-1)
        scores = torch.matmul(q, k.transpose(-2, -1).contiguous()) * 0.25
        scores = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return self.out(torch.relu(torch.matmul(scores, h)))


def _inputs():
    return torch.randint(0, 50, (2, 6)), torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)


def test_capture_writes_through_the_forms_and_scalars_made_once():
    torch.manual_seed(0)
    model = Attention().eval()
    ids, mask = _inputs()
    program = capture(model, (ids, mask), {})
    written = {b.out_step.op for b in program.buffers if b.arena}
    # linear and matmul: their own out= overloads give their bits on these shapes
    assert {"into.embedding", "into.contiguous", "into.masked_fill", "into.relu"} <= written
    assert all(b.arena for b in program.buffers[:-1]) and not program.buffers[-1].arena  # the output
    scaled = [b.out_step for b in program.buffers if b.arena and b.out_step.op == "aten.mul.out"]
    assert scaled and ScalarTensor(0.25, "float32") in scaled[0].args


def test_an_attention_model_on_the_arena_is_bit_for_bit_and_allocates_only_its_output():
    torch.manual_seed(0)
    model = Attention().eval()
    reference = Attention().eval()
    reference.load_state_dict(model.state_dict())
    memoplan.apply(
        model, 'memplan 1\nexample "tests.memonger.test_memonger_forms:example"\nmemonger { peak_slack = 10 }\n'
    )
    with torch.no_grad():
        for _ in range(3):
            ids, mask = torch.randint(0, 50, (2, 6)), torch.rand(6, 6) > 0.5
            mask.fill_diagonal_(False)
            assert torch.equal(_bits(model(ids, mask)), _bits(reference(ids, mask)))
        ids, mask = _inputs()
        steady, _ = count_allocations(lambda: model(ids, mask))
        eager, _ = count_allocations(lambda: reference(ids, mask))
    assert steady.count == 1 and steady.bytes == 2 * 6 * 8 * 4  # the output only
    assert eager.count == 10
    assert arena_state(model).arena_calls == 4


def example():
    return _inputs()


class Residual(nn.Module):
    """BatchNorm, then ReLU; the BatchNorm's output is read again by the sum, the ReLU's is not."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = _bn()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = self.bn(x)
        y = torch.relu(h)
        return self.fc(y + h)


def test_a_pointwise_op_writes_over_its_input_only_where_it_reads_it_last():
    torch.manual_seed(0)
    program = capture(Residual().eval(), (torch.randn(4, 6, 8, 8),), {})
    ops = [program.steps[b.producer].op for b in program.buffers]
    bn, relu, add = (ops.index(op) for op in ("aten.batch_norm.default", "aten.relu.default", "aten.add.Tensor"))
    assert program.buffers[relu].over == bn and program.buffers[add].over in (bn, relu)
    plan = lay_out(program, slack=10)
    slot_of = plan.slot_of()
    assert slot_of[relu] != slot_of[bn]  # the sum reads the BatchNorm's output after the ReLU
    assert slot_of[add] in (slot_of[relu], slot_of[bn])  # the sum is the last reader of one of them
    assert plan.layout.stats.arena_bytes == 2 * program.buffers[bn].size


def test_in_place_slots_are_bit_for_bit_and_shrink_the_arena():
    torch.manual_seed(0)
    model = nn.Sequential(_bn(), nn.ReLU(), nn.Conv2d(6, 4, 1), _bn_of(4), nn.GELU(), nn.Flatten(), nn.Linear(256, 3))
    model.eval()
    reference = copy.deepcopy(model)
    text = "memplan 1\nexample randn(4, 6, 8, 8)\nmemonger { }\n"
    plan = plan_arena(reference, parse(text))
    memoplan.apply(model, text)
    assert [len(held) for held in plan.slots][:2] == [2, 2]  # BatchNorm > ReLU, BatchNorm > GELU
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4, 6, 8, 8)
            assert torch.equal(_bits(model(x)), _bits(reference(x)))
    assert arena_state(model).arena_calls == 2


def _bn_of(channels: int):
    bn = nn.BatchNorm2d(channels).eval()
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
    return bn
