"""CLI tests: ``memoplan.cli.main([...])`` in-process, and once as ``python -m memoplan.cli``.

Exit codes: 0 clean, 1 diagnostics / not equivalent / not canonical, 2 usage.
Diagnostics go to stderr with code, ``file:line:col`` and a caret; results to stdout.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _cli import TRACEBACK, run, write
from _paths import ROOT

from memoplan import cli, cli_load

PLANS = sorted((ROOT / "plans").glob("*.memplan"))
assert PLANS, "plans/ holds the bundled example plans"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


# ---------------------------------------------------------------- the command set is frozen


def test_subcommands_are_frozen() -> None:
    assert cli.SUBCOMMANDS == (
        "check",
        "fmt",
        "rule",
        "docs",
        "explain",
        "verify",
        "write-module",
        "profile",
        "plan",
        "report",
        "lsp",
        "demo",
    )
    parser = cli._parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert tuple(sub.choices) == (*cli.SUBCOMMANDS, "compile")  # the old name, hidden (MP540)


def test_no_command_is_a_usage_error(capsys) -> None:
    code, out, err = run(capsys)
    assert code == 2
    assert "check" in err and "verify" in err


def test_unknown_command_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["compile-everything"])
    assert info.value.code == 2


def test_version(capsys) -> None:
    from memoplan import __version__

    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert __version__ in capsys.readouterr().out


# ---------------------------------------------------------------- check


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_check_every_bundled_plan(capsys, path: Path) -> None:
    code, out, err = run(capsys, "check", path)
    assert code == 0, err
    assert out.startswith(f"{path}: ok, ")
    assert "planned" in out and "example of 1 input" in out


def test_check_bad_plan_renders_every_diagnostic(capsys, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "bad.memplan",
        "memplan 1\n"
        'model "memoplan.examples.cnn:build"\n'
        "module featurs.0 { keep }\n"
        "module classifier { compress input = bit }\n",
    )
    code, out, err = run(capsys, "check", path)
    assert code == 1
    assert out == ""
    assert f"{path}:3:8: error[MP301]" in err
    assert f"{path}:4:21: error[MP309]" in err
    lines = err.splitlines()
    i = lines.index(next(line for line in lines if "error[MP301]" in line))
    assert lines[i + 1] == "  3 | module featurs.0 { keep }"
    assert lines[i + 2] == "    |        ^^^^^^^^^"
    assert "`features.0`" in err  # nearest path
    assert "2 errors" in err


def test_check_syntax_errors_all_reported(capsys, tmp_path: Path) -> None:
    path = write(tmp_path, "syntax.memplan", "memplan 1\nmodule a { chekpoint }\nbudgett 4 GiB\n")
    code, out, err = run(capsys, "check", path)
    assert code == 1
    assert f"{path}:2:12: error[MP102]" in err
    assert f"{path}:3:1: error[MP101]" in err
    assert "^" in err


def test_check_without_model_statement_only_parses(capsys, tmp_path: Path) -> None:
    path = write(tmp_path, "nomodel.memplan", "memplan 1\nmodule anything.* { checkpoint }\n")
    code, out, err = run(capsys, "check", path)
    assert code == 0
    assert out.strip() == f"{path}: ok, 1 rule"


def test_check_missing_file(capsys, tmp_path: Path) -> None:
    code, out, err = run(capsys, "check", tmp_path / "nope.memplan")
    assert code == 1
    assert "MP107" in err


def test_check_unreadable_plans(capsys, tmp_path: Path) -> None:
    binary = tmp_path / "latin1.memplan"
    binary.write_bytes(b"memplan 1\nmodule caf\xe9 { keep }\n")
    for path in (binary, tmp_path):
        code, out, err = run(capsys, "check", path)
        assert code == 1
        assert "error[MP107]" in err


def test_check_warnings_do_not_fail(capsys, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "warn.memplan",
        'memplan 1\nmodel "memoplan.examples.spiking:build"\nmodule class LIF { state = functional }\n'
        "module blocks { checkpoint segments = 9 }\n",
    )
    code, out, err = run(capsys, "check", path)
    assert code == 0
    assert f"{path}:4:17: warning[MP307]" in err
    assert "ok" in out


# ---------------------------------------------------------------- model / example overrides

MODEL_PY = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.GELU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.body(x))

def build():
    torch.manual_seed(0)
    return Net()

def inputs():
    return torch.randn(3, 4)

def broken():
    raise RuntimeError("factory failed")

def not_a_model():
    return 42
"""

