"""Every policy under ``torch.compile``: what Dynamo captures, and training equal to the compiled unplanned model.

:class:`memoplan.graphs.CountingBackend` counts the graphs, the graph breaks (by reason) and the
ops, ops inside higher-order-op subgraphs included (a checkpointed region is one such op), then
hands each graph to ``aot_eager`` (AOTAutograd with functionalisation, no C++ compiler).  Each case
trains one step of the planned model compiled and of the unplanned model compiled, from the same
seed, and compares the loss, the input and parameter gradients and the buffers:

* ``WHOLE``: plain ``checkpoint`` (whole, ``segments``/``split`` without state, ``nested``), the
  ``memory`` block, on the bundled models and HF GPT-2 / Llama / BERT with their default
  configuration (``use_cache=True``): as many graphs as the unplanned model (one), no break, at
  least its ops, no memoplan warning, bit for bit.
* ``OUTSIDE``: memoplan's own region (``compress``, ``state = functional``, ``temporal_chunk`` and
  ``segments``/``split`` holding stateful modules) leaves the graph on purpose: graph breaks,
  MP417 once per region, the same results (bit for bit; ``temporal_chunk`` within
  :data:`memoplan.verification.CHUNK_RTOL`, as in eager mode).
* the ``memonger`` arena (an inference plan) compiles to one graph without a break, with
  eager's outputs bit for bit.

docs/compile.md has the table these cases prove.
"""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch
from torch import nn

import memoplan
from memoplan.examples import spiking, transformer
from memoplan.graphs import Capture, CountingBackend
from memoplan.neurons import reset
from memoplan.runtime import compiled as compiled_regions
from memoplan.verification import CHUNK_RTOL
from tests import real_models

WHOLE, OUTSIDE = "whole", "outside"


def _transformer() -> nn.Module:
    return transformer.Transformer(n_blocks=2)


def _spiking() -> nn.Module:
    return spiking.SpikingCNN(channels=(4, 4))


def _spikingjelly() -> nn.Module:
    pytest.importorskip("spikingjelly")
    return real_models.spiking()


def _hf(name: str):
    def build() -> nn.Module:
        pytest.importorskip("transformers")
        return getattr(real_models, name)()

    build.__name__ = name
    return build


def _ids() -> tuple[torch.Tensor]:
    return (torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1)),)


def _events(steps: int = 3) -> tuple[torch.Tensor]:
    return ((torch.rand(steps, 2, 2, 8, 8, generator=torch.Generator().manual_seed(1)) < 0.2).float(),)


def _jelly_events() -> tuple[torch.Tensor]:
    return ((torch.rand(3, 2, 1, 8, 8, generator=torch.Generator().manual_seed(1)) < 0.3).float(),)


STATE = "module class LIFNeuron { state = functional }\n"
JELLY_STATE = "module class LIFNode { state = functional }\n"

# id: (model, example, plan rules, expectation)
CASES = {
    "transformer-checkpoint": (_transformer, _ids, "module blocks.* { checkpoint }", WHOLE),
    "transformer-nested": (
        _transformer,
        _ids,
        "module blocks.* { checkpoint nested = true }\nmodule blocks.*.mlp { checkpoint nested = true }",
        WHOLE,
    ),
    "transformer-memory": (_transformer, _ids, "memory { atomic_clean_policy = 1 }", WHOLE),
    "gpt2-checkpoint": (_hf("gpt2"), _ids, "module transformer.h.* { checkpoint }", WHOLE),
    "llama-checkpoint": (_hf("llama"), _ids, "module model.layers.* { checkpoint }", WHOLE),
    "bert-checkpoint": (_hf("bert"), _ids, "module bert.encoder.layer.* { checkpoint }", WHOLE),
    "transformer-compress": (_transformer, _ids, "module blocks.0 {\n checkpoint\n compress input = auto\n}", OUTSIDE),
    "spiking-state": (_spiking, _events, "module blocks.* { checkpoint }\n" + STATE, OUTSIDE),
    "spiking-segments": (_spiking, _events, "module blocks { checkpoint segments = 2 }\n" + STATE, OUTSIDE),
    "spiking-split-bit": (
        _spiking,
        _events,
        "module blocks.0 {\n checkpoint split = [lif]\n compress input = bit\n}\n" + STATE,
        OUTSIDE,
    ),
    "spiking-temporal-chunk": (_spiking, _events, "module blocks { temporal_chunk 3 dim 0 }\n" + STATE, OUTSIDE),
    "spikingjelly-state": (_spikingjelly, _jelly_events, "module features.* { checkpoint }\n" + JELLY_STATE, OUTSIDE),
}


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(compiled_regions, "_OUTSIDE", set())
    monkeypatch.setattr(compiled_regions, "_WARNED", set())
    yield
    torch._dynamo.reset()


