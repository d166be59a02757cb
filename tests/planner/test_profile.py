"""Profile stage: per-module saved bytes, binary probing, JSON, merge, chain, and a model left as it was."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest
import torch
from torch import nn

from memoplan.examples import cnn, mlp, spiking, transformer
from memoplan.planner.profiling.profile import (
    ChainLink,
    ModuleProfile,
    Profile,
    chain,
    default_candidates,
    merge,
    nested_candidates,
    profile,
)
from memoplan.runtime.codecs import estimate_nbytes
from memoplan.specs import Example

F32 = 4
BATCH, WIDTH, DEPTH = 4, 16, 3


def _profile(model: nn.Module, *args, **kwargs) -> Profile:
    kwargs.setdefault("progress", False)
    kwargs.setdefault("repeats", 1)
    return profile(model, *args, **kwargs)


@pytest.fixture(scope="module")
def gelu_profile() -> Profile:
    torch.manual_seed(0)
    return _profile(mlp.build(DEPTH, WIDTH, "gelu"), mlp.example(BATCH, WIDTH), repeats=3)


@pytest.fixture(scope="module")
def spiking_profile() -> Profile:
    torch.manual_seed(0)
    return _profile(spiking.build(), Example(spiking.example(steps=2, batch=2, size=8)))


# ---------------------------------------------------------------- saved bytes


def test_gelu_mlp_saved_bytes_match_shapes(gelu_profile: Profile) -> None:
    activation = BATCH * WIDTH * F32
    names = [f"layers.{i}" for i in range(2 * DEPTH)]
    assert list(gelu_profile.names) == ["", "layers", *names]
    for name in names:
        m = gelu_profile[name]
        # Linear saves its input, GELU saves its input: one (batch, width) float32 each.
        assert m.saved_bytes == activation, name
        assert m.input_bytes == m.output_bytes == activation
        assert m.input_numel == BATCH * WIDTH
        assert m.calls == 1
        assert not m.input_binary
        assert m.packed_input_bytes == m.input_bytes
    assert gelu_profile["layers.0"].type == "torch.nn.modules.linear.Linear"
    assert gelu_profile["layers.1"].type == "torch.nn.modules.activation.GELU"
    # The containers save nothing of their own; their subtrees add up.
    assert gelu_profile[""].saved_bytes == gelu_profile["layers"].saved_bytes == 0
    total = 2 * DEPTH * activation
    assert gelu_profile.subtree_saved_bytes("layers") == total
    assert gelu_profile.subtree_saved_bytes("") == total == gelu_profile.saved_bytes
    assert gelu_profile.subtree_saved_bytes("layers.3") == activation
    assert gelu_profile.unattributed_saved_bytes == 0


def test_relu_saves_its_output_and_shared_storage_counts_once() -> None:
    p = _profile(mlp.build(DEPTH, WIDTH, "relu"), mlp.example(BATCH, WIDTH))
    activation = BATCH * WIDTH * F32
    assert p["layers.0"].saved_bytes == activation  # the model input
    for i in range(DEPTH):
        # ReLU saves its output; the next Linear saves that same tensor, charged once (to ReLU).
        assert p[f"layers.{2 * i + 1}"].saved_bytes == activation
        if i:
            assert p[f"layers.{2 * i}"].saved_bytes == 0
    assert p.subtree_saved_bytes("") == (DEPTH + 1) * activation


def test_structure_fields_and_whole_step_figures(gelu_profile: Profile) -> None:
    p = gelu_profile
    assert p["layers"].is_sequential and p["layers"].children == 2 * DEPTH
    assert not p[""].is_sequential and p[""].children == 1
    assert p["layers.0"].children == 0
    assert [m.order for m in p.modules] == list(range(len(p.modules)))
    assert p.parameter_bytes == DEPTH * (WIDTH * WIDTH + WIDTH) * F32
    assert p.peak_bytes > p.saved_bytes
    assert p.peak_method == "live-storage" and p.device == "cpu"
    assert p.torch_version == torch.__version__
    assert [(t.name, t.shape, t.dtype) for t in p.inputs] == [("args[0]", (BATCH, WIDTH), "float32")]
    assert p.step_seconds > 0 and p.repeats == 3 and p.ranks == 1
    for m in p.modules:
        assert m.forward_seconds > 0
        assert m.recompute_seconds == m.forward_seconds
    # Medians of dominated samples stay dominated: a parent's time includes its children's.
    assert p[""].forward_seconds >= p["layers"].forward_seconds >= p["layers.0"].forward_seconds


def test_shared_module_adds_up_its_calls() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.GELU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.act(x))

    x = torch.randn(3, 5, requires_grad=True)
    p = _profile(Twice(), (x,))
    assert p["act"].calls == 2
    assert p["act"].saved_bytes == 2 * 3 * 5 * F32
    assert p["act"].input_bytes == 2 * 3 * 5 * F32
    assert x.grad is None  # the example's gradient is restored too


def test_kwargs_inputs_are_described() -> None:
    torch.manual_seed(0)
    p = _profile(transformer.build(), transformer.example_with_mask(batch=2, seq=8))
    assert [(t.name, t.shape, t.dtype) for t in p.inputs] == [
        ("args[0]", (2, 8), "int64"),
        ("kwargs['attention_mask']", (2, 8), "bool"),
    ]
    # A block's inputs: x (float32) and the mask (bool), passed as a keyword argument.
    assert p["blocks.0"].input_bytes == 2 * 8 * transformer.D_MODEL * F32 + 2 * 8
    assert not p["blocks.0"].input_binary
    assert p["blocks"].calls == 0 and p["blocks"].order is None  # a ModuleList never runs


# ---------------------------------------------------------------- binary inputs


def test_binary_detection(spiking_profile: Profile, gelu_profile: Profile) -> None:
    first = spiking_profile["blocks.0"]
    assert first.input_binary
    assert spiking_profile["blocks.1"].input_binary  # spikes of the previous block
    numel = 2 * 2 * spiking.IN_CHANNELS * 8 * 8
    assert first.input_numel == numel and first.input_bytes == numel * F32
    assert first.packed_input_bytes == estimate_nbytes("bit", numel, torch.float32)
    assert not spiking_profile["blocks.0.bn"].input_binary  # convolution outputs
    assert not gelu_profile["layers.0"].input_binary  # randn input


def test_binary_is_probed_in_train_mode() -> None:
    # Train-mode dropout rescales 0/1 to 0/2: a probe in eval mode would call it binary.
    model = nn.Sequential(nn.Dropout(0.5), nn.Linear(64, 4)).eval()
    x = (torch.rand(8, 64) < 0.5).float()
    p = _profile(model, (x,))
    assert p["0"].input_binary
    assert not p["1"].input_binary
    assert not model.training and not any(m.training for m in model.modules())


# ---------------------------------------------------------------- JSON


def test_json_round_trip(gelu_profile: Profile, spiking_profile: Profile, tmp_path) -> None:
    for p in (gelu_profile, spiking_profile):
        text = p.to_json()
        data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
        assert data["version"] == 1
        assert text == json.dumps(data, sort_keys=True, indent=1) + "\n"  # sorted keys
        again = Profile.from_json(text)
        assert again == p
        assert again.to_json() == text
        path = tmp_path / "p.json"
        p.save(path)
        assert Profile.load(path) == p


def test_json_rejects_other_versions_and_malformed(gelu_profile: Profile) -> None:
    data = json.loads(gelu_profile.to_json())
    with pytest.raises(ValueError, match="version"):
        Profile.from_dict({**data, "version": 2})
    with pytest.raises(ValueError, match="missing peak_bytes"):
        Profile.from_dict({k: v for k, v in data.items() if k != "peak_bytes"})
    bad = {**data, "modules": [{**data["modules"][0], "colour": "red"}, *data["modules"][1:]]}
    with pytest.raises(ValueError, match="unexpected colour"):
        Profile.from_dict(bad)


# ---------------------------------------------------------------- merge


def _tweak(p: Profile, **changes) -> Profile:
    """A copy of ``p`` with every module's fields changed by ``changes[field](module)``."""
    modules = tuple(dataclasses.replace(m, **{k: f(m) for k, f in changes.items()}) for m in p.modules)
    return dataclasses.replace(p, modules=modules)


