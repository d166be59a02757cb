"""`memoplan --help` and usage errors: options in groups (basic first), examples, did-you-mean."""

from __future__ import annotations

import argparse

import pytest

from memoplan import cli, cli_parser


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def _usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main(list(argv))
    assert info.value.code == 2
    return capsys.readouterr().err


def test_a_mistyped_command_suggests_the_nearest(capsys) -> None:
    err = _usage_error(capsys, "chek", "plan.memplan")
    assert "invalid choice: 'chek'" in err
    assert "did you mean `check`?" in err


def test_a_mistyped_choice_suggests_the_nearest(capsys) -> None:
    err = _usage_error(capsys, "plan", "--preset", "balanse", "-o", "x.memplan")
    assert "did you mean `balanced`?" in err
    err = _usage_error(capsys, "zzzzzz")
    assert "did you mean" not in err  # nothing near: argparse's list of choices alone


def test_plan_help_lists_the_basics_first_and_the_sublinear_knobs_apart(capsys) -> None:
    text = _help(capsys, "plan")
    assert text.startswith("usage: memoplan plan [PLAN] -o PATH [options]\n")
    titles = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles[:2] == ["positional arguments", "basic options"]
    assert titles.index("advanced options") < titles.index("output options")
    assert titles[-2].startswith("sublinear search") and titles[-1] == "examples"
    assert "other options" not in titles  # every option of `plan` is placed in a group
    basic = text.split("basic options:")[1].split("advanced options:")[0]
    for option in ("--model", "--example", "--budget", "--preset", "--output"):
        assert option in basic
    assert "--thresh-nr-try" not in basic
    assert "  memoplan plan --model memoplan.examples.cnn:build" in text.split("examples:")[1]


@pytest.mark.parametrize("command", sorted(cli.SUBCOMMANDS))
def test_every_command_has_a_description_groups_and_examples(capsys, command: str) -> None:
    text = _help(capsys, command)
    assert text.splitlines()[0].endswith("[options]")
    assert "\nexamples:\n  memoplan " + command in text
    assert "\noutput options:\n" in text
    assert "\noptions:\n" not in text and "\noptional arguments:\n" not in text
    assert "\nother options:\n" not in text  # every option of every command is placed in a group


def test_an_option_no_group_names_goes_to_other_options() -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--model")
    parser.add_argument("--something-new")
    parser.add_argument("-q", "--quiet", action="store_true")
    cli_parser.group_options(parser)
    groups = {g.title: [a.dest for a in g._group_actions] for g in parser._action_groups}
    assert list(groups) == ["basic options", "output options", "other options"]
    assert groups["basic options"] == ["model"]
    assert groups["other options"] == ["something_new"]
    assert groups["output options"] == ["help", "quiet"]
    assert "other options:\n  --something-new" in parser.format_help()


def test_top_level_help_has_examples(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "examples:\n  memoplan demo my-plans" in out
