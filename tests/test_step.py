"""The training step a plan is for (memoplan.step, the `step` block, --loss/--autocast/...).

What is run: the loss (auto takes the model's own, sum, a callable), autocast, the optimizer
state in the dtype torch.optim keeps, fp32 master weights, FSDP2 mixed precision; that
`memoplan plan` writes the step into the plan and `verify` runs it again; that bad input is a
located diagnostic and writes nothing; and that the estimate of the user's step is its
measured peak (a narrow bf16 Llama with labels, tests/step_models.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
from _paths import TESTS

import memoplan
from memoplan.cli import main
from memoplan.diagnostics import PlanError
from memoplan.measure import measure_step, training_step
from memoplan.planner.profiling.estimate import fake_step, sharded_estimate
from memoplan.step import check_precision, make_step, optimizer_state_bytes, running
from memoplan.syntax import ast, parse
from memoplan.syntax.blocks import StepConfig

sys.path.insert(0, str(TESTS))
import step_models  # noqa: E402

CPU = torch.device("cpu")

NET = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)) for _ in range(4)])
        self.head = nn.Linear(32, 50)

    def forward(self, x, labels=None):
        logits = self.head(self.layers(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.float(), labels)
        return out


def build():
    torch.manual_seed(0)
    return Net()


def example():
    from memoplan.specs import Example

    g = torch.Generator().manual_seed(0)
    return Example((torch.randn(256, 32, generator=g),), {"labels": torch.randint(0, 50, (256,), generator=g)})


def mean(output):
    return output["logits"].float().mean()


def raises(output):
    raise RuntimeError("no such label")
"""


@pytest.fixture
def net(tmp_path, monkeypatch):
    """A folder holding net.py (a model whose output carries its loss when given labels), the cwd."""
    (tmp_path / "net.py").write_text(textwrap.dedent(NET))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def _net():
    namespace: dict = {}
    exec(compile(textwrap.dedent(NET), "net.py", "exec"), namespace)
    return namespace["build"](), namespace["example"](), namespace


# ---------------------------------------------------------------- the loss


def test_auto_takes_the_models_own_loss_and_the_sum_where_it_has_none():
    model, example, _ = _net()
    with running(make_step(StepConfig())):
        _, loss = training_step(model, example.args, dict(example.kwargs))
    own = model(*example.args, **example.kwargs)["loss"]
    assert torch.equal(loss, own)
    with running(make_step(StepConfig())):
        _, unlabeled = training_step(model, example.args, {})
    assert torch.equal(unlabeled, model(*example.args)["logits"].float().sum())
    with running(make_step(StepConfig(loss="sum"))):
        _, summed = training_step(model, example.args, dict(example.kwargs))
    out = model(*example.args, **example.kwargs)
    assert torch.equal(summed, out["logits"].float().sum() + out["loss"].float().sum())


def test_the_models_own_loss_where_there_is_none_is_mp252():
    model, example, _ = _net()
    with running(make_step(StepConfig(loss="model"))), pytest.raises(PlanError) as caught:
        training_step(model, example.args, {})
    assert [d.code for d in caught.value.diagnostics] == ["MP252"]


@pytest.mark.slow
def test_a_hugging_face_models_own_loss_is_its_loss_attribute():
    model, example = step_models.build(), step_models.example()
    output, loss = training_step(model, example.args, dict(example.kwargs))  # no step set: auto
    assert loss is output.loss and loss.dtype == torch.float32


# ---------------------------------------------------------------- precision and optimizer state


