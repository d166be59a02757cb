"""What a long command says while it works: its stages in plain words, a bar with an estimate of
the time left where the amount of work is known, and the details with ``-v``.

One :data:`REPORTER` per process.  The command line sets it from ``-q``/``-v`` and ``--format``
(``memoplan.cli_output.configure``); a library caller gets plain lines on stderr.  Bars are
drawn only when stderr is a terminal: a log file, a CI job or a pipe gets one line per stage and
never a carriage return, and nothing of this goes to stdout (``--format json`` stays one
document).  No torch here.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["REPORTER", "Reporter", "size"]


def size(n: float) -> str:
    """Bytes for a person: ``512 B``, ``3.4 KiB``, ``2.27 MiB``, ``1.50 GiB``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if unit != "KiB" else f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _count(n: int, unit: str) -> str:
    """``1 step``, ``3 steps``: ``unit`` is the plural."""
    return f"{n} {unit.removesuffix('s') if n == 1 else unit}"


def _seconds(s: float) -> str:
    if s < 10:
        return f"{s:.1f} s"
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


@dataclass
class _Bar:
    label: str
    total: int
    unit: str
    started: float = field(default_factory=time.monotonic)
    done: int = 0

    def text(self, columns: int = 100, width: int = 20) -> str:
        """The bar's line (under the stage's label), at most ``columns - 1`` characters."""
        filled = width * min(self.done, self.total) // max(self.total, 1)
        text = f"  [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {self.unit}"
        if 0 < self.done < self.total:
            elapsed = time.monotonic() - self.started
            left = elapsed / self.done * (self.total - self.done)
            text += f", {_seconds(elapsed)}, about {_seconds(left)} left"
        return text[: columns - 1]


class Reporter:
    """Stages, bars and lines on stderr (see the module's docstring)."""

    def __init__(self) -> None:
        self.verbosity = 0  # -1 quiet (nothing), 0 stages, 1+ details too
        self.enabled = True  # False: nothing at all (--format json)
        self.stream: TextIO | None = None  # None: sys.stderr when written
        self.started = time.monotonic()
        self._bar: _Bar | None = None
        self._drawn = 0  # characters of the bar now on the terminal's line

    def configure(self, *, verbosity: int = 0, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.verbosity, self.enabled, self.stream = verbosity, enabled, stream
        self.started = time.monotonic()
        self._bar, self._drawn = None, 0

    @property
    def out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    @property
    def bars(self) -> bool:
        """Whether bars are drawn: stderr is a terminal (not ``TERM=dumb``), and not quiet."""
        isatty = getattr(self.out, "isatty", None)
        return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb" and self.shows(0)

    def shows(self, level: int) -> bool:
        return self.enabled and self.verbosity >= level

    def say(self, message: str, level: int = 0) -> None:
        """A line: a stage (``level`` 0) or a detail (1: only with ``-v``)."""
        if not self.shows(level):
            return
        if self.verbosity > 0:
            message += f" [{time.monotonic() - self.started:.1f} s]"
        self._clear()
        self.out.write(f"memoplan: {message}\n")
        self._draw()

    def detail(self, message: str) -> None:
        self.say(message, 1)

    @contextmanager
    def stage(self, label: str, total: int, unit: str = "steps") -> Iterator[_Bar]:
        """A stage of ``total`` pieces of work: its label on a line, and on a terminal a bar under
        it with the time left, redrawn as :meth:`advance` is called and replaced by what it took."""
        self.say(f"{label} ({_count(total, unit)})")
        outer, self._bar = self._bar, _Bar(label, max(int(total), 0), unit)
        self._draw()
        try:
            yield self._bar
        finally:
            bar, self._bar = self._bar, outer
            if self.bars:
                self._clear()
                self.out.write(f"  {_count(bar.done, unit)} in {_seconds(time.monotonic() - bar.started)}\n")
                self.out.flush()
                self._draw()

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.done += n
            self._draw()

    def _draw(self) -> None:
        if self._bar is None or not self.bars:
            if self.shows(0):
                self.out.flush()
            return
        text = self._bar.text(shutil.get_terminal_size().columns)  # one line: \r redraws it
        self.out.write("\r" + text.ljust(self._drawn))
        self._drawn = len(text)
        self.out.flush()

    def _clear(self) -> None:
        if self._drawn:
            self.out.write("\r" + " " * self._drawn + "\r")
            self._drawn = 0


REPORTER = Reporter()
