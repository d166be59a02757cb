"""The `dtr` block: dynamic eviction at run time, equivalent bit for bit and within its threshold.

Property tests draw small models (BatchNorm, Dropout, stateful neurons, keyword arguments, a
block called twice) and thresholds from "evict nothing" to "evict everything"; several
training steps of the planned model must equal the unplanned model's: outputs, gradients,
buffers, RNG state and neuron state.  The bound is checked against the live-storage meter.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
from _profiles import n_examples  # tests/_profiles.py: the hypothesis profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import memoplan
from memoplan import cli, neurons
from memoplan.compare import compare
from memoplan.diagnostics import PlanError
from memoplan.measure import LiveStorageMeter
from memoplan.runtime.dtr import DTR_ATTR

WIDTH = 8
BATCH = 6


class Dense(nn.Module):
    """Linear, BatchNorm, GELU, Dropout; a keyword argument scales its output."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width), nn.GELU(), nn.Dropout(0.3))

    def forward(self, x, *, scale=1.0, shift=None):
        y = self.seq(x) * scale
        return y if shift is None else y + shift


class Spiking(nn.Module):
    """A Linear into a stateful LIF neuron over a time axis (dim 0), with a surrogate gradient."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.lif = neurons.LIF(threshold=0.3)

    def forward(self, x, *, scale=1.0, shift=None):
        return self.lif(self.fc(x).unsqueeze(0).expand(3, -1, -1)).mean(0) * scale + x


class Net(nn.Module):
    def __init__(self, kinds: list[str], twice: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Dense() if k == "dense" else Spiking() for k in kinds)
        self.twice = twice
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x, shift=None):
        for i, block in enumerate(self.blocks):
            x = block(x, scale=0.5 + i, shift=shift)
        if self.twice:
            x = self.blocks[0](x, scale=2.0)  # a block called a second time in the step
        return self.head(x)


def _plan(threshold: int, minimum: int = 0, memory: float = 1.0, time: float = 1.0) -> str:
    return (
        "memplan 1\n"
        f"dtr {{ eviction_threshold = {threshold} B; evictee_minimum_size = {minimum} B; "
        f"recomp_memory_factor = {memory}; recomp_time_factor = {time} }}\n"
    )


def _state(model: nn.Module) -> dict:
    return {name: m.v for name, m in model.named_modules() if isinstance(m, neurons.LIF)}


def _step(model: nn.Module, x: torch.Tensor, shift: torch.Tensor, seed: int):
    torch.manual_seed(seed)
    call = model
    model = getattr(model, "_orig_mod", model)  # a compiled model's names are its module's
    neurons.reset(model)
    out = call(x, shift=shift)
    (out.square().sum() + out.sum()).backward()
    result = {
        "outputs": out.detach(),
        "gradients": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        "buffers": {n: b.clone() for n, b in model.named_buffers()},
        "rng": torch.get_rng_state(),
        "state": {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in _state(model).items()},
        "input gradient": x.grad.clone(),
    }
    for p in model.parameters():
        p.grad = None
    x.grad = None
    return result


def _same(reference: nn.Module, planned: nn.Module, steps: int, seed: int) -> None:
    for step in range(steps):
        generator = torch.Generator().manual_seed(seed + step)
        x = torch.randn(BATCH, WIDTH, generator=generator).requires_grad_()
        shift = torch.randn(WIDTH, generator=generator)
        before = _step(reference, x, shift, seed + step)
        after = _step(planned, x, shift, seed + step)
        for name in before:
            check = compare(name, {name: before[name]}, {name: after[name]}, 0.0)
            assert check.equal and not check.within, (step, check.differences[:3])


@st.composite
def cases(draw):
    kinds = draw(st.lists(st.sampled_from(["dense", "spiking"]), min_size=1, max_size=4))
    twice = draw(st.booleans())
    # From 1 byte (evict everything it may) to far above the saved bytes (evict nothing).
    threshold = draw(st.sampled_from([1, 512, 2048, 4096, 8192, 1 << 40]))
    memory = draw(st.sampled_from([0.0, 1.0, 2.0]))
    time = draw(st.sampled_from([0.0, 1.0, 0.5]))
    return kinds, twice, threshold, memory, time, draw(st.integers(0, 2**16))


@settings(max_examples=n_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_training_with_dtr_equals_unplanned_bit_for_bit(case):
    kinds, twice, threshold, memory, time, seed = case
    torch.manual_seed(seed)
    reference = Net(kinds, twice)
    planned = memoplan.apply(copy.deepcopy(reference), _plan(threshold, 0, memory, time))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # MP430 when 1 byte cannot be met
        _same(reference, planned, steps=3, seed=seed)
    stats = memoplan.dtr_stats(planned)
    if threshold == 1 << 40:
        assert stats.evictions == stats.recomputes == 0
    if threshold == 1:
        assert stats.evictions > 0 and stats.recomputes > 0


def test_the_threshold_holds_at_every_boundary_as_the_meter_measures_it():
    """At every block boundary, the meter's live bytes are exactly what the tracker holds
    (plus the block's output when it holds no part of it), and that is within the threshold.

    The blocks have no parameters outside them and the root runs nothing else, so every
    activation alive at a boundary is the tracker's or the output on its way to the next block."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)) for _ in range(6)]
    model = nn.Sequential(*blocks)
    threshold = 300_000
    planned = memoplan.apply(copy.deepcopy(model), _plan(threshold, 1024))
    tracker = planned.__dict__[DTR_ATTR]
    x = torch.randn(128, 64)
    seen = []

    def boundary(module, args, output):
        held = tracker.owners()
        own = output.untyped_storage()
        extra = 0 if own.data_ptr() in held else own.nbytes()
        # The meter sees what ops allocate: not the example, made before it, nor the RNG states
        # the tracker keeps for its recomputes (torch.get_rng_state() is no op).
        before = x.untyped_storage().nbytes() + sum(c.cpu_rng.untyped_storage().nbytes() for c in tracker.live_calls())
        seen.append((meter.current_bytes, tracker.total() - before + extra, tracker.total()))

    for block in planned:
        block.register_forward_hook(boundary)
    with LiveStorageMeter() as meter:
        planned(x).sum().backward()
    assert len(seen) == 6
    for measured, expected, total in seen:
        assert measured == expected
        assert total <= threshold
    stats = memoplan.dtr_stats(planned)
    assert stats.evictions > 0 and stats.over_threshold == 0 and stats.tracked_peak <= threshold

    with LiveStorageMeter() as unplanned:
        model(x).sum().backward()
    assert meter.peak_bytes < unplanned.peak_bytes


def test_a_threshold_above_everything_evicts_nothing_and_keeps_what_autograd_keeps():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 32)) for _ in range(4)])
    planned = memoplan.apply(copy.deepcopy(model), _plan(1 << 40))
    x = torch.randn(16, 32)
    with LiveStorageMeter() as a:
        model(x).sum().backward()
    with LiveStorageMeter() as b:
        planned(x).sum().backward()
    stats = memoplan.dtr_stats(planned)
    assert stats.evictions == 0 and stats.recomputes == 0
    rng_states = 4 * torch.get_rng_state().nbytes  # the states a recompute would replay
    assert b.peak_bytes <= a.peak_bytes + rng_states