@pytest.mark.slow
def test_optimizer_state_is_counted_in_the_dtype_torch_optim_keeps():
    model = step_models.build(torch.bfloat16)
    example = step_models.example()
    for name, make, states in (
        ("adamw", lambda ps: torch.optim.AdamW(ps, foreach=False), 2),
        ("momentum", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), 1),
    ):
        optimizer = make(model.parameters())
        training_step(model, example.args, dict(example.kwargs))
        optimizer.step()
        kept = sum(
            t.numel() * t.element_size()
            for state in optimizer.state.values()
            for key, t in state.items()
            if isinstance(t, torch.Tensor) and key != "step"  # Adam's step counters: scalars on the CPU
        )
        assert optimizer_state_bytes(model, name) == kept, name  # bf16 parameters, bf16 state
        params = sum(p.numel() for p in model.parameters())
        assert kept == states * 2 * params
        # fp32 master weights: an fp32 copy of each parameter and fp32 state
        assert optimizer_state_bytes(model, name, master_weights=True) == (states + 1) * 4 * params
        assert optimizer_state_bytes(model, name, 2) == -(-kept // 2)


def test_a_device_without_the_precision_is_mp253():
    model, _, _ = _net()
    plan = parse("memplan 1\nstep { autocast = bf16 }\n", "p.memplan")
    step = make_step(StepConfig(autocast="bf16"))
    span = plan.block(ast.BlockKind.STEP).entries[0].span
    with pytest.raises(PlanError) as caught:
        check_precision(step, model, torch.device("meta"), {"autocast": span})
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.code == "MP253" and diagnostic.span == span and "meta" in diagnostic.message
    check_precision(step, model, CPU)  # the CPU has bf16 autocast


@pytest.mark.slow
def test_every_step_key_changes_the_step():
    from memoplan.planner.profiling.shard import SHARDS
    from memoplan.planner.profiling.shard import optimizer_state_bytes as kept

    model, example, ns = _net()
    params = sum(p.numel() for p in model.parameters())

    def peak(config: StepConfig, on=model) -> int:
        token = SHARDS.set(config.shards)
        try:
            with running(make_step(config)):
                return fake_step(on, example, CPU, peak_only=True).peak_bytes
        finally:
            SHARDS.reset(token)

    def state(config: StepConfig, on=model) -> int:
        with running(make_step(config)):
            return kept(on, config.optimizer, config.shards)

    default = peak(StepConfig())
    bf16 = ns["build"]().to(torch.bfloat16)
    changed = {
        "loss": peak(StepConfig(loss="sum")) > default,  # a float32 copy of the logits
        "autocast": peak(StepConfig(autocast="bf16")) < default,
        "optimizer": state(StepConfig(optimizer="adamw")) == 2 * 4 * params,
        "master_weights": state(StepConfig(optimizer="adamw"), bf16) == 2 * 2 * params
        and state(StepConfig(optimizer="adamw", master_weights="fp32"), bf16) == 3 * 4 * params,
        "shards": peak(StepConfig(shards=2)) != default,  # gradients halved, gathered blocks added
        "mixed_precision": peak(StepConfig(shards=2, mixed_precision="bf16")) < peak(StepConfig(shards=2)),
    }
    assert set(changed) == set(vars(StepConfig())) and all(changed.values()), changed


# ---------------------------------------------------------------- the estimate of the user's step


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "autocast"), [(torch.bfloat16, "none"), (torch.float32, "bf16"), (torch.bfloat16, "bf16")]
)
def test_the_estimate_is_the_measured_peak_of_a_bf16_llama_with_its_own_loss(dtype, autocast):
    model, example = step_models.build(dtype), step_models.example()
    step = make_step(StepConfig(loss="model", autocast=autocast))
    with running(step):
        measured = measure_step(model, example.args, example.kwargs).peak_bytes
        estimated = fake_step(model, example, CPU).peak_bytes
    print(f"{dtype} autocast {autocast}: estimated {estimated} B, measured {measured} B")
    assert estimated == measured  # the same kernels here: to the byte
    with running(make_step(StepConfig(loss="sum", autocast=autocast))):
        summed = measure_step(model, example.args, example.kwargs).peak_bytes
    assert summed > measured  # the sum keeps a float32 copy of the logits the model's own loss does not
    with running(step):  # the model built without its weights: the same estimate
        assert fake_step(step_models.fake(dtype), example, CPU).peak_bytes == measured


