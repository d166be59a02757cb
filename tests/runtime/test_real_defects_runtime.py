"""Runtime and resolver defects found on real models (issue 16): each case failed before its fix.

* a failed install is rolled back and reported (``MP406``);
* a planned model pickles (``torch.save``/``torch.load``, also in a fresh process) and deep-copies;
* `state = functional` on a container means the stateful modules inside it;
* a checkpointed module that changes its input in place (``ReLU(inplace=True)``) is refused
  by the resolver (``MP323``) or, when only the run shows it, named at run time (``MP407``);
* a plan that checkpoints a model whose HF gradient checkpointing is on gets ``MP322``;
* `temporal_chunk ... dim d` past the input's dimensions names the rule, module and shape (``MP408``).
"""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import memoplan
from memoplan import runtime as rt
from memoplan.diagnostics import PlanError
from memoplan.runtime.install import qualified_type_name


def plan(text: str) -> str:
    return "memplan 1\n" + textwrap.dedent(text).lstrip("\n")


def step(model: nn.Module, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One seeded forward and backward: the output and every parameter's gradient."""
    torch.manual_seed(1)
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    out.float().square().sum().backward()
    return out.detach(), [p.grad for p in model.parameters()]


def assert_same_step(reference: nn.Module, planned: nn.Module, *inputs: torch.Tensor) -> None:
    out_a, grads_a = step(reference, *inputs)
    out_b, grads_b = step(planned, *inputs)
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


# ---------------------------------------------------------------- a small ResNet (no torchvision)


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: one in-place ReLU module, called twice."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(channels), BasicBlock(channels))
        self.fc = nn.Linear(channels, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer1(self.relu(self.bn1(self.conv1(x))))
        return self.fc(x.mean((2, 3)))


def resnet() -> ResNet:
    torch.manual_seed(0)
    return ResNet()


IMAGES = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(3))


# ---------------------------------------------------------------- 13: a failed install is undone


class NoForward(nn.Linear):
    """A module whose __setattr__ refuses an instance `forward`."""

    def __setattr__(self, name, value):
        if name == "forward":
            raise AttributeError("NoForward keeps its forward")
        super().__setattr__(name, value)


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = NoForward(4, 4)

    def forward(self, x):
        return self.b(self.a(x))


def test_a_failed_install_restores_every_module_and_names_the_one_that_refused():
    model = TwoLayers()
    before = {name: dict(vars(m)) for name, m in model.named_modules()}
    with pytest.raises(PlanError) as caught:
        memoplan.apply(model, plan("module a { checkpoint }\nmodule b { checkpoint }\n"))
    assert caught.value.codes == ["MP406"]
    assert "`b`" in str(caught.value) and "NoForward keeps its forward" in str(caught.value)
    assert {name: dict(vars(m)) for name, m in model.named_modules()} == before
    assert rt.installed_plan(model) is None
    memoplan.apply(model, plan("module a { checkpoint }\n"))  # nothing was left half-installed
    assert rt.installed_plan(model) is not None


# ---------------------------------------------------------------- 9: pickling and deep copies


def test_a_planned_model_pickles_and_loads_planned():
    planned = memoplan.apply(resnet(), plan("module layer1.* { checkpoint }\n"))
    plan_id = rt.installed_plan(planned)
    buffer = io.BytesIO()
    torch.save(planned, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert rt.installed_plan(loaded) == plan_id
    block = loaded.layer1[0]
    assert block.forward.__self__ is block and "forward" in vars(block)
    assert_same_step(resnet(), loaded, IMAGES)
    memoplan.remove(loaded)
    assert "forward" not in vars(block) and rt.installed_plan(loaded) is None
    assert rt.installed_plan(planned) == plan_id  # the original is untouched


def test_pickling_other_bound_methods_is_unchanged_and_a_local_forward_is_refused_at_save_time():
    import pickle

    planned = memoplan.apply(resnet(), plan("module layer1.* { checkpoint }\n"))
    conv = pickle.loads(pickle.dumps(planned.layer1[0].conv1))
    assert pickle.loads(pickle.dumps(conv.forward)).__func__ is nn.Conv2d.forward

    def local_forward(self, *args, **kwargs):
        return type(self).forward(self, *args, **kwargs)

    model = resnet()
    rt.install(model, [rt.Target("fc", qualified_type_name(nn.Linear), local_forward)], plan_id="local")
    with pytest.raises(PlanError) as caught:
        torch.save(model, io.BytesIO())
    assert caught.value.codes == ["MP409"] and "memoplan.remove(model)" in str(caught.value)


@pytest.mark.slow
def test_a_planned_model_loads_planned_in_a_fresh_process(tmp_path):
    """The generated module apply() imported from its cache is not importable there: its source travels."""
    from memoplan.examples import cnn

    torch.manual_seed(0)
    planned = memoplan.apply(cnn.build(), plan("module features.* { checkpoint; compress input = bit }\n"))
    torch.save(planned, tmp_path / "model.pt")
    script = textwrap.dedent(
        """
        import sys, torch
        from memoplan import runtime as rt
        model = torch.load(sys.argv[1], weights_only=False)
        print(rt.installed_plan(model), type(model.features[0].forward.__self__).__name__)
        """
    )
    env = {**os.environ, "MEMOPLAN_CACHE_DIR": str(tmp_path / "empty-cache")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "model.pt")], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [rt.installed_plan(planned), "ConvBlock"]


def test_a_deep_copy_of_a_planned_model_is_planned_equivalent_and_independent():
    original = memoplan.apply(resnet(), plan("module layer1.* { checkpoint }\n"))
    clone = copy.deepcopy(original)
    assert rt.installed_plan(clone) == rt.installed_plan(original)
    assert clone.layer1[1].forward.__self__ is clone.layer1[1]
    assert_same_step(resnet(), clone, IMAGES)
    assert all(p.grad is None for p in original.parameters())
    memoplan.remove(clone)
    assert "forward" in vars(original.layer1[0]) and "forward" not in vars(clone.layer1[0])


# ---------------------------------------------------------------- 5: `state = functional` on a container


class Blocks(nn.Module):
    """Blocks of a SpikingJelly multi-step conv and a LIFNode: what a user writes a container rule for."""

    def __init__(self) -> None:
        super().__init__()
        neuron = pytest.importorskip("spikingjelly.activation_based.neuron")
        from spikingjelly.activation_based import layer

        torch.manual_seed(0)
        self.blocks = nn.Sequential(
            *(
                nn.Sequential(
                    layer.Conv2d(cin, 4, 3, padding=1, step_mode="m"),
                    neuron.LIFNode(tau=2.0, v_threshold=0.3, step_mode="m"),
                )
                for cin in (2, 4)
            )
        )

    def forward(self, x):
        return self.blocks(x)


SPIKES = (torch.rand(8, 2, 2, 5, 5, generator=torch.Generator().manual_seed(5)) < 0.4).float()


def spiking_step(model: nn.Module) -> dict:
    from spikingjelly.activation_based import functional

    functional.reset_net(model)
    model.zero_grad(set_to_none=True)
    x = SPIKES.clone().requires_grad_()
    out = model(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    nodes = {n: m.v.detach().clone() for n, m in model.named_modules() if hasattr(m, "v")}
    return {"out": out.detach(), "dx": x.grad, "v": nodes, "grads": [p.grad for p in model.parameters()]}


def test_state_functional_on_blocks_threads_the_neurons_inside_them():
    """The plan of issue 16: was MP315 ("implement memoplan_state() on the container")."""
    model = Blocks()
    text = plan("module blocks.* { checkpoint; temporal_chunk 4 dim 0; state = functional }\n")
    resolved = memoplan.resolve(memoplan.parse(text), model)
    assert resolved.module("blocks.0").region_state == ("1",)
    assert resolved.module("blocks.1.1").state is not None and resolved.module("blocks.0").state is None
    ref, got = spiking_step(copy.deepcopy(model)), spiking_step(memoplan.apply(copy.deepcopy(model), text))
    assert ref["out"].sum() > 0 and torch.equal(ref["out"], got["out"])
    assert ref["v"].keys() == got["v"].keys() == {"blocks.0.1", "blocks.1.1"}
    # Chunks run the conv on fewer rows: the documented chunk tolerance (docs/state.md).
    for a, b in [(ref["dx"], got["dx"]), *zip(ref["grads"], got["grads"]), *zip(ref["v"].values(), got["v"].values())]:
        assert (a - b).abs().max() <= 1e-5 * a.abs().max()


def test_state_functional_on_a_checkpointed_block_is_bit_identical():
    model = Blocks()
    text = plan("module blocks.* { checkpoint; state = functional }\n")
    ref, got = spiking_step(copy.deepcopy(model)), spiking_step(memoplan.apply(copy.deepcopy(model), text))
    assert ref["out"].sum() > 0 and torch.equal(ref["out"], got["out"]) and torch.equal(ref["dx"], got["dx"])
    assert all(torch.equal(a, b) for a, b in zip(ref["grads"], got["grads"], strict=True))
    assert all(torch.equal(ref["v"][n], got["v"][n]) for n in ref["v"])  # advanced once


def test_state_functional_on_a_module_with_nothing_stateful_inside_shows_the_rule_to_write():
    with pytest.raises(PlanError) as caught:
        memoplan.resolve(memoplan.parse(plan("module layer1.0 { state = functional }\n")), resnet())
    assert caught.value.codes == ["MP315"]
    assert "holds no module that does" in str(caught.value) and "state = functional }`" in str(caught.value)


# ---------------------------------------------------------------- 6: a region that overwrites its input


def test_checkpointing_an_in_place_relu_is_refused_by_the_resolver():
    with pytest.raises(PlanError) as caught:
        memoplan.resolve(memoplan.parse(plan("module layer1.0.relu { checkpoint }\n")), resnet())
    assert caught.value.codes == ["MP323"]
    assert caught.value.diagnostics[0].span.line == 2
    assert "`layer1.0.relu` (ReLU, inplace=True)" in str(caught.value)
    assert "module layer1.0 { checkpoint }" in caught.value.diagnostics[0].help


def test_a_region_whose_first_child_is_in_place_is_refused_and_the_enclosing_block_is_fine():
    seq = nn.Sequential(nn.Sequential(nn.ReLU(inplace=True), nn.Linear(3, 3)), nn.Linear(3, 1))
    with pytest.raises(PlanError) as caught:
        memoplan.resolve(memoplan.parse(plan("module 0 { checkpoint }\n")), seq)
    assert caught.value.codes == ["MP323"] and "`0.0`" in str(caught.value)
    memoplan.resolve(memoplan.parse(plan("module 0.1 { checkpoint }\n")), seq)
    reference = resnet()
    assert_same_step(
        reference, memoplan.apply(copy.deepcopy(reference), plan("module layer1.* { checkpoint }\n")), IMAGES
    )


def test_a_split_region_that_starts_with_an_in_place_module_is_refused():
    model = nn.Sequential(nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Linear(3, 1)))
    with pytest.raises(PlanError) as caught:
        memoplan.resolve(memoplan.parse(plan("module 0 { checkpoint split = [1] }\n")), model)
    assert caught.value.codes == ["MP323"] and "`0.1`" in str(caught.value)
    memoplan.resolve(memoplan.parse(plan("module 0 { checkpoint split = [2] }\n")), model)


class Doubles(nn.Module):
    """Overwrites its input in place, which no attribute tells the resolver."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        x.mul_(2)
        return self.fc(x)


@pytest.mark.parametrize("policy", ["checkpoint", "checkpoint; compress input = bit"])
def test_a_region_that_overwrites_its_input_at_run_time_names_the_module(policy):
    model = nn.Sequential(nn.Linear(3, 3), Doubles())
    memoplan.apply(model, plan(f"module 1 {{ {policy} }}\n"))
    with pytest.raises(PlanError) as caught:
        model(torch.ones(2, 3, requires_grad=True))
    assert caught.value.codes == ["MP407"]
    assert "`1` overwrote its input in place" in str(caught.value)


# ---------------------------------------------------------------- 7: HF gradient checkpointing on too


def gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("enable", ["gradient_checkpointing_enable", "activation_checkpointing_enable"])
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")
def test_a_plan_that_checkpoints_a_model_with_hf_gradient_checkpointing_on_is_warned(enable):
    model = gpt2()
    text = plan("# comment\nmodule transformer.h.* { checkpoint }\n")
    assert memoplan.resolve(memoplan.parse(text), model).warnings == ()
    getattr(model, enable)()
    (warning,) = memoplan.resolve(memoplan.parse(text), model).warnings
    assert warning.code == "MP322" and not warning.is_error and warning.span.line == 3
    assert "`transformer.h.0` and 1 more" in warning.message
    assert "activation_checkpointing_disable()" in warning.help  # transformers 5's name first
    assert "gradient_checkpointing_disable()" in warning.help  # and the one before it
    # A plan that recomputes nothing does not duplicate it.
    assert memoplan.resolve(memoplan.parse(plan("module transformer.h.* { keep }\n")), model).warnings == ()


# ---------------------------------------------------------------- 10: temporal_chunk past the input's dims


def test_temporal_chunk_past_the_input_dims_names_the_rule_module_and_shape():
    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU())
    memoplan.apply(model, plan("module 0 { temporal_chunk 2 dim 5 }\n"))
    with pytest.raises(PlanError) as caught:
        model(torch.randn(2, 3, 4, 4, requires_grad=True))
    assert caught.value.codes == ["MP408"]
    message = str(caught.value)
    assert ":2)" in message and "`0`" in message and "(2, 3, 4, 4)" in message and "dim 5" in message


def test_check_with_an_example_refuses_a_chunk_dim_past_the_input_at_the_rule(tmp_path, capsys):
    from memoplan import cli
    from memoplan.resolver.shapes import check_example

    text = plan(
        """
        model "memoplan.examples.cnn:build"
        example randn(2, 3, 8, 8)
        module features.1 { temporal_chunk 2 dim 5 }
        """
    )
    path = tmp_path / "dims.memplan"
    path.write_text(text)
    assert cli.main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "dims.memplan:4:" in err and "error[MP324]" in err and "`features.1`" in err
    assert "shape (2, 16, 8, 8)" in err  # what features.1 sees, not the model's input
    from memoplan.examples import cnn

    ok = memoplan.parse(plan("module features.1 { temporal_chunk 2 dim 3 }\n"))
    assert check_example(ok, cnn.build(), (torch.randn(2, 3, 8, 8),), {}) == []
