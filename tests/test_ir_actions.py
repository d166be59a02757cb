"""A module's IR is one tuple of typed actions in a canonical order; the resolver builds it per
policy type and the code generator dispatches per action type (no optional field per policy)."""

from __future__ import annotations

import typing

import pytest
from _paths import ROOT

from memoplan import ir, load, resolve
from memoplan.codegen.emit import EMITTERS, emit
from memoplan.examples import spiking, transformer
from memoplan.resolver import lower
from memoplan.syntax.policies import POLICIES

ORIGIN = ir.Origin("p.memplan", 3, "block", "written")


def _every_action() -> list[ir.Action]:
    return [
        ir.CheckpointAction(ORIGIN),
        ir.CompressAction(ORIGIN, codec=next(iter(ir.Codec))),
        ir.TemporalChunkAction(ORIGIN, 4, 0),
        ir.StateAction(ORIGIN, next(iter(ir.StateMode))),
        ir.KeepAction(ORIGIN),
        ir.BuffersCommitOnceAction(ORIGIN),
        ir.EvictAction(ORIGIN),
    ]


def test_the_action_union_lists_every_action_type_in_the_canonical_order():
    assert ir.ACTION_TYPES == typing.get_args(ir.Action)
    assert [type(a) for a in _every_action()] == list(ir.ACTION_TYPES)
    assert len({t.kind for t in ir.ACTION_TYPES}) == len(ir.ACTION_TYPES)


def test_a_module_plan_keeps_its_actions_in_the_canonical_order_whatever_it_is_given():
    actions = _every_action()
    forward = ir.ModulePlan("a", "m.A", tuple(actions))
    backward = ir.ModulePlan("a", "m.A", tuple(reversed(actions)))
    assert forward == backward and hash(forward) == hash(backward)
    assert forward.actions == tuple(actions)
    for action in actions:  # the read-only views read the tuple
        assert getattr(forward, action.kind) is forward.action(type(action)) is action
    assert [policy for policy, _ in forward.decisions()][-1] == "dtr (may be evicted)"
    assert [policy for policy, _ in forward.decisions()][:-1] == ["written"] * (len(actions) - 1)


def test_a_module_plan_refuses_two_actions_of_one_type_and_values_that_are_no_action():
    with pytest.raises(ValueError, match="two actions"):
        ir.ModulePlan("a", "m.A", (ir.KeepAction(ORIGIN), ir.KeepAction(ORIGIN)))
    with pytest.raises(TypeError, match="not an IR action"):
        ir.ModulePlan("a", "m.A", (ORIGIN,))  # type: ignore[arg-type]


def test_with_action_adds_or_replaces_one_action():
    plan = ir.ModulePlan("a", "m.A", (ir.StateAction(ORIGIN, next(iter(ir.StateMode))),))
    evicted = plan.with_action(ir.EvictAction(ORIGIN))
    assert [type(a) for a in evicted.actions] == [ir.StateAction, ir.EvictAction] and plan.evict is None
    other = ir.Origin("p.memplan", 9, "block", "keep")
    assert evicted.with_action(ir.EvictAction(other)).evict.origin is other


def test_every_policy_binds_to_an_action_and_every_action_has_an_emitter():
    assert set(lower._ACTIONS) == set(POLICIES)
    assert set(EMITTERS) == set(ir.ACTION_TYPES)


def test_resolved_modules_list_their_actions_in_order():
    s = resolve(load(ROOT / "plans" / "spiking.memplan"), spiking.build())
    block = s.module("blocks.0")
    assert [type(a) for a in block.actions] == [ir.CompressAction, ir.TemporalChunkAction]
    assert [type(a) for a in s.module("blocks.0.lif").actions] == [ir.StateAction]
    d = resolve(load(ROOT / "plans" / "transformer_dtr.memplan"), transformer.build())
    evicted = [m for m in d.modules if m.evict is not None]
    assert evicted and all(isinstance(m.actions[-1], ir.EvictAction) for m in evicted)
    assert all(m.evict.origin.policy == "dtr" and m.evict.written == "dtr (may be evicted)" for m in evicted)


def test_an_action_the_emitter_does_not_know_cannot_slip_through(monkeypatch):
    s = resolve(load(ROOT / "plans" / "spiking.memplan"), spiking.build())
    monkeypatch.delitem(EMITTERS, ir.CompressAction)
    with pytest.raises(KeyError):
        emit(s)
