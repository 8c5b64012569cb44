"""Classification metrics for NLI predictions: what `spinn evaluate` reports.

Everything derives from one confusion matrix, so accuracy, per-class
precision / recall / F1 and the plot can never disagree. The JSON layout is
flat and stable (sorted keys, fixed class order) because DVC compares it
across commits with `dvc metrics diff`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spinn.data import f1_scores
from spinn.data.schema import LABELS
from spinn.evaluation.calibration import Calibration
from spinn.evaluation.figures import saved_figure
from spinn.ground.errors import SpinnError
from spinn.model.checkpoint import DEV_SHARES_KEY


@dataclass(frozen=True)
class ClassScores:
    precision: float
    recall: float
    f1: float
    support: int


@dataclass(frozen=True)
class Metrics:
    """Scores of one prediction set; `confusion[gold][predicted]` counts examples."""

    confusion: tuple[tuple[int, ...], ...]
    classes: tuple[str, ...] = LABELS
    transition_accuracy: float | None = None
    bracket_f1: float | None = None
    """Unlabelled bracket F1 of the model's own trees against the data's (when it built its own)."""
    oov_share: float | None = None
    """The share of the data's tokens outside the model's vocabulary (set by `spinn evaluate`)."""
    calibration: Calibration | None = None
    """How well the probabilities match the accuracy, before and after the model's temperature (set by
    `spinn evaluate`)."""
    label_scheme: str | None = None
    """The gold scheme `classes` are those of (spinn.data.label_schemes; set by `spinn evaluate`)."""

    @property
    def examples(self) -> int:
        return int(np.asarray(self.confusion).sum())

    @property
    def accuracy(self) -> float:
        matrix = np.asarray(self.confusion)
        return float(np.trace(matrix) / matrix.sum()) if matrix.sum() else 0.0

    def per_class(self) -> dict[str, ClassScores]:
        matrix = np.asarray(self.confusion, dtype=np.float64)
        scores = {}
        for index, name in enumerate(self.classes):
            true_positive = matrix[index, index]
            predicted, actual = matrix[:, index].sum(), matrix[index, :].sum()
            precision = true_positive / predicted if predicted else 0.0
            recall = true_positive / actual if actual else 0.0
            scores[name] = ClassScores(
                float(precision), float(recall), f1_scores.f1(float(precision), float(recall)), int(actual)
            )
        return scores

    @property
    def predicted_shares(self) -> dict[str, float]:
        """The share of the examples predicted as each class (the confusion matrix's columns): on dev, what
        a labelling run's label shares are compared with to measure drift."""
        matrix = np.asarray(self.confusion, dtype=np.float64)
        counts, total = matrix.sum(axis=0), matrix.sum()  # (C,) predictions per class
        return {name: float(counts[index] / total) if total else 0.0 for index, name in enumerate(self.classes)}

    @property
    def macro_f1(self) -> float:
        """Over every class of the scheme (spinn.data.f1_scores.macro_f1 says why)."""
        return f1_scores.macro_f1({name: scores.f1 for name, scores in self.per_class().items()}, over=self.classes)

    @classmethod
    def from_json(cls, data: dict) -> Metrics:
        """Back from `to_json`'s layout (as a checkpoint keeps its dev scores)."""
        return cls(
            tuple(tuple(int(count) for count in row) for row in data["confusion_matrix"]["counts"]),
            tuple(data["confusion_matrix"]["labels"]),
            data.get("transition_accuracy"),
            data.get("bracket_f1"),
            data.get("oov_share"),
            label_scheme=data.get("label_scheme"),
        )

    def summary(self) -> dict:
        """The headline numbers only: what `spinn evaluate --output` writes and `dvc metrics show` lists."""
        result: dict = {"accuracy": self.accuracy, "macro_f1": self.macro_f1, "examples": self.examples}
        if self.transition_accuracy is not None:
            result["transition_accuracy"] = self.transition_accuracy
        if self.bracket_f1 is not None:
            result["bracket_f1"] = self.bracket_f1
        if self.oov_share is not None:
            result["oov_share"] = self.oov_share
        if self.calibration is not None:
            result.update(self.calibration.summary())
        return result

    def to_json(self) -> dict:
        """The whole, stable layout: the summary, per-class scores, the share of each predicted class and the
        confusion matrix (the report file, and the dev scores a checkpoint keeps)."""
        result = self.summary()
        result["per_class"] = {name: vars(score) for name, score in self.per_class().items()}
        result[DEV_SHARES_KEY] = self.predicted_shares
        result["confusion_matrix"] = {"labels": list(self.classes), "counts": [list(row) for row in self.confusion]}
        if self.label_scheme is not None:
            result["label_scheme"] = self.label_scheme
        if self.calibration is not None:
            result["calibration"] = self.calibration.to_json()
        return result


def confusion_matrix(gold: np.ndarray, predicted: np.ndarray, n_classes: int = len(LABELS)) -> np.ndarray:
    """(n_classes, n_classes) counts, rows gold, columns predicted."""
    gold, predicted = np.asarray(gold, dtype=np.int64), np.asarray(predicted, dtype=np.int64)
    if gold.shape != predicted.shape:
        raise SpinnError(f"{gold.shape[0]} gold labels but {predicted.shape[0]} predictions")
    if gold.size and (min(gold.min(), predicted.min()) < 0 or max(gold.max(), predicted.max()) >= n_classes):
        raise SpinnError(f"labels must be class indices in [0, {n_classes})")
    return np.bincount(gold * n_classes + predicted, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def score(
    gold: np.ndarray, predicted: np.ndarray, transition_accuracy: float | None = None, bracket_f1: float | None = None
) -> Metrics:
    matrix = confusion_matrix(gold, predicted)
    return Metrics(tuple(tuple(int(v) for v in row) for row in matrix), LABELS, transition_accuracy, bracket_f1)


def plot_confusion(metrics: Metrics, path: Path, title: str = "Confusion matrix") -> Path:
    """Write the confusion matrix as a PNG (counts and row-normalised shading)."""
    matrix = np.asarray(metrics.confusion, dtype=np.float64)
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    path = Path(path)
    with saved_figure(path, (4.8, 4.2)) as axes:
        axes.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
        ticks = range(len(metrics.classes))
        axes.set_xticks(ticks, metrics.classes, rotation=30, ha="right")
        axes.set_yticks(ticks, metrics.classes)
        axes.set_xlabel("predicted")
        axes.set_ylabel("gold")
        axes.set_title(f"{title}\naccuracy {metrics.accuracy:.4f} ({metrics.examples} examples)")
        for (row, column), count in np.ndenumerate(matrix):
            color = "white" if shares[row, column] > 0.5 else "black"
            axes.text(column, row, f"{int(count)}", ha="center", va="center", color=color)
    return path