def _loss(out) -> torch.Tensor:
    out = getattr(out, "logits", out)
    return out.float().square().mean()


def train_compiled(model: nn.Module, example: tuple[torch.Tensor, ...]) -> tuple[Capture, dict, list[str]]:
    """One step of ``model`` under ``torch.compile`` with the counting backend (seeded)."""
    torch._dynamo.reset()
    backend = CountingBackend("aot_eager")
    reset(model)
    x = tuple(t.clone().requires_grad_(t.is_floating_point()) for t in example)
    with warnings.catch_warnings(record=True) as caught, backend:
        warnings.simplefilter("always")
        torch.manual_seed(7)
        loss = _loss(torch.compile(model, backend=backend)(*x))
        loss.backward()
    record = {"loss": loss.detach(), "inputs": [t.grad for t in x if t.requires_grad]}
    record.update({f"grad {n}": p.grad for n, p in model.named_parameters()})
    record.update({f"buffer {n}": b for n, b in model.named_buffers()})
    ours = [str(w.message) for w in caught if str(w.message).startswith("memoplan: MP")]
    return backend.capture, record, ours


@functools.cache
def unplanned(build) -> tuple[nn.Module, Capture, dict]:
    torch.manual_seed(0)
    model = build()
    capture, record, _ = train_compiled(copy.deepcopy(model), EXAMPLES[build]())
    return model, capture, record


EXAMPLES = {build: example for build, example, _, _ in CASES.values()}


def _same(ref: dict, got: dict, rtol: float) -> None:
    assert ref.keys() == got.keys()
    for key, a in ref.items():
        b = got[key]
        if isinstance(a, list):
            for x, y in zip(a, b):
                _close(x, y, rtol, key)
        elif a is not None:
            _close(a, b, rtol, key)


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float, key: str) -> None:
    if rtol == 0 or not a.is_floating_point():
        assert torch.equal(a, b), key
    else:
        assert (a - b).abs().max() <= rtol * max(a.abs().max(), 1e-12), key


FAST = {"transformer-nested", "transformer-memory", "spiking-segments"}  # under 10 s each on two cores


@pytest.mark.parametrize("case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
@pytest.mark.slow
def test_policy_under_compile(case):
    build, _example, rules, expected = CASES[case]
    model, base, ref = unplanned(build)
    planned = memoplan.apply(copy.deepcopy(model), "memplan 1\n" + rules + "\n")
    capture, got, ours = train_compiled(planned, EXAMPLES[build]())
    if expected == WHOLE:
        assert (capture.graphs, capture.break_count) == (base.graphs, base.break_count) == (1, 0), capture.describe()
        assert capture.ops >= base.ops, (capture.ops, base.ops)
        assert ours == []
    else:
        assert capture.break_count > base.break_count, capture.describe()
        assert ours and all(m.startswith("memoplan: MP417:") for m in ours), ours
        assert len(ours) == len(set(ours))  # once per region
    _same(ref, got, CHUNK_RTOL if "temporal_chunk" in rules else 0.0)


def test_memonger_inference_under_compile_gives_eager_outputs():
    """The ``memonger`` arena replaces an inference forward; compiled, Dynamo traces through it."""
    from memoplan.examples import mlp

    torch.manual_seed(0)
    model = mlp.MLP(depth=3, width=32).eval()
    reference = copy.deepcopy(model)
    memoplan.apply(model, "memplan 1\nexample randn(8, 32)\nmemonger { }\n")
    backend = CountingBackend("aot_eager")
    x = torch.randn(8, 32)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught, backend:
        warnings.simplefilter("always")
        got = torch.compile(model, backend=backend)(x)
        want = reference(x)
    assert torch.equal(got, want)
    assert (backend.capture.graphs, backend.capture.break_count) == (1, 0), backend.capture.describe()
    assert not [w for w in caught if str(w.message).startswith("memoplan: MP")]


@pytest.mark.slow
def test_verify_compile_reports_graphs_and_breaks_next_to_the_peaks():
    from memoplan.specs import Example
    from memoplan.verification import render_report, verify

    torch.manual_seed(0)
    model = _transformer()
    plan = "memplan 1\nmodule blocks.* { checkpoint }\nmodule blocks.0 { compress input = auto }\n"
    report = verify(model, plan, Example(_ids(), {}), compile="aot_eager")
    assert report.equivalent
    unplanned, planned = report.captures
    assert (unplanned.graphs, unplanned.break_count) == (1, 0)
    assert planned.break_count > 0  # blocks.0 is memoplan's own region: it leaves the graph (MP417)
    text = render_report(report)
    assert f"torch.compile (backend aot_eager): unplanned {unplanned.describe()}; planned {planned.describe()}" in text
    assert "the peaks above are eager's" in text  # the CPU meter keeps Dynamo out


def test_counting_backend_counts_ops_inside_a_checkpoint_subgraph():
    from memoplan.graphs import count_ops

    block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))

    def forward(x):
        return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).sum()

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(forward, backend=keep)(torch.randn(2, 4, requires_grad=True))
    (gm,) = graphs
    hops = [
        n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)
    ]
    assert len(hops) == 1  # the checkpoint
    assert count_ops(gm) == 4  # linear, tanh, linear inside it; sum outside


