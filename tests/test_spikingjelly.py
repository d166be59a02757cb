"""SpikingJelly 2.0 neurons under memoplan plans, with `state = functional` and nothing else.

SpikingJelly is optional (the Makefile installs it with `pip install --no-deps
spikingjelly==2.0.0` and then `loguru tqdm`).  Its model zoo imports torchvision, so only
`activation_based.neuron`, `layer`, `functional` and `surrogate` are imported here.

Its stateful modules (`neuron.LIFNode`, `neuron.IFNode`, `layer.Dropout`, ...) are
`MemoryModule`s; memoplan's state adapter reads and writes their `_memories`, so a plan
only has to mark them:

    module class LIFNode { state = functional }

Every planned run is compared with the same model without a plan: outputs, input and
parameter gradients, every neuron's final `v` and the RNG state are bit-identical for
checkpointed regions.  Temporal chunks run each layer on fewer rows at a time and sum
weight gradients chunk by chunk, which may round differently: there the spikes are still
identical and gradients and potentials agree within max|diff| <= 1e-5 * max|ref|.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

neuron = pytest.importorskip("spikingjelly.activation_based.neuron")
from spikingjelly.activation_based import functional, layer, surrogate  # noqa: E402

import memoplan  # noqa: E402
from memoplan.diagnostics import PlanError  # noqa: E402
from memoplan.runtime import state  # noqa: E402

T, B, F, H = 8, 3, 5, 6  # time steps, batch, input features, hidden
CHUNK_RTOL = 1e-5

STATE = """
module class LIFNode { state = functional }
module class IFNode { state = functional }
"""


def plan(text: str) -> str:
    return "memplan 1\n" + text + STATE


# ---------------------------------------------------------------- models


class MultiStep(nn.Module):
    """step_mode='m': a (T, B, ...) sequence through a SpikingJelly Linear and a neuron."""

    def __init__(self, node: nn.Module, cin: int = H):
        super().__init__()
        self.fc = layer.Linear(cin, H, step_mode="m")
        self.node = node

    def forward(self, x):
        return self.node(self.fc(x))


class SingleStep(nn.Module):
    """step_mode='s': loops over time itself, calling a single-step neuron once per step."""

    def __init__(self, node: nn.Module, cin: int = H):
        super().__init__()
        self.fc = nn.Linear(cin, H)
        self.node = node

    def forward(self, x):
        return torch.stack([self.node(self.fc(x_t)) for x_t in x.unbind(0)])


class Net(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x):
        return self.blocks(x)


def multi_step_net() -> Net:
    torch.manual_seed(0)
    return Net(
        [
            MultiStep(neuron.LIFNode(tau=2.0, v_threshold=0.3, step_mode="m"), cin=F),
            MultiStep(neuron.IFNode(v_threshold=0.5, step_mode="m")),
            # soft reset, a non-default surrogate, decay_input=False
            MultiStep(
                neuron.LIFNode(
                    tau=3.0,
                    v_threshold=0.4,
                    v_reset=None,
                    decay_input=False,
                    surrogate_function=surrogate.ATan(),
                    step_mode="m",
                )
            ),
        ]
    )


def single_step_net() -> Net:
    torch.manual_seed(0)
    return Net(
        [
            SingleStep(neuron.LIFNode(tau=2.0, v_threshold=0.3), cin=F),
            SingleStep(neuron.IFNode(v_threshold=0.5, detach_reset=True)),
        ]
    )


def events(seed: int = 1, steps: int = T) -> torch.Tensor:
    return (torch.rand(steps, B, F, generator=torch.Generator().manual_seed(seed)) < 0.4).float()


def nodes(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, (neuron.LIFNode, neuron.IFNode))}


def regions(out: torch.Tensor) -> int:
    """How many memoplan regions the autograd graph of ``out`` holds (each is one node)."""
    seen, todo, count = set(), [out.grad_fn], 0
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        count += type(fn).__name__ == "_RegionFunctionBackward"
        todo.extend(next_fn for next_fn, _ in fn.next_functions)
    return count


def train_step(model: nn.Module, x: torch.Tensor, *, reset: bool = True) -> dict:
    if reset:
        functional.reset_net(model)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    x = x.clone().requires_grad_()
    out = model(x)
    weight = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * weight).sum().backward()
    return {
        "regions": regions(out),
        "out": out.detach(),
        "dx": x.grad,
        "grads": {n: p.grad for n, p in model.named_parameters()},
        "v": {n: m.v.detach().clone() for n, m in nodes(model).items()},
        "rng": torch.get_rng_state(),
    }


def assert_same(ref: dict, got: dict, *, chunked: tuple[str, ...] = ()) -> None:
    """Bit-identical, except with ``chunked`` (parameter-name prefixes of chunked modules).

    Temporal chunks run a layer on fewer rows at a time, which may take another BLAS path:
    their weight gradients, the input gradient and the potentials agree within
    max|diff| <= CHUNK_RTOL * max|ref|.  Spikes are thresholded, so they stay identical.
    """

    def close(a, b, what):
        if chunked:
            assert (a - b).abs().max() <= CHUNK_RTOL * a.abs().max(), what
        else:
            assert torch.equal(a, b), what

    assert ref["out"].sum() > 0, "no spikes: the test would prove nothing"
    assert torch.equal(ref["out"], got["out"])
    close(ref["dx"], got["dx"], "input gradient")
    assert ref["v"].keys() == got["v"].keys()
    for name in ref["v"]:
        close(ref["v"][name], got["v"][name], name)  # advanced once, not twice
    for name, g in ref["grads"].items():
        h = got["grads"][name]
        assert g is not None and h is not None, name
        if name.startswith(chunked or "\0"):
            assert (g - h).abs().max() <= CHUNK_RTOL * g.abs().max(), name
        else:
            assert torch.equal(g, h), name
    assert torch.equal(ref["rng"], got["rng"])


def planned(model: nn.Module, text: str) -> nn.Module:
    return memoplan.apply(copy.deepcopy(model), plan(text))


# ---------------------------------------------------------------- out of the box


def test_spikingjelly_memory_modules_are_stateful_for_memoplan():
    for node in (neuron.LIFNode(), neuron.IFNode(step_mode="m"), layer.Dropout(0.5)):
        assert state.is_stateful(node)
    lif = neuron.LIFNode(step_mode="m")
    assert state.get_state(lif) == {"v": 0.0}
    lif(torch.ones(2, 3))
    assert isinstance(state.get_state(lif)["v"], torch.Tensor)
    state.load_state(lif, {"v": 0.25})
    assert lif.v == 0.25 and lif._memories["v"] == 0.25


MULTI_STEP_PLANS = {  # name -> (plan, regions per step)
    "checkpoint": ("module blocks.* { checkpoint }", 3),
    "checkpoint+bit": ("module blocks.0 { checkpoint }\nmodule blocks[1:] {\n checkpoint\n compress input = bit\n}", 3),
    "segments": ("module blocks { checkpoint segments = 2 }", 2),
    "whole model": ("module blocks {\n checkpoint\n compress input = bit\n}", 1),
}


@pytest.mark.parametrize("name", MULTI_STEP_PLANS)
def test_multi_step_neurons_in_checkpointed_regions_are_bit_exact(name):
    net = multi_step_net()
    text, count = MULTI_STEP_PLANS[name]
    ref = train_step(copy.deepcopy(net), events())
    got = train_step(planned(net, text), events())
    assert (ref["regions"], got["regions"]) == (0, count)
    assert_same(ref, got)


@pytest.mark.parametrize("chunks", [2, 3, T])
def test_multi_step_neurons_in_temporal_chunks_match(chunks):
    net = multi_step_net()
    ref = train_step(copy.deepcopy(net), events())
    text = f"module blocks.* {{\n temporal_chunk {chunks} dim 0\n compress input = bit\n}}"
    got = train_step(planned(net, text), events())
    assert got["regions"] == 3 * chunks
    assert_same(ref, got, chunked=("blocks.",))


class DroppedMultiStep(MultiStep):
    """SpikingJelly's Dropout draws one mask at the first step and keeps it (a memory) for the rest."""

    def __init__(self):
        super().__init__(neuron.LIFNode(tau=2.0, v_threshold=0.3, step_mode="m"), cin=F)
        self.drop = layer.Dropout(0.4, step_mode="m")

    def forward(self, x):
        return self.node(self.drop(self.fc(x)))