# ---------------------------------------------------------------- the command line


@pytest.mark.slow
def test_plan_writes_the_step_and_verify_runs_it_again(net, capsys):
    (net / "out").mkdir()
    assert (
        main(
            [
                "plan",
                "--model",
                "net.py:build",
                "--example",
                "net.py:example",
                "--budget",
                "70%",
                "--loss",
                "net.py:mean",
                "--optimizer",
                "adamw",
                "-o",
                "out/p.memplan",
            ]
        )
        == 0
    )
    text = (net / "out" / "p.memplan").read_text()
    assert 'step {\n    loss      = "../net.py:mean"\n    optimizer = adamw\n}' in text  # from the plan's folder
    assert "# step: loss ../net.py:mean, optimizer adamw" in text
    capsys.readouterr()
    assert main(["verify", "out/p.memplan"]) == 0
    assert "step: loss net.py:mean, optimizer adamw" in capsys.readouterr().out  # found from here
    # the same loss, given again: no contradiction; another: MP254 at the key, nothing run
    assert main(["verify", "out/p.memplan", "--optimizer", "adamw"]) == 0
    capsys.readouterr()
    assert main(["verify", "out/p.memplan", "--loss", "sum"]) == 1
    err = capsys.readouterr().err
    assert "p.memplan:" in err and "error[MP254]" in err and '`loss = "../net.py:mean"`' in err and "^^^" in err


def test_a_loss_that_raises_is_located_and_nothing_is_written(net, capsys):
    plan = net / "p.memplan"
    plan.write_text(
        'memplan 1\nmodel "net.py:build"\nexample "net.py:example"\nstep {\n    loss = "net.py:raises"\n}\n'
    )
    assert main(["plan", str(plan), "--budget", "70%", "-o", "new.memplan"]) == 1
    err = capsys.readouterr().err
    assert "p.memplan:5:5: error[MP251]" in err and "raised RuntimeError: no such label" in err
    assert not (net / "new.memplan").exists()
    assert (
        main(["profile", "--model", "net.py:build", "--example", "randn(8, 32)", "--loss", "model", "-o", "x.json"])
        == 1
    )
    assert "error[MP252]" in capsys.readouterr().err and not (net / "x.json").exists()


