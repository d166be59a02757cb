"""Tests for the bundled example models: they build, train one step and match their layout."""

from __future__ import annotations

import importlib

import pytest
import torch
from _paths import ROOT
from torch import nn

from memoplan.examples import cnn, mlp, spiking, transformer
from memoplan.neurons import LIF, reset

ALL = ["cnn", "transformer", "spiking", "mlp"]


def _forward_backward(model: nn.Module, inputs: tuple, **kwargs) -> torch.Tensor:
    out = model(*inputs, **kwargs)
    out.float().square().mean().backward()
    return out


@pytest.mark.parametrize("name", ALL)
def test_builds_and_trains_one_step(name: str) -> None:
    module = importlib.import_module(f"memoplan.examples.{name}")
    torch.manual_seed(0)
    model = module.build()
    inputs = module.example()
    assert isinstance(model, nn.Module)
    assert isinstance(inputs, tuple)
    out = _forward_backward(model, inputs)
    assert torch.isfinite(out).all()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads), "every parameter gets a gradient"
    assert all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", ALL)
def test_build_is_deterministic_given_the_seed(name: str) -> None:
    module = importlib.import_module(f"memoplan.examples.{name}")
    states = []
    for _ in range(2):
        torch.manual_seed(123)
        states.append((module.build().state_dict(), module.example()))
    (sd_a, in_a), (sd_b, in_b) = states
    assert sd_a.keys() == sd_b.keys()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert all(torch.equal(a, b) for a, b in zip(in_a, in_b))


def test_cnn_layout_and_shapes() -> None:
    model = cnn.build()
    (x,) = cnn.example()
    assert x.shape == (8, 3, 32, 32)
    assert isinstance(model.features, nn.Sequential)
    assert all(isinstance(block, cnn.ConvBlock) for block in model.features)
    names = dict(model.named_modules())
    for i in range(len(model.features)):
        assert isinstance(names[f"features.{i}.conv"], nn.Conv2d)
        assert isinstance(names[f"features.{i}.bn"], nn.BatchNorm2d)
        assert isinstance(names[f"features.{i}.act"], (nn.ReLU, nn.GELU))
    acts = {type(block.act) for block in model.features}
    assert acts == {nn.ReLU, nn.GELU}
    assert isinstance(model.dropout, nn.Dropout)
    assert isinstance(model.classifier, nn.Linear)
    assert model(x).shape == (8, cnn.NUM_CLASSES)


def test_transformer_layout_and_shapes() -> None:
    model = transformer.build()
    (ids,) = transformer.example()
    assert ids.shape == (4, 32) and ids.dtype == torch.int64
    assert 0 <= ids.min() and ids.max() < transformer.VOCAB
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == 4
    assert not any(isinstance(m, nn.TransformerEncoder) for m in model.modules())
    names = dict(model.named_modules())
    assert isinstance(names["blocks.0.ln1"], nn.LayerNorm)
    assert isinstance(names["blocks.3.attn.attn_drop"], nn.Dropout)
    assert isinstance(names["blocks.2.mlp.act"], nn.GELU)
    assert isinstance(names["head"], nn.Linear)
    assert model(ids).shape == (4, 32, transformer.VOCAB)


def test_transformer_attention_mask_keyword() -> None:
    torch.manual_seed(0)
    model = transformer.build().eval()
    example = transformer.example_with_mask()
    (ids,) = example.args
    mask = example.kwargs["attention_mask"]
    assert mask.shape == ids.shape and not mask.all()
    masked = model(ids, attention_mask=mask)
    assert masked.shape == (4, 32, transformer.VOCAB)
    assert torch.isfinite(masked).all()
    # Unpadded rows are unaffected; row 0 (padded at the end) differs only from the padding on.
    plain = model(ids)
    assert torch.allclose(masked[1:], plain[1:])
    first_pad = int(mask[0].long().argmin())
    assert torch.allclose(masked[0, :first_pad], plain[0, :first_pad])
    assert not torch.allclose(masked[0, first_pad:], plain[0, first_pad:])
    _forward_backward(transformer.build(), example.args, **example.kwargs)


