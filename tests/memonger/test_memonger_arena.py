"""The memonger arena module: bit for bit eager's outputs, training untouched, capture diagnostics,
generated code that is deterministic and safe against any name."""

from __future__ import annotations

import ast
import copy
import io

import pytest
import torch
from torch import nn

import memoplan
from memoplan.diagnostics import PlanError
from memoplan.examples import cnn, mlp, transformer
from memoplan.memonger.measure import count_allocations
from memoplan.memonger.probe import allocated_inside
from memoplan.runtime.arena import arena_state

CNN = 'memplan 1\nmodel "memoplan.examples.cnn:build"\nexample randn(8, 3, 32, 32)\n'
MASKED = 'memplan 1\nmodel "memoplan.examples.transformer:build"\nexample "memoplan.examples.transformer:example_with_mask"\n'
SMALL_CNN = "memplan 1\nexample randn(4, 3, 8, 8)\n"


def _small_cnn():
    """BatchNorm (running statistics), dropout and ReLU: what training changes and inference does not."""
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(), nn.Linear(144, 3)
    )


def _plan(head: str, algo: str = "greedy", ordering: str = "topological", slack: str = "10") -> str:
    """The block with a ``peak_slack`` that keeps every buffer an out= form can write (the arena's
    mechanics under test); the default slack is tested on its own."""
    return head + f"memonger {{ algo = {algo}; ordering = {ordering}; peak_slack = {slack} }}\n"


def _eager(model, *args, **kwargs):
    model.eval()
    with torch.no_grad():
        return model(*args, **kwargs)


SMALL_MLP = "memplan 1\nexample randn(32, 64)\n"


def _small_mlp():
    return mlp.MLP(depth=4, width=64)


@pytest.mark.parametrize(
    "build,head,inputs,algo,ordering",
    [
        (cnn.build, CNN, lambda: ((torch.randn(8, 3, 32, 32),), {}), "greedy", "topological"),
        (
            transformer.build,
            MASKED,
            lambda: ((transformer.example_with_mask().args[0],), dict(transformer.example_with_mask().kwargs)),
            "dp",
            "longest_path",
        ),
        (_small_mlp, SMALL_MLP, lambda: ((torch.randn(32, 64),), {}), "dp", "topological"),
    ],
    ids=["cnn", "transformer-mask", "mlp"],
)
def test_the_arena_gives_eager_outputs_bit_for_bit(build, head, inputs, algo, ordering):
    torch.manual_seed(0)
    model = build().eval()
    reference = copy.deepcopy(model)
    memoplan.apply(model, _plan(head, algo, ordering))
    state = arena_state(model)
    for _ in range(3):  # new values each call: the arena is reused, nothing of a call survives it
        args, kwargs = inputs()
        with torch.no_grad():
            got = model(*args, **kwargs)
        assert torch.equal(got, _eager(reference, *args, **kwargs))
        with torch.inference_mode():
            assert torch.equal(model(*args, **kwargs), got)
    assert state.arena_calls == 6 and state.eager_calls == 0


def test_training_and_other_calls_run_the_models_own_forward():
    torch.manual_seed(0)
    model = _small_cnn()
    reference = copy.deepcopy(model)
    memoplan.apply(model, _plan(SMALL_CNN))
    state = arena_state(model)
    x = torch.randn(4, 3, 8, 8)
    for m in (model, reference):  # a training step: dropout and BatchNorm statistics as without the plan
        torch.manual_seed(1)
        m.train()
        m(x).sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), reference.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), reference.buffers()))
    model.eval()
    reference.eval()
    assert torch.equal(model(x), reference(x))  # eval with grad enabled
    with torch.no_grad():
        other = torch.randn(2, 3, 8, 8)  # another batch size than the example's
        assert torch.equal(model(other), reference(other))
        assert torch.equal(model(x), reference(x))  # the arena's call
        strided = x.transpose(2, 3).contiguous().transpose(2, 3)  # the same shape, other strides
        assert torch.equal(model(strided), reference(strided))
        model[3].train()  # one module in training mode: its dropout draws a mask
        reference[3].train()
        torch.manual_seed(2)
        got = model(x)
        torch.manual_seed(2)
        assert torch.equal(got, reference(x))
    assert state.arena_calls == 1 and state.eager_calls == 5


