"""Hostile plan text: any line ending, control and bidi characters, huge lines and files.

Every excerpt under a diagnostic keeps its source line and caret whatever the line endings,
shows no raw control character (escaped through ``memoplan.diagnostics.printable``), and a
huge line is clipped around the caret.  The CLI runs in-process (``memoplan.cli.main``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _cli import run
from _paths import ROOT, TESTS

import memoplan
from memoplan.diagnostics import EXCERPT_WIDTH, PlanError

FIXTURES = TESTS / "fixtures" / "hostile"

# A raw C0/C1 control (a line break or a tab aside) or a bidi override in printed output.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


def _check(capsys, path: Path) -> tuple[int, str]:
    code, out, err = run(capsys, "check", "--syntax-only", path)
    assert not RAW_CONTROL.search(out + err), repr(out + err)
    return code, err


# ---------------------------------------------------------------- line endings


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_excerpt_and_caret_whatever_the_line_ending(capsys, tmp_path, newline) -> None:
    path = tmp_path / "plan.memplan"
    path.write_bytes(newline.join([b"memplan 1", b"module b { bogus }", b""]))
    code, err = _check(capsys, path)
    assert code == 1
    assert f"{path}:2:12: error[MP102]" in err
    assert "  2 | module b { bogus }\n    |            ^^^^^\n" in err
    assert "\r" not in err


def test_mixed_line_endings_count_lines_as_the_parser_does(capsys, tmp_path) -> None:
    path = tmp_path / "mixed.memplan"
    path.write_bytes(b"memplan 1\r\n# one\rmodule a { bogus }\nmodule b { keep }\r\rmodule c { nope }\r\n")
    code, err = _check(capsys, path)
    assert code == 1
    assert "  3 | module a { bogus }\n    |            ^^^^^\n" in err
    assert "  6 | module c { nope }\n    |            ^^^^\n" in err


def test_byte_order_mark_is_not_shown_and_the_caret_stays(capsys, tmp_path) -> None:
    path = tmp_path / "bom.memplan"
    path.write_bytes("\ufeffmemplan 1 bogus\n".encode())
    code, err = _check(capsys, path)
    assert code == 1
    assert "\ufeff" not in err
    assert "  1 | memplan 1 bogus\n    |           ^^^^^\n" in err


# ---------------------------------------------------------------- control and bidi characters


@pytest.mark.parametrize("hostile", ["\x1b[2J", "\u202e", "\x07", "\x9b31m", "\u2028"], ids=repr)
def test_excerpts_escape_control_and_bidi_characters(capsys, tmp_path, hostile) -> None:
    path = tmp_path / "plan.memplan"
    path.write_text(f"memplan 1\nmodule a {{ bogus }}  # {hostile} x\n", encoding="utf-8")
    code, err = _check(capsys, path)
    assert code == 1
    assert "  2 | module a { bogus }  # " in err
    assert "    |            ^^^^^\n" in err


def test_caret_stays_under_the_span_after_an_escaped_character(capsys, tmp_path) -> None:
    path = tmp_path / "plan.memplan"
    path.write_text('memplan 1\nmodule "\x1b[2J" { bogus }\n', encoding="utf-8")
    code, err = _check(capsys, path)
    assert code == 1
    line, caret = err.split("\n")[1:3]
    assert line == '  2 | module "\\x1b[2J" { bogus }'
    assert caret.index("^") == line.index("bogus") and caret.count("^") == 5


def test_the_loading_model_line_escapes_the_spec(capsys, tmp_path) -> None:
    path = tmp_path / "plan.memplan"
    path.write_text('memplan 1\nmodel "\\u001b[2Jno_such_module_31a\\u202e:build"\n', encoding="utf-8")
    code, out, err = run(capsys, "check", path)
    assert code == 1
    assert "memoplan: loading model \\x1b[2Jno_such_module_31a\\u202e:build" in err
    assert not RAW_CONTROL.search(out + err), repr(err)


# ---------------------------------------------------------------- huge lines


def test_excerpt_of_a_huge_line_is_clipped_around_the_caret(tmp_path) -> None:
    text = "memplan 1\nbudget 4 GiB  # " + "x" * 60_000 + "\nmodule a { bogus }  # " + "y" * 60_000 + "\n"
    with pytest.raises(PlanError) as info:
        memoplan.parse(text, "huge.memplan")
    rendered = str(info.value)
    assert len(rendered) < 4 * EXCERPT_WIDTH
    assert "  3 | module a { bogus }  # " in rendered and rendered.count("y") < EXCERPT_WIDTH
    assert "    |            ^^^^^\n" in rendered


def test_clipped_excerpt_keeps_the_caret_far_along_a_line() -> None:
    text = "memplan 1\nmodule " + "a." * 5000 + "b { bogus }\n"
    with pytest.raises(PlanError) as info:
        memoplan.parse(text, "long.memplan")
    line, caret = str(info.value).split("\n")[1:3]
    assert line.startswith("  2 | ...") and "a.a.a." in line and line.endswith("b { bogus }")
    assert len(line) < EXCERPT_WIDTH + 20
    assert caret.index("^") == line.index("bogus") and caret.count("^") == 5


# ---------------------------------------------------------------- files that are not plans, and the size limit


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_a_device_is_refused_without_reading_it(capsys, device) -> None:
    if not Path(device).exists():
        pytest.skip(f"no {device} here")
    code, err = _check(capsys, Path(device))
    assert code == 1
    assert f"error[MP107]: cannot read plan `{device}`: it is not a regular file" in err


def test_a_named_pipe_is_refused_without_waiting_for_a_writer(capsys, tmp_path) -> None:
    import os

    fifo = tmp_path / "plan.memplan"
    os.mkfifo(fifo)
    code, err = _check(capsys, fifo)  # would block forever if the pipe were opened for reading
    assert code == 1 and "error[MP107]" in err and "not a regular file" in err


def test_a_plan_over_the_size_limit_is_mp109_and_not_read(capsys, tmp_path, monkeypatch) -> None:
    from memoplan.syntax import reading

    path = tmp_path / "big.memplan"
    path.write_bytes(b"memplan 1\n" + b"# padding\n" * 2000)
    monkeypatch.setattr(reading, "MAX_PLAN_BYTES", 1000)
    reads = []
    monkeypatch.setattr(reading.os, "fdopen", lambda *a, **k: reads.append(a) or open(*a, **k))
    code, err = _check(capsys, path)
    assert code == 1 and len(reads) == 1
    assert f"error[MP109]: plan `{path}` is too large: 20,010 bytes, over the limit of 1,000 bytes" in err
    with pytest.raises(PlanError) as info:
        memoplan.load(path)
    assert info.value.codes == ["MP109"]


def test_text_over_the_size_limit_is_mp109_before_parsing(monkeypatch) -> None:
    from memoplan.syntax import parser, reading

    monkeypatch.setattr(reading, "MAX_PLAN_BYTES", 100)
    monkeypatch.setattr(parser, "_parse_tree", lambda *a, **k: pytest.fail("parsed a plan over the limit"))
    plan, diagnostics = parser.parse_with_diagnostics("memplan 1\n" + "module a { keep }\n" * 10, "x.memplan")
    assert plan is None and [d.code for d in diagnostics] == ["MP109"]


def test_endless_standard_input_is_read_only_up_to_the_limit(tmp_path) -> None:
    import subprocess
    import sys

    root = ROOT
    with open("/dev/zero", "rb") as endless:
        done = subprocess.run(
            [sys.executable, "-m", "memoplan", "check", "--syntax-only", "-"],
            stdin=endless,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=root,
            env={**__import__("os").environ, "PYTHONPATH": str(root)},
        )
    assert done.returncode == 1
    assert "error[MP109]: plan `<stdin>` is too large" in done.stderr and "Traceback" not in done.stderr


def test_parsing_leaves_the_garbage_collector_as_it_found_it() -> None:
    import gc

    assert gc.isenabled()
    memoplan.parse("memplan 1\nmodule a { keep }\n")
    assert gc.isenabled()
    with pytest.raises(PlanError):
        memoplan.parse("memplan 1\nmodule a { bogus }\n")
    assert gc.isenabled()
    gc.disable()
    try:
        memoplan.parse("memplan 1\n")
        assert not gc.isenabled()  # a caller's own choice is kept
    finally:
        gc.enable()


def test_file_names_from_a_folder_are_escaped_in_every_line(capsys, tmp_path) -> None:
    (tmp_path / "x\x1b[2Jy.memplan").write_text("memplan 1\nmodule a { keep }\n", encoding="utf-8")
    (tmp_path / "b\u202ez.memplan").write_text("memplan 1\nmodule a { kep }\n", encoding="utf-8")
    for argv in (["check", "--syntax-only"], ["check"], ["fmt", "--check"], ["fmt"]):
        code, out, err = run(capsys, *argv, tmp_path)
        assert code in (1, 3), (argv, err)
        assert not RAW_CONTROL.search(out + err), (argv, out + err)
        assert "x\\x1b[2Jy.memplan" in out + err and "b\\u202ez.memplan" in err
