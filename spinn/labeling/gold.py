"""Agreement with gold labels: when a labelled corpus brings its own gold column, how often the model agrees.

A corpus that arrives with gold labels (SICK's entailment_label, an MNLI dev
sample's gold_label) is also a test set: the label summary reports accuracy
over the rows that have gold, and a confusion count (gold -> predicted), so a
user sees at once whether the model transfers to their data.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spinn.data.schema import LABELS

GOLD_COLUMN = "gold_label"
PREDICTED_COLUMN = "label"


@dataclass(frozen=True)
class GoldAgreement:
    """Accuracy over the rows with gold, and how many rows of each gold class got each predicted label."""

    with_gold: int
    correct: int
    confusion: dict[str, dict[str, int]]
    """gold label -> predicted label -> rows."""

    @property
    def accuracy(self) -> float:
        return self.correct / self.with_gold

    def report(self) -> list[str]:
        """A line of accuracy and one per gold class: `  gold neutral -> entailment 3, neutral 40, ...`."""
        lines = [f"accuracy against the file's gold labels: {self.accuracy:.4f} on {self.with_gold} pairs"]
        for gold in LABELS:
            row = self.confusion[gold]
            lines.append(f"  gold {gold} -> " + ", ".join(f"{predicted} {row[predicted]}" for predicted in LABELS))
        return lines


def agreement(pairs: Iterable[tuple[str | None, str | None]]) -> GoldAgreement | None:
    """From (gold, predicted) label pairs; None when no row has both (no gold column, or all unlabelled)."""
    counts = Counter((gold, predicted) for gold, predicted in pairs if gold is not None and predicted is not None)
    with_gold = sum(counts.values())
    if not with_gold:
        return None
    confusion = {gold: {predicted: counts[gold, predicted] for predicted in LABELS} for gold in LABELS}
    return GoldAgreement(with_gold, sum(counts[label, label] for label in LABELS), confusion)


def predictions_agreement(predictions: Path) -> GoldAgreement | None:
    """The agreement in a label run's predictions Parquet (its gold_label and label columns)."""
    import pyarrow.parquet as pq

    table = pq.read_table(predictions, columns=[GOLD_COLUMN, PREDICTED_COLUMN])
    return agreement(zip(table[GOLD_COLUMN].to_pylist(), table[PREDICTED_COLUMN].to_pylist(), strict=True))


def gold_report(predictions: Path) -> list[str]:
    """The label summary's lines on gold: accuracy and the confusion count, none when there is no gold."""
    found = predictions_agreement(predictions) if Path(predictions).is_file() else None
    return found.report() if found is not None else []
