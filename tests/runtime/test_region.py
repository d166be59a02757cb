"""memoplan's own region (compressed input, threaded state, temporal chunks) against the unplanned model."""

from __future__ import annotations

import contextlib
import copy
import functools

import pytest
import torch
from _tolerance import assert_within_chunk_tolerance  # tests/_tolerance.py
from torch import nn

from memoplan.diagnostics import PlanError
from memoplan.measure import LiveStorageMeter
from memoplan.neurons import LIF, reset
from memoplan.runtime import run_planned, state
from memoplan.runtime.region import RegionOptions, run_chunked, run_region

# Temporal chunks sum weight gradients chunk by chunk: equal up to float reassociation.
CHUNK_RTOL = 1e-5  # max |difference| <= CHUNK_RTOL * max |gradient|, per tensor


class Block(nn.Module):
    """Conv over every time step, then a stateful LIF neuron over time: x is (T, B, C, H, W)."""

    def __init__(self, channels: int = 4, dropout: float = 0.0):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.drop = nn.Dropout(dropout)
        self.lif = LIF(threshold=0.3)

    def forward(self, x):
        steps, batch = x.shape[:2]
        y = self.drop(self.conv(x.flatten(0, 1))).unflatten(0, (steps, batch))
        return self.lif(y)


def _net(dropout: float = 0.0, blocks: int = 3) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[Block(dropout=dropout) for _ in range(blocks)])


def _spikes(steps: int = 8) -> torch.Tensor:
    return (torch.rand(steps, 2, 4, 12, 12, generator=torch.Generator().manual_seed(3)) < 0.3).float()


def _step(model: nn.Sequential, x: torch.Tensor, planned: dict | None):
    """One training step; ``planned`` holds run_planned options (None: unplanned)."""
    reset(model)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    x = x.clone().requires_grad_()
    h = x
    for i, block in enumerate(model):
        options = {**planned, "where": f"{planned.get('where', 'blocks')}.{i}"} if planned else None
        h = block(h) if options is None else run_planned(block, (h,), {}, stateful=("lif",), **options)
    weight = torch.linspace(-1, 1, h.numel()).view_as(h)
    (h * weight).sum().backward()
    return {
        "out": h.detach(),
        "dx": x.grad,
        "grads": [p.grad for p in model.parameters()],
        "v": [b.lif.v.detach() for b in model],
        "rng": torch.get_rng_state(),
    }


@pytest.mark.parametrize("codec", ["none", "bit", "bool", "uint8", "sparse", "auto"])
def test_region_is_bit_exact_for_every_lossless_codec(codec):
    net = _net(dropout=0.2)
    a = _step(copy.deepcopy(net), _spikes(), None)
    b = _step(copy.deepcopy(net), _spikes(), {"codec": codec})
    assert torch.equal(a["out"], b["out"])
    assert torch.equal(a["dx"], b["dx"])
    assert all(torch.equal(g, h) for g, h in zip(a["grads"], b["grads"]))
    assert all(torch.equal(v, w) for v, w in zip(a["v"], b["v"]))  # state advanced once
    assert torch.equal(a["rng"], b["rng"])  # dropout replayed, not redrawn


@pytest.mark.parametrize("chunks", [2, 3, 8])
def test_temporal_chunks_equal_the_unchunked_step(chunks):
    net = _net(dropout=0.2)
    a = _step(copy.deepcopy(net), _spikes(), None)
    b = _step(copy.deepcopy(net), _spikes(), {"codec": "bit", "chunks": chunks})
    # Each chunk's convolution runs on fewer images, which may take another oneDNN or
    # BLAS kernel: the input gradient and the carried state agree within memoplan
    # verify's tolerance.  The outputs are spikes, thresholded: equal.
    assert torch.equal(a["out"], b["out"])
    assert_within_chunk_tolerance({"dx": a["dx"]}, {"dx": b["dx"]})
    assert_within_chunk_tolerance(dict(enumerate(a["v"])), dict(enumerate(b["v"])))
    assert torch.equal(a["rng"], b["rng"])
    for g, h in zip(a["grads"], b["grads"]):
        assert (g - h).abs().max() <= CHUNK_RTOL * g.abs().max()


