"""Where `apply` writes generated code: MEMOPLAN_CACHE_DIR, else XDG_CACHE_HOME, else ~/.cache;
a temporary folder (with a warning) when that cannot be written; MP410 when nothing can; and
what the cache runs is only what it can check (issue 39): no planted bytecode, no folder of
another user, no module changed after it was written."""

from __future__ import annotations

import importlib.util
import marshal
import os
import stat
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import memoplan
from memoplan.codegen import write

PLAN = "memplan 1\nmodule 0 { checkpoint }\n"


@pytest.fixture(autouse=True)
def _fresh_imports(monkeypatch) -> None:
    """Each test writes its code again: generated modules already imported are forgotten."""
    for name in [n for n in sys.modules if n.startswith("memoplan_generated_")]:
        monkeypatch.delitem(sys.modules, name)


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())


def _generated(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def test_memoplan_cache_dir_wins(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert write.cache_dir() == tmp_path / "own" / "generated"


def test_xdg_cache_home_is_followed(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("MEMOPLAN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert write.cache_dir() == tmp_path / "xdg" / "memoplan" / "generated"
    model = _model()
    memoplan.apply(model, PLAN)
    assert _generated(tmp_path / "xdg" / "memoplan")
    memoplan.remove(model)


def test_relative_xdg_is_ignored_and_home_is_the_default(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("MEMOPLAN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert write.cache_dir() == tmp_path / "home" / ".cache" / "memoplan" / "generated"


def test_unusable_cache_falls_back_to_a_temporary_folder(tmp_path, monkeypatch) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(blocked / "cache"))
    monkeypatch.setattr(write.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    model = _model()
    reference = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        memoplan.apply(model, PLAN)
    assert _generated(tmp_path / "tmp")
    model(torch.randn(2, 4)).sum().backward()
    memoplan.remove(model)
    assert all(torch.equal(a, b) for a, b in zip(reference, model.parameters()))


def test_nothing_usable_is_mp509_and_changes_nothing(tmp_path, monkeypatch) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("not a folder")
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(blocked / "cache"))
    monkeypatch.setattr(write.tempfile, "gettempdir", lambda: str(blocked / "tmp"))
    model = _model()
    forward = model[0].forward
    with pytest.raises(memoplan.PlanError) as info:
        memoplan.apply(model, PLAN)
    assert info.value.diagnostics[0].code == "MP410"
    assert "MEMOPLAN_CACHE_DIR" in info.value.diagnostics[0].help
    assert model[0].forward == forward and "forward" not in vars(model[0])


# ---------------------------------------------------------------- the cache trusts only what it can check (issue 39)


def _forget_generated(monkeypatch) -> None:
    """As a new process: no generated module imported yet."""
    for name in [n for n in sys.modules if n.startswith("memoplan_generated_")]:
        monkeypatch.delitem(sys.modules, name)


def _plant_pyc(module: Path, marker: Path) -> Path:
    """Bytecode that Python's import would take for ``module``: the source's size and mtime in its
    header, and code that leaves ``marker`` behind when it runs."""
    code = compile(f"open({str(marker)!r}, 'w').close()\n", str(module), "exec")
    info = module.stat()
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
    header += (int(info.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (info.st_size & 0xFFFFFFFF).to_bytes(
        4, "little"
    )
    pyc = Path(importlib.util.cache_from_source(str(module)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(header + marshal.dumps(code))
    return pyc


def _as_another_users(monkeypatch, folder: Path) -> None:
    """``os.lstat`` says ``folder`` belongs to another user (as if they had made it first)."""
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        info = real_lstat(path, *args, **kwargs)
        if Path(path) == folder:
            fields = list(info)
            fields[4] = info.st_uid + 1  # st_uid
            return os.stat_result(fields)
        return info

    monkeypatch.setattr(os, "lstat", lstat)


def test_a_planted_pyc_beside_the_cached_module_is_never_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))
    model = _model()
    memoplan.apply(model, PLAN)
    memoplan.remove(model)
    (module,) = _generated(tmp_path / "cache")
    marker = tmp_path / "planted-code-ran"
    _plant_pyc(module, marker)
    _forget_generated(monkeypatch)
    memoplan.apply(model, PLAN)  # the cached module is byte-identical: only the .pyc could differ
    assert not marker.exists()
    model(torch.randn(2, 4)).sum().backward()
    memoplan.remove(model)


def test_apply_writes_no_bytecode_into_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    model = _model()
    memoplan.apply(model, PLAN)
    memoplan.remove(model)
    assert list((tmp_path / "cache").rglob("*.pyc")) == []


def test_a_cached_module_changed_after_it_was_written_is_not_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))
    marker = tmp_path / "planted-code-ran"
    real_replace = write.replace_file

    def replace_then_tamper(path, data, **kwargs):  # another process rewrites the file right after
        real_replace(path, data, **kwargs)
        Path(path).write_text(f"open({str(marker)!r}, 'w').close()\n")
        return path

    monkeypatch.setattr(write, "replace_file", replace_then_tamper)
    model = _model()
    forward = model[0].forward
    with pytest.raises(memoplan.PlanError, match="not what memoplan wrote") as info:
        memoplan.apply(model, PLAN)
    assert info.value.diagnostics[0].code == "MP410"
    assert not marker.exists()
    assert model[0].forward == forward


def test_a_temporary_folder_made_first_by_another_user_is_refused(tmp_path, monkeypatch) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(blocked / "cache"))
    temp = tmp_path / "tmp"
    monkeypatch.setattr(write.tempfile, "gettempdir", lambda: str(temp))
    model = _model()
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        memoplan.apply(model, PLAN)  # learn where the module goes; then another user's folder is there
    memoplan.remove(model)
    (module,) = _generated(temp)
    shared = temp / f"memoplan-{os.geteuid()}"
    for folder in (shared, *shared.rglob("*")):
        if folder.is_dir():
            folder.chmod(0o777)
    marker = tmp_path / "planted-code-ran"
    _plant_pyc(module, marker)
    _as_another_users(monkeypatch, shared)
    _forget_generated(monkeypatch)
    forward = model[0].forward
    with pytest.raises(memoplan.PlanError) as info:
        memoplan.apply(model, PLAN)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "MP410" and f"{shared} belongs to another user" in diagnostic.message
    assert not marker.exists()
    assert model[0].forward == forward and "forward" not in vars(model[0])


def test_a_cache_folder_of_another_user_is_not_used(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "generated").mkdir(parents=True)
    _as_another_users(monkeypatch, tmp_path / "cache" / "generated")
    monkeypatch.setattr(write.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    model = _model()
    with pytest.warns(RuntimeWarning, match="belongs to another user"):
        memoplan.apply(model, PLAN)
    memoplan.remove(model)
    assert _generated(tmp_path / "tmp") and not _generated(tmp_path / "cache")


def test_a_folder_of_ours_that_others_may_write_is_closed_before_use(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "generated").mkdir(parents=True)
    (tmp_path / "cache" / "generated").chmod(0o777)
    model = _model()
    memoplan.apply(model, PLAN)
    memoplan.remove(model)
    for folder in [tmp_path / "cache" / "generated", *(tmp_path / "cache" / "generated").iterdir()]:
        assert stat.S_IMODE(folder.stat().st_mode) & 0o022 == 0, folder


def test_a_link_planted_as_the_cached_module_is_replaced_not_written_through(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))
    model = _model()
    memoplan.apply(model, PLAN)
    memoplan.remove(model)
    (module,) = _generated(tmp_path / "cache")
    victim = tmp_path / "victim.txt"
    victim.write_text("a file of the user's\n")
    module.unlink()
    module.symlink_to(victim)
    _forget_generated(monkeypatch)
    memoplan.apply(model, PLAN)
    memoplan.remove(model)
    assert victim.read_text() == "a file of the user's\n"
    assert not module.is_symlink() and module.read_text().startswith("# Code generated by memoplan")