def test_a_spikingjelly_dropout_mask_is_carried_from_chunk_to_chunk():
    torch.manual_seed(0)
    net = Net([DroppedMultiStep()])
    text = (
        "memplan 1\nmodule blocks.0 { temporal_chunk 4 dim 0 }\n"
        "module class LIFNode { state = functional }\n"
        "module class spikingjelly.activation_based.layer.Dropout { state = functional }\n"
    )
    ref = train_step(copy.deepcopy(net), events())
    got = train_step(memoplan.apply(copy.deepcopy(net), text), events())
    assert got["regions"] == 4
    assert_same(ref, got, chunked=("blocks.",))  # one mask drawn, in chunk 0, then carried


SINGLE_STEP_PLANS = {  # name -> (plan, chunked parameters, regions per step)
    "checkpoint+bit": ("module blocks.* {\n checkpoint\n compress input = bit\n}", (), 2),
    "temporal_chunk": ("module blocks.* { temporal_chunk 3 dim 0 }", ("blocks.",), 6),
    "one region over both": ("module blocks { checkpoint }", (), 1),
}


@pytest.mark.parametrize("name", SINGLE_STEP_PLANS)
def test_single_step_neurons_match(name):
    net = single_step_net()
    text, chunked, count = SINGLE_STEP_PLANS[name]
    ref = train_step(copy.deepcopy(net), events())
    got = train_step(planned(net, text), events())
    assert got["regions"] == count
    assert_same(ref, got, chunked=chunked)