def test_transformer_is_causal() -> None:
    model = transformer.build().eval()
    (ids,) = transformer.example()
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % transformer.VOCAB
    assert torch.allclose(model(ids)[:, :-1], model(changed)[:, :-1])


def test_spiking_input_is_binary_and_shaped() -> None:
    (x,) = spiking.example()
    assert x.shape == (spiking.T, spiking.BATCH, 2, 32, 32) == (8, 8, 2, 32, 32)
    assert x.dtype == torch.float32
    assert set(x.unique().tolist()) == {0.0, 1.0}
    (small,) = spiking.example(steps=2, batch=3, size=8)
    assert small.shape == (2, 3, 2, 8, 8)


def test_spiking_layout_and_spikes() -> None:
    torch.manual_seed(0)
    model = spiking.build()
    (x,) = spiking.example()
    assert isinstance(model.blocks, nn.Sequential) and len(model.blocks) == 4
    names = dict(model.named_modules())
    for i in range(4):
        block = names[f"blocks.{i}"]
        assert isinstance(block, spiking.SpikingBlock) and isinstance(block, nn.Sequential)
        assert list(block._modules) == ["conv", "bn", "lif"]  # what `checkpoint split = [lif]` names
        assert isinstance(names[f"blocks.{i}.conv"], nn.Conv2d)
        assert isinstance(names[f"blocks.{i}.bn"], nn.BatchNorm2d)
        assert isinstance(names[f"blocks.{i}.lif"], LIF)  # memoplan's stateful neuron
    assert isinstance(model.dropout, nn.Dropout)

    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
        block.lif.register_forward_hook(lambda _m, _i, out: outputs.append(out))
    assert model(x).shape == (8, spiking.NUM_CLASSES)
    assert len(inputs) == len(outputs) == 4
    for tensor in inputs:  # every block reads binary spikes: `compress input = bit` holds them
        assert set(tensor.unique().tolist()) <= {0.0, 1.0}
    for out in outputs:
        assert out.shape == (8, 8, 32, 32, 32)  # (T, B, C, H, W): every block the same size
        assert set(out.unique().tolist()) <= {0.0, 1.0}
        assert 0.01 < out.mean() < 0.5


def test_spiking_forward_is_deterministic() -> None:
    results = []
    for _ in range(2):
        torch.manual_seed(7)
        model = spiking.build()
        (x,) = spiking.example(batch=2)
        results.append(model(x))
    assert torch.equal(results[0], results[1])


def test_spiking_neurons_keep_state_until_reset() -> None:
    torch.manual_seed(0)
    blocks = spiking.build().blocks  # train mode: BatchNorm normalises with the batch's statistics
    (x,) = spiking.example(batch=2)
    first = blocks(x)
    assert all(isinstance(m.v, torch.Tensor) for m in blocks.modules() if isinstance(m, LIF))
    assert not torch.equal(blocks(x), first)  # the second call starts from the first call's potentials
    spiking.reset(blocks)
    assert all(m.v == m.v_reset for m in blocks.modules() if isinstance(m, LIF))
    assert torch.equal(blocks(x), first)
    # A sequence fed in two pieces gives the spikes of one call (what temporal chunks rely on),
    # here through a neuron alone: BatchNorm would take each piece's own statistics.
    lif = blocks[0].lif
    current = torch.randn(8, 2, 3, 4, 4)
    reset(lif)
    whole = lif(current)
    reset(lif)
    assert torch.equal(whole, torch.cat([lif(current[:3]), lif(current[3:])]))


