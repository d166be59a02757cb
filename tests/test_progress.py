"""What a long command shows while it works (memoplan.progress): stages in plain words, a bar
with the time left on a terminal only, details with -v, nothing with -q or --format json."""

from __future__ import annotations

import io
import re

import pytest

from memoplan import cli
from memoplan.progress import Reporter, size


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(reporter: Reporter, total: int = 3) -> None:
    reporter.say("loading model")
    with reporter.stage("measuring the training step", total, "steps"):
        for i in range(total):
            reporter.detail(f"step {i}")
            reporter.advance()
    reporter.say("done")


def test_a_terminal_gets_a_bar_with_the_time_left(monkeypatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    reporter, out = Reporter(), Terminal()
    reporter.configure(stream=out)
    _run(reporter)
    text = out.getvalue()
    assert "\r  [######" in text
    assert re.search(r"\r  \[#+\.+\] 1/3 steps, \d+\.\d s, about \d+\.\d s left", text)
    assert "step 0" not in text  # details only with -v
    lines = [line.rsplit("\r", 1)[-1] for line in text.split("\n")]  # what stays on screen
    assert lines[:2] == ["memoplan: loading model", "memoplan: measuring the training step (3 steps)"]
    assert re.fullmatch(r"  3 steps in \d+\.\d s", lines[2])  # the bar, replaced by what it took
    assert lines[3:] == ["memoplan: done", ""]


def test_a_log_gets_one_line_a_stage_and_no_carriage_return() -> None:
    reporter, out = Reporter(), io.StringIO()
    reporter.configure(stream=out)
    _run(reporter, total=1)
    assert out.getvalue() == (
        "memoplan: loading model\nmemoplan: measuring the training step (1 step)\nmemoplan: done\n"
    )


def test_dumb_terminal_gets_no_bar(monkeypatch) -> None:
    monkeypatch.setenv("TERM", "dumb")
    reporter, out = Reporter(), Terminal()
    reporter.configure(stream=out)
    _run(reporter)
    assert "\r" not in out.getvalue()


def test_verbose_adds_details_and_elapsed_time() -> None:
    reporter, out = Reporter(), io.StringIO()
    reporter.configure(verbosity=1, stream=out)
    _run(reporter, total=2)
    lines = out.getvalue().splitlines()
    assert [re.sub(r" \[\d+\.\d s\]$", "", line) for line in lines] == [
        "memoplan: loading model",
        "memoplan: measuring the training step (2 steps)",
        "memoplan: step 0",
        "memoplan: step 1",
        "memoplan: done",
    ]
    assert all(re.search(r" \[\d+\.\d s\]$", line) for line in lines)


@pytest.mark.parametrize("settings", [{"verbosity": -1}, {"enabled": False}])
def test_quiet_and_json_say_nothing(settings) -> None:
    for stream in (io.StringIO(), Terminal()):
        reporter = Reporter()
        reporter.configure(stream=stream, **settings)
        _run(reporter)
        assert stream.getvalue() == ""


def test_sizes_in_plain_units() -> None:
    assert [size(n) for n in (0, 512, 1536, 2378496, 3 << 30)] == ["0 B", "512 B", "1.5 KiB", "2.27 MiB", "3.00 GiB"]


PLAN = ("plan", "--model", "memoplan.examples.cnn:build", "--example", "randn(2, 3, 16, 16)")


@pytest.mark.slow
def test_plan_speaks_plain_words_quiet_says_nothing_verbose_the_details(tmp_path, capsys) -> None:
    out = tmp_path / "p.memplan"
    # 50%, hard: whole blocks miss it, so the search widens and tries runs of `features` (the old
    # jargon), then refuses (MP601: this CNN's least peak is about 75%)
    assert cli.main([*PLAN, "--budget", "50%", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "memoplan: measuring the training step (1 step)" in err
    assert "checkpointing features in " in err and "runs of its children" in err
    for jargon in ("Chen et al.", "sqrt(n)", "0 of 0 trials", "least-peak split of", " B ->"):
        assert jargon not in err
    assert "error[MP601]" in err
    # a hint: the plan of whole blocks is written, quickly
    assert cli.main([*PLAN, "--budget", "50%", "--hint", "-o", str(out), "-q"]) == 0
    assert capsys.readouterr().err == ""
    assert cli.main([*PLAN, "--budget", "50%", "--hint", "-o", str(out), "-v"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"^memoplan: profile: time 1/1 step \[\d+\.\d s\]$", err, re.M)
