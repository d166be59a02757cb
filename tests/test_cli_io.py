"""The command line in CI and pre-commit: several files, folders and standard input; `--format
json|github`; distinct exit codes; -q/-v; `python -m memoplan`; `-o -`; `check --syntax-only`."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import run, write
from _paths import ROOT

PLANS = sorted((ROOT / "plans").glob("*.memplan"))
BROKEN = "memplan 1\nmodule { keep\n"
MESSY = "memplan 1\nmodule   fc {keep}\n"
CLEAN = "memplan 1\n\nmodule fc { keep }\n"


def _stdin(monkeypatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8"))


def test_check_several_files_and_a_folder(capsys, tmp_path) -> None:
    folder = tmp_path / "plans"
    write(folder.mkdir() or folder, "a.memplan", CLEAN)
    (folder / "deep").mkdir()
    write(folder / "deep", "b.memplan", CLEAN)
    write(folder, "notes.txt", "not a plan")
    other = write(tmp_path, "c.memplan", CLEAN)
    code, out, err = run(capsys, "check", "--syntax-only", folder, other)
    assert code == 0, err
    assert out.splitlines() == [
        f"{folder / 'a.memplan'}: ok, 1 rule",
        f"{folder / 'deep' / 'b.memplan'}: ok, 1 rule",
        f"{other}: ok, 1 rule",
    ]


def test_check_reports_every_broken_file_and_goes_on(capsys, tmp_path) -> None:
    bad = write(tmp_path, "bad.memplan", BROKEN)
    good = write(tmp_path, "good.memplan", CLEAN)
    code, out, err = run(capsys, "check", "--syntax-only", bad, good)
    assert code == 1
    assert f"{bad}:2:8: error[MP100]" in err
    assert f"{good}: ok" in out


def test_check_reads_standard_input(capsys, monkeypatch) -> None:
    _stdin(monkeypatch, BROKEN)
    code, out, err = run(capsys, "check", "--syntax-only", "-")
    assert code == 1 and "<stdin>:2:8: error[MP100]" in err


def test_fmt_standard_input_to_standard_output(capsys, monkeypatch) -> None:
    _stdin(monkeypatch, MESSY)
    code, out, err = run(capsys, "fmt", "-")
    assert (code, out, err) == (0, CLEAN, "")


def test_fmt_a_folder(capsys, tmp_path) -> None:
    path = write(tmp_path, "a.memplan", MESSY)
    code, out, _ = run(capsys, "fmt", tmp_path)
    assert code == 0 and out == f"reformatted {path}\n"
    assert path.read_text(encoding="utf-8") == CLEAN


def test_fmt_check_exit_codes_are_distinct(capsys, tmp_path) -> None:
    clean = write(tmp_path, "clean.memplan", CLEAN)
    messy = write(tmp_path, "messy.memplan", MESSY)
    broken = write(tmp_path, "broken.memplan", BROKEN)
    assert run(capsys, "fmt", "--check", clean)[0] == 0
    assert run(capsys, "fmt", "--check", messy)[0] == 1  # would reformat
    assert run(capsys, "fmt", "--check", broken)[0] == 3  # cannot be parsed
    assert run(capsys, "fmt", "--check", messy, broken)[0] == 3
    assert messy.read_text(encoding="utf-8") == MESSY


def test_usage_error_is_2(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        run(capsys, "check", "--no-such-option", "x.memplan")
    assert info.value.code == 2


def test_check_json_schema(capsys, tmp_path) -> None:
    bad = write(tmp_path, "bad.memplan", BROKEN)
    good = write(tmp_path, "good.memplan", CLEAN)
    code, out, err = run(capsys, "check", "--syntax-only", "--format", "json", bad, good)
    assert code == 1 and err == ""
    document = json.loads(out)
    assert document["version"] == 1 and document["command"] == "check" and document["exit_code"] == 1
    first, second = document["files"]
    assert first["path"] == str(bad) and first["status"] == "error"
    (diagnostic,) = first["diagnostics"]
    assert diagnostic["code"] == "MP100" and diagnostic["severity"] == "error"
    assert diagnostic["span"] == {"file": str(bad), "line": 2, "column": 8, "end_line": 2, "end_column": 9}
    assert diagnostic["help"].startswith("expected")
    assert second == {"path": str(good), "status": "ok", "diagnostics": [], "summary": f"{good}: ok, 1 rule"}


def test_check_json_carries_notes_of_a_clean_plan(capsys, tmp_path) -> None:
    path = write(tmp_path, "b.memplan", "memplan 1\nbudget 1 GiB\n")
    code, out, err = run(capsys, "check", "--format", "json", path)
    assert code == 0 and err == ""
    (found,) = json.loads(out)["files"]
    assert [d["severity"] for d in found["diagnostics"]] == ["note"]


def test_github_annotations(capsys, tmp_path) -> None:
    bad = write(tmp_path, "a,b.memplan", BROKEN)
    code, out, _ = run(capsys, "check", "--syntax-only", "--format", "github", bad)
    assert code == 1
    (line,) = out.splitlines()
    name = str(bad).replace(",", "%2C").replace(":", "%3A")
    assert line.startswith(f"::error file={name},line=2,col=8,endLine=2,endColumn=9,title=memoplan MP100::unexpected")
    assert "%0Ahelp: expected" in line and "\n" not in line


def test_fmt_check_json_and_github(capsys, tmp_path) -> None:
    messy = write(tmp_path, "messy.memplan", MESSY)
    code, out, _ = run(capsys, "fmt", "--check", "--format", "json", messy)
    (found,) = json.loads(out)["files"]
    assert code == 1 and found["status"] == "reformat" and found["diff"].startswith("---")
    code, out, _ = run(capsys, "fmt", "--check", "--format", "github", messy)
    assert code == 1 and out == f"::error file={messy},title=memoplan fmt::would reformat (run memoplan fmt)\n"


def test_quiet_prints_only_problems(capsys, tmp_path) -> None:
    good = write(tmp_path, "good.memplan", "memplan 1\nbudget 1 GiB\n")
    code, out, err = run(capsys, "check", "-q", good)
    assert (code, out, err) == (0, "", "")
    code, out, err = run(capsys, "check", "-v", good)
    assert code == 0 and "note[" in err and ": ok" in out


def test_verify_json(capsys) -> None:
    code, out, err = run(capsys, "verify", "--format", "json", "-q", ROOT / "plans" / "cnn_bn_dropout.memplan")
    assert code == 0
    (found,) = json.loads(out)["files"]
    assert found["status"] == "ok" and found["equivalent"] is True
    assert found["peak_bytes"]["planned"] < found["peak_bytes"]["unplanned"]
    assert {c["name"] for c in found["checks"]} >= {"outputs", "gradients", "buffers"}
    assert "verdict: EQUIVALENT" in err  # the human-readable report, off stdout


def test_profile_to_standard_output(capsys, tmp_path) -> None:
    code, out, err = run(
        capsys,
        "profile",
        "--model",
        "memoplan.examples.cnn:build",
        "--example",
        "randn(2, 3, 32, 32)",
        "--repeats",
        "1",
        "-o",
        "-",
    )
    assert code == 0
    assert json.loads(out)["modules"]
    assert not Path("-").exists()


def test_python_dash_m_and_syntax_only_without_torch(tmp_path) -> None:
    """`python -m memoplan check --syntax-only` on a plan with a `model` line imports no torch."""
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['memoplan', 'check', '--syntax-only', sys.argv[1]]\n"
        "try:\n    runpy.run_module('memoplan', run_name='__main__')\n"
        "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", probe, str(ROOT / "plans" / "transformer.memplan")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert result.stdout.strip().endswith("exit 0 False"), result.stderr
    assert ": ok, 2 rules" in result.stdout


def test_demo_copies_the_bundled_plans(capsys, tmp_path) -> None:
    code, out, err = run(capsys, "demo", tmp_path / "demo", "-q")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "demo").glob("*.memplan")) == [p.name for p in PLANS]
    assert "verdict: EQUIVALENT" in out


def test_pre_commit_hooks_run_memoplan() -> None:
    text = (ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8")
    assert "entry: memoplan check --syntax-only" in text and "entry: memoplan fmt" in text
    assert text.count("files: \\.memplan$") == 2
