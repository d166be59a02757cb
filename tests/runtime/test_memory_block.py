"""The `memory` block: gradients in one flat buffer (`atomic_clean_policy = 0`), bit for bit
against PyTorch's per-parameter gradients, and the CUDA allocator policies' decisions."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from _paths import TESTS
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import memoplan
from memoplan import cli
from memoplan.diagnostics import PlanError, Severity
from memoplan.examples.cnn import build
from memoplan.runtime.memory import AllocatorState, MemorySettings, allocator_plan
from memoplan.syntax import parse

FLAT = "memplan 1\nmodule features.* : ConvBlock { checkpoint }\nmemory { atomic_clean_policy = 0 }\n"


class Net(nn.Module):
    """BatchNorm, Dropout, a frozen layer and a layer that gets no gradient on odd steps."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.GELU(), nn.Dropout(0.2))
        self.frozen = nn.Linear(12, 12)
        self.frozen.requires_grad_(False)
        self.body = nn.Sequential(nn.Linear(12, 12), nn.Tanh())
        self.sometimes = nn.Linear(12, 12)
        self.head = nn.Linear(12, 3)

    def forward(self, x, step: int = 0):
        h = self.body(self.frozen(self.stem(x)))
        if step % 2 == 0:
            h = self.sometimes(h)
        return self.head(h)


NET_PLAN = "memplan 1\nmodule body { checkpoint }\nmemory { atomic_clean_policy = 0 }\n"

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam_foreach": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True),
    "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, fused=True),
    "adamw_loop": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False),
}


def _train(model: nn.Module, make_opt, *, set_to_none: bool, zero_by: str, accumulate: int) -> list[dict]:
    opt = make_opt(model.parameters())
    states = []
    for step in range(4):
        for micro in range(accumulate):  # gradient accumulation: backward onto existing gradients
            torch.manual_seed(100 * step + micro)
            x = torch.randn(5, 6)
            model(x, step).square().mean().backward()
        opt.step()
        states.append(
            {
                "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
                "buffers": {n: b.clone() for n, b in model.named_buffers()},
                "rng": torch.get_rng_state(),
            }
        )
        (opt if zero_by == "optimizer" else model).zero_grad(set_to_none=set_to_none)
    return states


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if a is None or b is None:
        return a is b
    return a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("zero_by", ["model", "optimizer"])
def test_training_with_a_flat_buffer_is_bit_identical(optimizer, set_to_none, zero_by):
    torch.manual_seed(0)
    base = Net()
    planned = memoplan.apply(copy.deepcopy(base), NET_PLAN)
    kwargs = dict(set_to_none=set_to_none, zero_by=zero_by, accumulate=2)
    expected = _train(copy.deepcopy(base), OPTIMIZERS[optimizer], **kwargs)
    got = _train(planned, OPTIMIZERS[optimizer], **kwargs)
    assert _same(expected, got)
    # The frozen layer has no gradient, the layer skipped on odd steps none after set_to_none.
    assert got[-1]["grads"]["frozen.weight"] is None
    if set_to_none:
        assert got[1]["grads"]["sometimes.weight"] is None


def test_every_trainable_gradient_is_a_view_of_one_buffer_and_zeroing_is_one_fill():
    torch.manual_seed(0)
    model = memoplan.apply(Net(), NET_PLAN)
    model(torch.randn(5, 6)).sum().backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    storages = {p.grad.untyped_storage().data_ptr() for p in trainable}
    assert len(storages) == 1 and len(trainable) == 10
    assert all(p.grad is None for p in model.frozen.parameters())

    with _CountZeroing() as planned_ops:
        model.zero_grad(set_to_none=False)
    reference = Net()
    reference(torch.randn(5, 6)).sum().backward()
    with _CountZeroing() as unplanned_ops:
        reference.zero_grad(set_to_none=False)
    assert planned_ops.calls == 1  # one fill of the buffer
    assert unplanned_ops.calls >= 1 and unplanned_ops.elements == sum(p.numel() for p in trainable)
    assert all(torch.count_nonzero(p.grad) == 0 for p in trainable)
    assert {p.grad.untyped_storage().data_ptr() for p in trainable} == storages  # still the views


class _CountZeroing(TorchDispatchMode):
    def __enter__(self):
        self.calls = self.elements = 0
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.zero_, torch.ops.aten.fill_, torch.ops.aten._foreach_zero_):
            self.calls += 1
            first = args[0]
            self.elements += sum(t.numel() for t in first) if isinstance(first, (list, tuple)) else first.numel()
        return func(*args, **(kwargs or {}))