def test_merge_takes_max_and_all(spiking_profile: Profile) -> None:
    a = spiking_profile
    b = _tweak(
        a,
        forward_seconds=lambda m: m.forward_seconds * 2,
        recompute_seconds=lambda m: m.recompute_seconds * 2,
        saved_bytes=lambda m: max(m.saved_bytes - 1, 0),
        input_bytes=lambda m: m.input_bytes + 8,
        input_binary=lambda m: m.input_binary and m.name != "blocks.1",
    )
    b = dataclasses.replace(b, peak_bytes=a.peak_bytes + 1, step_seconds=a.step_seconds / 2, device="cpu:1")
    merged = merge([a, b])
    assert merged == merge([b, a])  # order does not matter
    assert merged.ranks == 2
    assert merged.peak_bytes == a.peak_bytes + 1
    assert merged.step_seconds == a.step_seconds
    assert merged.device == "cpu,cpu:1"
    for ma, mb, m in zip(a.modules, b.modules, merged.modules):
        assert m.forward_seconds == mb.forward_seconds == m.recompute_seconds
        assert m.saved_bytes == ma.saved_bytes
        assert m.input_bytes == mb.input_bytes
        assert m.input_binary == (ma.input_binary and mb.input_binary)
    assert merged["blocks.0"].input_binary and not merged["blocks.1"].input_binary
    assert merged["blocks.1"].packed_input_bytes == merged["blocks.1"].input_bytes
    assert merge([a]) == a
    assert Profile.from_json(merged.to_json()) == merged


