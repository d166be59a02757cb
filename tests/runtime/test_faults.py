"""Faults while a plan is installed and run: Ctrl-C during ``apply`` leaves nothing half-done, an
error in a recompute says which module was recomputed, and ``apply`` shows its warnings."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

import memoplan
from memoplan import runtime as rt
from memoplan.runtime import pickling
from memoplan.syntax import parse

# the module, not the function ``memoplan.runtime.install`` that the package exports
install_module = importlib.import_module("memoplan.runtime.install")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


LAYERS = 6


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(8, 8) for _ in range(LAYERS)))


def _state(model: nn.Module) -> dict[str, dict[str, tuple[int, int | None]]]:
    """Every module's instance attributes, by identity, with the size of its dicts (hooks)."""
    return {
        name: {key: (id(value), len(value) if isinstance(value, dict) else None) for key, value in vars(m).items()}
        for name, m in model.named_modules()
    }


PLAN = "memplan 1\nmodule * : Linear { checkpoint }\n"


class _Interrupt:
    """Raise KeyboardInterrupt at the ``at``-th call (0-based) of a wrapped function."""

    def __init__(self, function, at: int) -> None:
        self.function, self.at, self.calls = function, at, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls - 1 == self.at:
            raise KeyboardInterrupt
        return self.function(*args, **kwargs)


def _after(function, at: int):
    """Raise KeyboardInterrupt just *after* the ``at``-th call of ``function`` did its work."""
    calls = [0]

    def wrapped(*args, **kwargs):
        result = function(*args, **kwargs)
        calls[0] += 1
        if calls[0] - 1 == at:
            raise KeyboardInterrupt
        return result

    return wrapped


def _assert_untouched_then_usable(model: nn.Module, before, plan: str = PLAN) -> None:
    assert _state(model) == before
    assert rt.installed_plan(model) is None
    memoplan.remove(model)  # a no-op, and no error
    assert _state(model) == before
    x = torch.randn(3, 8)
    expected = model(x)
    memoplan.apply(model, parse(plan))  # applying again works: no MP403
    assert rt.installed_plan(model) is not None
    assert torch.equal(model(x), expected)
    memoplan.remove(model)
    assert _state(model) == before


class _Refusing(nn.Linear):
    """A module whose ``__setattr__`` is interrupted while the plan sets its forward."""

    interrupt_at: int | None = None
    seen = 0

    def __setattr__(self, name, value):
        if name == "forward":
            index = type(self).seen
            type(self).seen += 1
            if index == type(self).interrupt_at:
                raise KeyboardInterrupt
        super().__setattr__(name, value)


@pytest.mark.parametrize("at", range(LAYERS))
def test_ctrl_c_while_a_forward_is_set_rolls_back_every_module(at, monkeypatch):
    model = nn.Sequential(*(_Refusing(8, 8) for _ in range(LAYERS)))
    before = _state(model)
    monkeypatch.setattr(_Refusing, "interrupt_at", at)
    monkeypatch.setattr(_Refusing, "seen", 0)
    with pytest.raises(KeyboardInterrupt):
        memoplan.apply(model, parse("memplan 1\nmodule * : _Refusing { checkpoint }\n"))
    assert _Refusing.seen == at + 1  # it was interrupted at that module, not before
    monkeypatch.setattr(_Refusing, "interrupt_at", None)
    _assert_untouched_then_usable(model, before, "memplan 1\nmodule * : _Refusing { checkpoint }\n")


@pytest.mark.parametrize("at", range(LAYERS))
def test_ctrl_c_after_a_module_is_patched_rolls_back_every_module(at, monkeypatch):
    model = _model()
    before = _state(model)
    monkeypatch.setattr(pickling, "register", _after(pickling.register, at))
    with pytest.raises(KeyboardInterrupt):
        memoplan.apply(model, parse(PLAN))
    monkeypatch.undo()
    _assert_untouched_then_usable(model, before)


