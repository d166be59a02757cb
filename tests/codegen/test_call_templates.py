"""Generated calls come from templates only (issue 41): one template per kind of call under
memoplan/codegen/templates/calls/, the same text the f-strings they replaced wrote (the goldens check
whole modules byte for byte; this checks every kind, and its options, one call at a time)."""

from __future__ import annotations

import ast
import importlib
from types import SimpleNamespace

import pytest
from _paths import ROOT

from memoplan.codegen.names import NameAllocator
from memoplan.enums import Boundaries

emit_module = importlib.import_module("memoplan.codegen.emit")
CALLS = ROOT / "memoplan" / "codegen" / "templates" / "calls"

BASE = dict(
    groups=None,
    preserve_rng=True,
    codec=None,
    validate="sample",
    tolerance=None,
    stateful=(),
    chunks=None,
    dim=0,
    chunk_args=(0,),
    boundaries=Boundaries.KEEP,
)

CASES = [
    ({}, "checkpoint", "_rt.run_checkpointed(self, type(self).forward, args, kwargs, preserve_rng=True)"),
    (
        {"preserve_rng": False, "save": ("matmul",)},
        "checkpoint_rng_off_saving_matmul",
        "_rt.run_checkpointed(self, type(self).forward, args, kwargs, preserve_rng=False, save=('matmul',))",
    ),
    (
        {"groups": (("a",), ("b", "c")), "save": ("matmul",)},
        "checkpoint_regions_2_saving_matmul",
        "_rt.run_segmented(self, (('a',), ('b', 'c')), args, kwargs, preserve_rng=True, save=('matmul',))",
    ),
    (
        {"groups": (("a",),), "codec": "int8", "tolerance": 0.01, "stateful": ("s",)},
        "checkpoint_regions_1_int8_stateful",
        "_rt.run_segmented(self, (('a',),), args, kwargs, preserve_rng=True, "
        "region=_rt.RegionOptions(codec='int8', validate='sample', tolerance=0.01), stateful=('s',))",
    ),
    (
        {"groups": (("a",),), "stateful": ("s",)},
        "checkpoint_regions_1_stateful",
        "_rt.run_segmented(self, (('a',),), args, kwargs, preserve_rng=True, "
        "region=_rt.RegionOptions(codec='none'), stateful=('s',))",
    ),
    (
        {"codec": "bit", "validate": "always"},
        "checkpoint_bit",
        "_rt.run_planned(self, args, kwargs, codec='bit', validate='always', preserve_rng=True, stateful=())",
    ),
    (
        {"chunks": 4, "dim": 1, "chunk_args": (0, "h"), "boundaries": Boundaries.RECOMPUTE, "stateful": ("x",)},
        "temporal_chunk_4_stateful_recompute",
        "_rt.run_planned(self, args, kwargs, codec='none', preserve_rng=True, stateful=('x',), chunks=4, dim=1, "
        "chunk_args=(0, 'h'), boundaries='recompute')",
    ),
    (
        {"chunks": 2},
        "temporal_chunk_2",
        "_rt.run_planned(self, args, kwargs, codec='none', preserve_rng=True, stateful=(), chunks=2, dim=0, "
        "chunk_args=(0,))",
    ),
]


@pytest.mark.parametrize(("fields", "name", "call"), CASES)
def test_each_call_kind_renders_as_before(fields, name, call):
    wrapper = emit_module._wrapper(emit_module._Policy(**{**BASE, **fields}), ["p"], ["a.memplan:3"], NameAllocator(()))
    assert (wrapper.name, wrapper.call) == (name, call)
    assert "\n" not in wrapper.call
    ast.parse(wrapper.call, mode="eval")


def test_block_settings_render_as_before():
    dtr = SimpleNamespace(eviction_threshold=1000, evictee_minimum_size=0, recomp_memory_factor=1, recomp_time_factor=2)
    for policy, reserve in ((0, None), (2, 4096), (4, 0)):
        memory = SimpleNamespace(static_memory_policy=policy, atomic_clean_policy=1)
        plan = SimpleNamespace(memory=memory, reserve_bytes=reserve, dtr=dtr)
        expected = f"_rt.MemorySettings(static_memory_policy={policy}, atomic_clean_policy=1"
        expected += f", reserve_bytes={reserve})" if policy in (2, 4) else ")"
        assert emit_module._memory_call(plan) == expected
    assert emit_module._dtr_call(plan) == (
        "_rt.DtrSettings(eviction_threshold=1000, evictee_minimum_size=0, recomp_memory_factor=1.0, "
        "recomp_time_factor=2.0)"
    )
    assert emit_module._memory_call(SimpleNamespace(memory=None)) is None
    assert emit_module._dtr_call(SimpleNamespace(dtr=None)) is None


def test_no_generated_call_is_built_in_python():
    """emit.py and arena.py hold no text of generated calls (every `_rt.`, `_arena.` or `torch.ops.`
    call is in a template), and every call template is used."""
    strings = []
    for name in ("emit.py", "arena.py"):
        source = (ROOT / "memoplan" / "codegen" / name).read_text(encoding="utf-8")
        tree = ast.parse(source)
        strings += [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    calls = ("_rt.", "_arena.into", "torch.ops", "out=arena")
    assert not [s for s in strings if any(c in s for c in calls)]
    used = {s for s in strings if s.startswith("calls/")}
    templates = {f"calls/{p.name}" for p in CALLS.glob("*.py.j2") if p.name != "region_options.py.j2"}
    assert used == templates