def test_chunk_count_above_the_time_axis_is_clamped_with_a_warning():
    net = _net()
    a = _step(copy.deepcopy(net), _spikes(steps=3), None)
    with pytest.warns(
        RuntimeWarning, match=r"clamp-test\.\d: temporal_chunk 16 over a time axis of 3 steps; using 3"
    ) as seen:
        b = _step(copy.deepcopy(net), _spikes(steps=3), {"chunks": 16, "where": "clamp-test"})
    assert torch.equal(a["out"], b["out"])
    # the warning names the line that called the region (here _step's), not memoplan's or torch's
    assert {(w.filename, w.lineno) for w in seen} == {(__file__, _step.__code__.co_firstlineno + 9)}


def test_state_carries_across_calls_and_recompute_does_not_advance_it():
    """Feed one sequence in two calls (state kept between them), each call a region."""
    net = _net(blocks=1)
    block_a, block_b = copy.deepcopy(net[0]), copy.deepcopy(net[0])
    x = _spikes().requires_grad_()
    outs = []
    for block, planned in ((block_a, False), (block_b, True)):
        reset(block)
        parts = []
        for piece in x.split(4):
            if planned:
                parts.append(run_planned(block, (piece,), {}, stateful=("lif",), codec="bit"))
            else:
                parts.append(block(piece))
        torch.cat(parts).sum().backward()
        outs.append((torch.cat(parts).detach(), block.lif.v.detach(), [p.grad.clone() for p in block.parameters()]))
        block.zero_grad()
    (ya, va, ga), (yb, vb, gb) = outs
    assert torch.equal(ya, yb)
    assert torch.equal(va, vb)
    assert all(torch.equal(g, h) for g, h in zip(ga, gb))


def test_batchnorm_statistics_are_committed_once_in_a_region():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Tanh())
    twin = copy.deepcopy(model)
    x = torch.randn(5, 6)
    model(x).sum().backward()
    fn = functools.partial(type(twin).forward, twin)
    run_region((twin,), fn, (x,), {}, RegionOptions()).sum().backward()
    for a, b in zip(model.buffers(), twin.buffers()):
        assert torch.equal(a, b)
    assert int(twin[1].num_batches_tracked) == 1


def test_non_binary_input_under_bit_names_the_module():
    net = _net(blocks=1)
    x = _spikes()
    x[0, 0, 0, 0, 0] = 0.7
    with pytest.raises(PlanError) as caught:
        run_planned(net[0], (x,), {}, codec="bit", validate="always", where="blocks.0", stateful=("lif",))
    assert caught.value.codes == ["MP405"]
    assert "blocks.0" in str(caught.value)


def test_compression_lowers_the_peak_by_the_saved_inputs():
    net = _net()
    peaks = {}
    for codec in ("none", "bit"):
        model = copy.deepcopy(net)
        x = _spikes()
        with LiveStorageMeter() as meter:
            _step(model, x, {"codec": codec})
        peaks[codec] = meter.peak_bytes
    assert peaks["bit"] < peaks["none"]


def test_frozen_parameters_get_no_gradient_and_the_rest_are_exact():
    net = _net()
    for p in net[1].parameters():
        p.requires_grad_(False)
    a = _step(copy.deepcopy(net), _spikes(), None)
    b = _step(copy.deepcopy(net), _spikes(), {"codec": "bit"})
    for g, h in zip(a["grads"], b["grads"]):
        assert (g is None) == (h is None)
        assert g is None or torch.equal(g, h)


def test_no_grad_runs_the_plain_forward():
    net = _net(blocks=1)
    x = _spikes()
    with torch.no_grad():
        reset(net)
        a = net[0](x)
        reset(net)
        b = run_planned(net[0], (x,), {}, codec="bit", stateful=("lif",))
    assert torch.equal(a, b)


def test_a_second_backward_with_retained_graph_recomputes_again():
    net = _net(blocks=1)
    x = _spikes().requires_grad_()
    reset(net)
    y = run_planned(net[0], (x,), {}, codec="bit", stateful=("lif",))
    y.sum().backward(retain_graph=True)
    first = x.grad.clone()
    y.sum().backward()
    assert torch.equal(x.grad, 2 * first)


def test_lif_speaks_the_state_protocol():
    lif = LIF()
    assert state.is_stateful(lif)
    lif(torch.ones(2, 3))
    assert isinstance(state.get_state(lif)["v"], torch.Tensor)
    state.load_state(lif, {"v": 0.5})
    assert lif.v == 0.5
    assert not state.is_stateful(nn.Linear(2, 2))


