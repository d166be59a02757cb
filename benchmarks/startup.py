"""Benchmark: how long memoplan's commands take to start, against importing torch (issue 40).

Run: `.venv/bin/python benchmarks/startup.py` (`--repeats 5 --json build/startup.json`).
Each case runs ``--repeats`` times in a fresh interpreter; the figure is the median CPU time
(user + system) of that process, as ``os.wait4`` reports it, so other jobs on the machine weigh
less than in wall time (the median wall time is printed beside it):

Every case runs once untimed first, with bytecode caching on (``PYTHONDONTWRITEBYTECODE``
unset), as a user's second command finds it.

* ``import torch`` (``python -c "import torch"``): the floor of any command that loads a model;
* ``import torch`` + the model's own import (``memoplan.examples.cnn``, the bundled CNN's module);
* ``memoplan check plans/cnn_bn_dropout.memplan``: parse, build the model, resolve the plan;
* ``memoplan --help``, ``rule MP301``, ``fmt --check``, ``check --syntax-only``: the syntax
  tools, which import no torch.

The goal (issue 40): ``check`` of the bundled plan within 1.3 x (torch + the model's import);
the summary line prints that ratio.  ``tests/test_needs_torch.py`` checks that the syntax tools
import no torch; this script measures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN = "plans/cnn_bn_dropout.memplan"
CLI = [sys.executable, "-m", "memoplan"]

CASES: dict[str, list[str]] = {
    "import torch": [sys.executable, "-c", "import torch"],
    "import torch + model": [sys.executable, "-c", "import torch, memoplan.examples.cnn"],
    "check (CNN plan)": [*CLI, "check", PLAN],
    "--help": [*CLI, "--help"],
    "rule MP301": [*CLI, "rule", "MP301"],
    "fmt --check": [*CLI, "fmt", "--check", PLAN],
    "check --syntax-only": [*CLI, "check", "--syntax-only", PLAN],
}


def run_once(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of ``command``, which must succeed."""
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    error = child.stderr.read().decode("utf-8", "replace") if child.stderr else ""
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{error[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall


def measure(repeats: int, only: list[str] | None = None) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: the modules' bytecode is cached after a first run
    results = {}
    for name, command in CASES.items():
        if only and name not in only:
            continue
        run_once(command, env)  # untimed: writes the bytecode caches, warms the disk cache
        runs = [run_once(command, env) for _ in range(repeats)]
        results[name] = {
            "cpu_s": statistics.median(cpu for cpu, _ in runs),
            "wall_s": statistics.median(wall for _, wall in runs),
            "runs": repeats,
        }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per case (the median is reported)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--only", nargs="+", choices=list(CASES), metavar="CASE", help="run these cases alone")
    args = parser.parse_args(argv)
    results = measure(args.repeats, args.only)
    print(f"{'case':<24} {'CPU s':>7} {'wall s':>7}   (median of {args.repeats})")
    for name, row in results.items():
        print(f"{name:<24} {row['cpu_s']:7.2f} {row['wall_s']:7.2f}")
    ratio = None
    if "check (CNN plan)" in results and "import torch + model" in results:
        ratio = results["check (CNN plan)"]["cpu_s"] / results["import torch + model"]["cpu_s"]
        print(f"check / (import torch + model), CPU: {ratio:.2f} x (goal: at most 1.3 x)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"results": results, "check_over_torch_and_model": ratio, "python": sys.version.split()[0]}
        args.json.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
