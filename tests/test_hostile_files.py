"""Hostile and unlucky files (issue 39): a write that fails leaves the old file whole, one
unwritable plan does not stop the others, a folder scan does not follow links out of the
folder, no excerpt of a file that is not a plan is printed, and no printed line starts with a
user-controlled ``::`` (a GitHub workflow command).

A failed write is a real one where it can be: a subprocess under ``RLIMIT_FSIZE`` (a full
disk or a quota fails the same way, mid-file).  The code cache's own attacks are in
tests/codegen/test_cache.py.
"""

from __future__ import annotations

import ast
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import run, write
from _paths import ROOT
from hypothesis import given
from hypothesis import strategies as st

import memoplan
from memoplan import targets
from memoplan.diagnostics import PlanError

resource = pytest.importorskip("resource")

LIMIT = 1024  # bytes a file may grow to in the limited subprocess (`ulimit -f 1`)
MESSY = "memplan 1\nmodule   fc {keep}\n"
CLEAN = "memplan 1\n\nmodule fc { keep }\n"


def _big_messy_plan(blocks: int = 80) -> str:
    """A plan that needs reformatting and is well over LIMIT bytes once formatted."""
    return "memplan 1\n" + "".join(f"module   blk{i}   {{checkpoint}}\n" for i in range(blocks))


def _limited(
    *args: str, cwd: Path, limit: int = LIMIT, module: str | None = "memoplan"
) -> subprocess.CompletedProcess[str]:
    """``python -m memoplan ARGS`` (``module=None``: ``python ARGS``) with files limited to
    ``limit`` bytes, as ``ulimit -f`` limits them."""

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *(["-m", module] if module else []), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=limit_files,
        timeout=300,
    )


def _leftovers(folder: Path) -> list[str]:
    """Temporary files a write left behind (there must be none)."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# ---------------------------------------------------------------- 1: every write replaces at once


def test_fmt_whose_write_fails_leaves_the_plan_whole(tmp_path) -> None:
    plan = write(tmp_path, "p.memplan", _big_messy_plan())
    before = plan.read_bytes()
    done = _limited("fmt", "p.memplan", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "error[MP508]: cannot write `p.memplan`: File too large" in done.stderr
    assert "the plan is left as it was" in done.stderr
    assert plan.read_bytes() == before  # not cut at 1,024 bytes
    assert _leftovers(tmp_path) == []


def test_replace_file_keeps_the_mode_and_leaves_no_temporary_file(tmp_path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    target.chmod(0o640)
    targets.replace_file(target, "new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert _leftovers(tmp_path) == []


def test_replace_file_writes_through_a_link_and_keeps_it(tmp_path) -> None:
    real = tmp_path / "real.memplan"
    real.write_text("old")
    link = tmp_path / "link.memplan"
    link.symlink_to(real)
    targets.replace_file(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_replace_file_never_replaces_a_device_or_a_folder(tmp_path) -> None:
    with pytest.raises(OSError):
        targets.replace_file(tmp_path, "x")
    assert tmp_path.is_dir()
    if Path("/dev/null").exists():
        with pytest.raises(OSError):
            targets.replace_file("/dev/null", "x")
        assert Path("/dev/null").is_char_device()


def test_replace_file_that_fails_midway_removes_its_temporary_file(tmp_path, monkeypatch) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old and whole")

    def fails(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(targets.os, "fsync", fails)
    with pytest.raises(OSError, match="No space"):
        targets.replace_file(target, "new")
    assert target.read_text() == "old and whole"
    assert _leftovers(tmp_path) == []


def _writes(tree: ast.AST) -> list[tuple[str, int]]:
    """``write_text``/``write_bytes`` calls and ``open``/``fdopen`` calls with a writing mode."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in ("write_text", "write_bytes"):
            found.append((name, node.lineno))
        elif name in ("open", "fdopen"):
            modes = [a for a in node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]]
            if any(
                isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax+") for m in modes
            ):
                found.append((name, node.lineno))
    return found


