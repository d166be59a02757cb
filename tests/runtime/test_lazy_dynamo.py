"""memoplan's runtime does not import Dynamo until something compiles (issue 40: start-up time).

Importing ``torch._dynamo`` costs about a second of CPU, more than the rest of torch; the runtime
marks its compile-time functions without importing it (``torch._disable_dynamo``, and the mark
``assume_constant_result`` sets).  The behaviour under ``torch.compile`` is tested by
tests/runtime/test_compile*.py and test_dtr.py; here: that applying a plan imports no Dynamo, and
that the mark is still the one the decorator sets.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from _paths import ROOT

pytestmark = pytest.mark.slow  # each imports torch (and Dynamo) afresh: seconds

EAGER = """\
import sys, torch
import memoplan
from memoplan.examples.cnn import build
model = build()
plan = memoplan.parse('memplan 1\\nmodule features.0 { checkpoint }\\nmodule features.1 {\\n checkpoint\\n compress input = auto\\n}\\ndtr { eviction_threshold = 1 KiB }\\n')
memoplan.apply(model, plan)
print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
"""


def test_applying_a_plan_imports_no_dynamo(tmp_path) -> None:
    """Importing memoplan, resolving a plan and installing it (what `memoplan check` does, and more).

    A checkpointed step itself does import Dynamo: torch's ``checkpoint`` is wrapped by
    ``torch._disable_dynamo``, which imports it at its first call."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEMOPLAN_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", EAGER], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_the_constant_result_mark_is_the_decorators() -> None:
    import torch._dynamo

    from memoplan.runtime.evictable import _checkpointed

    def probe() -> None: ...

    marked = torch._dynamo.assume_constant_result(probe)
    assert marked is probe and set(vars(probe)) == {"_dynamo_marked_constant"}
    assert all(getattr(_checkpointed, name) == value for name, value in vars(probe).items())