def test_the_plans_step_that_cannot_run_is_located_and_nothing_is_written(net, capsys, monkeypatch):
    """A `loss` the output lacks (MP252), autocast the device cannot do (MP253) and an option that
    contradicts the plan's `step` block (MP254): each at its key of the block, no file written."""
    plan = net / "p.memplan"
    head = 'memplan 1\nmodel "net.py:build"\nexample randn(8, 32)\n'  # no labels: no loss of its own
    plan.write_text(head + "step {\n    loss = model\n}\n")
    assert main(["plan", str(plan), "--budget", "70%", "-o", "new.memplan"]) == 1
    err = capsys.readouterr().err
    assert "p.memplan:5:5: error[MP252]" in err and "carries no `loss`" in err
    assert main(["plan", str(plan), "--budget", "70%", "--loss", "sum", "-o", "new.memplan"]) == 1
    err = capsys.readouterr().err
    assert "p.memplan:5:5: error[MP254]" in err and "`--loss sum` contradicts" in err
    plan.write_text(head + "step {\n    autocast = bf16\n}\n")
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)  # a device without it
    for command in (["plan", str(plan), "--budget", "70%", "-o", "new.memplan"], ["verify", str(plan)]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert "p.memplan:5:5: error[MP253]" in err and "torch has no autocast on cpu" in err
    assert not (net / "new.memplan").exists()


def test_mixed_precision_without_shards_is_refused(net, capsys):
    args = ["profile", "--model", "net.py:build", "--example", "net.py:example", "-o", "x.json"]
    assert main([*args, "--mixed-precision", "bf16"]) == 1
    assert "error[MP250]" in capsys.readouterr().err and not (net / "x.json").exists()


@pytest.mark.slow
def test_the_api_takes_the_same_step(net):
    model, example, _ = _net()
    config = StepConfig(loss="sum", optimizer="adamw")
    result = memoplan.plan(model, example, "70%", step=config)
    block = result.plan.block(ast.BlockKind.STEP)
    assert block is not None and {e.key for e in block.entries} == {"loss", "optimizer"}
    assert memoplan.verify(model, memoplan.resolve(result.plan, model), example, step=config).equivalent
    # a plan file's own step block, its loss found from the plan's folder
    (net / "sub").mkdir()
    path = net / "sub" / "p.memplan"
    path.write_text('memplan 1\nstep { loss = "../net.py:raises" }\n')
    with pytest.raises(PlanError) as caught:
        memoplan.verify(model, path, example)
    assert [d.code for d in caught.value.diagnostics] == ["MP251"]


# ---------------------------------------------------------------- FSDP2 mixed precision on two ranks


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="torch.distributed with gloo")
def test_the_fsdp2_mixed_precision_estimate_holds_per_rank_on_two_ranks(tmp_path, monkeypatch):
    # A size whose activations outweigh the two decoder layers the estimate counts as gathered
    # at the peak (tests/step_models.py); at the size (STEP_MODELS_SIZE=full) it holds too.
    monkeypatch.setenv("STEP_MODELS_SIZE", os.environ.get("STEP_MODELS_SIZE", "fsdp"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(TESTS / "_step_worker.py"), str(rank), "2", str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = [proc.communicate(timeout=300)[0] for proc in procs]
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{log[-3000:]}"
    model = step_models.build(torch.float32)  # FSDP2 keeps the fp32 parameters, sharded
    for rank in range(2):
        measured = torch.load(tmp_path / f"rank{rank}.pt")["peak"]
        with running(make_step(StepConfig(loss="model", shards=2, mixed_precision="bf16"))):
            estimated = sharded_estimate(model, step_models.example(rank), 2, "none", progress=False, repeats=1)
        print(f"rank {rank}: FSDP2 bf16/fp32 step estimated {estimated.peak_bytes} B, measured {measured} B")
        assert abs(estimated.peak_bytes - measured) <= 0.05 * measured, (estimated.peak_bytes, measured)


def test_a_sharded_step_from_the_plans_block_is_not_measured(net, capsys):
    plan = net / "p.memplan"
    plan.write_text('memplan 1\nmodel "net.py:build"\nexample "net.py:example"\nstep { shards = 2 }\n')
    assert main(["plan", str(plan), "--budget", "70%", "--method", "measured", "-o", "new.memplan"]) == 1
    assert "error[MP603]" in capsys.readouterr().err and not (net / "new.memplan").exists()


@pytest.mark.slow
def test_report_runs_the_plans_step(net, capsys):
    pytest.importorskip("matplotlib")
    plan = net / "p.memplan"
    plan.write_text('memplan 1\nmodel "net.py:build"\nexample "net.py:example"\nstep { loss = "net.py:raises" }\n')
    assert main(["report", str(plan), "-o", "r.html", "--no-sweep"]) == 1
    err = capsys.readouterr().err
    assert "p.memplan:4:8: error[MP251]" in err and not (net / "r.html").exists()
    plan.write_text('memplan 1\nmodel "net.py:build"\nexample "net.py:example"\nstep { loss = "net.py:mean" }\n')
    assert main(["report", str(plan), "-o", "r.html", "--no-sweep"]) == 0
    assert (net / "r.html").exists()


def test_check_says_where_the_step_block_acts(tmp_path, capsys):
    plan = tmp_path / "p.memplan"
    plan.write_text("memplan 1\nstep { loss = sum; optimizer = adamw }\n")
    assert main(["check", str(plan)]) == 0
    err = capsys.readouterr().err
    assert "p.memplan:2:1: note[MP255]" in err and "`memoplan plan`, `verify` and `report`" in err