def test_remove_gives_every_parameter_its_own_gradient_back():
    torch.manual_seed(0)
    base = Net()
    model = memoplan.apply(copy.deepcopy(base), NET_PLAN)
    x = torch.randn(5, 6)
    for m in (model, base):
        torch.manual_seed(1)
        m(x).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    memoplan.remove(model)
    assert "zero_grad" not in model.__dict__ and not model._forward_pre_hooks
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters() if p.requires_grad)
    storages = [p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None]
    assert len(set(storages)) == len(storages) == len(grads)
    assert _same(grads, {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    # and it trains as the unplanned model does
    kwargs = dict(set_to_none=True, zero_by="model", accumulate=1)
    assert _same(grads, {n: p.grad for n, p in base.named_parameters() if p.grad is not None})
    model.zero_grad()
    base.zero_grad()
    assert _same(_train(base, OPTIMIZERS["sgd"], **kwargs), _train(model, OPTIMIZERS["sgd"], **kwargs))


def test_a_deep_copy_has_its_own_buffer_and_pickling_fails_at_save_time():
    torch.manual_seed(0)
    model = memoplan.apply(Net(), NET_PLAN)
    twin = copy.deepcopy(model)
    for m in (model, twin):
        m(torch.randn(5, 6)).sum().backward()
    mine = {p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None}
    theirs = {p.grad.untyped_storage().data_ptr() for p in twin.parameters() if p.grad is not None}
    assert len(mine) == len(theirs) == 1 and mine != theirs
    with pytest.raises(TypeError, match="atomic_clean_policy = 0.*cannot be pickled.*state_dict"):
        torch.save(model, io.BytesIO())
    memoplan.remove(twin)
    assert "zero_grad" not in twin.__dict__


def test_verify_holds_a_plan_with_a_memory_block_equivalent(tmp_path, capsys):
    plan = tmp_path / "p.memplan"
    plan.write_text(
        FLAT.replace("memplan 1\n", 'memplan 1\nmodel "memoplan.examples.cnn:build"\nexample randn(8, 3, 32, 32)\n')
    )
    assert cli.main(["verify", str(plan)]) == 0
    assert "verdict: EQUIVALENT" in capsys.readouterr().out


def test_the_compiled_module_carries_the_memory_block(tmp_path):
    out = tmp_path / "planned.py"
    memoplan.write_module(build(), parse(FLAT, "p.memplan"), out)
    text = out.read_text()
    assert "MEMORY = _rt.MemorySettings(static_memory_policy=0, atomic_clean_policy=0)" in text
    assert "memory=MEMORY" in text
    memoplan.write_module(build(), parse(FLAT, "p.memplan"), tmp_path / "again.py")
    assert (tmp_path / "again.py").read_text() == text
    plain = parse(FLAT.replace("memory { atomic_clean_policy = 0 }\n", ""), "p.memplan")
    without = memoplan.write_module(build(), plain, tmp_path / "plain.py")
    assert "MEMORY" not in without.read_text()


def test_atomic_clean_policy_1_keeps_per_parameter_gradients():
    model = memoplan.apply(build(), FLAT.replace("atomic_clean_policy = 0", "atomic_clean_policy = 1"))
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    storages = [p.grad.untyped_storage().data_ptr() for p in model.parameters()]
    assert len(set(storages)) == len(storages)


# ---------------------------------------------------------------- static_memory_policy


@pytest.mark.parametrize(
    "policy,state,expandable,reserve",
    [
        (3, AllocatorState(False), False, 0),  # no CUDA: nothing to configure
        (0, AllocatorState(True), False, 0),
        (3, AllocatorState(True), True, 0),
        (2, AllocatorState(True, 4096, 1), False, 1 << 20),  # a reservation may come after allocations
        (4, AllocatorState(True), True, 1 << 20),
    ],
)
def test_the_allocator_decision(policy, state, expandable, reserve):
    decided = allocator_plan(MemorySettings(policy, 1, reserve_bytes=1 << 20), state)
    assert (decided.expandable_segments, decided.reserve_bytes) == (expandable, reserve)


@pytest.mark.parametrize("policy", [3, 4])
def test_expandable_segments_after_the_first_cuda_allocation_is_an_error(policy):
    with pytest.raises(PlanError) as caught:
        allocator_plan(MemorySettings(policy, 1, reserve_bytes=1 << 20), AllocatorState(True, 2 << 20, 1))
    assert caught.value.codes == ["MP423"]
    assert "2097152 B in 1 segment are already reserved" in str(caught.value)
    assert "before `model.to('cuda')`" in str(caught.value)


def test_a_reserving_policy_needs_a_budget_in_bytes_and_cpu_gets_a_note(tmp_path, capsys):
    plan = tmp_path / "p.memplan"
    plan.write_text("memplan 1\nbudget 50%\nmemory { static_memory_policy = 2 }\n")
    assert cli.main(["check", str(plan)]) == 1
    err = capsys.readouterr().err
    assert f"{plan}:3:10: error[MP227]" in err and "budget 4 GiB" in err
    plan.write_text("memplan 1\nbudget 1 GiB\nmemory { static_memory_policy = 4 }\n")
    assert cli.main(["check", str(plan)]) == 0
    err = capsys.readouterr().err
    if not torch.cuda.is_available():
        assert f"{plan}:3:10: note[MP228]" in err and "changes nothing on this machine" in err
    resolved = memoplan.resolve(memoplan.load(plan), build())
    assert resolved.reserve_bytes == 1 << 30
    notes = [d for d in resolved.warnings if d.severity is Severity.NOTE]
    assert [d.code for d in notes] == ([] if torch.cuda.is_available() else ["MP228"])


# ---------------------------------------------------------------- DDP and FSDP2


@pytest.mark.dist
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="gloo is needed")
def test_ddp_trains_bit_identically_and_bucket_views_and_fsdp2_are_refused(tmp_path):
    worker = TESTS / "_memory_worker.py"
    env = dict(os.environ, OMP_NUM_THREADS="1", MEMOPLAN_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(worker.parent.parent), env.get("PYTHONPATH", "")])
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(rank), "2", str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        logs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank}:\n{log}"
    for rank in range(2):
        record = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert record["planned"]["flat"] == [True] * 3 and record["unplanned"]["flat"] == [False] * 3
        assert _same(record["unplanned"]["params"], record["planned"]["params"])
        assert record["bucket_view"] == "MP421"
        assert record["fsdp"] == "MP422"
