"""Progress lines on time, with an ETA, for logs where no bar is seen (Prefect, CI, torchrun).

A line is due every `every_s` seconds of wall time, checked by reading the
clock after each step or batch, never the device: a slow machine still gets
its line every 30 s, where a line per window of steps came minutes apart.
The ETA extrapolates the rate of the work done since this process started.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TextIO

REPORT_EVERY_S = 30.0
"""How often a flow's training and evaluation print a progress line, and a command's where no terminal shows."""


def report_interval(report_every_s: float | None, stream: TextIO | None = None) -> float | None:
    """Seconds between progress lines: as asked; else REPORT_EVERY_S when `stream` (stderr) is no terminal
    (DVC's log, CI, a pipe), where a bar redrawn with carriage returns is one unreadable line; else None,
    a bar."""
    if report_every_s is not None:
        return report_every_s
    stream = stream or sys.stderr
    return None if stream.isatty() else REPORT_EVERY_S


class ProgressClock:
    """When the next progress line is due, and how long the rest of `total` units will take."""

    def __init__(
        self, total: int, every_s: float | None, done: int = 0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total, self.every_s = total, every_s
        self._clock = clock
        self._started, self._done_at_start = clock(), done
        self._next = self._started + (every_s or 0.0)
        self.reported: int | None = None
        """The units done at the last line printed (the caller sets it), so a closing line is not a repeat."""

    def due(self) -> bool:
        """True once per `every_s` seconds (never without `every_s`)."""
        if self.every_s is None:
            return False
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self.every_s
        return True

    def eta(self, done: int) -> str:
        """`ETA 0:01:23` at the rate since the start; `ETA unknown` before anything is done."""
        progressed, elapsed = done - self._done_at_start, self._clock() - self._started
        if progressed <= 0 or elapsed <= 0:
            return "ETA unknown"
        left = max(0, self.total - done) * elapsed / progressed
        return f"ETA {timedelta(seconds=round(left))}"

    def fraction(self, done: int) -> str:
        return f"{done}/{self.total} ({done / self.total:.0%})" if self.total else f"{done}"
