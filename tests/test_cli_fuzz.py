"""Any bytes given to ``memoplan check`` and ``memoplan fmt``: exit 0 or 1 (``fmt``: 3 when the
plan cannot be read or parsed, as documented), never a traceback, and no raw control or
bidirectional character in what is printed.  In-process through ``memoplan.cli.main``;
``tests/fixtures/hostile/`` holds the fuzz cases that once broke this (CR-only and mixed line
ends, escape sequences, bidi overrides, NUL, lone surrogates, deep nesting, a long line).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _paths import TESTS
from _profiles import n_examples
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from memoplan import cli

FIXTURES = TESTS / "fixtures" / "hostile"
TRACEBACK = "Traceback (most recent call last)"
# A raw C0/C1 control (a line break aside) or a bidi override or separator in printed output.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")

PIECES = [
    "memplan 1",
    "memplan 2",
    "module",
    "a.b",
    "layers.*",
    "**",
    "[0:3]",
    "class Linear",
    "not",
    "{",
    "}",
    "checkpoint",
    "segments = 2",
    "compress input=uint8",
    "keep",
    "budget 4 GiB",
    "dtr",
    "eviction_threshold = 1 GiB",
    "sublinear",
    "memory",
    "#",
    '"',
    '"x"',
    "\\",
    ";",
    "=",
    "\n",
    "\r",
    "\r\n",
    "\t",
    " ",
    "\ufeff",
    "\x00",
    "\x1b[2J",
    "\u202e",
    "\x9b",
    "\u2028",
    "\ud800",
    "é",
    "😀",
    "1e999",
    "-1",
    "0x",
    "'",
    "**x",
    "\\u00",
    "\f",
    "\v",
]


def _run(capsys, *argv) -> tuple[int, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out + err


def _assert_clean(output: str) -> None:
    assert TRACEBACK not in output
    assert not RAW_CONTROL.search(output), repr(RAW_CONTROL.search(output).group())


def _check_all(capsys, path: Path, full: bool) -> None:
    data = path.read_bytes()
    code, output = _run(capsys, "check", "--syntax-only", path)
    assert code in (0, 1), output
    _assert_clean(output)
    if full:  # resolving would import the plan's model: only for plans that name none
        code, output = _run(capsys, "check", path)
        assert code in (0, 1), output
        _assert_clean(output)
    code, output = _run(capsys, "fmt", "--check", path)
    assert code in (0, 1, 3), output
    _assert_clean(output)
    assert path.read_bytes() == data  # --check changes nothing
    code, output = _run(capsys, "fmt", path)
    assert code in (0, 3), output
    _assert_clean(output)
    if code == 0:  # formatted: formatting again changes nothing
        formatted = path.read_bytes()
        assert _run(capsys, "fmt", "--check", path)[0] == 0
        assert path.read_bytes() == formatted


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate as the bytes a careless tool writes


texts = st.lists(st.sampled_from(PIECES), max_size=30).map(" ".join).map(_encode)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


@settings(max_examples=n_examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=300), texts, texts.map(lambda b: b"memplan 1\n" + b)))
def test_any_bytes_give_a_clean_exit_and_clean_output(capsys, tmp_path, data: bytes) -> None:
    assume(b"model" not in data and b"example" not in data)
    path = tmp_path / "fuzz.memplan"
    path.write_bytes(data)
    _check_all(capsys, path, full=True)


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.memplan")), ids=lambda p: p.stem)
def test_fuzz_regressions(capsys, tmp_path, fixture: Path) -> None:
    path = tmp_path / fixture.name
    path.write_bytes(fixture.read_bytes())
    _check_all(capsys, path, full=True)
