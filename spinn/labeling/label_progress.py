"""Progress of a label run: pairs parsed and pairs labelled, with pairs/s.

At a terminal, two tqdm bars on stderr (parse, model); in a flow, where no one
watches a terminal, one log line every `every_s` seconds. The parse phase
counts a pair when its share of the shard's sentences is parsed, so the bar
moves with every Stanza batch, not once per shard. Updates may come from a
parser pool's callback thread, so they take a lock.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from tqdm import tqdm

from spinn.ground.progress import REPORT_EVERY_S


class _Bar(tqdm):
    """tqdm without its monitor thread (it only retunes redraw intervals; our bars move once per batch), so
    the process stays single-threaded and the parser may fork its workers (spinn.parsing.parser)."""

    monitor_interval = 0


class LabelProgress:
    """Pairs through the parse and model phases of a run of `total` rows."""

    def __init__(
        self,
        total: int,
        *,
        bars: bool = True,
        log: Callable[[str], None] | None = None,
        every_s: float = REPORT_EVERY_S,
    ) -> None:
        self.total = total
        self._lock = threading.Lock()
        self._log, self._every_s = log, every_s
        self._started = self._logged = time.perf_counter()
        self._counts = {"parse": 0.0, "model": 0.0}
        self._shown = {"parse": 0, "model": 0}  # whole pairs on the bars (a shard's share may be fractional)
        self._bars = (
            {
                phase: _Bar(
                    total=total, desc=phase, unit=" pairs", position=position, file=sys.stderr, dynamic_ncols=True
                )
                for position, phase in enumerate(self._counts)
            }
            if bars
            else {}
        )

    def parsed(self, pairs: float) -> None:
        self._add("parse", pairs)

    def labelled(self, pairs: float) -> None:
        self._add("model", pairs)

    def skipped(self, pairs: int) -> None:
        """Rows that need neither phase (shards an earlier run finished, rows the reader rejected)."""
        self._add("parse", pairs)
        self._add("model", pairs)

    def line(self) -> str:
        seconds = max(time.perf_counter() - self._started, 1e-9)
        counts = ", ".join(
            f"{phase} {count:.0f}/{self.total} ({count / seconds:.0f} pairs/s)" for phase, count in self._counts.items()
        )
        return f"{counts} after {seconds:.0f} s"

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        if self._log is not None:
            self._log(self.line())

    def _add(self, phase: str, pairs: float) -> None:
        with self._lock:
            self._counts[phase] += pairs
            if phase in self._bars:
                whole = int(self._counts[phase] + 1e-6)
                self._bars[phase].update(whole - self._shown[phase])
                self._shown[phase] = whole
            if self._log is not None and time.perf_counter() - self._logged >= self._every_s:
                self._logged = time.perf_counter()
                self._log(self.line())


class ShardShare:
    """A shard's parse progress in pairs: each parsed sentence is worth pairs / sentences to parse."""

    def __init__(self, progress: LabelProgress | None, pairs: int) -> None:
        self.progress, self.pairs = progress, pairs
        self._lock = threading.Lock()  # the pool's callback thread and the caller both tell
        self.to_parse: int | None = None  # known once the parser has checked its cache
        self.early = 0  # sentences parsed before to_parse was known (in this process: all of them)
        self.told = 0.0

    def __call__(self, sentences: int) -> None:
        with self._lock:
            if self.to_parse is None:
                self.early += sentences
            else:
                self._tell(self.pairs * sentences / max(self.to_parse, 1))

    def known(self, to_parse: int) -> None:
        with self._lock:
            self.to_parse = to_parse
            self._tell(self.pairs * self.early / max(to_parse, 1))

    def finish(self) -> None:
        """The rest of the shard's pairs (rounding, cache hits, a shard with nothing to parse)."""
        with self._lock:
            self._tell(self.pairs - self.told)

    def _tell(self, pairs: float) -> None:
        pairs = min(pairs, self.pairs - self.told)
        if pairs > 0 and self.progress is not None:
            self.told += pairs
            self.progress.parsed(pairs)
