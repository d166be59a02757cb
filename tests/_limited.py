"""Run a memoplan command in an address space too small for the unplanned step of a model
(tests/planner/test_oom.py): ``python _limited.py MARGIN_MIB memoplan-arguments...``.

After the imports and one tiny training step (the autograd engine's and oneDNN's first-use
costs), ``RLIMIT_AS`` is set to the address space in use plus the margin.  The caller sets
``MALLOC_MMAP_THRESHOLD_`` (large blocks mapped and unmapped with each tensor, so the address
space follows the live bytes instead of a fragmented heap) and one thread, and may name modules
to import before the limit in ``MEMOPLAN_LIMITED_IMPORTS`` (comma-separated).
"""

from __future__ import annotations

import importlib
import os
import resource
import sys

import torch
import torch._dynamo  # noqa: F401 - memoplan imports it on first use (a step under torch's checkpoint)
import torch._subclasses.fake_tensor  # noqa: F401 - imported before the limit, as everything else
import torch.utils.flop_counter  # noqa: F401

import memoplan.cli
import memoplan.planner.profiling.estimate  # noqa: F401
import memoplan.verification  # noqa: F401
from memoplan.measure import training_step


def address_space() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def main() -> int:
    margin = int(float(sys.argv[1]) * 2**20)
    # Modules the model's code imports (e.g. transformers), imported before the limit as memoplan is.
    for name in filter(None, os.environ.get("MEMOPLAN_LIMITED_IMPORTS", "").split(",")):
        importlib.import_module(name)
    training_step(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()), (torch.randn(2, 4),))
    limit = address_space() + margin
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return memoplan.cli.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