def test_ctrl_c_before_the_plan_is_recorded_rolls_back(monkeypatch):
    model = _model()
    before = _state(model)

    class Interrupted(install_module.InstalledPlan):
        def __init__(self, *args, **kwargs):
            raise KeyboardInterrupt

    monkeypatch.setattr(install_module, "InstalledPlan", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        memoplan.apply(model, parse(PLAN))
    monkeypatch.undo()
    _assert_untouched_then_usable(model, before)


@pytest.mark.parametrize("error", [SystemExit(2), GeneratorExit()], ids=["SystemExit", "GeneratorExit"])
def test_any_base_exception_is_rolled_back_and_re_raised_as_it_was(error, monkeypatch):
    model = _model()
    before = _state(model)

    def raising(function):
        raise error

    monkeypatch.setattr(pickling, "register", raising)
    with pytest.raises(type(error)) as caught:
        memoplan.apply(model, parse(PLAN))
    assert caught.value is error
    monkeypatch.undo()
    _assert_untouched_then_usable(model, before)


def test_ctrl_c_after_the_memory_block_is_in_place_rolls_it_back(monkeypatch):
    model = _model()
    before = _state(model)
    monkeypatch.setattr(install_module, "install_memory", _after(install_module.install_memory, 0))
    with pytest.raises(KeyboardInterrupt):
        memoplan.apply(model, parse(PLAN + "memory { atomic_clean_policy = 0 }\n"))
    monkeypatch.undo()
    assert not model._forward_pre_hooks
    _assert_untouched_then_usable(model, before)


ARENA_PLAN = "memplan 1\nexample randn(3, 8)\nmemonger { algo = greedy; ordering = topological }\n"


GPT2_TARGETS = (
    "memplan 1\nmodule transformer.h.*.attn.* { checkpoint }\nmodule transformer.h.*.mlp.* { checkpoint }\n"
    "module transformer.h.*.ln_* { checkpoint }\nmodule lm_head { checkpoint }\n"
)


def test_ctrl_c_at_every_module_of_a_hugging_face_apply(monkeypatch):
    """The issue's case: an interrupted apply of a real model, at each of its patched modules."""
    pytest.importorskip("transformers")
    from real_models import gpt2

    torch.manual_seed(0)
    model = gpt2().eval()
    resolved = memoplan.resolve(parse(GPT2_TARGETS), model)
    count = len(resolved.modules)
    assert count == 21
    before = _state(model)
    tokens = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        expected = model(tokens).logits
    register = pickling.register
    for at in range(count):
        monkeypatch.setattr(pickling, "register", _after(register, at))
        with pytest.raises(KeyboardInterrupt):
            memoplan.apply(model, resolved)
        monkeypatch.setattr(pickling, "register", register)
        assert _state(model) == before, f"interrupted at module {at + 1} of {count}"
        assert rt.installed_plan(model) is None
    memoplan.apply(model, resolved)  # no MP403: nothing was left behind
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, expected)
    memoplan.remove(model)
    assert _state(model) == before


class _ArenaHost(nn.Sequential):
    """Interrupted while its forward is set: before (``"before"``) or after (``"after"``) storing it."""

    interrupt: str | None = None

    def __setattr__(self, name, value):
        if name == "forward" and type(self).interrupt == "before":
            raise KeyboardInterrupt
        super().__setattr__(name, value)
        if name == "forward" and type(self).interrupt == "after":
            raise KeyboardInterrupt


@pytest.mark.parametrize("position", ["before", "after", "recording", "registering"])
def test_ctrl_c_while_the_memonger_arena_is_installed_rolls_back(position, monkeypatch):
    from memoplan.runtime import arena

    torch.manual_seed(0)
    model = _ArenaHost(*(nn.Linear(8, 8) for _ in range(LAYERS))).eval()
    before = _state(model)
    if position == "registering":
        monkeypatch.setattr(pickling, "register", _Interrupt(pickling.register, 0))
    elif position == "recording":

        class Interrupted(arena.ArenaState):
            def __init__(self, *args, **kwargs):
                raise KeyboardInterrupt

        monkeypatch.setattr(arena, "ArenaState", Interrupted)
    else:
        monkeypatch.setattr(_ArenaHost, "interrupt", position)
    with pytest.raises(KeyboardInterrupt):
        memoplan.apply(model, parse(ARENA_PLAN))
    monkeypatch.undo()
    assert _state(model) == before and arena.arena_state(model) is None
    memoplan.apply(model, parse(ARENA_PLAN))
    assert arena.arena_state(model) is not None
    memoplan.remove(model)
    assert _state(model) == before