OVERRIDE_PLAN = "memplan 1\nmodule body { checkpoint segments = 2 }\nmodule head { checkpoint }\n"


@pytest.fixture()
def user_model(tmp_path: Path) -> tuple[Path, Path]:
    model = write(tmp_path, "net.py", MODEL_PY)
    plan = write(tmp_path, "net.memplan", OVERRIDE_PLAN)
    return model, plan


def test_check_with_model_file_and_inline_example(capsys, user_model) -> None:
    model, plan = user_model
    code, out, err = run(capsys, "check", plan, "--model", f"{model}:build", "--example", "randn(3, 4)")
    assert code == 0, err
    assert "2 modules planned" in out and "example of 1 input" in out


def test_check_with_example_file_spec(capsys, user_model) -> None:
    model, plan = user_model
    code, out, err = run(capsys, "check", plan, "--model", f"{model}:Net", "--example", f"{model}:inputs")
    assert code == 0, err
    assert "example of 1 input" in out


def test_model_override_beats_plan_model(capsys, user_model, tmp_path: Path) -> None:
    model, _ = user_model
    plan = write(tmp_path, "over.memplan", 'memplan 1\nmodel "memoplan.examples.cnn:build"\nmodule head { keep }\n')
    code, out, err = run(capsys, "check", plan)
    assert code == 1 and "MP301" in err  # the CNN has no `head`
    code, out, err = run(capsys, "check", plan, "--model", f"{model}:build")
    assert code == 0, err


def test_relative_model_file_resolves_against_the_plan(capsys, user_model, tmp_path: Path, monkeypatch) -> None:
    plan = write(
        tmp_path, "rel.memplan", 'memplan 1\nmodel "net.py:build"\nexample randn(3, 4)\nmodule head { checkpoint }\n'
    )
    monkeypatch.chdir(ROOT)
    code, out, err = run(capsys, "check", plan)
    assert code == 0, err


@pytest.mark.parametrize(
    "spec, code_",
    [
        ("no_such_module_xyz:build", "MP502"),
        ("memoplan.examples.cnn:no_such_factory", "MP503"),
        ("not a spec", "MP501"),
        ("{tmp}/missing.py:build", "MP502"),
        ("{tmp}/net.py:broken", "MP504"),
        ("{tmp}/net.py:not_a_model", "MP505"),
    ],
)
@pytest.mark.parametrize("command", ["check", "explain", "verify"])
def test_bad_model_spec_is_a_diagnostic_not_a_traceback(capsys, user_model, tmp_path, spec, code_, command) -> None:
    _, plan = user_model
    args = [command, plan, "--model", spec.format(tmp=tmp_path)]
    if command == "verify":
        args += ["--example", "randn(3, 4)"]
    code, out, err = run(capsys, *args)
    assert code == 1
    assert f"[{code_}]" in err


@pytest.mark.parametrize("example", ["randn(3,", "randn(3, 4, dtype=float99)", "nope.module:fn"])
def test_bad_example_spec_is_a_diagnostic(capsys, user_model, example) -> None:
    model, plan = user_model
    code, out, err = run(capsys, "check", plan, "--model", f"{model}:build", "--example", example)
    assert code == 1
    assert re.search(r"\[MP[125]\d\d\]", err)


def test_verify_needs_model_and_example(capsys, tmp_path: Path, user_model) -> None:
    model, plan = user_model
    code, out, err = run(capsys, "verify", plan)
    assert code == 1 and "MP502" in err
    code, out, err = run(capsys, "verify", plan, "--model", f"{model}:build")
    assert code == 1 and "MP502" in err and "example" in err