class PerStep(nn.Module):
    """The model loops over time and calls a single-step cell once per step: one region per call."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.cell = SingleStepCell()

    def forward(self, x):
        return torch.stack([self.cell(x_t) for x_t in x.unbind(0)])


class SingleStepCell(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(F, H)
        self.drop = layer.Dropout(0.3)  # a MemoryModule too: its mask is drawn at step 0, then kept
        self.node = neuron.LIFNode(tau=2.0, v_threshold=0.3)

    def forward(self, x):
        return self.node(self.drop(self.fc(x)))


def test_state_is_threaded_from_one_region_call_to_the_next():
    net = PerStep()
    text = (
        "memplan 1\n"
        "module cell {\n checkpoint\n compress input = bit\n}\n"
        "module class LIFNode { state = functional }\n"
        "module class spikingjelly.activation_based.layer.Dropout { state = functional }\n"
    )
    ref = train_step(copy.deepcopy(net), events())
    got = train_step(memoplan.apply(copy.deepcopy(net), text), events())
    assert got["regions"] == T
    assert_same(ref, got)


# ---------------------------------------------------------------- fangwei123456/spikingjelly#629


def test_recompute_does_not_advance_the_state_a_second_time():
    net = multi_step_net()
    model = planned(net, "module blocks.* { checkpoint }")
    functional.reset_net(model)
    out = model(events().requires_grad_())
    after_forward = {n: m.v for n, m in nodes(model).items()}
    snapshot = {n: v.detach().clone() for n, v in after_forward.items()}
    out.sum().backward()  # three recomputes, each of which runs its neuron again
    for name, m in nodes(model).items():
        assert m.v is after_forward[name]  # the forward's state tensor, put back
        assert torch.equal(m.v, snapshot[name])


def test_plain_torch_checkpoint_gets_it_wrong():
    """The control: what the tests above would catch without memoplan's region.

    torch's checkpoint recomputes from the state the forward *left* (wrong gradients),
    and, when its early stop does not cut the recompute short, advances it again.
    """
    net = multi_step_net()
    x = events()
    ref = train_step(copy.deepcopy(net.blocks[0]), x)
    for early_stop in (True, False):
        block = copy.deepcopy(net.blocks[0])
        functional.reset_net(block)
        with torch.utils.checkpoint.set_checkpoint_early_stop(early_stop):
            out = checkpoint(block, x.clone().requires_grad_(), use_reentrant=False)
            snapshot = block.node.v.detach().clone()
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        assert torch.equal(out, ref["out"])
        assert not torch.equal(block.fc.weight.grad, ref["grads"]["fc.weight"])
        assert torch.equal(block.node.v, snapshot) == early_stop


# ---------------------------------------------------------------- reset_net and sequences


@pytest.mark.parametrize(
    "text, chunked",
    [
        ("module blocks.* {\n checkpoint\n compress input = bit\n}", ()),
        ("module blocks.* { temporal_chunk 4 dim 0 }", ("blocks.",)),
    ],
    ids=["checkpoint+bit", "temporal_chunk"],
)
def test_reset_net_between_two_sequences_behaves_as_before(text, chunked):
    net = multi_step_net()
    ref_model, model = copy.deepcopy(net), planned(net, text)
    for seed in (1, 2):
        ref = train_step(ref_model, events(seed), reset=False)
        got = train_step(model, events(seed), reset=False)
        assert_same(ref, got, chunked=chunked)
        functional.reset_net(ref_model)
        functional.reset_net(model)
        for (name, a), b in zip(nodes(ref_model).items(), nodes(model).values()):
            assert a.v == 0.0 and b.v == 0.0 and type(a.v) is type(b.v) is float, name


def test_state_carried_into_a_second_sequence_after_detach_net():
    """Truncated BPTT: no reset between the halves, only SpikingJelly's detach_net."""
    net = multi_step_net()
    ref_model, model = copy.deepcopy(net), planned(net, "module blocks.* { checkpoint }")
    functional.reset_net(ref_model)
    functional.reset_net(model)
    x = events(steps=2 * T)
    for half in x.split(T):
        assert_same(train_step(ref_model, half, reset=False), train_step(model, half, reset=False))
        functional.detach_net(ref_model)
        functional.detach_net(model)


