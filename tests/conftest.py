"""Shared pytest configuration: the golden-file update flag, the hypothesis profile
(``MEMOPLAN_HYPOTHESIS``, see ``tests/_profiles.py``) and the bundled transformer's profile."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from _profiles import PROFILE  # tests/_profiles.py
from hypothesis import settings

settings.load_profile(PROFILE)

# Under pytest-xdist (`make test` runs `-n 2`), each worker gets its share of the cores for
# torch's intra-op threads: two workers with a thread pool of every core each would fight over
# them.  Set before torch is first imported, so torch and every subprocess a test starts read it.
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _workers))

_CACHE: list[str] = []


def pytest_configure(config):
    """Tests never write into the user's cache: generated code goes to a temporary folder
    (inherited by every subprocess) unless a test sets its own."""
    folder = tempfile.mkdtemp(prefix="memoplan-test-cache-")
    _CACHE.append(folder)
    os.environ["MEMOPLAN_CACHE_DIR"] = os.path.join(folder, "memoplan")
    os.environ["XDG_CACHE_HOME"] = os.path.join(folder, "xdg")


def pytest_unconfigure(config):
    for folder in _CACHE:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="rewrite tests/golden/ from the current code generator instead of comparing with it",
    )


@pytest.fixture
def update_goldens(request) -> bool:
    return bool(request.config.getoption("--update-goldens"))


TRANSFORMER = ("--model", "memoplan.examples.transformer:build", "--example", "randint(4, 32, high=100)")


@pytest.fixture(scope="session")
def transformer_profile(tmp_path_factory) -> str:
    """A profile of the bundled transformer (`memoplan profile`), measured once: planning runs
    that reuse it (`--profile`) search over the same timings, so their plans can be compared."""
    from memoplan.cli import main

    path = tmp_path_factory.mktemp("profile") / "profile.json"
    assert main(["profile", *TRANSFORMER, "-o", str(path)]) == 0
    return str(path)


@pytest.fixture(autouse=True)
def _progress_as_a_library_caller_gets_it():
    """Every test starts with memoplan.progress as a library caller finds it: a command an
    earlier test ran (`-q`, `--format json`) does not silence the next test's progress."""
    from memoplan.progress import REPORTER

    REPORTER.configure()


@pytest.fixture(scope="module", autouse=True)
def _long_lived_objects_out_of_the_collectors_way():
    """memoplan collects garbage before every metered step (memoplan.measure.gc_paused); in a test
    process that has imported torch, Dynamo, Inductor and transformers, a full collection walks
    millions of long-lived objects (about 0.1 s each time) that are never garbage.  Each test
    module starts by collecting once and freezing what is left (all of it reachable, so nothing
    is kept that was garbage), and unfreezes it at its end: the collections in between walk only
    what the module's tests created, which is every object a test's step could leave behind."""
    import gc

    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
