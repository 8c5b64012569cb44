"""What a label run did: each shard's result, the counts its merge makes, and the run's summary (counts,
reasons, speeds, label shares, confidence, OOV share, drift).

The summary is built once, by `spinn.labeling.label.label`, from the counts
(the merge's, or those the published record kept) and the facts of the run.
The CLI prints its report, the Prefect flow publishes its figures as an
artifact, and both log them to an MLflow run (spinn/labeling/track.py).

Drift: a scheduled labelling job whose input changes (another source,
another language, a broken upstream step) shows it in the shares of labels
the model gives long before anyone reads the rows. The reference is what the
same model predicted on its dev split when it was trained, read from the dev
scores its checkpoint keeps (`predicted_shares`, written by training); the
figure is the total variation distance, 0 for the same shares, 1 for
disjoint ones.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from spinn.data.label_schemes import AUTO, Agreement, agreement, outside_words
from spinn.data.rejects import RejectReason
from spinn.data.schema import LABELS
from spinn.ground.errors import SpinnError
from spinn.labeling.label_settings import GOLD_COLUMN, PROBABILITY_COLUMNS
from spinn.model.checkpoint import DEV_SHARES_KEY, Checkpoint
from spinn.model.parser_choice import PARSER_STANZA

NO_REFERENCE = (
    "drift not measured: the model's checkpoint keeps no dev label shares (a last.pt, or a model trained "
    "before they were recorded)"
)


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
    parser_workers: int | None = None
    model_threads: int | None = None
    """How the process that labelled the shard ran (None: reused, labelled by an earlier run)."""


@dataclass
class PredictionCounts:
    """The labels given, the summed top-class probability, and the (gold value, label) pairs of the rows with
    gold, over the labelled rows of an output."""

    labels: Counter = field(default_factory=Counter)
    top_probability_sum: float = 0.0
    gold: Counter = field(default_factory=Counter)

    def add(self, table: pa.Table) -> None:
        """Count a table of output rows (a merged shard)."""
        predicted = table.column("label").to_pylist()
        self.labels.update(predicted)
        self.gold.update(
            (gold, label) for gold, label in zip(table.column(GOLD_COLUMN).to_pylist(), predicted, strict=True) if gold
        )
        if table.num_rows:
            top = pc.max_element_wise(*(table.column(name) for name in PROBABILITY_COLUMNS))  # (N,)
            self.top_probability_sum += pc.sum(top.cast(pa.float64())).as_py()


@dataclass(frozen=True)
class LabelCounts:
    """What a published output holds and what its shards cost: made by the merge, kept in the run's record."""

    rows: int
    labelled: int
    rejected: int
    shards: int
    shards_reused: int
    reasons: dict[str, int]
    parse_seconds: float
    model_seconds: float
    tokens: int
    unknown_tokens: int
    predicted: PredictionCounts
    parser_workers: int | None = None
    model_threads: int | None = None
    """How the shards labelled in this run ran (None: none was)."""
    repaired: tuple[str, ...] = ()
    """Damaged parts of an earlier run's resumable state that this run found and redid, each in words."""