def test_parameters_state_dict_and_remove():
    model = _small_mlp()
    params = {name: p for name, p in model.named_parameters()}
    keys = list(model.state_dict())
    memoplan.apply(model, _plan(SMALL_MLP))
    assert "forward" in model.__dict__
    assert list(model.state_dict()) == keys
    assert all(p is params[name] for name, p in model.named_parameters())
    memoplan.remove(model)
    assert "forward" not in model.__dict__ and arena_state(model) is None
    assert memoplan.runtime.installed_plan(model) is None
    memoplan.apply(model, _plan(SMALL_MLP))  # applies again after remove


def test_weights_changed_after_apply_are_used():
    model = _small_mlp().eval()
    memoplan.apply(model, _plan(SMALL_MLP))
    x = torch.randn(32, 64)
    with torch.no_grad():
        before = model(x)
        model.layers[0].weight.mul_(2)
        after = model(x)
    memoplan.remove(model)
    with torch.no_grad():
        assert torch.equal(after, model(x)) and not torch.equal(before, after)


def test_a_copy_and_a_pickled_model_get_an_arena_of_their_own():
    model = _small_mlp().eval()
    memoplan.apply(model, _plan(SMALL_MLP))
    x = torch.randn(32, 64)
    with torch.no_grad():
        expected = model(x)
        twin = copy.deepcopy(model)
        assert torch.equal(twin(x), expected) and arena_state(twin).arena is not arena_state(model).arena
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert arena_state(loaded).arena is None
        assert torch.equal(loaded(x), expected) and arena_state(loaded).arena_calls == 1


def test_after_the_first_call_only_the_outputs_and_ops_without_out_are_allocated():
    model = _small_mlp().eval()
    memoplan.apply(model, _plan(SMALL_MLP))
    x = torch.randn(32, 64)
    with torch.no_grad():
        first, _ = count_allocations(lambda: model(x))
        steady, _ = count_allocations(lambda: model(x))
        eager, _ = count_allocations(lambda: type(model).forward(model, x))
    assert first.count == 2  # the arena, and the output
    assert steady.count == 1 and steady.bytes == 32 * 64 * 4  # the output only
    assert eager.count == 8


class Leaky(nn.Module):
    """Keeps a membrane potential between calls, as a plain tensor attribute (as spiking neurons do)."""

    def __init__(self) -> None:
        super().__init__()
        self.v = torch.zeros(())

    def forward(self, x):
        self.v = self.v * 0.5 + x
        return (self.v > 1).float()


class Stateful(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.cell = Leaky()

    def forward(self, x):
        return self.cell(self.fc(x))


def test_a_model_that_keeps_state_between_calls_is_refused_and_left_as_it_was():
    model = Stateful()
    potential = model.cell.v
    rng = torch.get_rng_state()
    with pytest.raises(PlanError) as caught:
        memoplan.apply(model, _plan("memplan 1\nexample randn(2, 4)\n"))
    (error,) = caught.value.errors
    assert error.code == "MP241" and error.span.line == 3 and "`cell`" in error.message
    assert "`v`" in error.message and "^^^" in caught.value.render()
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert model.cell.v is potential and all(m.training for m in model.modules())
    assert torch.equal(torch.get_rng_state(), rng)


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 4)
        self.gate = Gate()

    def forward(self, x):
        return self.gate(self.head(x))


class Gate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: no single graph
            return x * 2
        return x


def test_a_graph_break_names_the_module_and_the_cause():
    model = Branchy()
    with pytest.raises(PlanError) as caught:
        memoplan.apply(model, _plan("memplan 1\nexample randn(2, 4)\n"))
    (error,) = caught.value.errors
    assert error.code == "MP240" and "`gate`" in error.message and error.span.line == 3
    assert "forward" not in model.__dict__


def test_a_resolved_plan_has_no_example_to_capture_with():
    model = _small_mlp()
    resolved = memoplan.resolve(memoplan.parse(_plan(SMALL_MLP)), model)
    with pytest.raises(PlanError) as caught:
        memoplan.apply(model, resolved)
    assert caught.value.codes == ["MP243"]