def test_no_module_writes_a_user_file_in_place() -> None:
    """Every file the package writes goes through ``memoplan.targets.replace_file``; the
    exceptions below write no user file."""
    allowed = {
        "memoplan/targets.py": 1,  # replace_file's own temporary file
        "memoplan/isolate.py": 2,  # the --isolate child's status file, in its private temporary folder
        "memoplan/lsp/worker.py": 1,  # the worker's protocol stream (a duplicated descriptor)
        "memoplan/planner/search/exact.py": 1,  # os.devnull
    }
    found = {}
    for path in sorted((ROOT / "memoplan").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        if "write_" not in text and "open(" not in text:
            continue
        writes = _writes(ast.parse(text))
        if writes:
            found[relative] = len(writes)
    assert found == allowed


def test_plan_output_whose_write_fails_leaves_the_old_file(tmp_path) -> None:
    """``plan -o`` (both planners) and ``fmt`` write through ``cli_output``: here without a model."""
    (tmp_path / "out.memplan").write_text("old plan, whole\n")
    script = "from memoplan.cli_output import write_output; from pathlib import Path; write_output(Path('out.memplan'), 'x' * 4096)"
    done = _limited("-c", script, cwd=tmp_path, module=None)
    assert done.returncode == 1 and "MP508" in done.stderr and "File too large" in done.stderr
    assert (tmp_path / "out.memplan").read_text() == "old plan, whole\n"
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
def test_profile_and_compile_whose_writes_fail_leave_the_old_files(tmp_path) -> None:
    (tmp_path / "m.py").write_text(
        "from torch import nn\n\n\ndef build():\n    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))\n"
    )
    write(tmp_path, "p.memplan", 'memplan 1\nmodel "m.py:build"\n\nmodule 0 { checkpoint }\n')
    old = {name: f"old {name}, whole\n".encode() * 4 for name in ("prof.json", "out.py")}
    for name, data in old.items():
        (tmp_path / name).write_bytes(data)
    commands = {
        "prof.json": ["profile", "--model", "m.py:build", "--example", "randn(4, 8)", "-o", "prof.json"],
        "out.py": ["write-module", "p.memplan", "-o", "out.py"],
    }
    for name, args in commands.items():
        done = _limited(*args, cwd=tmp_path, limit=128)  # each output is larger
        assert done.returncode == 1, (name, done.stderr)
        assert "error[MP508]" in done.stderr and "File too large" in done.stderr, (name, done.stderr)
        assert (tmp_path / name).read_bytes() == old[name], name
    assert _leftovers(tmp_path) == []


# ---------------------------------------------------------------- 2: one unwritable plan stops nothing


def test_fmt_folder_with_a_plan_it_cannot_write_formats_the_others(tmp_path) -> None:
    folder = tmp_path / "plans"
    folder.mkdir()
    write(folder, "a.memplan", MESSY.replace("fc", "a"))
    big = write(folder, "big.memplan", _big_messy_plan())
    write(folder, "z.memplan", MESSY.replace("fc", "z"))
    before = big.read_bytes()
    done = _limited("fmt", "plans", "--format", "json", cwd=tmp_path)
    document = json.loads(done.stdout)
    assert done.returncode == 3 and document["exit_code"] == 3
    statuses = {f["path"]: f["status"] for f in document["files"]}
    assert statuses == {
        "plans/a.memplan": "reformatted",
        "plans/big.memplan": "error",
        "plans/z.memplan": "reformatted",
    }
    (failed,) = [f for f in document["files"] if f["status"] == "error"]
    assert [d["code"] for d in failed["diagnostics"]] == ["MP508"]
    assert (folder / "a.memplan").read_text() == CLEAN.replace("fc", "a")
    assert (folder / "z.memplan").read_text() == CLEAN.replace("fc", "z")
    assert big.read_bytes() == before


def test_fmt_leaves_a_read_only_plan_alone_and_formats_the_others(capsys, tmp_path, monkeypatch) -> None:
    folder = tmp_path / "plans"
    folder.mkdir()
    first = write(folder, "a.memplan", MESSY)
    locked = write(folder, "b.memplan", MESSY)
    last = write(folder, "c.memplan", MESSY)
    locked.chmod(0o444)
    if os.geteuid() == 0:  # root may write any file: take its override away for this test
        real_access = os.access

        def access(path, mode, **kwargs) -> bool:
            if Path(path) == locked and mode & os.W_OK:
                return False
            return real_access(path, mode, **kwargs)

        monkeypatch.setattr(os, "access", access)
    code, out, err = run(capsys, "fmt", folder)
    assert code == 3
    assert f"error[MP508]: cannot write `{locked}`: Permission denied" in err
    assert first.read_text() == CLEAN and last.read_text() == CLEAN
    assert locked.read_text() == MESSY and stat.S_IMODE(locked.stat().st_mode) == 0o444
    assert out.splitlines() == [f"reformatted {first}", f"reformatted {last}"]


# ---------------------------------------------------------------- 4: no secret printed from a file that is not a plan

TOKEN = "ghp_SECRETTOKEN0123456789"
CREDENTIALS = f"[default]\naws_access_key_id = AKIAEXAMPLE\naws_secret_access_key = {TOKEN}\n"


def _memoplan(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m memoplan ARGS`` with the token in its environment (``/proc/self/environ``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEMOPLAN_TEST_TOKEN": TOKEN}
    return subprocess.run(
        [sys.executable, "-m", "memoplan", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture()
def linked(tmp_path: Path, monkeypatch) -> Path:
    """``plans/`` with one plan and links, named like plans, to a credentials file and to the
    process's environment, both outside the folder (the current folder)."""
    (tmp_path / "plans").mkdir()
    write(tmp_path / "plans", "ok.memplan", CLEAN)
    secret = write(tmp_path, "credentials", CREDENTIALS)
    (tmp_path / "plans" / "creds.memplan").symlink_to(secret)
    if ENVIRON.exists():
        (tmp_path / "plans" / "env.memplan").symlink_to(ENVIRON)
    monkeypatch.chdir(tmp_path)
    return tmp_path


ENVIRON = Path("/proc/self/environ")


def _secrets() -> list[str]:
    """What must not be printed: the token, and each entry of this process's environment."""
    entries = ENVIRON.read_bytes().decode("utf-8", "replace").split("\0") if ENVIRON.exists() else []
    return [TOKEN, "AKIAEXAMPLE", *(e for e in entries if len(e) > 12)]


def _leaks(text: str) -> list[str]:
    return [secret for secret in _secrets() if secret in text]


@pytest.mark.skipif(not ENVIRON.exists(), reason="no /proc/self/environ here")
def test_a_link_to_the_environment_prints_no_token(linked) -> None:
    done = _memoplan("check", "--syntax-only", "plans", "plans/env.memplan", cwd=linked)
    assert done.returncode == 1
    assert TOKEN not in done.stdout + done.stderr
    assert "skipped plans/env.memplan: a link to a file outside plans" in done.stderr  # the folder's
    assert "error[MP107]: `plans/env.memplan` is not a plan: it holds NUL bytes" in done.stderr  # named


@pytest.mark.parametrize("command", [["check", "--syntax-only"], ["fmt", "--check"]])
def test_a_folder_scan_does_not_follow_links_out_of_the_folder(capsys, linked, command) -> None:
    code, out, err = run(capsys, *command, "plans")
    assert code == 0, err
    assert _leaks(out + err) == []
    assert "skipped plans/creds.memplan: a link to a file outside plans" in err
    assert "plans/ok.memplan: ok, 1 rule" in out or command[0] == "fmt"


def test_a_link_inside_the_folder_is_read(capsys, tmp_path, monkeypatch) -> None:
    (tmp_path / "plans" / "deep").mkdir(parents=True)
    write(tmp_path / "plans", "ok.memplan", CLEAN)
    (tmp_path / "plans" / "deep" / "same.memplan").symlink_to("../ok.memplan")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "check", "--syntax-only", "plans")
    assert code == 0 and "plans/deep/same.memplan: ok, 1 rule" in out


@pytest.mark.parametrize("command", [["check", "--syntax-only"], ["fmt", "--check"], ["fmt"]])
@pytest.mark.parametrize("name", ["creds.memplan", "env.memplan"])
def test_a_linked_file_named_itself_prints_no_excerpt(capsys, linked, command, name) -> None:
    if not (linked / "plans" / name).exists():
        pytest.skip("no /proc/self/environ here")
    before = (linked / "credentials").read_bytes()
    for output in ("text", "json", "github") if command[0] == "fmt" else ("text",):
        code, out, err = run(capsys, *command, f"plans/{name}", "--format", output)
        assert code in (1, 3), err
        assert _leaks(out + err) == [], output
        assert ("MP104" if name == "creds.memplan" else "MP107") in out + err
        assert " | " not in err  # no source line shown
    assert (linked / "credentials").read_bytes() == before


@pytest.mark.parametrize(
    "data, code",
    [
        (b"memplan 1\n\x00\x01 " + TOKEN.encode(), "MP107"),  # a NUL byte: binary
        (TOKEN.encode() + b" \xff\n", "MP104"),  # not UTF-8 and no header
        (f"# notes\n{TOKEN}\nmemplan 1\n".encode(), "MP104"),  # the header is not the first statement
    ],
)
def test_a_file_that_is_not_a_plan_prints_no_excerpt(capsys, tmp_path, data, code) -> None:
    path = tmp_path / "x.memplan"
    path.write_bytes(data)
    for command in (["check", "--syntax-only"], ["fmt", "--check"]):
        status, out, err = run(capsys, *command, path)
        assert status in (1, 3)
        assert f"error[{code}]" in err and TOKEN not in out + err and " | " not in err
    with pytest.raises(PlanError) as info:
        memoplan.load(path)
    assert TOKEN not in str(info.value)


def test_standard_input_that_is_not_a_plan_prints_no_excerpt(capsys, monkeypatch) -> None:
    for text in (CREDENTIALS, f"token={TOKEN}\n", f"memplan 1\n\0{TOKEN}\n"):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8"))
        code, out, err = run(capsys, "check", "--syntax-only", "-")
        assert code == 1 and ("error[MP104]" in err or "error[MP107]" in err)
        assert _leaks(out + err) == []


def test_a_plan_with_an_error_still_shows_its_line(capsys, tmp_path) -> None:
    path = write(tmp_path, "p.memplan", "memplan 1\nmodule fc { checkpointing }\n")
    status, out, err = run(capsys, "check", "--syntax-only", path)
    assert status == 1 and "2 | module fc { checkpointing }" in err


# ---------------------------------------------------------------- 5: no line starts with a `::` of the user's


def _commands(text: str) -> list[str]:
    """The lines of ``text`` that GitHub Actions would read as workflow commands."""
    return [line for line in text.splitlines() if line.lstrip().startswith("::")]


def test_a_plan_named_like_a_workflow_command_is_not_one(capsys, tmp_path, monkeypatch) -> None:
    write(tmp_path, "::add-mask::x.memplan", "memplan 1\n")
    write(tmp_path, "::error::y.memplan", "not a plan\n")
    write(tmp_path, " ::warning::z.memplan", MESSY)
    monkeypatch.chdir(tmp_path)
    for command in (["check", "--syntax-only", "."], ["fmt", "--check", "."], ["fmt", "--check", "-v", "."]):
        status, out, err = run(capsys, *command)
        assert status in (1, 3)
        assert _commands(out) == [] and _commands(err) == [], command
    status, out, err = run(capsys, "check", "--syntax-only", ".")
    assert "\\x3a:add-mask::x.memplan: ok, 0 rules" in out.splitlines()
    assert "\\x3a:error::y.memplan:1:1: error[MP104]" in err


def test_github_format_keeps_its_own_annotations_only(capsys, tmp_path, monkeypatch) -> None:
    write(tmp_path, "::error::y.memplan", "not a plan\n")
    write(tmp_path, "::add-mask::z.memplan", MESSY)
    monkeypatch.chdir(tmp_path)
    status, out, err = run(capsys, "fmt", "--check", ".", "--format", "github")
    assert status == 3
    assert [line.split(" ", 1)[0] for line in _commands(out)] == ["::error", "::error"]
    assert all(",title=memoplan " in line for line in _commands(out))
    assert _commands(err) == []


def test_module_names_like_workflow_commands_are_not_ones(capsys, tmp_path) -> None:
    write(
        tmp_path,
        "m.py",
        "from torch import nn\n\n\ndef build():\n    model = nn.Sequential()\n"
        "    model.add_module('::add-mask::x', nn.Linear(4, 4))\n    return model\n",
    )
    plan = write(tmp_path, "p.memplan", "memplan 1\nmodule ** { checkpoint }\n")
    status, out, err = run(capsys, "explain", plan, "--model", f"{tmp_path / 'm.py'}:build")
    assert status == 0, err
    assert "\\x3a:add-mask::x  Linear  checkpoint" in out
    assert _commands(out) == [] and _commands(err) == []


@given(st.lists(st.tuples(st.text(alphabet=" \t:\n\rab", max_size=10), st.booleans()), max_size=10))
def test_line_guard_defuses_commands_however_the_text_is_split(pieces) -> None:
    from memoplan.cli_output import LineGuard

    sink = io.StringIO()
    guard = LineGuard(sink)
    for piece, release in pieces:
        guard.write(piece)
        if release:  # what `--format github` does before its own annotations
            guard.release()
    guard.release()
    written = sink.getvalue()
    assert _commands(written) == []
    assert written.replace("\\x3a", ":") == "".join(piece for piece, _ in pieces)  # nothing else changed