def test_no_grad_evaluation_and_remove():
    net = multi_step_net()
    model = planned(net, "module blocks.* {\n checkpoint\n compress input = bit\n}")
    with torch.no_grad():
        functional.reset_net(net)
        functional.reset_net(model)
        assert torch.equal(net(events()), model(events()))
    memoplan.remove(model)
    assert all("forward" not in m.__dict__ for m in model.modules())


# ---------------------------------------------------------------- refused without the mark


@pytest.mark.parametrize(
    "text, unmarked",
    [
        ("module blocks.* { checkpoint }", "blocks.0.node"),
        ("module blocks.1 { temporal_chunk 2 dim 0 }", "blocks.1.node"),
        ("module blocks { checkpoint segments = 2 }", "blocks.0.node"),
        (
            "module blocks.1 {\n checkpoint\n compress input = bit\n}\nmodule class LIFNode { state = functional }",
            "blocks.1.node",
        ),
    ],
    ids=["checkpoint", "temporal_chunk", "segments", "only-LIFNode-marked"],
)
def test_a_neuron_in_a_region_without_state_functional_is_refused(text, unmarked):
    model = multi_step_net()
    with pytest.raises(PlanError) as caught:
        memoplan.apply(model, "memplan 1\n" + text + "\n")
    assert set(caught.value.codes) == {"MP314"}  # one error per region
    assert f"`{unmarked}`" in str(caught.value)
    assert "state = functional" in str(caught.value)  # the help says what to write
    assert all("forward" not in m.__dict__ for m in model.modules())  # nothing was applied


def test_an_unmarked_spikingjelly_dropout_is_refused_too():
    with pytest.raises(PlanError) as caught:
        memoplan.apply(
            PerStep(), "memplan 1\nmodule cell { checkpoint }\nmodule class LIFNode { state = functional }\n"
        )
    assert caught.value.codes == ["MP314"]
    assert "`cell.drop`" in str(caught.value)


# ---------------------------------------------------------------- known gap: store_v_seq


class Monitored(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.block = MultiStep(neuron.LIFNode(tau=2.0, v_threshold=0.3, step_mode="m", store_v_seq=True), cin=F)

    def forward(self, x):
        return self.block(x)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="memoplan threads a MemoryModule's `_memories` only; `v_seq` (store_v_seq=True) is a plain "
    "attribute, so the recompute replaces it (with a tensor holding the recompute's graph) and each "
    "temporal chunk overwrites it with its own steps",
)
@pytest.mark.parametrize("text", ["module block { checkpoint }", "module block { temporal_chunk 2 dim 0 }"])
def test_store_v_seq_is_as_without_a_plan(text):
    net = Monitored()
    ref = copy.deepcopy(net)
    model = memoplan.apply(copy.deepcopy(net), f"memplan 1\n{text}\nmodule class LIFNode {{ state = functional }}\n")
    for m in (ref, model):
        functional.reset_net(m)
        out = m(events())
    kept = model.block.node.v_seq
    out.sum().backward()
    assert model.block.node.v_seq is kept  # the forward's, as `v` is
    assert torch.equal(model.block.node.v_seq, ref.block.node.v_seq)


@pytest.mark.parametrize(
    "make",
    [
        lambda: neuron.PSN(T=T),
        lambda: neuron.MaskedPSN(k=2, T=T, step_mode="m"),
        lambda: neuron.SlidingPSN(k=2, step_mode="m"),
    ],
    ids=["PSN", "MaskedPSN", "SlidingPSN"],
)
def test_chunking_time_over_a_parallel_spiking_neuron_is_refused(make):
    """PSN, MaskedPSN and SlidingPSN mix time steps: a chunk would compute another function (or a shape error)."""
    torch.manual_seed(0)
    net = Net([MultiStep(make(), cin=F)])
    with torch.no_grad():
        net.blocks[0].fc.bias.add_(1.0)  # enough input that every kind fires
    text = "memplan 1\nmodule blocks.0 { temporal_chunk 2 dim 0 }\n"
    if state.is_stateful(net.blocks[0].node):  # MaskedPSN and SlidingPSN are MemoryModules; PSN keeps no state
        text += "module blocks.0.node { state = functional }\n"
    with pytest.raises(PlanError) as caught:
        memoplan.resolve(memoplan.parse(text), net)
    assert caught.value.codes == ["MP304"]
    assert "mixes time steps" in str(caught.value) and "blocks.0.node" in str(caught.value)
    # Checkpointing them is fine (the whole sequence is recomputed at once) and bit-equal.
    ref = train_step(copy.deepcopy(net), events())
    got = train_step(memoplan.apply(copy.deepcopy(net), text.replace("temporal_chunk 2 dim 0", "checkpoint")), events())
    assert_same(ref, got)
