"""Real models through the whole chain: profile -> plan -> verify -> compile -> import -> train.

HF ``transformers`` GPT-2, BERT and Llama from tiny configs (2 layers, d=32, seq 16,
vocab 128; no weights, no hub; default ``use_cache`` and attention implementation) and
a SpikingJelly network (tests/real_models.py).  Each goes through the command line as a
user would: ``memoplan profile``, ``memoplan plan --budget``, ``memoplan verify`` (must
say EQUIVALENT), ``memoplan write-module`` (the model named by path, ``tests/real_models.py:
gpt2``), then the compiled module is imported and applied to a fresh model, and two SGD
steps of it equal two steps of the unplanned model: outputs, gradients, parameters,
buffers and RNG state, compared by memoplan.compare (structured outputs by their tensors).

transformers and spikingjelly are required, not skipped when missing: `make install`
installs them, and CI runs these tests.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from _paths import TESTS

import memoplan
from memoplan import specs
from memoplan.cli import main
from memoplan.compare import compare
from memoplan.syntax import parse_example_spec
from memoplan.verification import CHUNK_RTOL

FACTORIES = TESTS / "real_models.py"

# name -> example.  No plan here has temporal chunks, so every model is held bit for bit.
MODELS = {
    "gpt2": "randint(2, 16, high=128)",
    "bert": "randint(2, 16, high=128)",
    "llama": "randint(2, 16, high=128)",
    "spiking": "randn(4, 2, 1, 8, 8)",
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _steps(model, example, seed: int, steps: int = 2):
    """``steps`` SGD steps; the outputs, gradients, parameters, buffers and RNG state after each."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(seed)
    record = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        output = example.run(model)
        logits = output if isinstance(output, torch.Tensor) else output.logits
        logits.float().square().mean().backward()
        optimizer.step()
        record.append(
            {
                "outputs": output,
                "gradients": {n: p.grad for n, p in model.named_parameters()},
                "parameters": {n: p.detach().clone() for n, p in model.named_parameters()},
                "buffers": {n: b.clone() for n, b in model.named_buffers()},
                "rng": torch.get_rng_state(),
            }
        )
        if hasattr(model, "features"):  # SpikingJelly neurons carry their potential to the next call
            from spikingjelly.activation_based import functional

            functional.reset_net(model)
    return record


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.slow
def test_profile_plan_verify_compile_and_train(name, tmp_path, capsys):
    model_spec = f"{FACTORIES}:{name}"
    example_spec = MODELS[name]
    spec_args = ["--model", model_spec, "--example", example_spec]
    profile, plan, compiled = tmp_path / "profile.json", tmp_path / f"{name}.memplan", tmp_path / f"{name}_plan.py"

    assert main(["profile", *spec_args, "--repeats", "1", "-o", str(profile)]) == 0
    # A hint: the planner writes its least-peak plan; at these tiny sizes checkpointing alone
    # cannot reach 50% (weights, gradients and logits dominate the peak), so a hard budget is refused.
    assert main(["plan", *spec_args, "--profile", str(profile), "--budget", "50%", "--hint", "-o", str(plan)]) == 0
    text = plan.read_text()
    assert "checkpoint" in text, text
    capsys.readouterr()
    assert main(["verify", str(plan), *spec_args]) == 0, capsys.readouterr().out
    assert "verdict: EQUIVALENT" in capsys.readouterr().out
    assert main(["write-module", str(plan), "--model", model_spec, "-o", str(compiled)]) == 0

    generated = _import(compiled, f"real_{name}_plan")
    torch.manual_seed(0)
    model = specs.load_model(model_spec)
    example = specs.make_example(parse_example_spec(example_spec))
    planned = generated.apply(copy.deepcopy(model))
    assert [t.path for t in generated.TARGETS] and all(
        "forward" in planned.get_submodule(t.path).__dict__ for t in generated.TARGETS
    )
    assert list(planned.state_dict()) == list(model.state_dict())

    # Bit for bit, except where the plan runs a block in time chunks: a convolution's weight
    # gradient and a BatchNorm's statistics are then sums over the chunks, equal up to float
    # reassociation (docs/guarantees.md: within CHUNK_RTOL of each category's largest magnitude).
    chunked = "temporal_chunk" in text
    expected, actual = _steps(model, example, seed=1), _steps(planned, example, seed=1)
    for step, (a, b) in enumerate(zip(expected, actual)):
        for category in a:
            check = compare(category, {category: a[category]}, {category: b[category]})
            close = chunked and check.largest <= CHUNK_RTOL
            assert check.exact or close, f"step {step + 1}, {category}: {check.differences[:3]}"


@pytest.mark.parametrize("name", list(MODELS))
def test_dtr_evicts_the_blocks_of_real_models_and_trains_bit_for_bit(name):
    """Every block evicted that may be (a 1-byte threshold), recomputed in backward: two SGD steps
    equal the unplanned model's, GPT-2's and Llama's returned DynamicCache included."""
    import warnings

    torch.manual_seed(0)
    model = specs.load_model(f"{FACTORIES}:{name}")
    example = specs.make_example(parse_example_spec(MODELS[name]))
    planned = memoplan.apply(
        copy.deepcopy(model), "memplan 1\ndtr {\n    eviction_threshold = 1 B\n    evictee_minimum_size = 0 B\n}\n"
    )
    assert list(planned.state_dict()) == list(model.state_dict())
    expected = _steps(model, example, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # MP430: 1 byte cannot be met
        actual = _steps(planned, example, seed=2)
    for step, (a, b) in enumerate(zip(expected, actual)):
        for category in a:
            check = compare(category, {category: a[category]}, {category: b[category]})
            assert check.exact, f"step {step + 1}, {category}: {check.differences[:3]}"
    stats = memoplan.dtr_stats(planned)
    assert stats.recomputes > 0, stats