def test_threshold_that_cannot_be_met_warns_once_and_verify_fails(tmp_path, capsys):
    torch.manual_seed(0)
    model = Net(["dense", "dense"], False)
    planned = memoplan.apply(copy.deepcopy(model), _plan(1))
    with pytest.warns(RuntimeWarning, match="MP430") as seen:
        planned(torch.randn(BATCH, WIDTH)).sum().backward()
    assert [w.filename for w in seen] == [__file__]  # the user's line, not torch's module.py
    assert memoplan.dtr_stats(planned).over_threshold > 0

    plan = tmp_path / "p.memplan"
    plan.write_text(
        'memplan 1\nmodel "memoplan.examples.transformer:build"\nexample "memoplan.examples.transformer:example"\n'
        "dtr {\n  eviction_threshold = 1 KiB\n}\n"
    )
    assert cli.main(["verify", str(plan)]) == 1
    out, err = capsys.readouterr()
    assert "verdict: EQUIVALENT" in out and "dtr: " in out
    assert f"{plan}:4:1: error[MP231]" in err


def test_verify_prints_what_dtr_did(tmp_path, capsys):
    plan = tmp_path / "p.memplan"
    plan.write_text(
        'memplan 1\nmodel "memoplan.examples.transformer:build"\nexample "memoplan.examples.transformer:example"\n'
        "dtr {\n  eviction_threshold = 1 MiB\n  evictee_minimum_size = 1 KiB\n}\n"
    )
    assert cli.main(["verify", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "verdict: EQUIVALENT" in out
    line = next(line for line in out.splitlines() if line.startswith("dtr: "))
    assert "eviction" in line and "recompute" in line and "of a 1048576 B threshold" in line


def test_explain_lists_the_candidates_and_why_others_are_left_out():
    plan = "memplan 1\nmodule blocks.1 { checkpoint }\nmodule blocks.2.attn.qkv { keep }\ndtr { eviction_threshold = 1 MiB }\n"
    from memoplan.examples import transformer

    rows = {row.path: dict(row.decisions) for row in memoplan.explain(memoplan.parse(plan), transformer.build())}
    assert "outermost container" in rows["blocks.0"]["dtr candidate"]
    assert "blocks.3" in rows and "dtr candidate" in rows["blocks.3"]
    assert "own rule (line 2)" in rows["blocks.1"]["not a dtr candidate"]
    assert "inside it has a rule (line 3)" in rows["blocks.2"]["not a dtr candidate"]
    resolved = memoplan.resolve(memoplan.parse(plan), transformer.build())
    assert [m.path for m in resolved.modules if m.evict] == ["blocks.0", "blocks.3"]


def test_remove_copy_and_pickle():
    torch.manual_seed(0)
    model = Net(["dense", "spiking"], True)
    keys = list(model.state_dict())
    planned = memoplan.apply(copy.deepcopy(model), _plan(64))
    assert list(planned.state_dict()) == keys
    copied = copy.deepcopy(planned)
    assert copied.__dict__[DTR_ATTR] is not planned.__dict__[DTR_ATTR]
    assert copied.blocks[0].__dict__[DTR_ATTR] is copied.__dict__[DTR_ATTR]
    loaded = pickle.loads(pickle.dumps(planned))
    for other in (copied, loaded):
        _same(copy.deepcopy(model), other, steps=2, seed=3)
        assert memoplan.dtr_stats(other).evictions > 0
    memoplan.remove(planned)
    assert not any(DTR_ATTR in m.__dict__ or "forward" in m.__dict__ for m in planned.modules())
    with pytest.raises(ValueError, match="no `dtr` block"):
        memoplan.dtr_stats(planned)


def test_eval_and_no_grad_run_the_plain_forward():
    torch.manual_seed(0)
    model = Net(["dense"], False).eval()
    planned = memoplan.apply(copy.deepcopy(model), _plan(1))
    x = torch.randn(BATCH, WIDTH)
    with torch.no_grad():
        assert torch.equal(model(x), planned(x))
    assert memoplan.dtr_stats(planned).candidates == 0


class _SinExp(nn.Module):
    def forward(self, x):
        return torch.sin(x).exp()  # sin saves its input, exp its output (evictable)


@pytest.mark.parametrize("threshold,code", [(1, "MP431"), (1 << 40, "MP434")])
def test_an_input_changed_in_place_after_the_forward_is_an_error_not_a_wrong_gradient(threshold, code):
    """Autograd refuses a saved tensor changed in place; so does a planned model, evicted (its
    recompute would start from the changed input) or not (the hooks turn autograd's check off)."""
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Sequential(_SinExp()))
    planned = memoplan.apply(copy.deepcopy(model), _plan(threshold))
    for m, error in ((model, "modified by an inplace operation"), (planned, code)):
        x = torch.randn(4, 8)
        h = m[0](x)
        y = m[1](h)
        with torch.no_grad():
            h.add_(1)  # the input block 1 saved, changed after its forward
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with pytest.raises(RuntimeError, match=error):
                y.sum().backward()


def test_under_torch_compile_candidates_become_a_static_checkpoint_choice():
    """A compiled graph calls no saved-tensor hook: the candidates are traced, checkpointed as the
    dtr simulator chooses (every one before an eager step measured them), said once (MP418).

    ``aot_eager``: PyTorch's ``backend="eager"`` gets checkpoint over BatchNorm and Dropout wrong,
    plan or not (tests/runtime/test_compile.py pins it); a checkpointed candidate inherits that."""
    backend = "aot_eager"
    torch.manual_seed(0)
    model = Net(["dense", "dense"], False)
    planned = memoplan.apply(copy.deepcopy(model), _plan(64))
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _same(copy.deepcopy(model), torch.compile(planned, backend=backend), steps=2, seed=1)
    said = [str(w.message) for w in caught if "MP418" in str(w.message)]
    assert len(said) == 1 and "2 of 2 checkpointed (`blocks.0`, `blocks.1`)" in said[0], said
    assert "no eager training step has measured them" in said[0]
    assert memoplan.dtr_stats(planned).candidates == 0  # nothing ran through the tracker
    torch._dynamo.reset()


def test_under_torch_compile_an_eager_step_first_gives_the_simulators_choice():
    from memoplan.runtime.evictable import compile_choice

    torch.manual_seed(0)
    model = Net(["dense", "dense", "dense"], False)
    x = torch.randn(BATCH, WIDTH)
    for threshold, expected in ((1 << 40, set()), (1, {"blocks.0", "blocks.1", "blocks.2"})):
        planned = memoplan.apply(copy.deepcopy(model), _plan(threshold))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            planned(x.clone().requires_grad_()).sum().backward()
        stats = memoplan.dtr_stats(planned)
        chosen, reason = compile_choice(planned.__dict__[DTR_ATTR])
        assert set(chosen) == expected and "the last eager step measured" in reason
        assert (stats.evictions > 0) == bool(expected)


def test_a_recompute_that_saves_different_tensors_is_an_error():
    class Flaky(nn.Module):
        calls = 0

        def forward(self, x):
            Flaky.calls += 1
            return torch.tanh(x) if Flaky.calls == 1 else torch.tanh(torch.sigmoid(x))

    model = nn.Sequential(nn.Sequential(Flaky()), nn.Sequential(nn.Linear(4, 4)))
    planned = memoplan.apply(model, _plan(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(RuntimeError, match="MP433"):
            planned(torch.randn(2, 4, requires_grad=True)).sum().backward()


def test_bad_dtr_blocks_change_nothing():
    model = Net(["dense"], False)
    with pytest.raises(PlanError) as caught:
        memoplan.apply(model, "memplan 1\ndtr { evictee_minimum_size = 1 KiB }\n")
    assert caught.value.errors[0].code.startswith("MP2")
    assert not any("forward" in m.__dict__ or DTR_ATTR in m.__dict__ for m in model.modules())


def test_the_modules_key_names_the_candidates():
    from memoplan.examples import transformer

    text = 'memplan 1\ndtr {\n  eviction_threshold = 1 KiB\n  modules = "blocks.*.mlp"\n}\n'
    resolved = memoplan.resolve(memoplan.parse(text), transformer.build())
    assert [m.path for m in resolved.modules if m.evict] == [f"blocks.{i}.mlp" for i in range(4)]
    for selector, words in (
        ("blocks.*.mlpp", "matches no module"),
        ("blocks.[", "is not a selector"),
        ("blocks.**", "inside it"),
    ):
        bad = text.replace("blocks.*.mlp", selector)
        model = transformer.build()
        with pytest.raises(PlanError) as caught:
            memoplan.apply(model, bad)
        (error,) = caught.value.errors
        assert error.code == "MP232" and words in error.message and error.span.line == 4
        assert not any("forward" in m.__dict__ for m in model.modules())


def test_tensor_only_candidates_without_buffers_evict_and_recompute_bit_for_bit():
    """The eager fast paths (no pytree walk for tensor-only calls, no buffer snapshot for a
    candidate without buffers, pinned saved tensors not counted twice) keep dropout's masks,
    the gradients and the tracked bytes those of the full bookkeeping."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Dropout(0.3)) for _ in range(3)))
    planned = memoplan.apply(copy.deepcopy(model), _plan(1, memory=1.0).replace("dtr {", 'dtr { modules = "*";'))
    x = torch.randn(BATCH, WIDTH)
    grads = []
    for m in (model, planned):
        torch.manual_seed(3)
        xi = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            m(xi).square().sum().backward()
        grads.append([xi.grad, *(p.grad for p in m.parameters())])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    stats = memoplan.dtr_stats(planned)
    assert stats.recomputes == stats.evictions > 0 and stats.tracked_now == 0
