"""A compiled plan does not depend on how or where its model was imported.

Compiled with the model given as ``path/file.py:factory`` (loaded by memoplan under a
private module name), the plan module must apply to the same model imported normally
(``import class_net``), and compiling the same repository in another folder must give
byte-identical files (so ``compile --check`` stays up to date).  The class identity a
plan records is the class's ``__qualname__`` plus the module's importable name
(docs/design.md, "Class identity").
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn

from memoplan.cli import main
from memoplan.runtime.install import qualified_type_name

NET = """\
from torch import nn


class Blk(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).tanh()


def build():
    return nn.Sequential(Blk(), Blk())
"""

PLAN = 'memplan 1\nmodel "{file}:build"\nmodule 0 {{ checkpoint }}\nmodule 1 {{ checkpoint }}\n'


def _repo(root: Path, stem: str, package: str | None = None) -> Path:
    """A repository with the model file (in ``package`` if given) and a plan naming it by path."""
    root.mkdir(parents=True)
    where = root
    if package:
        where = root / package
        where.mkdir()
        (where / "__init__.py").write_text("")
    (where / f"{stem}.py").write_text(NET)
    file = f"{package}/{stem}.py" if package else f"{stem}.py"
    (root / "net.memplan").write_text(PLAN.format(file=file))
    return root


def _compile(root: Path, *extra: str, monkeypatch) -> int:
    monkeypatch.chdir(root)
    return main(["write-module", "net.memplan", "-o", "net_plan.py", *extra])


def _import_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def on_path(monkeypatch):
    """Import a module by its ordinary name from a folder; forgotten afterwards."""
    imported: list[str] = []

    def do(folder: Path, name: str):
        monkeypatch.syspath_prepend(str(folder))
        importlib.invalidate_caches()
        imported.append(name)
        return importlib.import_module(name)

    yield do
    for name in imported:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def test_plan_compiled_from_a_file_path_applies_to_the_model_imported_normally(tmp_path, monkeypatch, on_path):
    root = _repo(tmp_path / "repo", "class_net_ident_a")
    assert _compile(root, monkeypatch=monkeypatch) == 0
    plan = _import_file(root / "net_plan.py", "net_plan_ident_a")
    assert {t.type_name for t in plan.TARGETS} == {"class_net_ident_a.Blk"}
    model = on_path(root, "class_net_ident_a").build()
    plan.apply(model)  # raised MP402 (`_memoplan_file_class_net_...Blk`) before
    assert "forward" in model[0].__dict__
    plan.remove(model)


def test_plan_of_a_file_in_a_package_names_the_class_by_its_package_path(tmp_path, monkeypatch, on_path):
    root = _repo(tmp_path / "repo", "class_net_ident_b", package="pkg_ident_b")
    assert _compile(root, monkeypatch=monkeypatch) == 0
    plan = _import_file(root / "net_plan.py", "net_plan_ident_b")
    assert {t.type_name for t in plan.TARGETS} == {"pkg_ident_b.class_net_ident_b.Blk"}
    plan.apply(on_path(root, "pkg_ident_b.class_net_ident_b").build())


def test_the_same_repository_compiled_in_another_folder_is_byte_identical(tmp_path, monkeypatch):
    first = _repo(tmp_path / "one", "class_net_ident_c")
    assert _compile(first, monkeypatch=monkeypatch) == 0
    second = tmp_path / "elsewhere" / "two"
    second.parent.mkdir()
    shutil.copytree(first, second)
    assert _compile(second, "--check", monkeypatch=monkeypatch) == 0
    assert _compile(second, monkeypatch=monkeypatch) == 0
    text = (first / "net_plan.py").read_text()
    assert (second / "net_plan.py").read_text() == text
    assert "_memoplan_file" not in text and str(tmp_path) not in text


def test_a_class_loaded_from_a_file_is_named_by_its_importable_name(tmp_path, on_path):
    from memoplan.specs import load_model

    root = _repo(tmp_path / "repo", "class_net_ident_d")
    loaded = load_model("class_net_ident_d.py:build", base_dir=root)
    imported = on_path(root, "class_net_ident_d").build()
    assert type(loaded[0]) is not type(imported[0])  # two module objects, one identity
    assert qualified_type_name(type(loaded[0])) == "class_net_ident_d.Blk"
    assert qualified_type_name(type(imported[0])) == "class_net_ident_d.Blk"
    assert qualified_type_name(nn.Linear) == "torch.nn.modules.linear.Linear"


@pytest.mark.slow
def test_a_script_run_as_main_applies_a_plan_compiled_from_its_file(tmp_path, monkeypatch):
    root = _repo(tmp_path / "repo", "train_ident_e")
    assert _compile(root, monkeypatch=monkeypatch) == 0
    with (root / "train_ident_e.py").open("a") as handle:
        handle.write(
            "\n\nif __name__ == '__main__':\n"
            "    import net_plan\n"
            "    model = net_plan.apply(build())\n"
            "    print(type(model[0]).__module__, 'forward' in model[0].__dict__)\n"
        )
    done = subprocess.run([sys.executable, "train_ident_e.py"], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["__main__", "True"]


def test_a_profile_names_classes_of_a_file_model_by_their_importable_name(tmp_path, monkeypatch):
    import json

    root = _repo(tmp_path / "repo", "class_net_ident_f")
    monkeypatch.chdir(root)
    assert (
        main(
            [
                "profile",
                "--model",
                "class_net_ident_f.py:build",
                "--example",
                "randn(2, 4)",
                "--repeats",
                "1",
                "-o",
                "p.json",
            ]
        )
        == 0
    )
    text = (root / "p.json").read_text()
    assert "_memoplan_file" not in text
    assert "class_net_ident_f.Blk" in {m["type"] for m in json.loads(text)["modules"]}
