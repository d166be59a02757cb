"""`memoplan lsp` with the initialization option `loadModel`: resolver diagnostics at their
ranges, selectors' modules on hover, module paths and classes in completion, a model rebuilt
when its file changes, and a model that fails or hangs reported without harm to the server.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from lsprotocol import types as lsp

from memoplan.lsp.worker import ModelWorker
from tests._lsp import ROOT, Session

CNN_PLAN = ROOT / "plans" / "cnn_bn_dropout.memplan"

NET = """\
from collections import OrderedDict

from torch import nn

print("building the model")  # the model's own output must not reach the protocol


def build():
    return nn.Sequential(OrderedDict([({NAME!r}, nn.Linear(2, 2)), ("act", nn.ReLU())]))
"""


@pytest.fixture(scope="module")
def server():
    session = Session({"loadModel": True, "modelTimeout": 60}, watch_files=True)
    yield session
    session.stop()


def _wait_hover(server: Session, uri: str, line: int, character: int, text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    value = ""
    while time.monotonic() < deadline:
        hover = server.hover(uri, line, character)
        value = hover.contents.value if hover else ""
        if text in value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"hover never showed {text!r}: {value}")


@pytest.mark.slow
def test_hover_on_a_selector_lists_its_modules_and_the_winning_rules(server) -> None:
    uri = CNN_PLAN.as_uri()
    server.open(uri, CNN_PLAN.read_text(encoding="utf-8"))
    # line 10 (index 9): `module features.* : ConvBlock { checkpoint }`; line 13: `module features.0 { keep }`
    value = _wait_hover(server, uri, 9, 10, "selects")
    assert "selects **5** modules: `ConvBlock` ×5" in value
    assert "- `features.0` (`ConvBlock`): `keep` — line 13 `module features.0`" in value
    assert "- `features.1` (`ConvBlock`): `checkpoint` — line 10" in value
    exact = server.hover(uri, 12, 9).contents.value
    assert "selects **1** module: `ConvBlock` ×1" in exact


def test_resolver_diagnostics_with_their_ranges(server) -> None:
    uri = (CNN_PLAN.parent / "lsp-model-test.memplan").as_uri()
    text = CNN_PLAN.read_text(encoding="utf-8").replace("module features.0 { keep }", "module featurez.0 { keep }")
    before = server.open(uri, text)
    found = server.diagnostics(uri, before, until=lambda ds: any(d.code == "MP301" for d in ds))
    (mp301,) = [d for d in found if d.code == "MP301"]
    line = text.split("\n").index("module featurez.0 { keep }")
    # the selector, as `memoplan check` underlines it
    assert (mp301.range.start.line, mp301.range.start.character, mp301.range.end.line, mp301.range.end.character) == (
        line,
        len("module "),
        line,
        len("module featurez.0"),
    )
    assert mp301.message.startswith("`featurez.0` matches no module")
    assert "features.0" in mp301.message  # the nearest real path
    assert mp301.severity == lsp.DiagnosticSeverity.Error


def test_completion_offers_the_models_paths_and_classes(server) -> None:
    uri = (CNN_PLAN.parent / "lsp-completion-test.memplan").as_uri()  # opened here: no test runs first
    server.open(uri, CNN_PLAN.read_text(encoding="utf-8"))
    _wait_hover(server, uri, 9, 10, "selects")
    text = CNN_PLAN.read_text(encoding="utf-8") + "module features.\n"
    server.change(uri, text)
    line = len(text.split("\n")) - 2
    labels = [item.label for item in server.complete(uri, line, len("module features."))]
    assert "features.0" in labels and "features.4" in labels
    assert all(label.startswith("features.") for label in labels)
    text += "module features.* : \n"
    server.change(uri, text)
    classes = [item.label for item in server.complete(uri, line + 1, len("module features.* : "))]
    assert "ConvBlock" in classes
    kinds = {item.kind for item in server.complete(uri, line + 1, len("module features.* : "))}
    assert kinds == {lsp.CompletionItemKind.Class}


def test_the_server_asks_to_hear_of_changed_python_files(server) -> None:
    deadline = time.monotonic() + 30
    while not server.registrations and time.monotonic() < deadline:
        time.sleep(0.05)
    (registration,) = server.registrations
    assert registration.method == lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES
    assert [w["globPattern"] for w in registration.register_options["watchers"]] == ["**/*.py"]  # as sent


def _rewrite(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a new mtime even on a coarse clock


@pytest.mark.slow
def test_model_is_rebuilt_when_its_file_changes(server, tmp_path: Path) -> None:
    net = tmp_path / "net.py"
    net.write_text(NET.replace("{NAME!r}", repr("a")), encoding="utf-8")
    plan = tmp_path / "net.memplan"
    text = 'memplan 1\nmodel "net.py:build"\nmodule a { checkpoint }\n'
    plan.write_text(text, encoding="utf-8")
    uri = plan.as_uri()
    server.open(uri, text)
    _wait_hover(server, uri, 2, 7, "selects **1** module: `Linear`")
    # The editor reports the changed file: the plan is resolved again, against the new model.
    _rewrite(net, NET.replace("{NAME!r}", repr("b")))
    before = len(server.published.get(uri, []))
    server.files_changed(net.as_uri())
    found = server.diagnostics(uri, before, until=lambda ds: any(d.code == "MP301" for d in ds))
    (mp301,) = [d for d in found if d.code == "MP301"]
    assert mp301.message.startswith("`a` matches no module")  # `a` was there before the file changed
    assert (mp301.range.start.line, mp301.range.start.character) == (2, 7)
    # Saving the plan checks the model's files too.
    assert "selects **0** modules" in server.hover(uri, 2, 7).contents.value


def test_a_model_that_raises_is_a_diagnostic_at_the_model_line(server, tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def build():\n    raise ValueError('no such weights')\n", encoding="utf-8")
    plan = tmp_path / "broken.memplan"
    text = 'memplan 1\n\nmodel "broken.py:build"\nmodule a { checkpoint }\n'
    uri = plan.as_uri()
    found = server.diagnostics(uri, server.open(uri, text), until=lambda ds: bool(ds))
    (mp504,) = found
    assert mp504.code == "MP504" and "no such weights" in mp504.message
    assert mp504.range.start.line == 2
    # the server goes on: a fixed spec resolves
    (tmp_path / "good.py").write_text(NET.replace("{NAME!r}", repr("a")), encoding="utf-8")
    fixed = text.replace("broken.py", "good.py")
    assert list(server.diagnostics(uri, server.change(uri, fixed), until=lambda ds: not ds)) == []


@pytest.mark.slow
def test_a_hanging_model_times_out_and_its_process_is_killed(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text("import time\n\ndef build():\n    time.sleep(60)\n", encoding="utf-8")
    worker = ModelWorker(timeout=1.5)
    text = 'memplan 1\nmodel "slow.py:build"\nmodule a { checkpoint }\n'
    started = time.monotonic()
    reply = worker.analyse(text, str(tmp_path / "slow.memplan"), str(tmp_path))
    assert "took longer than 1.5 s" in reply["error"]
    assert time.monotonic() - started < 20
    assert worker._process is None  # killed; the next request starts a fresh process
    worker.close()


def test_the_example_is_built_in_the_model_process(server, tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text(NET.replace("{NAME!r}", repr("a")), encoding="utf-8")
    text = 'memplan 1\nmodel "net.py:build"\nexample randn(99999999999, 99999999999)\nmodule a { checkpoint }\n'
    uri = (tmp_path / "huge.memplan").as_uri()
    found = server.diagnostics(uri, server.open(uri, text), until=lambda ds: bool(ds))
    assert [(d.code, d.range.start.line) for d in found] == [("MP507", 2)]  # refused before allocating


def test_a_large_models_paths_come_a_thousand_at_a_time(server, tmp_path: Path) -> None:
    (tmp_path / "wide.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Sequential(*[nn.Identity() for _ in range(1500)])\n",
        encoding="utf-8",
    )
    text = 'memplan 1\nmodel "wide.py:build"\nmodule 0 { keep }\n'
    uri = (tmp_path / "wide.memplan").as_uri()
    server.open(uri, text)
    _wait_hover(server, uri, 2, 7, "selects **1** module")
    text += "module \n"  # being typed: the paths come from the last model answer
    server.change(uri, text)
    everything = server.completion_list(uri, 3, len("module "))
    assert len(everything.items) == 1000 and everything.is_incomplete
    server.change(uri, text.replace("module \n", "module 149\n"))
    narrowed = server.completion_list(uri, 3, len("module 149"))
    assert [item.label for item in narrowed.items] == [
        "149",
        "1490",
        "1491",
        "1492",
        "1493",
        "1494",
        "1495",
        "1496",
        "1497",
        "1498",
        "1499",
    ]
    assert not narrowed.is_incomplete