DTR = "dtr { eviction_threshold = 256 KiB; evictee_minimum_size = 1 KiB }"
DTR_CASES = {"transformer": _transformer, "gpt2": _hf("gpt2")}


@pytest.mark.slow
@pytest.mark.parametrize("measured", [False, True], ids=["compiled-first", "eager-step-first"])
@pytest.mark.parametrize("name", list(DTR_CASES))
def test_dtr_under_compile_is_traced_as_a_static_checkpoint_choice(name, measured):
    """``dtr`` compiles with the model (one graph, no break, the unplanned model's ops), its
    candidates checkpointed as the dtr simulator chooses (every one before an eager step), said
    once (MP418); gradients bit for bit those of the compiled unplanned model."""
    from memoplan.runtime.dtr import DTR_ATTR
    from memoplan.runtime.evictable import compile_choice

    build = DTR_CASES[name]
    if build not in EXAMPLES:
        EXAMPLES[build] = _ids
    model, base, ref = unplanned(build)
    planned = memoplan.apply(copy.deepcopy(model), "memplan 1\n" + DTR + "\n")
    tracker = planned.__dict__[DTR_ATTR]
    if measured:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _loss(planned(*_ids())).backward()
        planned.zero_grad(set_to_none=True)
        assert memoplan.dtr_stats(planned).evictions > 0  # the threshold makes the eager tracker evict
    chosen, _ = compile_choice(tracker)
    everyone = set(tracker.paths.values())
    assert chosen == everyone if not measured else 0 < len(chosen) < len(everyone)  # measured: 1 of 2
    capture, got, ours = train_compiled(planned, _ids())
    assert (capture.graphs, capture.break_count) == (base.graphs, base.break_count) == (1, 0), capture.describe()
    assert capture.ops >= base.ops, (capture.ops, base.ops)  # the goal was 80% of them
    assert len(ours) == 1 and ours[0].startswith("memoplan: MP418:"), ours
    assert f"{len(chosen)} of {len(everyone)} checkpointed" in ours[0]
    _same(ref, got, 0.0)


@pytest.mark.slow
@pytest.mark.skipif(
    __import__("os").environ.get("MEMOPLAN_TEST_INDUCTOR") != "1",
    reason="Inductor compiles C++ kernels: about 2 minutes here; set MEMOPLAN_TEST_INDUCTOR=1",
)
def test_dtr_under_inductor_gives_the_compiled_unplanned_models_gradients(monkeypatch):
    """With ``fallback_random`` (eager's dropout masks), the dtr transformer compiled by Inductor
    trains bit for bit as the unplanned transformer compiled by Inductor."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "fallback_random", True)
    torch.manual_seed(0)
    model = _transformer()
    planned = memoplan.apply(copy.deepcopy(model), "memplan 1\n" + DTR + "\n")
    results = []
    for m in (model, planned):
        torch._dynamo.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(7)
            loss = _loss(torch.compile(m, backend="inductor")(*_ids()))
            loss.backward()
        results.append([loss.detach(), *(p.grad for p in m.parameters())])
    assert all(torch.equal(a, b) for a, b in zip(*results))