# ---------------------------------------------------------------- an error in a recompute


class _Odd(ValueError):
    """The user's own exception type: it must come out as itself."""


class _FailsOnSecondCall(nn.Module):
    """Works in the forward, raises when the plan runs it again in backward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 2:
            raise _Odd("the second call fails")
        return torch.tanh(self.linear(x))


RECOMPUTED = [
    ("checkpoint", "memplan 1\nmodule 1 { checkpoint }\n", "`1` (a checkpointed region)"),
    ("region", "memplan 1\nmodule 1 { checkpoint; compress input = auto }\n", "`1` (a memoplan region)"),
    (
        "dtr",
        "memplan 1\ndtr { eviction_threshold = 1 B; evictee_minimum_size = 0 B }\n",
        "`1` (an evicted dtr candidate)",
    ),
]


@pytest.mark.parametrize("text,named", [case[1:] for case in RECOMPUTED], ids=[case[0] for case in RECOMPUTED])
def test_an_error_in_a_recompute_names_the_module_and_keeps_its_type(text, named):
    import warnings

    from memoplan.runtime.recompute import RECOMPUTE_NOTE

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), _FailsOnSecondCall(), nn.Linear(4, 4))
    planned = memoplan.apply(model, parse(text))
    x = torch.randn(2, 4, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        y = planned(x)
        with pytest.raises(_Odd) as caught:
            y.sum().backward()
    assert type(caught.value) is _Odd and str(caught.value) == "the second call fails"
    notes = [note for note in getattr(caught.value, "__notes__", []) if note.startswith(RECOMPUTE_NOTE)]
    assert len(notes) == 1, caught.value.__notes__ if hasattr(caught.value, "__notes__") else None
    assert named in notes[0] and "in backward" in notes[0]
    assert model[1].calls == 2  # the forward ran, then the recompute raised


def test_an_error_in_the_forward_itself_gets_no_recompute_note():
    model = nn.Sequential(nn.Linear(4, 4), _FailsOnSecondCall())
    model[1].calls = 1  # the forward call is the failing one
    planned = memoplan.apply(model, parse("memplan 1\nmodule 1 { checkpoint }\n"))
    with pytest.raises(_Odd) as caught:
        planned(torch.randn(2, 4, requires_grad=True))
    assert not getattr(caught.value, "__notes__", None)


# ---------------------------------------------------------------- apply shows its warnings


def _gpt2():
    pytest.importorskip("transformers")
    from real_models import gpt2

    torch.manual_seed(0)
    return gpt2()


GPT2_PLAN = "memplan 1\n# checkpoint every block\nmodule transformer.h.* { checkpoint }\n"


def _enable(model) -> None:
    """Turn the model's own (Hugging Face) gradient checkpointing on, as the Trainer does."""
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()


def _mp322(caught) -> list:
    return [w for w in caught if issubclass(w.category, memoplan.MemoplanWarning) and w.message.code == "MP322"]


def _train_step(model) -> None:
    model.train()
    model(torch.randint(0, 128, (2, 16))).logits.square().mean().backward()


