"""Runtime stage tests: a planned model trains bit-identically to an unplanned deep copy.

Each test builds a tiny model, deep-copies it, installs hand-written targets on
the copy (the same calls generated code makes) and compares outputs, gradients,
buffers and RNG progression with ``torch.equal``.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from _imports import imported_modules  # tests/_imports.py
from torch import nn
from torch.utils.checkpoint import checkpoint

from memoplan import runtime as rt
from memoplan.runtime.install import qualified_type_name

# --- what generated code looks like -------------------------------------------------


def _policy_checkpoint(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return rt.run_checkpointed(self, type(self).forward, args, kwargs, preserve_rng=True)


def _policy_checkpoint_no_rng(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return rt.run_checkpointed(self, type(self).forward, args, kwargs, preserve_rng=False)


def _targets(
    model: nn.Module, paths: Iterable[str], forward: Callable[..., Any] = _policy_checkpoint
) -> tuple[rt.Target, ...]:
    return tuple(
        rt.Target(
            path=path,
            type_name=qualified_type_name(type(model.get_submodule(path))),
            forward=forward,
        )
        for path in paths
    )


def _planned(model: nn.Module, paths: Iterable[str], **kw: Any) -> nn.Module:
    planned = copy.deepcopy(model)
    rt.install(planned, _targets(planned, paths, **kw), plan_id="test-plan")
    return planned


# --- models ---------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, width: int, momentum: float | None = 0.1) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.bn = nn.BatchNorm1d(width, momentum=momentum)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.nn.functional.gelu(self.bn(self.linear(x))))


class Net(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Linear(4, width)
        self.blocks = nn.Sequential(Block(width), Block(width, momentum=None))
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class Counter(nn.Module):
    """Output depends on a counter buffer that the forward advances in place."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x) * (self.count + 1.0)
        self.count.add_(1.0)
        return out


