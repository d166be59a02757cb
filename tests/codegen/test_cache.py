"""Where `apply` writes generated code: MEMOPLAN_CACHE_DIR, else XDG_CACHE_HOME, else ~/.cache;
a temporary folder (with a warning) when that cannot be written; MP410 when nothing can."""

from __future__ import annotations

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
    import sys

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
