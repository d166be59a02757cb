"""The first diagnostics an editor shows come from the parser alone, within a second of opening.

A fresh `memoplan lsp` imports torch in the background (for the statement checks and the model);
the syntax diagnostics must not wait for it.  One test replaces torch by a package whose import
takes ten minutes (it sleeps), so diagnostics that arrive at all prove the independence rather
than timing a race; another runs the real thing.  The one-second goal is a benchmark, not a
test: ``tools/lsp_latency.py --first`` measures it (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests._lsp import ROOT, Session

BROKEN = "memplan 1\n\nmodule blocks.* {\n    checkpoint\n"  # the closing brace not typed yet
CLEAN = "memplan 1\nmodule fc { keep }\nbudget 50%\n"
# Seconds from didOpen to the first diagnostics that no answer waiting for torch's (stand-in,
# ten-minute) import could meet, however loaded the machine.
LIMIT = 60.0


def _first(session: Session, name: str, text: str, until=None) -> tuple[float, list]:
    uri = (ROOT / "build" / name).as_uri()
    started = time.perf_counter()
    found = session.diagnostics(uri, session.open(uri, text), until=until, timeout=120)
    return time.perf_counter() - started, found


@pytest.fixture
def torch_never_loads(tmp_path: Path) -> dict:
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("import time\ntime.sleep(600)\n", encoding="utf-8")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))


@pytest.mark.slow
def test_syntax_diagnostics_do_not_import_torch(torch_never_loads):
    session = Session(env=torch_never_loads)
    try:
        took, found = _first(session, "startup-broken.memplan", BROKEN)
        assert [d.code for d in found] == ["MP106"]
        assert took < LIMIT, f"first diagnostics after {took:.2f} s"
        # A plan without errors: what the parser says is published at once, the statement
        # checks (which need torch) follow when ready — here never.
        took, found = _first(session, "startup-clean.memplan", CLEAN)
        assert list(found) == []
        assert took < LIMIT, f"first diagnostics after {took:.2f} s"
        # Hover and formatting need no torch either.
        uri = (ROOT / "build" / "startup-clean.memplan").as_uri()
        assert "specificity" in session.hover(uri, 1, 8).contents.value
        assert session.format(uri) is not None
        # The statement checks of the clean text wait for torch; an edit's parse does not queue
        # behind them.
        started = time.perf_counter()
        found = session.diagnostics(uri, session.change(uri, BROKEN), timeout=120)
        took = time.perf_counter() - started
        assert [d.code for d in found] == ["MP106"]
        assert took < LIMIT, f"diagnostics of an edit after {took:.2f} s"
    finally:
        assert session.stop() == 0  # the exit does not wait for torch's import


@pytest.mark.slow
def test_first_diagnostics_then_the_statement_checks_with_real_torch():
    session = Session()
    try:
        _, found = _first(session, "startup-real.memplan", BROKEN)
        assert [d.code for d in found] == ["MP106"]
        # The statement checks arrive once torch is in: MP224 notes where the budget is measured.
        _, found = _first(session, "startup-real-clean.memplan", CLEAN, until=lambda found: found)
        assert "MP224" in [d.code for d in found]
    finally:
        assert session.stop() == 0