class ReassigningCounter(Counter):
    """Same, but the forward rebinds the buffer instead of mutating it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x) * (self.count + 1.0)
        self.count = self.count + 1.0
        return out


class CountingScale(nn.Module):
    """A parameter-free counter: scales its input by (calls so far + 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x * (self.count + 1.0)
        self.count.add_(1.0)
        return out


class KwargsBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(
        self,
        x: torch.Tensor,
        scale: float,
        *,
        extra: dict[str, torch.Tensor],
        use_reentrant: str = "unset",
        context_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        y = self.lin(x) * scale + extra["shift"]
        if use_reentrant == "double":
            y = y * 2
        if context_fn is not None:
            y = context_fn(y)
        return {"y": torch.tanh(y), "pair": (y.sum(), use_reentrant)}


class KwargsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = KwargsBlock()

    def forward(self, x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        out = self.inner(x, 0.5, extra={"shift": shift}, use_reentrant="double", context_fn=torch.sin)
        assert out["pair"][1] == "double"
        return out["y"] + out["pair"][0]


# --- comparison helpers -----------------------------------------------------------------


def _seeded_step(model: nn.Module, *args: Any, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    out = model(*args)
    out.float().pow(2).sum().backward()
    return out


def _assert_same_state(a: nn.Module, b: nn.Module) -> None:
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert (pa.grad is None) == (pb.grad is None), name
        if pa.grad is not None:
            assert torch.equal(pa.grad, pb.grad), f"grad of {name}"
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def _assert_equivalent_steps(plain: nn.Module, planned: nn.Module, *args: Any, steps: int = 2) -> None:
    for step in range(steps):
        out_plain = _seeded_step(plain, *args, seed=step)
        rng_plain = torch.get_rng_state()
        out_planned = _seeded_step(planned, *args, seed=step)
        rng_planned = torch.get_rng_state()
        assert torch.equal(out_plain, out_planned)
        assert torch.equal(rng_plain, rng_planned), "global RNG advanced differently"
        _assert_same_state(plain, planned)


# --- equivalence -------------------------------------------------------------------------


def test_outputs_grads_buffers_and_rng_match() -> None:
    torch.manual_seed(0)
    plain = Net()
    planned = _planned(plain, ["blocks.0", "blocks.1", "head"])
    _assert_equivalent_steps(plain, planned, torch.randn(16, 4), steps=3)
    assert int(planned.blocks[0].bn.num_batches_tracked) == 3


def test_batchnorm_updated_once_and_real_buffers_kept() -> None:
    torch.manual_seed(0)
    plain = Block(6)
    planned = _planned(nn.Sequential(plain), ["0"])[0]
    running_mean = planned.bn.running_mean
    x = torch.randn(10, 6)
    _assert_equivalent_steps(plain, planned, x)
    # The recompute wrote into throw-away copies; the module holds its own tensors still.
    assert planned.bn.running_mean is running_mean
    assert int(planned.bn.num_batches_tracked) == 2


def test_first_call_in_eval_mode_then_training() -> None:
    """Which buffers a forward changes is learned per training mode: eval first is fine."""
    torch.manual_seed(0)
    plain = Block(6)
    planned = _planned(nn.Sequential(plain), ["0"])[0]
    x = torch.randn(10, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for model in (plain, planned):
            model.eval()
        _assert_equivalent_steps(plain, planned, x, steps=1)
        for model in (plain, planned):
            model.train()
        _assert_equivalent_steps(plain, planned, x, steps=2)
    assert int(planned.bn.num_batches_tracked) == 2


def test_module_called_twice_in_one_step() -> None:
    """Each call is its own region; each recompute sees the buffers its own call saw."""

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block(6)
            self.counter = CountingScale()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.counter(self.block(self.counter(self.block(x))))

    torch.manual_seed(0)
    plain = Twice()
    planned = _planned(plain, ["block", "counter"])
    _assert_equivalent_steps(plain, planned, torch.randn(10, 6), steps=2)
    assert int(planned.block.bn.num_batches_tracked) == 4


def test_naive_checkpoint_updates_batchnorm_twice() -> None:
    """pytorch/pytorch#96136: the comparison above can fail; plain checkpoint fails it."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(6)
    naive = copy.deepcopy(bn)
    x = torch.randn(10, 6, requires_grad=True)
    bn(x).pow(2).sum().backward()
    checkpoint(naive, x, use_reentrant=False).pow(2).sum().backward()
    assert int(bn.num_batches_tracked) == 1
    assert int(naive.num_batches_tracked) == 2
    assert not torch.equal(bn.running_mean, naive.running_mean)


def test_retain_graph_recomputes_twice_still_commits_once() -> None:
    torch.manual_seed(0)
    plain = Block(6)
    planned = _planned(nn.Sequential(plain), ["0"])[0]
    x = torch.randn(10, 6)
    for model in (plain, planned):
        torch.manual_seed(3)
        loss = model(x).pow(2).sum()
        loss.backward(retain_graph=True)
        loss.backward()
    _assert_same_state(plain, planned)
    assert int(planned.bn.num_batches_tracked) == 1


def test_dropout_masks_and_rng_match() -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8))
    planned = _planned(plain, ["1"])
    x = torch.randn(32, 8, requires_grad=True)
    grads = []
    for model in (plain, planned):
        x.grad = None
        _seeded_step(model, x, seed=7)
        grads.append(x.grad.clone())
    # The input gradient carries the dropout mask of the forward: identical masks.
    assert torch.equal(grads[0], grads[1])
    _assert_equivalent_steps(plain, planned, x)


def test_without_preserve_rng_the_recompute_draws_another_mask() -> None:
    """Shows the RNG comparison can fail: with preserve_rng=False it does."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8))
    planned = _planned(plain, ["1"], forward=_policy_checkpoint_no_rng)
    x = torch.randn(32, 8)
    _seeded_step(plain, x, seed=1)
    rng_plain = torch.get_rng_state()
    _seeded_step(planned, x, seed=1)
    assert not torch.equal(torch.get_rng_state(), rng_plain)
    assert not torch.equal(plain[0].weight.grad, planned[0].weight.grad)


@pytest.mark.parametrize("cls", [Counter, ReassigningCounter])
def test_counter_buffer_recomputes_identically(cls: type[Counter]) -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(cls(), nn.Linear(4, 2))
    planned = _planned(plain, ["0"])
    _assert_equivalent_steps(plain, planned, torch.randn(5, 4), steps=3)
    assert float(planned[0].count) == 3.0


def test_naive_checkpoint_recomputes_counter_with_advanced_value() -> None:
    torch.manual_seed(0)
    plain = Counter()
    naive = copy.deepcopy(plain)
    x = torch.randn(5, 4)
    plain(x).pow(2).sum().backward()
    checkpoint(naive, x, use_reentrant=False).pow(2).sum().backward()
    # The recompute saw count == 1 where the forward saw 0 (it stopped early, before
    # advancing the counter again), so the weight gradient is wrong.
    assert not torch.equal(plain.lin.weight.grad, naive.lin.weight.grad)


def test_keyword_non_tensor_and_nested_arguments() -> None:
    torch.manual_seed(0)
    plain = KwargsNet()
    planned = _planned(plain, ["inner"])
    shift = torch.randn(4, requires_grad=True)
    x = torch.randn(3, 4)
    grads = []
    for model in (plain, planned):
        shift.grad = None
        _seeded_step(model, x, shift)
        grads.append(shift.grad.clone())
    assert torch.equal(grads[0], grads[1])
    _assert_same_state(plain, planned)


def test_frozen_inputs_and_frozen_parameters() -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(Block(6), nn.Linear(6, 2))
    planned = _planned(plain, ["0"])
    # Input needs no grad, parameters do (reentrant checkpoint would give None grads).
    _assert_equivalent_steps(plain, planned, torch.randn(8, 6))
    # Parameters frozen, input needs grad.
    for model in (plain, planned):
        model.requires_grad_(False)
    x = torch.randn(8, 6, requires_grad=True)
    grads = []
    for model in (plain, planned):
        x.grad = None
        _seeded_step(model, x)
        grads.append(x.grad.clone())
    assert torch.equal(grads[0], grads[1])
    _assert_same_state(plain, planned)


def test_no_grad_evaluation() -> None:
    torch.manual_seed(0)
    plain = Net()
    planned = _planned(plain, ["blocks.0", "blocks.1"])
    batch = torch.randn(16, 4)
    _seeded_step(plain, batch)
    _seeded_step(planned, batch)
    x = torch.randn(5, 4)
    for train in (False, True):
        plain.train(train)
        planned.train(train)
        with torch.no_grad():
            torch.manual_seed(1)
            a = plain(x)
            torch.manual_seed(1)
            b = planned(x)
        assert torch.equal(a, b)
        _assert_same_state(plain, planned)


# --- structure --------------------------------------------------------------------------


def test_structure_identity_and_types_unchanged() -> None:
    torch.manual_seed(0)
    model = Net()
    keys = list(model.state_dict())
    params = [id(p) for p in model.parameters()]
    types = {name: type(m) for name, m in model.named_modules()}
    rt.install(model, _targets(model, ["blocks.0", "head"]), plan_id="p1")
    assert list(model.state_dict()) == keys
    assert [id(p) for p in model.parameters()] == params
    assert {name: type(m) for name, m in model.named_modules()} == types
    assert isinstance(model.blocks[0], Block) and type(model.head) is nn.Linear
    assert rt.installed_plan(model) == "p1"
    # A checkpoint from the unplanned model loads into the planned one and back.
    other = Net()
    model.load_state_dict(other.state_dict())
    other.load_state_dict(model.state_dict())


def test_hooks_still_run_around_the_planned_forward() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    calls: list[str] = []
    model[0].register_forward_pre_hook(lambda m, a: calls.append("pre"))
    model[0].register_forward_hook(lambda m, a, o: calls.append("post"))
    rt.install(model, _targets(model, ["0"]), plan_id="p")
    model(torch.randn(2, 4)).sum().backward()
    assert calls == ["pre", "post"]  # once each: hooks are outside the recomputed region


def test_optimizer_built_before_install_keeps_training() -> None:
    torch.manual_seed(0)
    plain = Net()
    planned = copy.deepcopy(plain)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    opt_planned = torch.optim.SGD(planned.parameters(), lr=0.1, momentum=0.9)
    rt.install(planned, _targets(planned, ["blocks.0", "blocks.1"]), plan_id="p")
    x = torch.randn(16, 4)
    for step in range(2):
        for model, opt in ((plain, opt_plain), (planned, opt_planned)):
            _seeded_step(model, x, seed=step)
            opt.step()
    _assert_same_state(plain, planned)


def test_uninstall_restores_previous_state() -> None:
    torch.manual_seed(0)
    model = Net()
    dicts = {name: dict(vars(m)) for name, m in model.named_modules()}
    rt.install(model, _targets(model, ["blocks.0", "head"]), plan_id="p")
    assert "forward" in vars(model.head)
    rt.uninstall(model)
    assert rt.installed_plan(model) is None
    assert {name: dict(vars(m)) for name, m in model.named_modules()} == dicts
    rt.uninstall(model)  # idempotent
    rt.install(model, _targets(model, ["head"]), plan_id="q")  # installable again
    assert rt.installed_plan(model) == "q"


def test_deepcopy_of_planned_model_is_planned_and_independent() -> None:
    torch.manual_seed(0)
    plain = Net()
    planned = _planned(plain, ["blocks.0", "blocks.1"])
    clone = copy.deepcopy(planned)
    assert rt.installed_plan(clone) == "test-plan"
    assert clone.blocks[0].forward.__self__ is clone.blocks[0]
    before = [p.detach().clone() for p in planned.parameters()]
    bn_before = planned.blocks[0].bn.running_mean.clone()
    _assert_equivalent_steps(plain, clone, torch.randn(16, 4))
    assert all(torch.equal(a, b) for a, b in zip(before, planned.parameters(), strict=True))
    assert torch.equal(planned.blocks[0].bn.running_mean, bn_before)
    assert all(p.grad is None for p in planned.parameters())
    rt.uninstall(clone)
    assert rt.installed_plan(planned) == "test-plan"
    assert "forward" in vars(planned.blocks[0])


# --- install refuses, changing nothing ----------------------------------------------------


def _snapshot(model: nn.Module) -> dict[str, dict[str, Any]]:
    return {name: dict(vars(m)) for name, m in model.named_modules()}


def test_install_refuses_missing_path() -> None:
    model = Net()
    before = _snapshot(model)
    targets = _targets(model, ["head"]) + (
        rt.Target(path="blocks.5", type_name="x.Block", forward=_policy_checkpoint),
        rt.Target(path="head.9", type_name="x.Head", forward=_policy_checkpoint),
    )
    with pytest.raises(rt.PlanMismatchError) as info:
        rt.install(model, targets, plan_id="p")
    assert info.value.codes == ["MP401", "MP401"]
    assert "blocks.5" in info.value.diagnostics[0].message
    assert "blocks.0" in (info.value.diagnostics[0].help or "")
    assert _snapshot(model) == before


def test_install_refuses_changed_class() -> None:
    model = Net()
    before = _snapshot(model)
    targets = _targets(model, ["blocks.0"]) + (
        rt.Target(path="head", type_name="torch.nn.modules.conv.Conv2d", forward=_policy_checkpoint),
    )
    with pytest.raises(rt.PlanMismatchError) as info:
        rt.install(model, targets, plan_id="p")
    assert info.value.codes == ["MP402"]
    message = info.value.diagnostics[0].message
    assert "torch.nn.modules.conv.Conv2d" in message and "torch.nn.modules.linear.Linear" in message
    assert _snapshot(model) == before


def test_install_refuses_double_install_and_foreign_patches() -> None:
    model = Net()
    rt.install(model, _targets(model, ["head"]), plan_id="p")
    before = _snapshot(model)
    with pytest.raises(rt.PlanMismatchError) as info:
        rt.install(model, _targets(model, ["blocks.0"]), plan_id="q")
    assert info.value.codes == ["MP403"]
    assert _snapshot(model) == before

    other = Net()
    other.stem.forward = lambda x: x  # someone else's patch
    before = _snapshot(other)
    with pytest.raises(rt.PlanMismatchError) as info:
        rt.install(other, _targets(other, ["stem", "head", "head"]), plan_id="p")
    assert info.value.codes == ["MP403", "MP403"]
    assert _snapshot(other) == before
    assert rt.installed_plan(other) is None


# --- segments ---------------------------------------------------------------------------------


def _segments(groups: tuple[tuple[str, ...], ...]) -> Callable[..., Any]:
    def _policy_segments(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return rt.run_segmented(self, groups, args, kwargs, preserve_rng=True)

    return _policy_segments


def test_segmented_sequential_equals_plain() -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(
        nn.Sequential(
            nn.Linear(4, 8),
            nn.BatchNorm1d(8),
            nn.GELU(),
            nn.Dropout(0.2),
            CountingScale(),
            nn.Linear(8, 2),
        )
    )
    groups = (("0", "1"), ("2", "3", "4"), ("5",))
    planned = _planned(plain, ["0"], forward=_segments(groups))
    _assert_equivalent_steps(plain, planned, torch.randn(12, 4), steps=3)
    outputs = []
    for model in (plain, planned):
        torch.manual_seed(5)
        with torch.no_grad():
            outputs.append(model(torch.ones(3, 4)))
    assert torch.equal(outputs[0], outputs[1])
    _assert_same_state(plain, planned)


def test_segmented_rejects_groups_that_do_not_cover_children() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)))
    rt.install(model, _targets(model, ["0"], forward=_segments((("0",), ("2",)))), plan_id="p")
    with pytest.raises(RuntimeError, match="do not cover"):
        model(torch.randn(1, 2))


# --- layering -----------------------------------------------------------------------------


def test_runtime_imports_only_torch_stdlib_and_leaves() -> None:
    # memoplan.enums: the values that cross stages and the codec specs (a leaf without torch);
    # memoplan.version: the version string MP424 names (a leaf that imports nothing)
    allowed_memoplan = {
        "memoplan.diagnostics",
        "memoplan.enums",
        "memoplan.runtime",
        "memoplan.version",
    }
    for path in Path(rt.__file__).parent.glob("*.py"):
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top == "memoplan":
                assert any(name == m or name.startswith(m + ".") for m in allowed_memoplan), (
                    f"{path.name} imports {name}"
                )
            else:
                assert top == "torch" or top in sys.stdlib_module_names or top == "__future__", (
                    f"{path.name} imports {name}"
                )