def test_lif_neuron_dynamics() -> None:
    lif = spiking.LIFNeuron(tau=2.0, threshold=1.0)
    current = torch.full((4, 1), 1.5)
    # v: 0.75 (no spike), 0.75 + 0.375 = 1.125 (spike, reset to 0), 0.75, 1.125 (spike)
    assert lif(current).flatten().tolist() == [0.0, 1.0, 0.0, 1.0]
    lif.reset()
    x = torch.randn(6, 3, requires_grad=True)
    lif(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0  # the surrogate gradient flows


SPIKING_PLANS = sorted((ROOT / "plans").glob("spiking*.memplan"))


@pytest.mark.parametrize("path", SPIKING_PLANS, ids=lambda p: p.name)
@pytest.mark.slow
def test_spiking_plans_train_identically_with_less_memory(path) -> None:
    from memoplan.measure import LiveStorageMeter
    from memoplan.specs import Example
    from memoplan.verification import verify

    with LiveStorageMeter():  # the first metered step of a process would read high (lazy imports)
        torch.zeros(1).add_(1)
    torch.manual_seed(0)
    model = spiking.build()
    (x,) = spiking.example(batch=2, size=16)
    report = verify(model, path, Example((x,)))
    assert report.equivalent, [c.differences for c in report.checks]
    assert report.planned.peak_bytes < report.unplanned.peak_bytes


def test_spiking_plan_uses_bit_compression_state_and_temporal_chunks() -> None:
    from memoplan import load, resolve

    plan = resolve(load(ROOT / "plans" / "spiking.memplan"), spiking.build())
    for i in range(4):
        block = plan.module(f"blocks.{i}")  # conv, BatchNorm and LIF chunked together, one step a chunk
        assert (block.temporal_chunk.chunks, block.temporal_chunk.dim) == (8, 0)
        assert block.temporal_chunk.recompute_boundaries  # the potentials chunks start from
        assert block.compress.codec.value == "bit"
        assert block.region_state == ("lif",)
        assert plan.module(f"blocks.{i}.lif").state is not None
    split = resolve(load(ROOT / "plans" / "spiking_split.memplan"), spiking.build())
    assert split.module("blocks.0").checkpoint.groups == (("conv", "bn"), ("lif",))


@pytest.mark.bench
def test_spiking_benchmark_runs_small(tmp_path) -> None:
    pytest.importorskip("spikingjelly.activation_based.memopt")
    import json
    import runpy

    bench = runpy.run_path(str(ROOT / "benchmarks" / "spiking_memory.py"))
    out = tmp_path / "results.json"
    # `--also` with no plan: the bundled plans besides the chosen one are verified by
    # test_spiking_plans_train_identically_with_less_memory above; here only the chosen one is.
    argv = ["--batch", "1", "--steps", "1", "--warmup", "0", "--top", "3", "--also", "--json", str(out)]
    assert bench["main"](argv) == 0
    results = json.loads(out.read_text())
    assert list(results["plans"]) == ["plans/spiking.memplan"]
    assert results["plans"]["plans/spiking.memplan"]["equivalent"]
    assert results["spikingjelly"]["compressors"] == ["BitSpikeCompressor"] * 4
    assert results["spikingjelly"]["twin_equals_model"]
    assert not results["spikingjelly"]["gradient_differences"]
    assert results["bit"]["block_inputs"][1]["bit_bytes"] * 32 == results["bit"]["block_inputs"][1]["float32_bytes"]
    assert len(results["targets"]) == 5 and all(isinstance(t["met"], bool) for t in results["targets"])


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_mlp_layout(activation: str) -> None:
    model = mlp.build(depth=3, width=16, activation=activation)
    (x,) = mlp.example(batch=5, width=16)
    assert x.shape == (5, 16)
    assert isinstance(model.layers, nn.Sequential) and len(model.layers) == 6
    act = nn.GELU if activation == "gelu" else nn.ReLU
    for i in range(3):
        assert isinstance(model.layers[2 * i], nn.Linear)
        assert isinstance(model.layers[2 * i + 1], act)
    assert model(x).shape == (5, 16)


def test_mlp_defaults() -> None:
    model = mlp.build()
    assert len(model.layers) == 40
    assert mlp.example()[0].shape == (1024, 512)
    with pytest.raises(ValueError):
        mlp.build(activation="tanh")