def test_apply_emits_the_plans_warnings_as_a_filterable_category():
    import warnings

    assert issubclass(memoplan.MemoplanWarning, UserWarning)
    model = _gpt2()
    _enable(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        memoplan.apply(model, parse(GPT2_PLAN, "gpt2.memplan"))
    (warning,) = _mp322(caught)
    assert str(warning.message).startswith("gpt2.memplan:3:")
    assert "warning[MP322]" in str(warning.message) and "`transformer.h.0` and 1 more" in str(warning.message)
    assert warning.filename == __file__  # it points at the caller's apply
    memoplan.remove(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=memoplan.MemoplanWarning)
        memoplan.apply(model, parse(GPT2_PLAN, "gpt2.memplan"))
    assert not _mp322(caught)  # users can silence them by category
    memoplan.remove(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        memoplan.apply(model, parse(GPT2_PLAN, "gpt2.memplan"), warn=False)
    assert not _mp322(caught)
    memoplan.remove(model)
    before = _state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", memoplan.MemoplanWarning)  # `-W error::memoplan.MemoplanWarning`
        with pytest.raises(memoplan.MemoplanWarning):
            memoplan.apply(model, parse(GPT2_PLAN, "gpt2.memplan"))
    assert _state(model) == before and rt.installed_plan(model) is None  # raised before anything changed


def test_hf_checkpointing_turned_on_after_apply_is_warned_once_at_the_first_training_forward():
    import warnings

    model = _gpt2()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        memoplan.apply(model, parse(GPT2_PLAN, "gpt2.memplan"))
        _enable(model)  # what the HF Trainer does in train()
        model.eval()
        with torch.no_grad():
            model(torch.randint(0, 128, (2, 16)))  # not a training forward: nothing recomputed yet
        assert not _mp322(caught)
        _train_step(model)
        _train_step(model)
    (warning,) = _mp322(caught)
    assert "turned on after the plan was applied" in str(warning.message)
    assert str(warning.message).startswith("gpt2.memplan:3:")
    assert "`activation_checkpointing=False`" in warning.message.diagnostic.help  # transformers 5's argument
    # at the user's line (the forward in _train_step), not torch's module.py that runs the hook
    assert (warning.filename, warning.lineno) == (__file__, _train_step.__code__.co_firstlineno + 2)


def test_no_late_warning_without_hf_checkpointing_and_remove_takes_the_watch_away():
    import warnings

    model = _gpt2()
    hooks = dict(model._forward_pre_hooks)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        memoplan.apply(model, parse(GPT2_PLAN, "gpt2.memplan"))
        _train_step(model)
        _enable(model)  # after the first training forward: the check is done
        _train_step(model)
    assert not _mp322(caught)
    memoplan.remove(model)
    assert dict(model._forward_pre_hooks) == hooks
    assert not any(key.startswith("_memoplan") for key in vars(model))


def test_a_watched_model_deep_copies_and_pickles_with_its_own_watch():
    import copy
    import io
    import warnings

    model = memoplan.apply(_gpt2(), parse(GPT2_PLAN, "gpt2.memplan"))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for clone in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        _enable(clone)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _train_step(clone)
        assert len(_mp322(caught)) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train_step(model)  # the original's own checkpointing is still off
    assert not _mp322(caught)


class _ChunkedFailsOnCall(nn.Module):
    """Linear then a LIF neuron over (T, B, F); its ``fail_at``-th call raises."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        from memoplan.neurons import LIF

        self.fc = nn.Linear(4, 4)
        self.lif = LIF(threshold=0.3)
        self.calls, self.fail_at = 0, fail_at

    def forward(self, x):
        self.calls += 1
        if self.calls == self.fail_at:
            raise _Odd("the second call fails")
        return self.lif(self.fc(x))


@pytest.mark.parametrize(
    "fail_at,named",
    [(3, "(a time chunk replayed for the state it ended with)"), (4, "(a memoplan region)")],
    ids=["replay", "chunk-recompute"],
)
def test_an_error_while_time_chunks_are_replayed_or_recomputed_is_named(fail_at, named):
    """Chunks 1 and 2 run forward (calls 1, 2); chunk 2's backward first replays chunk 1 for the
    state chunk 2 starts from (call 3), then recomputes chunk 2 (call 4)."""
    from memoplan.neurons import reset
    from memoplan.runtime.recompute import RECOMPUTE_NOTE

    torch.manual_seed(0)
    model = nn.Sequential(_ChunkedFailsOnCall(fail_at))
    text = "memplan 1\nmodule class LIF { state = functional }\nmodule 0 { temporal_chunk 2 dim 0 boundaries = recompute }\n"
    memoplan.apply(model, parse(text))
    reset(model)
    y = model(torch.randn(8, 2, 4, requires_grad=True))
    with pytest.raises(_Odd) as caught:
        y.sum().backward()
    notes = [note for note in getattr(caught.value, "__notes__", []) if note.startswith(RECOMPUTE_NOTE)]
    assert len(notes) == 1 and f"`0` {named}" in notes[0], getattr(caught.value, "__notes__", None)
    assert model[0].calls == fail_at
