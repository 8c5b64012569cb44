"""What a parser gives and what the stages ask of one: `Parsed`, `Unparsed` and the `Parser` protocol.

Two parsers implement it: the Stanza `SentenceParser` (spinn.parsing.parser) and
the token-only `TokenOnly` (spinn.parsing.parse) for models that build their own
trees. The parse stage and the labeller take either through this protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from spinn.data.rejects import RejectReason


@dataclass(frozen=True)
class Parsed:
    tokens: list[str]  # PTB-normalised leaves
    transitions: list[int]  # SHIFT/REDUCE of the binarized tree, 2n - 1 long (empty: no tree)
    binary_parse: str  # SNLI's `( left right )` format ("" without a tree)


@dataclass(frozen=True)
class Unparsed:
    reason: RejectReason  # EMPTY_SENTENCE, TOO_LONG or PARSE_FAILED
    message: str


Progress = Callable[[int], None]
"""Told the number of distinct sentences each time a batch of them is parsed."""


def told(progress: Progress, size: int) -> Callable[[Future], None]:
    """A batch future's done-callback that reports its batch's size."""
    return lambda _: progress(size)


class BatchClock:
    """When a `submit` call began and when the last of its batches finished: the timing half of a PendingParse
    whose batches run in worker processes (`_done` is each batch future's done-callback)."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._last_done = self._started

    @property
    def seconds(self) -> float:
        """Wall seconds from the call until its last batch was done (waiting for `result` not counted)."""
        return self._last_done - self._started

    def seconds_after(self, moment: float) -> float:
        """Wall seconds of work after `moment` (perf_counter): time that batches of an earlier call, queued
        ahead of this one's, did not already account for."""
        return max(self._last_done - max(self._started, moment), 0.0)

    @property
    def finished_at(self) -> float:
        return self._last_done

    def _done(self, _future: Future | None = None) -> None:
        self._last_done = max(self._last_done, time.perf_counter())


class PendingParse(Protocol):
    """The parses of one `submit` call, maybe still running in worker processes."""

    to_parse: int
    """Distinct texts this call gives the parser (not cached, not already in flight)."""

    def result(self) -> dict[str, Parsed | Unparsed]:
        """One result per distinct input text, keyed by that exact text, in input order (waits if needed)."""
        ...

    @property
    def seconds(self) -> float:
        """Wall seconds from the call until its last batch was parsed."""
        ...

    def seconds_after(self, moment: float) -> float:
        """Wall seconds of parsing after `moment` (perf_counter)."""
        ...

    @property
    def finished_at(self) -> float:
        """perf_counter when its last batch was parsed."""
        ...


class Parser(Protocol):
    """Turns sentences into tokens and (maybe) binary trees, each failure an `Unparsed`."""

    @property
    def model_id(self) -> str:
        """What made the trees: recorded with them, and the parse cache's key."""
        ...

    @property
    def workers(self) -> int:
        """Processes that parse (1: this one)."""
        ...

    def parse(self, sentences: Iterable[str]) -> dict[str, Parsed | Unparsed]:
        """One result per distinct input text, keyed by that exact text, in input order."""
        ...

    def submit(self, sentences: Iterable[str], progress: Progress | None = None) -> PendingParse:
        """Start parsing; return at once when other processes parse."""
        ...

    def close(self) -> None:
        """Release workers, caches and files."""
        ...
