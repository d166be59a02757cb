"""Every policy once (memoplan/syntax/policies.py): the builder, formatter, resolver defaults,
the language server and the reference agree with the specs, and an option added through the
spec alone reaches each of them."""

from __future__ import annotations

import dataclasses
import re

import pytest
from _paths import ROOT
from torch import nn

import memoplan
from memoplan.codegen import emit
from memoplan.diagnostics import PlanError
from memoplan.lsp import language
from memoplan.lsp.completion import completions
from memoplan.resolver import resolution
from memoplan.syntax import ast, format_plan, parse
from memoplan.syntax.build import POLICY_NAMES
from memoplan.syntax.policies import POLICIES, Option, PolicySpec

README = (ROOT / "grammar" / "README.md").read_text(encoding="utf-8")


def _section(policy: str) -> tuple[str, str]:
    """The heading line of a policy's section in the reference, and its text up to the next heading."""
    start = README.index(f"### `{policy}")
    end = README.index("\n### ", start + 1)
    heading, _, body = README[start:end].partition("\n")
    return heading, body


def reference_mismatches(spec: PolicySpec) -> list[str]:
    """What the reference's section on ``spec`` says differently from the spec."""
    heading, body = _section(spec.name)
    problems = []
    rows = {m[1]: (m[2], m[3]) for m in re.finditer(r"^\| `(\w+)` \| ([^|]*) \| ([^|]*) \|", body, re.M)}
    for option in spec.options:
        if f"{option.key} =" not in heading:
            problems.append(f"{option.key}: not in the heading")
        if option.words and "|".join(option.words) not in heading:
            problems.append(f"{option.key}: heading does not list {'|'.join(option.words)}")
        if "| option | values | default |" in body:
            if option.key not in rows:
                problems.append(f"{option.key}: no row in the option table")
                continue
            values, default = rows[option.key]
            if option.words and values != option.values_text:
                problems.append(f"{option.key}: values {values!r} != {option.values_text!r}")
            if default != option.default_text:
                problems.append(f"{option.key}: default {default!r} != {option.default_text!r}")
    return problems


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_reference_agrees_with_each_policys_spec(name):
    assert reference_mismatches(POLICIES[name]) == []


def test_the_policy_words_come_from_the_specs():
    assert POLICY_NAMES == tuple(POLICIES) == language.POLICIES
    for name, spec in POLICIES.items():
        assert language.policy_options(name) == spec.keys
        for option in spec.options:
            assert language.option_values(name, option.key) == option.words


def test_left_out_options_read_as_the_specs_defaults():
    bare = resolution.bare(parse("memplan 1\nmodule a { temporal_chunk 2 dim 0 }\n").rules[0].policies[0])
    assert (bare.args, bare.allow_nonequivalent, bare.boundaries) == ((0,), False, ast.Boundaries.KEEP)


# ---------------------------------------------------------------- a throwaway option


@pytest.fixture
def probe_option():
    """``checkpoint probe = true|false``: an AST field and an Option, nothing else."""
    node = dataclasses.make_dataclass(
        "ProbedCheckpoint",
        [("probe", "bool | None", dataclasses.field(default=None))],
        bases=(ast.Checkpoint,),
        frozen=True,
    )
    old = POLICIES["checkpoint"]
    POLICIES["checkpoint"] = PolicySpec(
        "checkpoint", node, old.aspect, old.options + (Option("probe", "bool", default=False, default_text="`false`"),)
    )
    yield POLICIES["checkpoint"]
    POLICIES["checkpoint"] = old


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x):
        return self.block(x)


def test_an_option_added_to_the_spec_reaches_every_stage(probe_option):
    text = "memplan 1\n\nmodule block { checkpoint nested = true probe = true }\n"
    plan = parse(text)  # parse: read, typed, in the node
    policy = plan.rules[0].policies[0]
    assert policy.probe is True and policy.nested is True
    assert format_plan(plan) == text  # format: written back, in the spec's order
    with pytest.raises(PlanError) as caught:  # checked as the spec says
        parse(text.replace("probe = true", "probe = 3"))
    assert caught.value.diagnostics[0].code == "MP202" and "`probe`" in str(caught.value)
    left_out = parse(text.replace(" probe = true", "")).rules[0].policies[0]
    assert resolution.bare(left_out).probe is False  # resolve: the default fills it in
    resolved = memoplan.resolve(plan, _Net())  # resolve and emit still go through
    assert resolved.module("block").checkpoint is not None
    assert "def " in emit(resolved).main.text
    at = text.index("probe")
    labels = [item.label for item in completions(text[:at] + "}\n", at, None)]
    assert "probe" in labels  # LSP completion: offered as an option
    assert language.option_values("checkpoint", "probe") == ("true", "false")
    # the reference: its missing row is what the reference test would report
    assert "probe: no row in the option table" in reference_mismatches(probe_option)
