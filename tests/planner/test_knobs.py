"""The planner's knobs (memoplan/planner/knobs.py) are one table: the ``plan`` command's options,
the keywords of ``memoplan.plan`` and the fields of ``PlanRequest`` agree with it, so a knob added
to the table shows everywhere or these tests fail."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from collections import defaultdict

import pytest

import memoplan
from memoplan.cli_parser import build_parser
from memoplan.planner.knobs import KNOBS, SUBLINEAR_KNOBS, knob, refused_choice
from memoplan.planner.request import PlanRequest, PlanRequestError

# what memoplan.plan and PlanRequest take besides the knobs: the model, the run and the plan completed
NOT_KNOBS_API = {"model", "example", "start", "sublinear", "profile", "progress", "step", "device", "device_memory"}
NOT_KNOBS_REQUEST = {"sublinear_options", "start", "start_name", "sources", "device", "device_memory"}


def _plan_parser() -> argparse.ArgumentParser:
    parser = build_parser(defaultdict(lambda: lambda args: 0), lambda error: None)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["plan"]


def test_every_knob_is_an_option_of_plan_as_the_table_says():
    options = {flag: action for action in _plan_parser()._actions for flag in action.option_strings}
    for row in KNOBS + SUBLINEAR_KNOBS:
        action = options[row.flag]
        assert action.dest == row.name
        assert action.help == row.help
        assert action.default == row.default
        if row.kind == "flag":
            assert isinstance(action, argparse._StoreTrueAction)
        elif row.kind == "choice":
            assert tuple(action.choices) == row.allowed()
        else:
            assert row.kind == "text" and action.choices is None and action.metavar == row.metavar


def test_the_sublinear_knobs_are_their_own_group_and_only_the_command_lines():
    group = next(g for g in _plan_parser()._action_groups if g.title and g.title.startswith("sublinear search"))
    assert [a.dest for a in group._group_actions] == [row.name for row in SUBLINEAR_KNOBS]
    parameters = inspect.signature(memoplan.plan).parameters
    fields = {f.name for f in dataclasses.fields(PlanRequest)}
    for row in SUBLINEAR_KNOBS:
        assert not row.api and not row.request and row.name not in parameters and row.name not in fields


def test_the_api_takes_the_knobs_and_no_other_planning_option():
    parameters = inspect.signature(memoplan.plan).parameters
    for row in KNOBS:
        if row.api:
            assert parameters[row.name].default == row.default, row.name
        else:
            assert row.name not in parameters, row.name
    assert set(parameters) - NOT_KNOBS_API == {row.name for row in KNOBS if row.api}


def test_the_request_holds_the_knobs_and_checks_their_words():
    fields = {f.name: f.default for f in dataclasses.fields(PlanRequest)}
    for row in KNOBS:
        if row.request:
            assert fields[row.name] == row.default, row.name
    assert set(fields) - NOT_KNOBS_REQUEST == {row.name for row in KNOBS if row.request}
    for row in KNOBS:
        if row.request and row.kind == "choice":
            with pytest.raises(PlanRequestError, match=f"no {row.name} `nope`: one of {', '.join(row.allowed())}"):
                PlanRequest(budget="50%", **{row.name: "nope"}).check()
            PlanRequest(budget="50%", **{row.name: row.allowed()[0]}).check()


def test_refused_choice_and_lookup():
    assert refused_choice("planner", "greedy") is None
    assert refused_choice("planner", None) is None
    assert refused_choice("budget", "anything") is None  # text: read later, not by its words
    assert refused_choice("method", "guessed") == "no method `guessed`: one of auto, measured, estimated"
    with pytest.raises(KeyError):
        knob("no_such_knob")
