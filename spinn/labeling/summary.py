"""What a label run did: each shard's result and the run's summary (counts, reasons, speeds, OOV share).

The CLI prints the summary's report, the Prefect flow publishes it as an
artifact, and the flow's MLflow run logs its figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from spinn.errors import SpinnError
from spinn.labeling.settings import PARSER_STANZA


@dataclass
class ShardResult:
    index: int
    labelled: int = 0
    rejected: int = 0
    reused: bool = False
    parse_seconds: float = 0.0
    model_seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    unknown_tokens: int = 0
    """Tokens of the labelled pairs, and those the model's vocabulary lacks (kept in the shard's metadata)."""


@dataclass
class LabelSummary:
    """What the stage did, for the CLI, the flow's artifacts and MLflow."""

    output: Path
    rejects: Path
    model: str
    parser: str
    rows: int
    labelled: int
    rejected: int
    shards: int
    shards_reused: int
    reasons: dict[str, int]
    parse_seconds: float
    model_seconds: float
    tokens: int = 0
    unknown_tokens: int = 0
    seconds: float = 0.0
    """The whole run, wall clock: loading the model and the parser included."""
    parser_workers: int = 1
    """Parser processes the run used (the parser settings' workers, auto decided)."""

    @property
    def pairs_per_second(self) -> float | None:
        """Rows done per second of the whole run, end to end (reused shards count as done)."""
        return self.rows / self.seconds if self.seconds else None

    @property
    def oov_share(self) -> float | None:
        """The share of the labelled pairs' tokens outside the model's vocabulary (None: no tokens)."""
        return self.unknown_tokens / self.tokens if self.tokens else None

    @property
    def parse_pairs_per_second(self) -> float | None:
        return self.labelled / self.parse_seconds if self.parse_seconds else None

    @property
    def model_pairs_per_second(self) -> float | None:
        return self.labelled / self.model_seconds if self.model_seconds else None

    def report(self) -> list[str]:
        lines = [
            (
                f"{self.rows} rows -> {self.output}: {self.labelled} labelled, {self.rejected} rejected "
                f"({self.shards} shards, {self.shards_reused} reused from an earlier run)"
            )
        ]
        lines += [f"  rejected {reason}: {count}" for reason, count in sorted(self.reasons.items())]
        if self.rejected:
            lines.append(f"rejects listed in {self.rejects}")
        speeds = [
            f"{name} {rate:.0f} pairs/s"
            for name, rate in (
                ("parse" if self.parser == PARSER_STANZA else "tokenize", self.parse_pairs_per_second),
                ("model", self.model_pairs_per_second),
                ("end to end", self.pairs_per_second),
            )
            if rate
        ]
        if speeds:
            lines.append(f"throughput (work done in this run): {', '.join(speeds)}")
        if self.oov_share is not None:
            lines.append(f"out of the model's vocabulary: {self.oov_share:.1%} of tokens")
        workers = f" ({self.parser_workers} workers)" if self.parser_workers > 1 else ""
        lines.append(f"model {self.model}, parser {self.parser}{workers}")
        return lines


def check_some_labelled(summary: LabelSummary) -> None:
    """A run that labelled no row is a mistake (a wrong file, the wrong columns), as it is for prepare: fail,
    once its rejects file, which says why, is written."""
    if summary.labelled == 0:
        reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(summary.reasons.items()))
        raise SpinnError(
            f"no row labelled: {summary.rejected} of {summary.rows} rejected ({reasons or 'no rows'}); "
            f"the reasons are in {summary.rejects}"
        )
