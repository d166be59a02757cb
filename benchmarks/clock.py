"""What a long benchmark prints while it runs: each line on stderr with the seconds since the
benchmark started (this module's import, at the script's start)."""

from __future__ import annotations

import sys
import time

_T0 = time.perf_counter()


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f} s] {message}", file=sys.stderr, flush=True)