def test_merge_requires_the_same_modules(gelu_profile: Profile) -> None:
    other = _profile(mlp.build(DEPTH - 1, WIDTH), mlp.example(BATCH, WIDTH))
    with pytest.raises(ValueError, match=r"different module sets.*missing from profile 1: `layers\.4`"):
        merge([gelu_profile, other])
    relu = _profile(mlp.build(DEPTH, WIDTH, "relu"), mlp.example(BATCH, WIDTH))
    with pytest.raises(ValueError, match="module `layers.1` has type"):
        merge([gelu_profile, relu])
    with pytest.raises(ValueError, match="at least one"):
        merge([])


# ---------------------------------------------------------------- model left as it was


def _hook_dicts(model: nn.Module) -> list[int]:
    names = [n for n, v in vars(nn.Module()).items() if "hook" in n and isinstance(v, dict)]
    assert "_forward_hooks" in names and "_forward_pre_hooks" in names
    return [len(getattr(m, n)) for m in model.modules() for n in names]


def _snapshot(model: nn.Module) -> dict:
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "ids": [id(t) for t in (*model.parameters(), *model.buffers())],
        "grads": [p.grad for p in model.parameters()],
        "training": [m.training for m in model.modules()],
        "rng": torch.get_rng_state(),
        "py_rng": random.getstate(),
    }


def _assert_unchanged(model: nn.Module, before: dict) -> None:
    after = _snapshot(model)
    assert after["state"].keys() == before["state"].keys()
    for key, value in before["state"].items():
        assert torch.equal(after["state"][key], value), key
    assert after["ids"] == before["ids"]
    assert all(a is b for a, b in zip(after["grads"], before["grads"]))
    assert after["training"] == before["training"]
    assert torch.equal(after["rng"], before["rng"])
    assert after["py_rng"] == before["py_rng"]
    assert not any(_hook_dicts(model))


@pytest.mark.parametrize("train", [True, False])
def test_model_state_is_unchanged(train: bool) -> None:
    torch.manual_seed(0)
    model = cnn.build().train(train)
    model.features[1].bn.eval()  # a frozen BatchNorm must stay so
    model.features[0].conv.weight.grad = torch.ones_like(model.features[0].conv.weight)
    example = cnn.example(batch=2)
    before = _snapshot(model)
    p = _profile(model, example, repeats=2)
    _assert_unchanged(model, before)
    assert p["features.0.bn"].saved_bytes > 0


def test_neuron_state_is_unchanged() -> None:
    torch.manual_seed(0)
    model = spiking.build()
    x = spiking.example(steps=2, batch=2, size=8)[0]
    lif = model.blocks[0].lif
    assert lif.v == lif.v_reset  # not yet materialised
    before = _snapshot(model)
    _profile(model, (x,), repeats=2)
    _assert_unchanged(model, before)
    assert lif.v == lif.v_reset and not isinstance(lif.v, torch.Tensor)
    # A state carried from an earlier call comes back as the same object.
    v = torch.rand(2, 32, 8, 8)
    lif.v = v
    _profile(model, (x,))
    assert lif.v is v