@dataclass(frozen=True)
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
    started_at: float
    """When the run began, in seconds since the epoch: its MLflow run starts there, so the UI shows the
    labelling's own duration (not the moment it was logged, which a busy store delays)."""
    tokens: int = 0
    unknown_tokens: int = 0
    seconds: float = 0.0
    """The whole run, wall clock: loading the model and the parser included."""
    parser_workers: int | None = None
    """Parser processes the run used (the parser settings' workers, auto decided; None: no shard ran)."""
    model_threads: int | None = None
    """torch threads the model ran with on the CPU (the settings' threads, auto decided; None: no shard ran)."""
    input: Path | None = None
    input_sha256: str = ""
    predicted: PredictionCounts = field(default_factory=PredictionCounts)
    dev_shares: dict[str, float] | None = None
    """The model's label shares on its dev split when it was trained (None: its checkpoint keeps none)."""
    published_before: bool = False
    """The output was already the published result of a run with the same arguments: nothing was done
    (spinn/labeling/published.py)."""
    repaired: tuple[str, ...] = ()
    """Damaged shards of an earlier run that this run labelled again, each in words."""
    label_scheme: str | None = None
    """The gold labels' scheme as the settings name it (None: auto, found from the values)."""
    max_tokens: int | None = None
    """The sentence length limit the run applied (named in the report when rows were too long)."""

    @classmethod
    def of(cls, counts: LabelCounts, **facts) -> LabelSummary:
        """The summary of a run whose output holds `counts`; `facts`: the rest (paths, names, seconds)."""
        return cls(**{name: getattr(counts, name) for name in counts.__dataclass_fields__}, **facts)

    @property
    def label_shares(self) -> dict[str, float]:
        """Each label's share of the labelled rows, every label named (0.0 when none got it)."""
        return {label: self.predicted.labels[label] / self.labelled if self.labelled else 0.0 for label in LABELS}

    @property
    def mean_top_probability(self) -> float | None:
        """How sure the model was: the mean of each labelled row's highest class probability."""
        return self.predicted.top_probability_sum / self.labelled if self.labelled else None

    @property
    def mean_sentence_tokens(self) -> float | None:
        """Tokens per sentence of the labelled pairs (premises and hypotheses alike)."""
        return self.tokens / (2 * self.labelled) if self.labelled else None

    @property
    def drift(self) -> float | None:
        """Total variation distance from the model's dev label shares (None: no reference, or nothing labelled)."""
        if self.dev_shares is None or not self.labelled:
            return None
        return total_variation(self.label_shares, self.dev_shares)

    @property
    def agreement(self) -> Agreement | None:
        """Accuracy and friends against the file's gold labels, in their own scheme (None: no gold)."""
        return agreement(self.predicted.gold, self.label_scheme or AUTO)

    @property
    def gold_rows(self) -> dict[str, int]:
        """Labelled rows by gold value (any scheme)."""
        rows: Counter = Counter()
        for (gold, _), count in self.predicted.gold.items():
            rows[gold] += count
        return dict(rows)

    def gold_warning(self) -> str | None:
        """The words for gold values the accuracy left out (outside the scheme), naming the input."""
        return outside_words(self.agreement, self.gold_rows, str(self.input or self.output))

    @property
    def rejected_share(self) -> float:
        return self.rejected / self.rows if self.rows else 0.0

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
        if self.published_before:
            lines.append(f"nothing to do: {self.output} is already the output of this same run (counts as it recorded)")
        lines += [f"repaired: {what}" for what in self.repaired]
        lines += [f"  rejected {reason}: {count}{self._why(reason)}" for reason, count in sorted(self.reasons.items())]
        if self.rejected:
            lines.append(f"rejects listed in {self.rejects}")
        lines += self._speed_lines()
        if self.oov_share is not None:
            lines.append(f"out of the model's vocabulary: {self.oov_share:.1%} of tokens")
        lines += self._prediction_lines()
        found = self.agreement
        lines += found.report() if found is not None else []
        warning = self.gold_warning()
        lines += [f"not scored: {warning.split(': ', 1)[1]}"] if warning else []
        lines.append(self._how_it_ran())
        return lines

    def _why(self, reason: str) -> str:
        """What to do about a reason the user can change: sentences over the token limit."""
        if reason == RejectReason.TOO_LONG.value and self.max_tokens is not None:
            return f" (a sentence over {self.max_tokens} tokens; raise the limit with --max-tokens)"
        return ""

    def _speed_lines(self) -> list[str]:
        speeds = [
            f"{name} {rate:.0f} pairs/s"
            for name, rate in (
                ("parse" if self.parser == PARSER_STANZA else "tokenize", self.parse_pairs_per_second),
                ("model", self.model_pairs_per_second),
                ("end to end", self.pairs_per_second),
            )
            if rate
        ]
        return [f"throughput (work done in this run): {', '.join(speeds)}"] if speeds else []

    def _how_it_ran(self) -> str:
        threads = "" if self.model_threads is None else f" ({self.model_threads} threads)"
        workers = f" ({self.parser_workers} workers)" if (self.parser_workers or 1) > 1 else ""
        return f"model {self.model}{threads}, parser {self.parser}{workers}"

    def _prediction_lines(self) -> list[str]:
        """Label shares, confidence and drift, when anything was labelled."""
        if not self.labelled:
            return []
        shares = ", ".join(f"{label} {share:.1%}" for label, share in self.label_shares.items())
        lines = [f"labels: {shares}; mean top-class probability {self.mean_top_probability:.3f}"]
        drift = self.drift
        lines.append(
            NO_REFERENCE
            if drift is None
            else f"drift from the model's dev predictions: {drift:.3f} (total variation distance, 0 to 1)"
        )
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


def dev_label_shares(saved: Checkpoint) -> dict[str, float] | None:
    """The share of each label in the model's predictions on dev, from its checkpoint; None when it has none."""
    shares = (saved.metrics or {}).get(DEV_SHARES_KEY)
    return None if not shares else {label: float(share) for label, share in shares.items()}


def total_variation(shares: dict[str, float], reference: dict[str, float]) -> float:
    """Half the summed absolute differences of two distributions over the same labels, in [0, 1]."""
    return 0.5 * sum(abs(shares.get(label, 0.0) - reference.get(label, 0.0)) for label in shares.keys() | reference)


class TooManyRejected(SpinnError):
    """A run that published its output with a larger share of its rows rejected than the settings allow. The
    summary rides along, so a front end still prints and logs what was labelled."""

    def __init__(self, summary: LabelSummary, limit: float) -> None:
        self.summary = summary
        reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(summary.reasons.items()))
        super().__init__(
            f"{summary.rejected} of {summary.rows} rows rejected ({summary.rejected_share:.1%}, more than the "
            f"{limit:.0%} allowed: {reasons}); the output is written and the reasons are in {summary.rejects}",
            fix=("max_rejected", "raise {} to accept such a file"),
        )


def check_rejected_share(summary: LabelSummary, limit: float) -> None:
    """Fail a run whose share of rejected rows is over `limit`, once its output and rejects file are written."""
    if summary.rejected_share > limit:
        raise TooManyRejected(summary, limit)