def test_chunked_region_splits_keyword_arguments_too():
    class Scale(nn.Module):
        def forward(self, x, *, gain):
            return x * gain

    module = Scale()
    x = torch.randn(6, 3, requires_grad=True)
    gain = torch.randn(6, 3, requires_grad=True)
    fn = functools.partial(type(module).forward, module)
    y = run_chunked((module,), fn, (x,), {"gain": gain}, RegionOptions(), (), chunks=3, dim=0, chunk_args=(0, "gain"))
    assert torch.equal(y, x * gain)
    y.sum().backward()
    assert torch.equal(x.grad, gain.detach())
    assert torch.equal(gain.grad, x.detach())


def test_auto_widens_when_a_later_input_does_not_fit_the_first_choice():
    """`auto` chose `bit` on binary data; a later non-binary value must not be stored as 1."""
    import memoplan

    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(4, 4))
    planned = memoplan.apply(copy.deepcopy(reference), "memplan 1\nmodule 0 { checkpoint; compress input = auto }\n")
    x = (torch.rand(32768, 4) < 0.5).float()  # large enough that sampled checks would skip elements
    planned(x).sum().backward()
    planned.zero_grad()
    x2 = x.clone()
    x2.view(-1)[1] = 2.0
    (planned(x2) ** 2).sum().backward()
    (reference(x2) ** 2).sum().backward()
    for p, q in zip(reference.parameters(), planned.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_chunk_outputs_go_into_one_buffer_as_they_come():
    """Joining chunks holds the whole output and one chunk's, never every chunk's plus their concatenation."""

    class Double(nn.Module):
        def forward(self, x):
            return x * 2

    module = Double()
    x = torch.randn(8, 1024, requires_grad=True)  # 32 KiB; a chunk of 2 steps is 8 KiB
    fn = functools.partial(type(module).forward, module)
    with LiveStorageMeter() as meter:
        y = run_chunked((module,), fn, (x,), {}, RegionOptions(), (), chunks=4, dim=0, chunk_args=(0,))
    assert meter.peak_bytes == x.nbytes + x.nbytes // 4
    y.backward(torch.arange(y.numel(), dtype=y.dtype).view_as(y))
    assert torch.equal(y, x * 2)
    assert torch.equal(x.grad, 2 * torch.arange(y.numel(), dtype=y.dtype).view_as(y))


def test_chunk_outputs_of_other_lengths_are_concatenated():
    """An output not as long as its chunk (a summary per chunk) and a non-tensor output come back as before."""

    class Summaries(nn.Module):
        def forward(self, x):
            return {"seq": x.sin(), "first": x[:1] * 3, "steps": "same"}

    module = Summaries()
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    fn = functools.partial(type(module).forward, module)
    out = run_chunked((module,), fn, (x,), {}, RegionOptions(), (), chunks=3, dim=0, chunk_args=(0,))
    assert out["steps"] == "same"
    assert torch.equal(out["seq"], x.sin())
    assert torch.equal(out["first"], x[::2] * 3)
    (out["seq"].sum() + out["first"].pow(2).sum()).backward()
    expected = x.detach().cos()
    expected[::2] += 18 * x.detach()[::2]
    assert torch.allclose(x.grad, expected, rtol=0, atol=1e-12)


def backward_peak(run, x: torch.Tensor, module: nn.Module) -> tuple[int, torch.Tensor]:
    """Peak bytes of ``run()``'s backward (gradient of ones), and the gradient of ``x`` it gives."""
    x.grad = None
    module.zero_grad(set_to_none=True)
    y = run()
    g = torch.ones_like(y)
    with LiveStorageMeter() as meter:
        y.backward(g)
    return meter.peak_bytes, x.grad.clone()


def test_the_decoded_input_is_not_held_while_backward_runs_through_the_region(monkeypatch):
    """The recompute keeps what saves the decoded input as the payload, decoding it again when needed.

    fn = conv2(conv1(x)): the peak is conv2's backward (conv1's output and its gradient),
    a moment when conv1's saved input need not exist.
    """
    import memoplan.runtime.region_function as region

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(16, 64, 1, bias=False), nn.Conv2d(64, 1, 1, bias=False))
    x = (torch.rand(4, 16, 32, 32) < 0.5).float().requires_grad_()
    fn = functools.partial(type(net).forward, net)

    def run():
        return run_region((net,), fn, (x,), {}, RegionOptions(codec="bit"))

    peak, grad = backward_peak(run, x, net)
    monkeypatch.setattr(region, "_saved_as_payload", lambda decoded, payload: contextlib.nullcontext())
    kept_peak, kept_grad = backward_peak(run, x, net)
    assert torch.equal(grad, kept_grad)
    # Without the payload, the decoded input (256 KiB) is alive at that moment too.
    assert kept_peak - peak == x.nbytes


