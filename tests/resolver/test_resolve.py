"""Resolve stage tests: selectors, precedence, legality checks, determinism and explain.

Models are small inline ``nn.Module`` trees (nested Sequential / ModuleList /
ModuleDict, custom classes, shared submodules) plus the bundled examples.
Diagnostics are asserted by code and span, never by wording alone.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from _paths import ROOT
from _profiles import n_examples  # tests/_profiles.py: the hypothesis profile
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from memoplan import ir, parse, resolve
from memoplan.diagnostics import PlanError, Severity
from memoplan.examples import cnn, mlp, spiking, transformer
from memoplan.resolver import explain, render_explain
from memoplan.resolver.bind import analyse
from memoplan.resolver.lower import _groups
from memoplan.resolver.selectors import ModelIndex, Specificity, select, specificity

PLANS = sorted((ROOT / "plans").glob("*.memplan"))


# ---------------------------------------------------------------- models


class Inner(nn.Module):
    """A custom block: conv -> bn -> drop."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 1)
        self.bn = nn.BatchNorm2d(1)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.bn(self.conv(x)))


class SpecialInner(Inner):
    """A subclass: class filters on `Inner` match it too."""


class Tree(nn.Module):
    """a: Sequential(Inner, SpecialInner, ReLU); b: ModuleList of 12 Inner; d: ModuleDict; conv; odd names."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(Inner(), SpecialInner(), nn.ReLU())
        self.b = nn.ModuleList(Inner() for _ in range(12))
        self.d = nn.ModuleDict({"x": Inner(), "y": nn.Dropout()})
        self.conv = nn.Conv2d(1, 1, 1)
        self.add_module("with space", nn.Linear(1, 1))
        self.add_module('q"uote', nn.Linear(1, 1))
        self.add_module("ünï", nn.Linear(1, 1))


def plan_of(body: str, file: str = "t.memplan"):
    return parse("memplan 1\n" + body, file)


def resolved(body: str, model: nn.Module):
    return resolve(plan_of(body), model)


def errors_of(body: str, model: nn.Module) -> PlanError:
    with pytest.raises(PlanError) as info:
        resolved(body, model)
    return info.value


def selected(selector: str, model: nn.Module | None = None) -> list[str]:
    model = model if model is not None else Tree()
    plan = plan_of(f"module {selector} {{ keep }}\n")
    return select(ModelIndex(model), plan.rules[0].selector)


def all_paths(model: nn.Module) -> list[str]:
    return sorted({p for p, _ in model.named_modules(remove_duplicate=False) if p}, key=ir.path_key)


def model_order(model: nn.Module) -> list[str]:
    """Every path in ``named_modules()`` order, the order ``explain`` lists them."""
    return list(dict.fromkeys(p for p, _ in model.named_modules(remove_duplicate=False) if p))


B = [f"b.{i}" for i in range(12)]


# ---------------------------------------------------------------- selectors


@pytest.mark.parametrize(
    "selector, expected",
    [
        # exact paths
        ("a", ["a"]),
        ("a.0.conv", ["a.0.conv"]),
        ("b.10", ["b.10"]),
        ("d.x.bn", ["d.x.bn"]),
        # `*` is exactly one segment
        ("a.*", ["a.0", "a.1", "a.2"]),
        ("*", ["a", "b", "conv", "d", 'q"uote', "with space", "ünï"]),
        ("*.*.conv", ["a.0.conv", "a.1.conv"] + [f"{p}.conv" for p in B] + ["d.x.conv"]),
        ("d.*", ["d.x", "d.y"]),
        # `**` is zero or more segments
        ("**.conv", ["a.0.conv", "a.1.conv"] + [f"{p}.conv" for p in B] + ["conv", "d.x.conv"]),
        ("a.**.bn", ["a.0.bn", "a.1.bn"]),
        ("a.**", ["a", "a.0", "a.0.bn", "a.0.conv", "a.0.drop", "a.1", "a.1.bn", "a.1.conv", "a.1.drop", "a.2"]),
        ("b.1.**", ["b.1", "b.1.bn", "b.1.conv", "b.1.drop"]),
        ("**.x.**.drop", ["d.x.drop"]),
        # `[i]`, negative index and slices over Sequential / ModuleList
        ("a[0]", ["a.0"]),
        ("a[-1]", ["a.2"]),
        ("b[1]", ["b.1"]),
        ("b[-1]", ["b.11"]),
        ("b[-12]", ["b.0"]),
        ("b[2:10:3]", ["b.2", "b.5", "b.8"]),
        ("b[:2]", ["b.0", "b.1"]),
        ("b[10:]", ["b.10", "b.11"]),
        ("b[::-5]", ["b.1", "b.6", "b.11"]),
        ("b[-3:-1]", ["b.9", "b.10"]),
        ("a[0:2].conv", ["a.0.conv", "a.1.conv"]),
        ("b[0:2].*", ["b.0.bn", "b.0.conv", "b.0.drop", "b.1.bn", "b.1.conv", "b.1.drop"]),
        ("**[0]", ["a.0", "b.0"]),
        # class filters: short, qualified (short and full module path), base classes
        ("* : Conv2d", ["conv"]),
        ("** : torch.nn.Conv2d", ["a.0.conv", "a.1.conv"] + [f"{p}.conv" for p in B] + ["conv", "d.x.conv"]),
        (
            "** : torch.nn.modules.batchnorm.BatchNorm2d",
            ["a.0.bn", "a.1.bn"] + [f"{p}.bn" for p in B] + ["d.x.bn"],
        ),
        ("** : _BatchNorm", ["a.0.bn", "a.1.bn"] + [f"{p}.bn" for p in B] + ["d.x.bn"]),
        ("class SpecialInner", ["a.1"]),
        ("class Inner", ["a.0", "a.1"] + B + ["d.x"]),
        ("a.* : Inner", ["a.0", "a.1"]),
        ("class torch.nn.Dropout", ["a.0.drop", "a.1.drop"] + [f"{p}.drop" for p in B] + ["d.x.drop", "d.y"]),
        (f"class {__name__}.SpecialInner", ["a.1"]),
        ("class ModuleDict", ["d"]),
        # `not`
        ("b.* not b[0:10]", ["b.10", "b.11"]),
        ("a.* not class SpecialInner", ["a.0", "a.2"]),
        ("d.** not class Dropout not d.x.*", ["d", "d.x"]),
        ("class Inner not b.*", ["a.0", "a.1", "d.x"]),
        # quoted segments
        ('"with space"', ["with space"]),
        ('"q\\"uote"', ['q"uote']),
        ('"ünï"', ["ünï"]),
        ("ünï", ["ünï"]),
        ('"a"."0"', ["a.0"]),
    ],
)
def test_selector_binds_exactly(selector: str, expected: list[str]) -> None:
    assert selected(selector) == expected


@pytest.mark.parametrize(
    "selector",
    [
        "d[0]",  # ModuleDict has no positions
        "d[0:2]",
        "a.0[0]",  # a custom module's named children have no positions
        "[0]",  # the root is not indexed
        "conv[0]",  # a leaf
        "b[12]",  # out of range
        "b[-13]",
        "b[20:30]",
        "a.3",
        "a.* : Conv2d",
        "class NoSuchClass",
        "class torch.nn.ReLU6",
        "** : nn.modules.Conv2d",  # a qualified name starts at the top-level package
    ],
)
def test_selector_matches_nothing(selector: str) -> None:
    assert selected(selector) == []


def test_root_is_selected_only_by_the_empty_path() -> None:
    model = nn.Sequential(nn.Linear(1, 1), nn.ReLU())
    assert selected("**", model) == ["0", "1"]
    assert selected("[0:2]", model) == ["0", "1"]
    assert selected("class Sequential", model) == []
    assert selected('"" : Linear', model) == []
    assert selected('""', model) == [""]
    assert selected('"" : Sequential', model) == [""]


def test_index_over_root_sequential() -> None:
    model = nn.Sequential(*(nn.Linear(1, 1) for _ in range(11)))
    assert selected("[-1]", model) == ["10"]
    assert selected("[::5]", model) == ["0", "5", "10"]


def test_class_filter_matches_locally_defined_classes() -> None:
    # A class defined in a function has the qualname `factory.<locals>.Local`;
    # a plan can only write its short name.
    class Local(nn.Linear):
        pass

    model = nn.Module()
    model.seq = nn.Sequential(Local(1, 1), nn.Linear(1, 1))
    assert selected("class Local", model) == ["seq.0"]
    assert selected("seq.* : Local", model) == ["seq.0"]
    assert selected(f"class {__name__}.Local", model) == ["seq.0"]
    assert selected("class Linear", model) == ["seq.0", "seq.1"]


def test_unicode_digit_names_are_not_indices() -> None:
    model = nn.Module()
    model.add_module("²", nn.Linear(1, 1))
    model.add_module("1", nn.Linear(1, 1))
    assert selected("*", model) == ["1", "²"]
    assert selected("[0]", model) == []  # "²" is not an integer name, so no positions
    plan = resolved("module * { checkpoint }\n", model)
    assert [m.path for m in plan.modules] == ["1", "²"]


def test_hostile_names_resolve() -> None:
    names = ['q"uote', "back\\slash", "new\nline", "cr\rx", "ls\u2028x", "nul\x00x", "class", "not", "1e5", "L" * 1000]
    model = nn.Module()
    for name in names:
        model.add_module(name, nn.Linear(1, 1))
    plan = resolved("module * { keep }\n", model)
    assert {m.path for m in plan.modules} == set(names)
    for name in names:
        quoted = (
            '"'
            + name.replace("\\", "\\\\")
            .replace('"', '\\"')
            .replace("\n", "\\n")
            .replace("\r", "\\r")
            .replace("\x00", "\\u0000")
            + '"'
        )
        assert selected(quoted, model) == [name], name


def test_index_positions_follow_integer_names_not_registration_order() -> None:
    forward = nn.ModuleList()
    backward = nn.ModuleList()
    layers = [nn.Linear(1, 1) for _ in range(3)]
    for i in (0, 1, 2):
        forward.add_module(str(i), layers[i])
    for i in (2, 0, 1):
        backward.add_module(str(i), layers[i])
    for model in (forward, backward):
        assert selected("[0]", model) == ["0"]
        assert selected("[-1]", model) == ["2"]
        assert selected("[1:]", model) == ["1", "2"]


# ---------------------------------------------------------------- selectors on the bundled models


def test_selectors_on_bundled_models() -> None:
    t = transformer.build()
    assert selected("blocks[-1]", t) == ["blocks.3"]
    assert selected("blocks.* : Block", t) == [f"blocks.{i}" for i in range(4)]
    assert selected("**.attn_drop", t) == [f"blocks.{i}.attn.attn_drop" for i in range(4)]
    assert selected("class Dropout", t) == [
        f"blocks.{i}.{p}" for i in range(4) for p in ("attn.attn_drop", "attn.resid_drop", "mlp.drop")
    ] + ["drop"]
    assert selected("class torch.nn.LayerNorm not blocks.**", t) == ["norm"]
    assert selected("class transformer.MLP", t) == []  # module prefix must start at the top
    assert selected("class memoplan.examples.transformer.MLP", t) == [f"blocks.{i}.mlp" for i in range(4)]

    m = mlp.build(depth=6, width=4)
    linears = [f"layers.{i}" for i in range(0, 12, 2)]
    assert selected("layers[0::2]", m) == linears
    assert selected("layers.* : Linear", m) == linears
    assert selected("layers[::2] not layers[-2]", m) == linears[:-1]

    c = cnn.build()
    assert selected("features[1:].bn", c) == [f"features.{i}.bn" for i in range(1, 5)]
    assert selected("** : torch.nn.BatchNorm2d", c) == [f"features.{i}.bn" for i in range(5)]

    s = spiking.build()
    assert selected("class LIFNeuron", s) == [f"blocks.{i}.lif" for i in range(4)]


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_every_bundled_plan_resolves(path: Path) -> None:
    from memoplan import load
    from memoplan.specs import load_model

    plan = load(path)
    model = load_model(plan.model.spec)
    result = resolve(plan, model)
    assert result.modules
    assert [m.path for m in result.modules] == sorted((m.path for m in result.modules), key=ir.path_key)
    assert not [w for w in result.warnings if w.is_error]


def test_bundled_plans_resolve_to_expected_decisions() -> None:
    from memoplan import load

    c = resolve(load(ROOT / "plans" / "cnn_bn_dropout.memplan"), cnn.build())
    assert c.module("features.0").keep is not None and c.module("features.0").checkpoint is None
    assert [m.path for m in c.modules if m.checkpoint] == [f"features.{i}" for i in range(1, 5)]

    s = resolve(load(ROOT / "plans" / "spiking.memplan"), spiking.build())
    blocks = [f"blocks.{i}" for i in range(4)]
    assert [m.path for m in s.modules if m.temporal_chunk] == blocks
    for path in blocks:
        assert s.module(path).temporal_chunk.chunks == 8
        assert s.module(path).temporal_chunk.recompute_boundaries
        assert s.module(path).compress.codec.value == "bit"
        assert s.module(path).region_state == ("lif",)  # the neuron's state is threaded

    t = resolve(load(ROOT / "plans" / "transformer.memplan"), transformer.build())
    assert [m.path for m in t.modules if m.checkpoint] == ["blocks.0", "blocks.1", "blocks.2"]
    assert t.module("blocks.3").keep is not None


# ---------------------------------------------------------------- precedence


def spec_of(selector: str) -> Specificity:
    return specificity(plan_of(f"module {selector} {{ keep }}\n").rules[0].selector)


@pytest.mark.parametrize(
    "selector, expected",
    [
        ("a", (1, 0, 0, 0, 0)),
        ("a.0.conv", (3, 0, 0, 0, 0)),
        ("a.*", (1, 0, 0, 1, 0)),
        ("a.**", (1, 0, 0, 0, 0)),
        ("**.conv", (1, 0, 0, 0, 0)),
        ("a[0]", (1, 1, 0, 0, 0)),
        ("b[0:3].*", (1, 1, 0, 1, 0)),
        ("*.* : Inner", (0, 0, 0, 2, 1)),
        ("class Inner", (0, 0, 0, 0, 1)),
        ("a.* not a.0", (1, 0, 0, 1, 0)),  # exclusions do not count
    ],
)
def test_specificity_tuple(selector: str, expected: tuple) -> None:
    assert spec_of(selector) == Specificity(*expected)


@pytest.mark.parametrize(
    "broad, narrow",
    [
        ("a.*", "a.0"),  # more literal segments
        ("a.*", "a[0]"),  # an index beats a star at equal literals
        ("*.0", "a[0]"),
        ("**.0", "*.0"),  # `*` counts, `**` does not
        ("a.*", "a.* : Inner"),  # a class filter breaks the tie
        ("class Inner", "*.*"),  # field by field: stars outrank the class filter
        ("** : Inner", "a.0"),
        ("*.*", "a.*"),
    ],
)
def test_most_specific_rule_wins(broad: str, narrow: str) -> None:
    assert spec_of(narrow) > spec_of(broad)
    for order in ((broad, narrow), (narrow, broad)):
        rules = {broad: "checkpoint", narrow: "keep"}
        body = "".join(f"module {s} {{ {rules[s]} }}\n" for s in order)
        plan = resolved(body, Tree())
        assert plan.module("a.0").keep is not None, order
        assert plan.module("a.0").checkpoint is None, order
        line = 2 + order.index(narrow)
        assert plan.module("a.0").keep.origin.line == line


def test_equal_specificity_disagreement_is_mp303_naming_both_lines() -> None:
    error = errors_of("module a.* { checkpoint }\nmodule *.0 { keep }\n", Tree())
    assert error.codes == ["MP303"]
    diag = error.diagnostics[0]
    assert "2" in diag.message and "3" in diag.message and "`a.0`" in diag.message
    assert (diag.span.line, diag.span.column) == (3, 14)
    assert [(label, span.line) for label, span in diag.notes][0][1] == 2
    rendered = error.render()
    assert "t.memplan:3:14" in rendered and "t.memplan:2:14" in rendered


def test_mp303_for_policy_options_and_other_aspects() -> None:
    error = errors_of("module a.* { checkpoint }\nmodule *.0 { checkpoint rng = off }\n", nn.Module())
    assert error.codes == ["MP301", "MP301"]
    model = Tree()
    error = errors_of("module a.* { checkpoint }\nmodule *.1 { checkpoint nested = true }\n", model)
    assert error.codes == ["MP303"]


def test_agreeing_duplicates_are_fine() -> None:
    body = "module a.* { checkpoint }\nmodule *.0 { checkpoint }  # same decision\nmodule a.* { checkpoint }\n"
    plan = resolved(body, Tree())
    assert [m.path for m in plan.modules] == ["a.0", "a.1", "a.2", "b.0"]
    assert plan.module("a.0").checkpoint.origin.line == 2


@pytest.mark.parametrize(
    "a, b",
    [
        ("checkpoint", "checkpoint rng = preserve"),
        ("checkpoint", "checkpoint impl = torch"),
        ("checkpoint", "checkpoint nested = false"),
        ("checkpoint segments = 2", "checkpoint segments = 2 rng = preserve  # spelled out"),
    ],
)
def test_default_options_agree_with_spelled_out_ones(a: str, b: str) -> None:
    model = nn.Module()
    model.a = nn.Sequential(nn.Sequential(nn.Linear(1, 1), nn.Linear(1, 1)))
    plan = resolved(f"module a.* {{ {a} }}\nmodule *.0 {{\n    {b}\n}}\n", model)
    assert plan.module("a.0").checkpoint.origin.line == 2


def test_aspects_are_decided_independently() -> None:
    body = "module a.* { checkpoint }\nmodule a.0 { buffers = commit_once }\n"
    plan = resolved(body, Tree())
    a0 = plan.module("a.0")
    assert a0.checkpoint is not None and a0.buffers_commit_once is not None


# ---------------------------------------------------------------- errors


def test_mp301_no_match_with_nearest_path() -> None:
    error = errors_of("module featurs.0 { keep }\n", cnn.build())
    (diag,) = error.diagnostics
    assert diag.code == "MP301"
    assert (diag.span.line, diag.span.column, diag.span.end_column) == (2, 8, 17)
    assert "`features.0`" in diag.help
    # fewest edits first, then the model's order: features.1 before features.4
    assert diag.help == "nearest paths: `features.0`, `features.1`, `features.2`"


def test_closest_ranks_by_edits_then_order() -> None:
    from memoplan.diagnostics import closest, edit_distance

    assert edit_distance("featurs.0", "features.0") == 1
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3
    paths = [f"blocks.{i}" for i in range(12)]
    assert closest("blocks.1x", paths) == ["blocks.1", "blocks.10", "blocks.11"]
    assert closest("blokcs.3", paths) == ["blocks.3", "blocks.0", "blocks.1"]
    assert closest("zzz", paths) == []


@settings(max_examples=n_examples(50), deadline=None)
@given(st.text("ab", max_size=6), st.text("ab", max_size=6))
def test_edit_distance_is_a_metric(a: str, b: str) -> None:
    from memoplan.diagnostics import edit_distance

    assert edit_distance(a, b) == edit_distance(b, a)
    assert (edit_distance(a, b) == 0) == (a == b)
    assert abs(len(a) - len(b)) <= edit_distance(a, b) <= max(len(a), len(b))


def test_mp301_did_you_mean_class() -> None:
    error = errors_of("module class ConvBlok { checkpoint }\nmodule ** : torch.nn.BatchNrm2d { keep }\n", cnn.build())
    assert error.codes == ["MP301", "MP301"]
    assert "`ConvBlock`" in error.diagnostics[0].help
    assert "`BatchNorm2d`" in error.diagnostics[1].help


def test_mp301_index_over_non_indexed_container() -> None:
    error = errors_of("module d[0] { keep }\n", Tree())
    assert error.codes == ["MP301"]
    assert error.diagnostics[0].help


def test_mp301_when_not_removes_everything() -> None:
    error = errors_of("module a.* not class Module not a.* { keep }\n", Tree())
    assert error.codes == ["MP301"]


def test_mp305_nested_checkpoint_and_nested_true() -> None:
    error = errors_of("module a { checkpoint }\nmodule a.0 { checkpoint }\n", Tree())
    assert error.codes == ["MP305"]
    diag = error.diagnostics[0]
    assert diag.span.line == 3
    assert diag.notes[0][1].line == 2
    for body in (
        "module a { checkpoint nested = true }\nmodule a.0 { checkpoint }\n",
        "module a { checkpoint }\nmodule a.0 { checkpoint nested = true }\n",
    ):
        plan = resolved(body, Tree())
        assert plan.module("a").checkpoint and plan.module("a.0").checkpoint
    plan = resolved("module a { checkpoint nested = true }\nmodule a.0 { checkpoint }\n", Tree())
    assert plan.module("a").checkpoint.nested and not plan.module("a.0").checkpoint.nested


def test_mp305_deep_nesting_and_segments() -> None:
    error = errors_of("module a { checkpoint segments = 2 }\nmodule a.0.conv { checkpoint }\n", Tree())
    assert error.codes == ["MP305"]


def test_mp306_segments_on_non_sequential() -> None:
    error = errors_of("module b { checkpoint segments = 2 }\nmodule a.0 { checkpoint segments = 2 }\n", Tree())
    assert error.codes == ["MP306", "MP306"]
    assert [d.span.line for d in error.diagnostics] == [2, 3]
    assert "ModuleList" in error.diagnostics[0].message and "Inner" in error.diagnostics[1].message


def test_segments_on_sequential_subclass_without_own_forward() -> None:
    class MySeq(nn.Sequential):
        pass

    model = nn.Module()
    model.s = MySeq(nn.Linear(1, 1), nn.Linear(1, 1))
    plan = resolved("module s { checkpoint segments = 2 }\n", model)
    assert plan.module("s").checkpoint.groups == (("0",), ("1",))


def test_mp307_more_segments_than_children_is_clamped() -> None:
    plan = resolved("module a { checkpoint segments = 5 }\n", Tree())
    assert plan.module("a").checkpoint.groups == (("0",), ("1",), ("2",))
    (warning,) = plan.warnings
    assert warning.code == "MP307" and warning.severity is Severity.WARNING
    assert (warning.span.line, warning.span.column) == (2, 12)


def test_segments_on_empty_sequential_does_not_crash() -> None:
    model = nn.Module()
    model.s = nn.Sequential()
    plan = resolved("module s { checkpoint segments = 2 }\n", model)
    assert plan.module("s").checkpoint.groups == ()
    assert [w.code for w in plan.warnings] == ["MP307"]


def test_mp308_rng_off_over_dropout() -> None:
    error = errors_of("module a.0 { checkpoint rng = off }\nmodule d.y { checkpoint rng = off }\n", Tree())
    assert error.codes == ["MP308", "MP308"]
    assert "drop" in error.diagnostics[0].message
    plan = resolved("module a.0.conv { checkpoint rng = off }\nmodule a.1 { checkpoint }\n", Tree())
    assert plan.module("a.0.conv").checkpoint.preserve_rng is False
    assert plan.module("a.1").checkpoint.preserve_rng is True


def test_mp308_catches_dropout_subclasses() -> None:
    model = nn.Module()
    model.s = nn.Sequential(nn.Linear(1, 1), nn.AlphaDropout(0.1))
    assert errors_of("module s { checkpoint rng = off }\n", model).codes == ["MP308"]


def test_mp309_compress_without_checkpoint() -> None:
    error = errors_of("module a.0 { compress input = bit }\n", Tree())
    assert error.codes == ["MP309"]
    assert (error.diagnostics[0].span.line, error.diagnostics[0].span.column) == (2, 14)
    # `keep` wins the recompute aspect over the broader checkpoint, so compress is alone again
    error = errors_of("module a.* { checkpoint; compress input = bit }\nmodule a.0 { keep }\n", Tree())
    assert error.codes == ["MP309"]


def test_mp310_keep_inside_region_is_a_warning() -> None:
    plan = resolved("module a { checkpoint }\nmodule a.0.conv { keep }\n", Tree())
    (warning,) = plan.warnings
    assert warning.code == "MP310" and not warning.is_error
    assert (warning.span.line, warning.span.column) == (3, 19)
    assert "`a`" in warning.message


def test_mp311_shared_module_with_conflicting_decisions() -> None:
    shared = nn.Linear(1, 1)
    model = nn.Module()
    model.first = shared
    model.second = shared
    error = errors_of("module first { checkpoint }\n", model)
    assert error.codes == ["MP311"]
    assert "`first`" in error.diagnostics[0].message and "`second`" in error.diagnostics[0].message
    error = errors_of("module first { checkpoint }\nmodule second { checkpoint rng = off }\n", model)
    assert "MP311" in error.codes
    # the same decision under both paths is fine, and installed once (first path)
    plan = resolved("module first { checkpoint }\nmodule second { checkpoint }\n", model)
    assert [m.path for m in plan.modules] == ["first"]
    plan = resolved("module * { checkpoint }\n", model)
    assert [m.path for m in plan.modules] == ["first"]


def test_mp304_temporal_chunk_over_dropout_needs_explicit_consent() -> None:
    error = errors_of("module a.0 { checkpoint; temporal_chunk 2 dim 0 }\n", Tree())
    assert error.codes == ["MP304"]
    assert (error.diagnostics[0].span.line, error.diagnostics[0].span.column) == (2, 26)
    assert "Dropout `a.0.drop`" in error.diagnostics[0].message
    assert "bn" not in error.diagnostics[0].message  # BatchNorm takes the whole batch's statistics
    plan = resolved("module a.0 { checkpoint; temporal_chunk 2 dim 0 allow_nonequivalent = true }\n", Tree())
    assert plan.module("a.0").temporal_chunk.allow_nonequivalent is True
    plan = resolved("module a.0.conv { checkpoint; temporal_chunk 2 dim 0 }\n", Tree())
    assert plan.module("a.0.conv").temporal_chunk.chunks == 2


def test_mp312_checkpoint_on_a_container_that_is_never_called() -> None:
    error = errors_of("module b { checkpoint }\nmodule d { checkpoint }\n", Tree())
    assert error.codes == ["MP312", "MP312"]


def test_all_errors_reported_together_in_line_order() -> None:
    body = (
        "module nope { keep }\n"  # 2: MP301
        "module a { checkpoint }\n"  # 3
        "module a.0 { checkpoint }\n"  # 4: MP305
        "module d.x { checkpoint rng = off }\n"  # 5: MP308
        "module conv { compress input = bit }\n"  # 6: MP309
        "module b { checkpoint segments = 2 }\n"  # 7: MP306
        "module a.1.bn { keep }\n"  # 8: MP310 (warning)
    )
    model = Tree()
    error = errors_of(body, model)
    assert error.codes == ["MP301", "MP305", "MP308", "MP309", "MP306", "MP310"]
    assert [d.span.line for d in error.diagnostics] == [2, 4, 5, 6, 7, 8]
    assert len(error.errors) == 5


def _snapshot(model: nn.Module):
    return (
        [(p, id(m), type(m), sorted(m.__dict__), m.training) for p, m in model.named_modules(remove_duplicate=False)],
        {k: v.clone() for k, v in model.state_dict().items()},
        [id(p) for p in model.parameters()],
    )


def test_failing_resolve_changes_nothing_about_the_model() -> None:
    model = Tree()
    before = _snapshot(model)
    errors_of("module a { checkpoint }\nmodule a.0 { checkpoint }\nmodule nope { keep }\n", model)
    after = _snapshot(model)
    assert before[0] == after[0]
    assert before[2] == after[2]
    assert before[1].keys() == after[1].keys()
    assert all(torch.equal(before[1][k], after[1][k]) for k in before[1])
    for _, module in model.named_modules():
        assert "forward" not in module.__dict__


# ---------------------------------------------------------------- determinism


class Ordered(nn.Module):
    """The same tree with children registered in a chosen order."""

    def __init__(self, order: list[str], layers: int = 12) -> None:
        super().__init__()
        parts = {
            "stem": lambda: nn.Conv2d(1, 1, 1),
            "layers": lambda: self._layers(layers, order),
            "head": lambda: nn.Linear(1, 1),
            "extra": lambda: nn.ModuleDict({k: nn.ReLU() for k in (order if len(order) == 4 else "zy")}),
        }
        for name in order:
            self.add_module(name, parts[name]())

    @staticmethod
    def _layers(n: int, order: list[str]) -> nn.ModuleList:
        layers = nn.ModuleList()
        indices = list(range(n)) if order[0] == "stem" else list(reversed(range(n)))
        for i in indices:
            layers.add_module(str(i), Inner())
        return layers


DETERMINISM_PLAN = (
    "module layers[0:12:3] { checkpoint }\n"
    "module layers.*.bn { buffers = commit_once }\n"
    "module stem { keep }\n"
    "module ** : Linear { checkpoint }\n"
    "module extra.* { keep }\n"
)


def test_same_ir_and_digest_regardless_of_registration_order() -> None:
    a = resolve(plan_of(DETERMINISM_PLAN), Ordered(["stem", "layers", "head", "extra"]))
    b = resolve(plan_of(DETERMINISM_PLAN), Ordered(["extra", "head", "layers", "stem"]))
    assert a == b
    assert a.digest == b.digest
    assert hash(a.modules) == hash(b.modules)


def test_same_digest_regardless_of_rule_order() -> None:
    rules = DETERMINISM_PLAN.splitlines(keepends=True)
    model = Ordered(["stem", "layers", "head", "extra"])
    first = resolve(plan_of("".join(rules)), model)
    second = resolve(plan_of("".join(reversed(rules))), model)
    assert first.digest == second.digest
    assert [m.path for m in first.modules] == [m.path for m in second.modules]
    strip = lambda p: [(m.path, m.type_name, m.checkpoint and m.checkpoint.groups, m.keep is None) for m in p.modules]  # noqa: E731
    assert strip(first) == strip(second)


def test_digest_changes_with_decisions_not_with_comments() -> None:
    model = Tree()
    base = resolved("module a.* { checkpoint }\n", model).digest
    assert resolved("# a comment\n\nmodule a.* {\n    checkpoint  # why\n}\n", model).digest == base
    assert resolved("module a[0:2] { checkpoint }\n", model).digest != base
    assert resolved("module a.* { keep }\n", model).digest != base


def test_module_plans_are_in_natural_path_order() -> None:
    plan = resolved("module b.* { checkpoint }\nmodule a.* { keep }\nmodule conv { keep }\n", Tree())
    assert [m.path for m in plan.modules] == ["a.0", "a.1", "a.2"] + B + ["conv"]
    assert ir.path_key("layers.2") < ir.path_key("layers.10")
    assert ir.path_key("layers.10") < ir.path_key("layers.a")
    assert ir.path_key("1") != ir.path_key("01")


@settings(max_examples=n_examples(200), deadline=None)
@given(st.lists(st.integers(0, 10**30) | st.text("ab.²_", min_size=1, max_size=3), min_size=2, max_size=8))
def test_path_key_is_natural_and_total(items) -> None:
    segments = [str(i) if isinstance(i, int) else i.replace(".", "_") for i in items]
    ordered = sorted(segments, key=ir.path_key)
    numbers = [int(s) for s in ordered if s.isascii() and s.isdigit()]
    assert numbers == sorted(numbers)
    # numbers first, then names in plain order; the order does not depend on input order
    assert sorted(reversed(segments), key=ir.path_key) == ordered


def test_huge_integer_names_do_not_crash() -> None:
    model = nn.ModuleList()
    model.add_module("9" * 5000, nn.Linear(1, 1))
    model.add_module("1" * 4999, nn.Linear(1, 1))
    plan = resolved("module * { checkpoint }\n", model)
    assert [m.path for m in plan.modules] == ["1" * 4999, "9" * 5000]
    assert selected("[-1]", model) == ["9" * 5000]


def test_module_plan_type_names() -> None:
    plan = resolved("module a.* { keep }\n", Tree())
    assert plan.module("a.1").type_name == f"{__name__}.SpecialInner"
    assert plan.module("a.2").type_name == "torch.nn.modules.activation.ReLU"


# ---------------------------------------------------------------- explain


def test_explain_has_a_row_for_every_module() -> None:
    model = Tree()
    rows = explain(plan_of("module a.0 { keep }\n"), model)
    assert [r.path for r in rows] == model_order(model)
    by_path = {r.path: r for r in rows}
    assert by_path["conv"].decisions == ()
    assert by_path["a.1"].class_name == "SpecialInner"
    text = render_explain(rows)
    for path in all_paths(model):
        assert path.split("\n")[0] in text
    assert render_explain(rows, all_modules=False).count("\n") == 1


def test_explain_shared_module_paths_and_bundled_models() -> None:
    for model in (cnn.build(), transformer.build(), spiking.build(), mlp.build(depth=3, width=4)):
        rows = explain(plan_of("module ** { buffers = commit_once }\n"), model)
        assert [r.path for r in rows] == model_order(model)
        assert all(r.decisions for r in rows)


def test_explain_names_winner_and_beaten_lines() -> None:
    body = (
        "module a.* { checkpoint }\n"  # 2
        "module ** : Inner { checkpoint }\n"  # 3
        "module a[0] { keep }\n"  # 4
        "module *.1 { checkpoint }\n"  # 5, agrees with 2
    )
    rows = {r.path: r for r in explain(plan_of(body), Tree())}
    ((what, why),) = rows["a.0"].decisions
    assert what == "keep"
    assert why.startswith("line 4 `module a[0]`")
    assert "than lines 2, 3" in why
    (what, why), *inside = rows["a.1"].decisions
    assert what == "checkpoint"
    assert why.startswith("line 2 `module a.*`") and "than line 3" in why and "line 5 agree" in why
    assert rows["a.2"].decisions == (
        ("checkpoint", "line 2 `module a.*`, the only rule that sets recompute for this module"),
    )
    ((what, why),) = rows["a.1.conv"].decisions
    assert what == "recomputed" and "`a.1`" in why and "line 2" in why
    assert rows["b.3"].decisions[0][1].startswith("line 3 ")


def test_explain_shared_module_second_path() -> None:
    shared = nn.Linear(1, 1)
    model = nn.Module()
    model.first = shared
    model.second = shared
    rows = {r.path: r for r in explain(plan_of("module * { checkpoint }\n"), model)}
    assert rows["first"].decisions[0][0] == "checkpoint"
    assert rows["second"].decisions == (("shared", "the same module object as `first`, planned there"),)


def test_explain_keep_inside_region() -> None:
    rows = {r.path: r for r in explain(plan_of("module a { checkpoint }\nmodule a.0 { keep }\n"), Tree())}
    assert [what for what, _ in rows["a.0"].decisions] == ["keep", "recomputed"]
    assert "`a` (line 2)" in rows["a.0"].decisions[1][1]


def test_explain_marks_equal_specificity_conflicts() -> None:
    rows = {r.path: r for r in explain(plan_of("module a.* { checkpoint }\nmodule *.0 { keep }\n"), Tree())}
    (_, why), *_ = rows["a.0"].decisions
    assert "line 3 agree" not in why
    assert "3" in why and "MP303" in why


# ---------------------------------------------------------------- segments groups


@settings(max_examples=n_examples(150), deadline=None)
@given(n=st.integers(1, 20), k=st.integers(1, 25))
def test_segment_groups_are_contiguous_and_even(n: int, k: int) -> None:
    seq = nn.Sequential(*(nn.Identity() for _ in range(n)))
    groups = _groups(seq, k)
    assert len(groups) == min(n, k)
    assert [name for g in groups for name in g] == [str(i) for i in range(n)]
    sizes = [len(g) for g in groups]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger groups come first
    assert all(sizes)


def test_segment_groups_follow_registration_order_of_execution() -> None:
    seq = nn.Sequential()
    for name in ("conv", "bn", "act", "pool", "drop"):
        seq.add_module(name, nn.Identity())
    model = nn.Module()
    model.s = seq
    plan = resolved("module s { checkpoint segments = 2 }\n", model)
    assert plan.module("s").checkpoint.groups == (("conv", "bn", "act"), ("pool", "drop"))
    plan = resolved("module s { checkpoint segments = 5 }\n", model)
    assert plan.module("s").checkpoint.groups == tuple((n,) for n in ("conv", "bn", "act", "pool", "drop"))
    assert not plan.warnings


def test_analyse_reports_without_raising() -> None:
    resolution = analyse(plan_of("module a { checkpoint }\nmodule a.0 { checkpoint }\n"), Tree())
    assert [d.code for d in resolution.diagnostics] == ["MP305"]
    assert resolution.inside_region["a.0.conv"] == "a.0"
    assert resolution.inside_region["a.1"] == "a"


def test_resolve_does_not_mutate_plan_or_depend_on_model_identity() -> None:
    plan = plan_of(DETERMINISM_PLAN)
    snapshot = copy.deepcopy(plan)
    model = Ordered(["stem", "layers", "head", "extra"])
    first = resolve(plan, model)
    second = resolve(plan, copy.deepcopy(model))
    assert plan == snapshot
    assert first == second
