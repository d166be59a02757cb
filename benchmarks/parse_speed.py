"""Benchmark: parsing large plans and recovering from errors (issue 31).

Run: `.venv/bin/python benchmarks/parse_speed.py` (`--rules 10000 --repeats 3`).
Prints, best of ``--repeats`` (CPU seconds of this process, `time.process_time`, so other
jobs on the machine weigh less than in wall time, plus the wall time of the same run):

* a valid plan of ``--rules`` rules (half `module layers.N.attn { checkpoint }`, half a
  three-line rule with a class filter, an exclusion and `compress`), with rules per second;
* the same plan with one bad line at the top (recovery: one error, the rest still parsed);
* the same plan with a bad line every 200 rules (50 errors: memoplan's cap per file);
* one 100,000-segment selector after a bad line (the issue's 100 KB case, scaled);
* text over the size limit (MP109: refused before parsing).

The grammar is built once before timing (that is the first parse of a process).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memoplan.syntax import parser, reading  # noqa: E402


def rules_plan(rules: int, bad_every: int = 0) -> str:
    lines = ["memplan 1", "budget 4 GiB"]
    for i in range(rules):
        if bad_every and i % bad_every == 0:
            lines.append(f"modle layers.{i} {{ checkpoint }}")
        elif i % 2:
            lines.append(f"module layers.{i}.attn {{ checkpoint }}  # attention of block {i}")
        else:
            lines.append(f"module class Block{i} not blocks.{i} {{\n  compress input=uint8\n}}")
    return "\n".join(lines) + "\n"


def long_selector_plan(segments: int) -> str:
    return "memplan 1\nbogus line\nmodule " + "a." * segments + "b { checkpoint }\n"


def timed(text: str, repeats: int) -> tuple[float, float, int]:
    """Best CPU and wall seconds of ``parse_with_diagnostics(text)``, and its diagnostics."""
    best_cpu = best_wall = float("inf")
    count = 0
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        _, diagnostics = parser.parse_with_diagnostics(text, "bench.memplan")
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
        count = len(diagnostics)
    return best_cpu, best_wall, count


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args.add_argument("--rules", type=int, default=10_000)
    args.add_argument("--segments", type=int, default=100_000)
    args.add_argument("--repeats", type=int, default=3)
    options = args.parse_args(argv)
    parser.parse_with_diagnostics("memplan 1\n")  # build the grammar
    cases = [
        (f"{options.rules:,} rules, valid", rules_plan(options.rules), options.rules),
        (f"{options.rules:,} rules, 1 bad line", rules_plan(options.rules, bad_every=options.rules), options.rules),
        (
            f"{options.rules:,} rules, 50 bad lines",
            rules_plan(options.rules, bad_every=max(1, options.rules // 50)),
            options.rules,
        ),
        (f"{options.segments:,}-segment selector after a bad line", long_selector_plan(options.segments), 0),
        (f"{reading.MAX_PLAN_BYTES + 1:,} characters (over the limit)", "#" * (reading.MAX_PLAN_BYTES + 1), 0),
    ]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, 1-minute load {load:.1f}; best of {options.repeats}"
    )
    print("| plan | size | diagnostics | CPU s | wall s | rules/s (CPU) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, text, rules in cases:
        cpu, wall, count = timed(text, options.repeats)
        rate = f"{rules / cpu:,.0f}" if rules and cpu else "-"
        print(f"| {name} | {len(text):,} B | {count} | {cpu:.3f} | {wall:.3f} | {rate} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