def test_a_planned_sequential_lets_go_of_its_decoded_input_after_the_first_module():
    """In the recompute, a chain's decoded input lives only until its first module has saved it as the payload."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(16, 1, 1, bias=False), nn.Conv2d(1, 64, 1, bias=False))
    x = (torch.rand(4, 16, 32, 32) < 0.5).float().requires_grad_()

    owned, grad = backward_peak(lambda: run_planned(net, (x,), {}, codec="bit"), x, net)
    fn = functools.partial(nn.Sequential.forward, net)
    held, held_grad = backward_peak(lambda: run_region((net,), fn, (x,), {}, RegionOptions(codec="bit")), x, net)
    assert torch.equal(grad, held_grad)
    # The peak is the recompute's second output (1 MiB); a caller holding the input adds it (256 KiB).
    assert held - owned == x.nbytes


def test_a_chunked_sequential_with_batchnorm_lets_go_of_each_chunks_decoded_input(monkeypatch):
    """The main and statistics passes hand a chunk's decoded input on as the chain's own, too."""
    import memoplan.runtime.region_function as region

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(16, 1, 1, bias=False), nn.BatchNorm2d(1), nn.Conv2d(1, 64, 1, bias=False))
    x = (torch.rand(4, 16, 32, 32) < 0.5).float().requires_grad_()

    def run():
        return run_planned(net, (x,), {}, codec="bit", chunks=2, dim=0)

    owned, grad = backward_peak(run, x, net)
    monkeypatch.setattr(region.WithStatistics, "run_owned", lambda self, box, kwargs: self(box.pop(), **kwargs))
    held, held_grad = backward_peak(run, x, net)
    assert torch.equal(grad, held_grad)
    # Held by the caller, a chunk's decoded input (128 KiB) is alive at the peak too.
    assert held - owned == x.nbytes // 2


def test_the_statistics_and_main_passes_keep_one_payload_per_chunk(monkeypatch):
    """Both passes read the same chunk of the input: it is encoded once and its payload kept once."""
    import memoplan.runtime.region_function as region

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(16, 4, 1, bias=False), nn.BatchNorm2d(4))
    x = (torch.rand(4, 16, 32, 32) < 0.5).float().requires_grad_()

    def after_forward() -> tuple[int, torch.Tensor, torch.Tensor]:
        x.grad = None
        net.zero_grad(set_to_none=True)
        with LiveStorageMeter() as meter:
            y = run_planned(net, (x,), {}, codec="bit", chunks=2, dim=0)
            live = meter.current_bytes - y.nbytes
        y.backward(torch.ones_like(y))
        return live, y.detach(), x.grad.clone()

    shared, y, grad = after_forward()
    monkeypatch.setattr(region._Run, "encode", region._Run._encode)
    twice, y_twice, grad_twice = after_forward()
    assert torch.equal(y, y_twice) and torch.equal(grad, grad_twice)
    # Encoded in each pass, the two chunks' bits (16 KiB each) would be kept twice.
    assert twice - shared == 2 * (x.numel() // 2 // 8)


def test_a_state_output_nobody_differentiates_gets_no_zero_gradient(monkeypatch):
    """The neuron's new state is an output of the region; unused, its gradient stays None, not zeros."""
    import memoplan.runtime.region_function as region

    torch.manual_seed(0)
    lif = LIF(threshold=0.5)
    x = torch.randn(4, 4096, requires_grad=True)
    fn = functools.partial(LIF.forward, lif)

    def run():
        lif.reset()
        return run_region((lif,), fn, (x,), {}, RegionOptions(), (lif,))

    peak, grad = backward_peak(run, x, lif)
    original = region._RegionFunction.forward

    def materializing(ctx, run, *inputs):
        outputs = original(ctx, run, *inputs)
        ctx.set_materialize_grads(True)
        return outputs

    monkeypatch.setattr(region._RegionFunction, "forward", staticmethod(materializing))
    zeros_peak, zeros_grad = backward_peak(run, x, lif)
    assert torch.equal(grad, zeros_grad)
    assert zeros_peak - peak == lif.v.nbytes  # a zero gradient for the state (16 KiB)
