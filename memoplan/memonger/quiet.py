"""Memonger stage: keep the PyTorch profiler's own lines off memoplan's output.

On CPU, :func:`memoplan.memonger.probe.allocated_inside` reads allocations from the profiler,
whose kineto back end writes ``USDT: ... SyncActivityProfilerHandler.cpp:52] profiler_start``
(and ``profiler_stop``) straight to file descriptor 2 on every start and stop: dozens of lines
on stderr for one ``memoplan verify`` or ``explain`` of a plan with a ``memonger`` block.  They
are written by C++ below Python's ``sys.stderr``, so :func:`profiler_quiet` catches them at the
file-descriptor level: while it is active, descriptor 2 points at a temporary file; afterwards
every line that is not the profiler's is written to the real stderr, in order.  Nothing else
is lost, only delayed until the profiled call ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["is_profiler_line", "profiler_quiet"]

_STDERR = 2


def is_profiler_line(line: bytes) -> bool:
    """A line kineto writes on a profiler's start or stop (``USDT:...] profiler_start``)."""
    return line.startswith(b"USDT:") and b"profiler_" in line


@contextlib.contextmanager
def profiler_quiet() -> Iterator[None]:
    """Run the block with the profiler's lines taken off descriptor 2; anything else written
    there meanwhile is passed on when the block ends."""
    try:
        _flush()
        saved = os.dup(_STDERR)
    except OSError:  # no stderr to protect
        yield
        return
    try:
        with tempfile.TemporaryFile() as capture:
            os.dup2(capture.fileno(), _STDERR)
            try:
                yield
            finally:
                _flush()
                os.dup2(saved, _STDERR)
                capture.seek(0)
                kept = [line for line in capture.read().splitlines(keepends=True) if not is_profiler_line(line)]
                if kept:
                    os.write(_STDERR, b"".join(kept))
    finally:
        os.close(saved)


def _flush() -> None:
    for stream in (sys.stderr, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