def test_profile_twice_gives_the_same_bytes(gelu_profile: Profile) -> None:
    torch.manual_seed(0)
    again = _profile(mlp.build(DEPTH, WIDTH, "gelu"), mlp.example(BATCH, WIDTH), repeats=3)

    def strip(p: Profile) -> list[ModuleProfile]:
        return [dataclasses.replace(m, forward_seconds=0.0, recompute_seconds=0.0) for m in p.modules]

    assert strip(again) == strip(gelu_profile)
    assert again.peak_bytes == gelu_profile.peak_bytes


def test_hooks_removed_even_when_forward_raises() -> None:
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    model = Boom().eval()
    with pytest.raises(RuntimeError, match="boom"):
        _profile(model, (torch.randn(2, 4),))
    assert not any(_hook_dicts(model))
    assert not model.training


# ---------------------------------------------------------------- chain


def test_chain_on_cnn() -> None:
    torch.manual_seed(0)
    p = _profile(cnn.build(), cnn.example(batch=2))
    links = chain(p)
    assert [link.name for link in links] == [f"features.{i}" for i in range(5)]
    for link in links:
        assert isinstance(link, ChainLink)
        assert link.saved_bytes == p.subtree_saved_bytes(link.name)
        assert link.saved_bytes == sum(p[f"{link.name}.{c}"].saved_bytes for c in ("conv", "bn", "act"))
        assert link.input_bytes == p[link.name].input_bytes
        assert link.forward_seconds == p[link.name].forward_seconds
    assert links[0].input_bytes == 2 * 3 * 32 * 32 * F32


def test_chain_on_transformer() -> None:
    torch.manual_seed(0)
    p = _profile(transformer.build(), transformer.example(batch=2, seq=8))
    assert default_candidates(p) == tuple(f"blocks.{i}" for i in range(transformer.N_BLOCKS))
    links = chain(p)
    assert [link.name for link in links] == list(default_candidates(p))
    assert all(link.saved_bytes > 0 for link in links)
    assert all(link.input_bytes == 2 * 8 * transformer.D_MODEL * F32 for link in links)


def test_nested_candidates_reach_every_depth_inside_the_blocks() -> None:
    torch.manual_seed(0)
    p = _profile(transformer.build(), transformer.example(batch=2, seq=8))
    names = nested_candidates(p)
    blocks = default_candidates(p)
    assert names[: len(blocks)] == blocks
    inner = names[len(blocks) :]
    # Children and grandchildren (the MLP's activation), each inside a block and holding saved memory.
    assert {"blocks.0.attn", "blocks.0.mlp", "blocks.0.mlp.act", "blocks.3.mlp.act"} <= set(inner)
    assert all(any(n.startswith(b + ".") for b in blocks) for n in inner)
    assert all(p.subtree_saved_bytes(n) > 0 for n in names)
    # Modules outside the blocks (embedding, head) and those that save nothing are not offered.
    assert all(n.startswith("blocks.") for n in names)
    saving_nothing = [m.name for m in p.modules if m.name.startswith("blocks.") and p.subtree_saved_bytes(m.name) == 0]
    assert not set(saving_nothing) & set(names)


def test_chain_defaults_on_mlp_and_spiking(gelu_profile: Profile, spiking_profile: Profile) -> None:
    assert [link.name for link in chain(gelu_profile)] == [f"layers.{i}" for i in range(2 * DEPTH)]
    # blocks.N are themselves Sequentials; the outer one holds the most.
    assert [link.name for link in chain(spiking_profile)] == [f"blocks.{i}" for i in range(4)]
    assert chain(spiking_profile)[0].input_binary


