"""Renamed names (memoplan.deprecations, issue 41): the new ones collide with nothing, the old ones
still work for a release with MP540 (command line) or a DeprecationWarning (Python)."""

from __future__ import annotations

import sys
import warnings

import pytest

from memoplan import cli, deprecations, rules
from memoplan.planner.budgets import COVERAGE_WORDS, AskedBudget, Preset, read_budget
from memoplan.planner.presets import PRESETS

SMALL = 'memplan 1\nmodel "memoplan.examples.mlp:build"\nmodule layers.0 { checkpoint }\n'


def test_budget_words_and_preset_names_do_not_collide():
    assert set(COVERAGE_WORDS).isdisjoint(PRESETS)
    assert set(deprecations.BUDGET_WORDS.values()) == set(COVERAGE_WORDS)
    assert {preset.word for preset in Preset} == set(COVERAGE_WORDS)
    assert PRESETS["safe"].budget.word == "checkpoint-half"  # no longer the budget called `speed`


@pytest.mark.parametrize(("old", "new"), sorted(deprecations.BUDGET_WORDS.items()))
def test_an_old_budget_word_is_its_new_one_with_a_deprecation(old, new):
    with pytest.warns(DeprecationWarning, match=rf"budget word '{old}' is deprecated: write '{new}'"):
        assert read_budget(old.upper()) == read_budget(new)
    args = cli._parser().parse_args(
        ["plan", "--budget", old, "--model", "m:f", "--example", "randn(1)", "-o", "p.memplan"]
    )
    assert args.budget == new
    (said,) = args.deprecated
    assert said.code == "MP540" and not said.is_error and f"`{new}`" in said.message


def test_a_new_budget_word_warns_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_budget("checkpoint-all") == AskedBudget(Preset.MEMORY, None)
        assert read_budget("4 GiB hint").hard is False
    args = cli._parser().parse_args(
        ["plan", "--budget", "checkpoint-all", "--model", "m:f", "--example", "randn(1)", "-o", "p.memplan"]
    )
    assert args.budget == "checkpoint-all" and not getattr(args, "deprecated", ())


def test_the_old_command_is_the_new_one_with_mp540_first(tmp_path, capsys, monkeypatch):
    args = cli._parser().parse_args(["compile", "p.memplan", "-o", "out.py", "--check"])
    assert args.run is cli._write_module and args.check and [d.code for d in args.deprecated] == ["MP540"]
    ran = []
    monkeypatch.setattr(
        cli, "_write_module", lambda args: ran.append(args.plan.name) or print("ran", file=sys.stderr) or 0
    )
    assert cli.main(["compile", "p.memplan", "-o", str(tmp_path / "out.py")]) == 0
    err = capsys.readouterr().err
    assert ran == ["p.memplan"] and err.index("warning[MP540]") < err.index("ran")  # said first, then run
    assert "`memoplan compile` is deprecated" in err and "`memoplan write-module`" in err


@pytest.mark.slow  # loads a model: about 2 s on its own
def test_the_old_command_runs_the_new_one_after_mp540(tmp_path, capsys):
    assert "MP540" in rules.RULES
    plan, new, old = tmp_path / "p.memplan", tmp_path / "new.py", tmp_path / "old.py"
    plan.write_text(SMALL)
    assert cli.main(["write-module", str(plan), "-o", str(new)]) == 0
    assert "MP540" not in capsys.readouterr().err
    assert cli.main(["compile", str(plan), "-o", str(old)]) == 0
    err = capsys.readouterr().err
    assert "warning[MP540]" in err and "`memoplan compile` is deprecated" in err and "`memoplan write-module`" in err
    assert old.read_bytes().replace(b"old", b"new") == new.read_bytes().replace(b"old", b"new")
    assert cli.main(["compile", str(plan), "-o", str(old), "--check"]) == 0  # every option of the new name


def test_the_old_command_is_not_listed(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    listed = capsys.readouterr().out
    assert "write-module" in listed and "compile " not in listed.replace("--compile", "")


# --- planner modules moved into subpackages --------------------------------------------------


def test_every_moved_planner_module_names_a_module_that_exists():
    import importlib.util
    from pathlib import Path

    from memoplan.deprecations import PLANNER_MODULES

    assert len(PLANNER_MODULES) == len(set(PLANNER_MODULES.values()))
    for old, new in PLANNER_MODULES.items():
        assert importlib.util.find_spec(new) is not None, new
        assert not (Path(__file__).parents[1] / (old.replace(".", "/") + ".py")).exists(), old


def test_an_old_planner_path_imports_the_moved_module_with_a_warning_at_the_import(monkeypatch):
    import memoplan.planner
    from memoplan.planner.profiling import estimate as moved

    monkeypatch.delitem(sys.modules, "memoplan.planner.estimate", raising=False)
    vars(memoplan.planner).pop("estimate", None)  # (hasattr would ask the package's __getattr__)
    with pytest.warns(
        DeprecationWarning, match=r"memoplan\.planner\.estimate moved to memoplan\.planner\.profiling\.estimate"
    ) as caught:
        import memoplan.planner.estimate as old  # noqa: F401
    assert old is moved and caught[0].filename == __file__
    vars(memoplan.planner).pop("estimate", None)
    with pytest.warns(DeprecationWarning, match="moved to") as caught:
        from memoplan.planner import estimate
    assert estimate is moved and len(caught) == 1 and caught[0].filename == __file__
    with pytest.raises(ImportError):
        import memoplan.planner.no_such_module  # noqa: F401
    with pytest.raises(ImportError):
        from memoplan.planner import no_such_module  # noqa: F401
