"""Benchmark: the slowest plans under the size limit, with and without a syntax error (issue 39).

Run: `.venv/bin/python benchmarks/parse_worst.py` (`--probe 262144 --top 4 --seed 0 --random 40`).

A generator builds plans from a line *body* repeated to fill the text (blank lines, comments,
`;`, one-line and three-line rules, statements given twice, long selectors, lines joined with
`\\`, policies inside one huge block) and a *fault* (none, a bad line at the top, an unclosed
block at the top, a bad line every 1,000 lines, 50 bad lines at the end of a huge block, an
unclosed string), plus ``--random`` bodies drawn from pieces of the language.  Every pair is
parsed at ``--probe`` characters and ranked by CPU seconds per character; the ``--top`` slowest
are then parsed at the size limit (`MAX_PLAN_BYTES`, 128 KiB) each in a fresh process, with the same body without a
fault next to it (what the parser itself costs); each process reports its CPU and wall seconds
and its peak resident memory (``ru_maxrss``, the interpreter and grammar included).  The last
line names the worst case found.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memoplan.syntax import parser, reading  # noqa: E402

BODIES = {
    "blank lines": "\n",
    "comments": "# a comment line\n",
    "semicolons": ";\n",
    "one-line rules": "module layers.0.attn { checkpoint }\n",
    "three-line rules": "module class Block not blocks.1 {\n  compress input=uint8\n}\n",
    "budget twice": "budget 4 GiB\n",
    "long selector": "module " + "a." * 200 + "b { checkpoint }\n",
    "joined lines": "module a.b \\\n",
    "policies": "  checkpoint\n",
}
FAULTS = {
    "none": ("", ""),
    "bad line at top": ("modle x\n", ""),
    "unclosed block at top": ("module x {\n", ""),
    "unclosed string at top": ('model "m\n', ""),
    "50 bad lines at the end of a huge block": ("module x {\n", "bogus\n" * 50 + "}\n"),
    "bad line every 1,000 lines": ("", ""),
}
PIECES = [
    "module",
    "a.b",
    "{",
    "}",
    "checkpoint",
    "segments = 2",
    "budget 4 GiB",
    "dtr",
    "#",
    '"',
    "\\",
    ";",
    "=",
    "\n",
    " ",
]


def plan(body: str, fault: str, size: int) -> str:
    """``memplan 1``, the fault's head, the body repeated up to ``size`` characters, the fault's tail."""
    head, tail = FAULTS[fault]
    room = max(0, size - len("memplan 1\n") - len(head) - len(tail))
    lines = body * (room // len(body))
    if fault == "bad line every 1,000 lines":
        step = len(body) * 1000
        lines = "".join(lines[i : i + step] + "modle x\n" for i in range(0, len(lines), step))
    return ("memplan 1\n" + head + lines + tail)[:size]


def random_bodies(count: int, seed: int) -> dict[str, str]:
    rng = random.Random(seed)
    bodies = {}
    for n in range(count):
        body = " ".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8))) + "\n"
        bodies[f"random {n}: {body!r}"] = body
    return bodies


def cpu_seconds(text: str) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    _, diagnostics = parser.parse_with_diagnostics(text, "worst.memplan")
    return time.process_time() - cpu, time.perf_counter() - wall, len(diagnostics)


def child(body: str, fault: str, size: int) -> None:
    """In a fresh process: parse one plan at ``size`` and print its figures as JSON."""
    parser.parse_with_diagnostics("memplan 1\n")  # build the grammar first
    text = plan(body, fault, size)
    cpu, wall, count = cpu_seconds(text)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"size": len(text), "cpu": cpu, "wall": wall, "diagnostics": count, "rss_mib": rss}))


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args.add_argument("--probe", type=int, default=256 * 1024)
    args.add_argument("--top", type=int, default=4)
    args.add_argument("--seed", type=int, default=0)
    args.add_argument("--random", type=int, default=40)
    args.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    options = args.parse_args(argv)
    if options.child:
        child(options.child[0], options.child[1], int(options.child[2]))
        return 0
    parser.parse_with_diagnostics("memplan 1\n")
    bodies = {**BODIES, **random_bodies(options.random, options.seed)}
    ranked = []
    for name, body in bodies.items():
        for fault in FAULTS:
            cpu, _, _ = cpu_seconds(plan(body, fault, options.probe))
            ranked.append((cpu / options.probe, name, fault))
    ranked.sort(reverse=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, 1-minute load {load:.1f}")
    print(f"{len(ranked)} plans probed at {options.probe:,} characters; the {options.top} slowest at the limit:")
    print("| body | fault | size | diagnostics | CPU s | wall s | peak RSS MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    worst = None
    for _, name, fault in ranked[: options.top]:
        for case in (fault, "none") if fault != "none" else (fault,):  # and the same body without a fault
            command = [sys.executable, __file__, "--child", bodies[name], case, str(reading.MAX_PLAN_BYTES)]
            result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            print(
                f"| {name} | {case} | {result['size']:,} | {result['diagnostics']} | {result['cpu']:.2f} | "
                f"{result['wall']:.2f} | {result['rss_mib']:.0f} |"
            )
            if case == fault and (worst is None or result["cpu"] > worst[0]["cpu"]):
                worst = (result, name, fault)
    if worst:
        result, name, fault = worst
        print(f"worst: {name} / {fault}: {result['cpu']:.2f} s CPU, {result['rss_mib']:.0f} MiB peak")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