class Odd(nn.Module):
    """Submodules and a parameter named like keywords, builtins and template names."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict(
            {name: nn.Linear(8, 8) for name in ("def", "arena", "naïve-ü", "a b", "__import__", "ARENA", "torch")}
        )

    def forward(self, x):
        for block in self.blocks.values():
            x = torch.relu(block(x)) + x
        return x


def test_generated_code_is_deterministic_readable_and_safe_against_any_name(tmp_path):
    plan = _plan("memplan 1\nexample randn(4, 8)\n", "dp", "longest_path")
    first = memoplan.write_module(Odd(), plan, tmp_path / "a.py").read_text()
    second = memoplan.write_module(Odd(), plan, tmp_path / "b.py").read_text()
    assert first == second
    ast.parse(first)
    names = {node.id for node in ast.walk(ast.parse(first)) if isinstance(node, ast.Name)}
    assert all(name.isascii() and name.isidentifier() for name in names)  # through the allocator
    assert "def arena_graph(arena, inputs, attributes):" in first  # no model name took a reserved one
    model = Odd().eval()
    reference = copy.deepcopy(model)
    memoplan.apply(model, plan)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))


def test_a_parameter_changed_in_dtype_or_shape_runs_the_models_own_forward():
    model = _small_mlp().eval()
    memoplan.apply(model, _plan(SMALL_MLP))
    state = arena_state(model)
    with torch.no_grad():
        model.layers[0].weight = nn.Parameter(torch.randn(64, 64).t())  # same shape, other strides
        reference = copy.deepcopy(model)
        memoplan.remove(reference)
        x = torch.randn(32, 64)
        assert torch.equal(model(x), reference(x))
    assert state.arena_calls == 0 and state.eager_calls == 1


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, *, scale: int = 1, extra=None):
        y = torch.relu(self.fc(x)) * scale
        return {"y": y, "extra": extra if extra is None else extra + y}


def test_keyword_arguments_constants_and_structured_outputs():
    model = Scaled().eval()
    reference = copy.deepcopy(model)
    memoplan.apply(model, 'memplan 1\nexample "tests.memonger.test_memonger_arena:scaled_example"\nmemonger { }\n')
    state = arena_state(model)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for kwargs in ({"scale": 3}, {"scale": 2}, {}, {"scale": 3, "extra": torch.ones(2, 4)}):
            got, expected = model(x, **kwargs), reference(x, **kwargs)
            assert got.keys() == expected.keys() and torch.equal(got["y"], expected["y"])
            assert (got["extra"] is None) == (expected["extra"] is None)
    assert state.arena_calls == 1 and state.eager_calls == 3  # only the captured constant and structure


def scaled_example():
    from memoplan.specs import Example

    return Example((torch.randn(2, 4),), {"scale": 3})


def test_a_submodule_replaced_after_apply_is_used():
    model = _small_mlp().eval()
    memoplan.apply(model, _plan(SMALL_MLP))
    model.layers[2] = nn.Linear(64, 64).eval()  # the same shapes: the arena runs, with the new weights
    reference = copy.deepcopy(model)
    memoplan.remove(reference)
    x = torch.randn(32, 64)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
    assert arena_state(model).arena_calls == 1


@pytest.mark.parametrize(
    "build,head,inputs",
    [
        (cnn.build, CNN, lambda: ((torch.randn(8, 3, 32, 32),), {})),
        (
            transformer.build,
            MASKED,
            lambda: ((transformer.example_with_mask().args[0],), dict(transformer.example_with_mask().kwargs)),
        ),
    ],
    ids=["cnn", "transformer-mask"],
)
def test_with_the_default_peak_slack_a_call_peaks_within_two_percent_of_eager(build, head, inputs):
    from memoplan.measure import LiveStorageMeter

    torch.manual_seed(0)
    model = build().eval()
    reference = copy.deepcopy(model)
    memoplan.apply(model, head + "memonger { }\n")
    args, kwargs = inputs()
    with torch.no_grad():
        model(*args, **kwargs)  # allocates the arena
        with LiveStorageMeter() as arena_meter:
            model(*args, **kwargs)
        with LiveStorageMeter() as eager_meter:
            reference(*args, **kwargs)
        steady, _ = count_allocations(lambda: model(*args, **kwargs))
        eager, _ = count_allocations(lambda: reference(*args, **kwargs))
        # the allocator's count, which also sees what kernels allocate and free inside (workspaces)
        arena_inside, _ = allocated_inside(lambda: model(*args, **kwargs), torch.device("cpu"))
        eager_inside, _ = allocated_inside(lambda: reference(*args, **kwargs), torch.device("cpu"))
    resident = arena_state(model).arena.untyped_storage().nbytes()
    assert resident > 0  # buffers are in the arena
    assert arena_meter.peak_bytes + resident <= 1.02 * eager_meter.peak_bytes
    assert arena_inside + resident <= 1.02 * eager_inside
    assert steady.count < eager.count