def test_verify_example_that_does_not_fit_is_a_diagnostic(capsys, user_model) -> None:
    model, plan = user_model
    code, out, err = run(capsys, "verify", plan, "--model", f"{model}:build", "--example", "randn(3, 5)")
    assert code == 1
    assert "MP504" in err


# ---------------------------------------------------------------- fmt


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_fmt_check_bundled_plans_are_canonical(capsys, path: Path) -> None:
    before = path.read_bytes()
    code, out, err = run(capsys, "fmt", "--check", path)
    assert code == 0, out + err
    assert out == ""
    assert path.read_bytes() == before


MESSY = "memplan 1\nmodule   features.0{keep}   # first\nmodule features.*:ConvBlock {\ncheckpoint\n}\n"


def test_fmt_check_non_canonical_leaves_file_unchanged(capsys, tmp_path: Path) -> None:
    path = write(tmp_path, "messy.memplan", MESSY)
    code, out, err = run(capsys, "fmt", "--check", path)
    assert code == 1
    assert f"would reformat {path}" in out
    assert path.read_text(encoding="utf-8") == MESSY


def test_fmt_rewrites_in_place(capsys, tmp_path: Path) -> None:
    from memoplan import format_plan, parse

    path = write(tmp_path, "messy.memplan", MESSY)
    canonical = format_plan(parse(MESSY))
    code, out, err = run(capsys, "fmt", path)
    assert code == 0
    assert f"reformatted {path}" in out
    assert path.read_text(encoding="utf-8") == canonical
    assert "# first" in canonical
    code, out, err = run(capsys, "fmt", "--check", path)
    assert code == 0 and out == ""


def test_fmt_many_files_and_a_broken_one(capsys, tmp_path: Path) -> None:
    good = write(tmp_path, "good.memplan", MESSY)
    bad = write(tmp_path, "bad.memplan", "memplan 1\nmodule { keep\n")
    code, out, err = run(capsys, "fmt", good, bad)
    assert code == 3  # a plan that cannot be parsed: not "would reformat" (1)
    assert "error[" in err and str(bad) in err
    assert f"reformatted {good}" in out
    assert bad.read_text(encoding="utf-8") == "memplan 1\nmodule { keep\n"


# ---------------------------------------------------------------- explain


def test_explain_lists_every_module_and_its_rule(capsys) -> None:
    from memoplan.examples import cnn

    path = ROOT / "plans" / "cnn_bn_dropout.memplan"
    code, out, err = run(capsys, "explain", path)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["module", "class", "decision"]
    for name, _ in cnn.build().named_modules():
        if name:
            assert any(line.startswith(name + " ") for line in lines), name
    row = next(line for line in lines if line.startswith("features.0 "))
    assert "keep" in row and "line 13" in row and "than line 10" in row
    row = next(line for line in lines if line.startswith("features.3 "))
    assert "checkpoint" in row and "line 10" in row
    row = next(line for line in lines if line.startswith("features.3.bn "))
    assert "inside the checkpoint region of `features.3`" in row
    row = next(line for line in lines if line.startswith("classifier "))
    assert "(no rule)" in row


def test_explain_planned_only(capsys) -> None:
    code, out, err = run(capsys, "explain", ROOT / "plans" / "transformer.memplan", "--planned-only")
    assert code == 0
    assert "(no rule)" not in out
    assert "blocks.3 " in out and "keep" in out


def test_explain_with_errors_reports_them(capsys, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "conflict.memplan",
        'memplan 1\nmodel "memoplan.examples.cnn:build"\nmodule features.* { checkpoint }\nmodule *.0 { keep }\n',
    )
    code, out, err = run(capsys, "explain", path)
    assert code == 1
    assert f"{path}:4:14: error[MP303]" in err


def test_explain_needs_a_model(capsys, tmp_path: Path) -> None:
    path = write(tmp_path, "nomodel.memplan", "memplan 1\nmodule a { keep }\n")
    code, out, err = run(capsys, "explain", path)
    assert code == 1 and "MP502" in err


