"""Hostile and unlucky input, second round (issue 39, items 7-10): what memoplan prints stays
what it promises whatever the user gives it.

* ``--format json`` is always JSON, in UTF-8: a file name that is not UTF-8 is escaped, and
  no float option takes ``nan``, ``inf`` or a negative number;
* what the user typed is echoed with its control characters escaped;
* messages name the real cause: the compare example, the compile backend;
* ``compile -o -`` writes to standard output as ``plan`` and ``profile`` do;
* Ctrl-C once the output is complete does not turn a finished command into exit 130.

The language server's side (every request answered) is ``tests/lsp/test_lsp_requests.py``;
bounded error recovery is ``tests/syntax/test_recovery_work.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from _cli import run, write
from _paths import ROOT

from memoplan import cli

RAW_ESCAPE = "\x1b"

MODEL_PY = """
from torch import nn


def build():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
"""

PLAN = 'memplan 1\nmodel "model.py:build"\nexample randn(2, 4)\nmodule "0" { checkpoint }\n'


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


def _usage_error(capsys, *argv) -> str:
    """``memoplan ARGV`` is a usage error (exit 2): its message, on stderr."""
    with pytest.raises(SystemExit) as info:
        cli.main([str(a) for a in argv])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err


# ---------------------------------------------------------------- item 7: JSON is JSON


def test_json_output_escapes_a_file_name_that_is_not_utf8(capsys, tmp_path) -> None:
    folder = tmp_path / "plans"
    folder.mkdir()
    name = os.fsdecode(b"bad\xff.memplan")  # as Python names such a file: a lone surrogate
    (folder / name).write_text("memplan 1\nmodle x\n", encoding="utf-8")
    write(folder, "good.memplan", "memplan 1\n")
    code, out, _ = run(capsys, "check", "--syntax-only", "--format", "json", folder)
    assert code == 1
    out.encode("utf-8")  # no lone surrogate: stdout gets UTF-8, not the raw byte 0xff
    document = json.loads(out)
    paths = [f["path"] for f in document["files"]]
    assert any(p.endswith("bad\\udcff.memplan") for p in paths), paths
    (bad,) = [f for f in document["files"] if "bad" in f["path"]]
    assert bad["diagnostics"][0]["code"] == "MP101"
    assert "\\udcff" in bad["diagnostics"][0]["span"]["file"]


def test_json_output_of_a_name_that_is_not_utf8_is_utf8_in_a_real_process(tmp_path) -> None:
    folder = tmp_path / "plans"
    folder.mkdir()
    (folder / os.fsdecode(b"\xff.memplan")).write_text("memplan 1\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), LC_ALL="C.UTF-8")
    done = subprocess.run(
        [sys.executable, "-m", "memoplan", "check", "--syntax-only", "--format", "json", str(folder)],
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert b"\xff" not in done.stdout
    assert json.loads(done.stdout.decode("utf-8"))["files"][0]["path"].endswith("\\udcff.memplan")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "NaN", "1e999"])
def test_rtol_refuses_what_is_not_a_finite_nonnegative_number(capsys, tmp_path, value) -> None:
    plan = write(tmp_path, "p.memplan", PLAN)
    err = _usage_error(capsys, "verify", plan, f"--rtol={value}", "--format", "json")
    assert "--rtol" in err and "finite number" in err


@pytest.mark.parametrize("value", ["nan", "inf", "-0.5"])
def test_report_budgets_refuse_nan_inf_and_negatives(capsys, tmp_path, value) -> None:
    plan = write(tmp_path, "p.memplan", PLAN)
    err = _usage_error(capsys, "report", plan, "-o", tmp_path / "r.html", "--budgets", "0.5", value)
    assert "--budgets" in err and "finite number" in err


def test_json_never_holds_nan_or_infinity() -> None:
    from memoplan.cli_output import json_safe

    document = json_safe({"rtol": float("nan"), "peak": [float("inf"), 1.5], "name\udcff": "x\udcfe"})
    text = json.dumps(document, allow_nan=False, ensure_ascii=False)
    assert json.loads(text) == {"rtol": None, "peak": [None, 1.5], "name\\udcff": "x\\udcfe"}


# ---------------------------------------------------------------- item 10: echoed input is escaped


def test_rule_does_not_echo_a_raw_escape(capsys) -> None:
    assert cli.main(["rule", "MP1\x1b[31m"]) == 2
    out, err = capsys.readouterr()
    assert RAW_ESCAPE not in out + err
    assert "MP1\\x1b[31m" in err


def test_usage_errors_escape_what_the_user_typed(capsys, tmp_path) -> None:
    err = _usage_error(capsys, "check", tmp_path, "--x\x1b[2J\u202e")  # argparse echoes unknown arguments as typed
    assert RAW_ESCAPE not in err and "\u202e" not in err
    assert "--x\\x1b[2J\\u202e" in err


@pytest.mark.parametrize(("value", "reason"), [("-1", "a share is in (0, 1]"), ("0", "a count is at least 1")])
def test_coverage_out_of_range_says_so_in_the_users_words(capsys, value, reason) -> None:
    code, _, err = run(capsys, "plan", "--model", "x:y", "--example", "randn(1)", f"--coverage={value}", "-o", "-")
    assert code == 2
    assert "Fraction" not in err
    assert f"got `{value}`: {reason}" in err


def test_rtol_and_coverage_errors_escape_the_value(capsys) -> None:
    err = _usage_error(capsys, "verify", "p.memplan", "--rtol", "\x1b[31m")
    assert RAW_ESCAPE not in err and "\\x1b[31m" in err
    code, _, err = run(capsys, "plan", "--model", "x:y", "--example", "randn(1)", "--coverage=\x1b[31m", "-o", "-")
    assert code == 2
    assert RAW_ESCAPE not in err and "\\x1b[31m" in err


# ---------------------------------------------------------------- item 10: compile -o -


def test_compile_to_standard_output_writes_no_file_named_dash(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", MODEL_PY)
    plan = write(tmp_path, "p.memplan", PLAN)
    code, out, _ = run(capsys, "compile", plan, "-o", "-")
    assert code == 0
    assert not (tmp_path / "-").exists()
    assert out.startswith("# Code generated by memoplan")
    code, _, _ = run(capsys, "compile", plan, "-o", tmp_path / "plan_module.py")
    assert code == 0
    assert (tmp_path / "plan_module.py").read_text(encoding="utf-8") == out


def test_compile_check_against_standard_output_is_refused(capsys, tmp_path) -> None:
    plan = write(tmp_path, "p.memplan", PLAN)
    code, out, err = run(capsys, "compile", plan, "-o", "-", "--check")
    assert code == 1 and out == ""
    assert "MP508" in err and "standard output" in err
    assert not (tmp_path / "-").exists()


# ---------------------------------------------------------------- item 9: messages name the cause


@pytest.mark.slow
def test_a_compare_example_of_the_wrong_shape_is_named(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "model.py", MODEL_PY)
    plan = write(tmp_path, "p.memplan", PLAN)
    code, _, err = run(capsys, "verify", plan, "--compare-example", "randn(2, 5)")
    assert code == 1
    assert "MP504" in err and "compare example" in err and "--compare-example" in err
    assert "check that the example input fits the model (`--example`)" not in err


def test_an_unknown_compile_backend_is_named_as_given(capsys, tmp_path) -> None:
    plan = write(tmp_path, "p.memplan", PLAN)
    err = _usage_error(capsys, "verify", plan, "--compile", "bogus_backend")
    assert "no backend `bogus_backend`" in err and "inductor" in err and "aot_eager" in err
    assert "CountingBackend" not in err and not err.rstrip().endswith("raised:")


def test_a_failing_compile_backend_is_named_with_what_it_raised(tmp_path) -> None:
    import torch
    from torch import nn

    from memoplan import parse, resolve
    from memoplan.diagnostics import PlanError
    from memoplan.graphs import CountingBackend
    from memoplan.specs import Example
    from memoplan.verification import verify

    @torch._dynamo.register_backend(name="memoplan_test_failing")
    def failing(gm, example_inputs):
        raise RuntimeError("this backend cannot compile anything\nsecond line")

    assert CountingBackend("memoplan_test_failing").__name__ == "memoplan_test_failing"
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    resolved = resolve(parse('memplan 1\nmodule "0" { checkpoint }\n'), model)
    with pytest.raises(PlanError) as info:
        verify(model, resolved, Example((torch.randn(2, 4),)), compile="memoplan_test_failing")
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "MP504"
    assert diagnostic.message == (
        "torch.compile's backend `memoplan_test_failing` raised RuntimeError: this backend cannot compile anything"
    )
    assert "aot_eager" in (diagnostic.help or "")


# ---------------------------------------------------------------- item 10: Ctrl-C after the output


LINGERING = """
import sys, threading, time
threading.Thread(target=time.sleep, args=(30,)).start()  # teardown waits for it, as for a model's thread
from memoplan.cli import main
sys.exit(main())
"""


def test_ctrl_c_after_the_output_is_complete_keeps_the_exit_code(tmp_path) -> None:
    plan = write(tmp_path, "p.memplan", "memplan 1\nmodle x\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-c", LINGERING, "check", "--syntax-only", str(plan)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        err = ""
        while "1 error" not in err and time.monotonic() < deadline:  # the command's last line
            err += child.stderr.readline()
        time.sleep(0.2)  # in Python's teardown, waiting for the thread
        child.send_signal(signal.SIGINT)
        out, rest = child.communicate(timeout=20)
    finally:
        child.kill()
    assert child.returncode == 1, (child.returncode, err + rest)  # the command's own code, not 130 or -2
    assert "KeyboardInterrupt" not in rest and "Traceback" not in rest