def test_chain_follows_execution_order_and_checks_candidates() -> None:
    class Backwards(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.unused = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(torch.tanh(self.b(x)))

    p = _profile(Backwards(), (torch.randn(2, 4),))
    assert default_candidates(p) == ("a", "b", "unused")  # no container: the root's children
    assert [link.name for link in chain(p)] == ["b", "a"]  # as run; `unused` never ran
    assert [link.name for link in chain(p, ["a", "b"])] == ["b", "a"]
    with pytest.raises(ValueError, match="did you mean `a`"):
        chain(p, ["a", "aa"])
    with pytest.raises(ValueError, match="must not nest"):
        chain(p, ["", "a"])


def test_explicit_candidates_in_subtrees(gelu_profile: Profile) -> None:
    links = chain(gelu_profile, ["layers.3", "layers.0"])
    assert [link.name for link in links] == ["layers.0", "layers.3"]


# ---------------------------------------------------------------- options


def test_progress_bar(capsys) -> None:
    model, example = mlp.build(1, 8), mlp.example(2, 8)
    profile(model, example, repeats=2)
    err = capsys.readouterr().err
    assert err == "memoplan: measuring the training step (4 steps)\n"  # not a terminal: one line, no bar
    profile(model, example, repeats=2, progress=False)
    assert capsys.readouterr().err == ""


def test_options_are_checked() -> None:
    model, example = mlp.build(1, 8), mlp.example(2, 8)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="repeats"):
            profile(model, example, repeats=bad, progress=False)
    with pytest.raises(TypeError, match="example"):
        profile(model, {"x": 1}, progress=False)
    p = profile(model, example, device="cpu", repeats=1, progress=False)
    assert p.device == "cpu"


def test_module_profile_is_frozen(gelu_profile: Profile) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        gelu_profile.peak_bytes = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        gelu_profile.modules[0].saved_bytes = 0  # type: ignore[misc]
    assert isinstance(gelu_profile.modules[0], ModuleProfile)
    assert math.isfinite(gelu_profile.step_seconds)


def test_in_place_parameter_change_is_reported() -> None:
    class Drifts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                self.lin.bias.add_(0.0)
            return self.lin(x)

    with pytest.warns(RuntimeWarning, match="modified parameter.*`lin.bias`"):
        _profile(Drifts(), (torch.randn(2, 4),))


def test_merge_of_differing_inputs_is_order_independent(gelu_profile: Profile) -> None:
    small = dataclasses.replace(gelu_profile, inputs=(dataclasses.replace(gelu_profile.inputs[0], shape=(1, WIDTH)),))
    assert merge([small, gelu_profile]).inputs == gelu_profile.inputs
    assert merge([gelu_profile, small]) == merge([small, gelu_profile])


# ---------------------------------------------------------------- what the output keeps


class _Cache:
    """A returned cache as transformers' DynamicCache is: an object pytree does not open."""

    def __init__(self, layers: list) -> None:
        self.layers = layers


class _Attends(nn.Module):
    """Saves ``k`` for backward (a matmul's operand) and returns it in a cache too."""

    def __init__(self) -> None:
        super().__init__()
        self.k = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, cache: list) -> torch.Tensor:
        k = self.k(x)
        cache.append({"keys": k})
        return torch.tanh(x @ k.transpose(0, 1)) @ k


class _Keeps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Attends(), _Attends()])

    def forward(self, x: torch.Tensor):
        cache: list = []
        for block in self.blocks:
            x = block(x, cache)
        return x, _Cache(cache)


def test_saved_bytes_the_output_keeps_are_counted_and_a_checkpoint_keeps_them_too() -> None:
    torch.manual_seed(0)
    prof = _profile(_Keeps(), (torch.randn(BATCH, WIDTH),))
    k_bytes = BATCH * WIDTH * F32
    assert [prof[f"blocks.{i}"].kept_bytes for i in range(2)] == [k_bytes, k_bytes]
    assert all(prof[f"blocks.{i}"].saved_bytes > k_bytes for i in range(2))  # k and tanh's output
    assert prof["blocks.0.k"].kept_bytes == 0  # the Linear saves its input, not k
    links = {link.name: link for link in chain(prof, ["blocks.0", "blocks.1"])}
    assert links["blocks.1"].kept_bytes == prof.subtree_kept_bytes("blocks.1") == k_bytes
    # Profiles written before kept bytes were measured still load, with none kept.
    data = json.loads(prof.to_json())
    for module in data["modules"]:
        del module["kept_bytes"]
    assert all(m.kept_bytes == 0 for m in Profile.from_dict(data).modules)