# ---------------------------------------------------------------- verify


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
@pytest.mark.slow
def test_verify_every_bundled_plan(capsys, path: Path) -> None:
    code, out, err = run(capsys, "verify", path)
    assert code == 0, out + err
    assert re.search(r"unplanned \d+\.\d+ MiB \(\d+ B\), planned \d+\.\d+ MiB \(\d+ B\)", out)
    assert out.rstrip().endswith("verdict: EQUIVALENT")
    assert "DIFFERENT" not in out


def test_verify_user_model_with_overrides(capsys, user_model) -> None:
    model, plan = user_model
    code, out, err = run(
        capsys, "verify", plan, "--model", f"{model}:build", "--example", "randn(16, 4)", "--seed", "3"
    )
    assert code == 0, out + err
    assert "verdict: EQUIVALENT" in out
    assert "body" in out and "head" in out


def test_models_are_built_from_the_seed_so_every_run_agrees(capsys) -> None:
    """A factory's random weights (and an example factory called after it) come after
    torch.manual_seed(seed), whatever the process drew before: `verify --seed` gives the
    same verdict every run."""
    built = []
    for before, seed in ((123, 4), (456, 4), (123, 5)):
        torch.manual_seed(before)
        model = cli_load.load_model(None, None, "memoplan.examples.spiking:build", required=True, seed=seed)
        example = cli_load.load_example(None, None, "memoplan.examples.spiking:example", required=True)
        built.append((next(model.parameters()).detach(), example.args[0]))
    assert torch.equal(built[0][0], built[1][0]) and torch.equal(built[0][1], built[1][1])
    assert not torch.equal(built[0][0], built[2][0])
    capsys.readouterr()


def test_verify_on_an_explicit_device(capsys, user_model) -> None:
    model, plan = user_model
    code, out, err = run(
        capsys, "verify", plan, "--model", f"{model}:build", "--example", "randn(16, 4)", "--device", "cpu"
    )
    assert code == 0, out + err
    assert "(live-storage, cpu)" in out and "verdict: EQUIVALENT" in out


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu", "`--device tpu` is not a device"),
        ("cuda:x", "`--device cuda:x` is not a device"),
        ("meta", "only cpu and cuda are supported"),
        ("cuda:64", "CUDA device"),  # "no CUDA device here", or "only N CUDA devices here"
    ],
)
@pytest.mark.parametrize("command", ["verify", "profile", "plan"])
def test_a_device_that_cannot_run_here_is_a_diagnostic_before_any_work(
    capsys, tmp_path, user_model, command, device, message
):
    model, plan = user_model
    spec = ("--model", f"{model}:build", "--example", "randn(16, 4)")
    argv = {
        "verify": ("verify", plan, *spec),
        "profile": ("profile", *spec, "-o", tmp_path / "p.json"),
        "plan": ("plan", *spec, "--budget", "50%", "-o", tmp_path / "p.memplan"),
    }[command]
    no_gpu = device.startswith("cuda:6") and not torch.cuda.is_available()
    if no_gpu and command != "verify":
        pytest.skip("profile and plan estimate a step for a CUDA device not here (tests/planner/test_meta.py)")
    code, out, err = run(capsys, *argv, "--device", device)
    assert code == 1
    assert "error[MP506]" in err and message in err
    if not no_gpu:  # verify of a model on the meta device estimates for any CUDA device: it loads the model first
        assert "loading model" not in err  # refused before the model is built
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "p.memplan").exists()


# ---------------------------------------------------------------- as a real process


@pytest.mark.slow
def test_python_dash_m_runs_the_cli(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEMOPLAN_CACHE_DIR": str(tmp_path / "cache")}
    ok = subprocess.run(
        [sys.executable, "-m", "memoplan.cli", "check", str(PLANS[0])],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert f"{PLANS[0]}: ok" in ok.stdout
    bad = write(tmp_path, "bad.memplan", 'memplan 1\nmodel "no_such_pkg_xyz:build"\nmodule a { keep }\n')
    failed = subprocess.run(
        [sys.executable, "-m", "memoplan.cli", "check", str(bad)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert failed.returncode == 1
    assert "MP502" in failed.stderr and TRACEBACK not in failed.stderr
    assert failed.stdout == ""
