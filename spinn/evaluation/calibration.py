"""Calibrated confidence: one temperature fitted on dev, and how far confidence is from accuracy.

A network trained on cross-entropy is usually overconfident: among the pairs
it labels with top probability 0.9, fewer than 90% are right. Bulk labels are
thresholded on that probability, so it should mean what it says. Temperature
scaling (Guo et al. 2017, "On Calibration of Modern Neural Networks") divides
the classifier's logits by one scalar T > 0 before the softmax, with T chosen
to minimise the negative log likelihood of the dev labels. The argmax, and so
every label, is unchanged; only the probabilities move.

Training fits T on the dev logits its evaluation already made and stores it in
best.pt (`Checkpoint.temperature`); predict() applies it. Evaluation reports
the expected calibration error before (T = 1) and after (the model's T): the
top probability of each pair is put in one of ECE_BINS equal-width bins of
(0, 1], each bin's |accuracy - mean top probability| weighted by its share of
the pairs, summed (a reliability diagram draws the same bins).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spinn.evaluation.figures import saved_figure
from spinn.ground.errors import SpinnError
from spinn.ground.io import atomic_path

ECE_BINS = 15
"""Equal-width bins of the top probability, as Guo et al. measured ECE."""
LOG_TEMPERATURE_BOUND = math.log(100.0)
"""The fit searches T in [1/100, 100]: wider than any useful temperature, narrow enough for a bounded search."""
SEARCH_TOLERANCE = 1e-6
"""Width in log T at which the search stops: T known to a part in a million."""
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
BIN_COLUMNS = ("bin_low", "bin_high", "count", "confidence", "accuracy")
UNCALIBRATED, CALIBRATED = "uncalibrated", "calibrated"
RELIABILITY_PLOT = "reliability"
RELIABILITY_DIR = "reliability"
"""The folder name `spinn evaluate` and the pipelines give the reliability diagram's files."""


def log_softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """(N, C) float64 log probabilities of logits / temperature, stable for any logit size."""
    scaled = np.asarray(logits, dtype=np.float64) / temperature  # (N, C)
    shifted = scaled - scaled.max(axis=1, keepdims=True)  # (N, C), largest 0
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    return np.exp(log_softmax(logits, temperature))  # (N, C)


def negative_log_likelihood(logits: np.ndarray, gold: np.ndarray, temperature: float) -> float:
    """Mean -log p(gold) of softmax(logits / temperature): what the temperature is fitted to."""
    chosen = log_softmax(logits, temperature)[np.arange(len(gold)), gold]  # (N,)
    return float(-chosen.mean())


def fit_temperature(logits: np.ndarray, gold: np.ndarray) -> float:
    """The T > 0 that minimises the dev NLL of softmax(logits / T), by golden-section search over log T.

    The NLL is convex in 1/T (a log-sum-exp of linear functions minus a linear one), so it has one minimum
    along log T and the search finds it. A T that does not lower the NLL below T = 1's (a model whose logits
    are all equal, say) is not one: 1.0 is returned."""
    logits, gold = _checked(logits, gold)
    low, high = -LOG_TEMPERATURE_BOUND, LOG_TEMPERATURE_BOUND

    def loss(log_temperature: float) -> float:
        return negative_log_likelihood(logits, gold, math.exp(log_temperature))

    left, right = high - GOLDEN * (high - low), low + GOLDEN * (high - low)
    left_loss, right_loss = loss(left), loss(right)
    while high - low > SEARCH_TOLERANCE:
        if left_loss <= right_loss:  # the minimum is left of `right`
            high, right, right_loss = right, left, left_loss
            left = high - GOLDEN * (high - low)
            left_loss = loss(left)
        else:
            low, left, left_loss = left, right, right_loss
            right = low + GOLDEN * (high - low)
            right_loss = loss(right)
    temperature = math.exp((low + high) / 2)
    return temperature if loss(math.log(temperature)) < loss(0.0) else 1.0


def _checked(logits: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logits, gold = np.asarray(logits, dtype=np.float64), np.asarray(gold, dtype=np.int64)
    if logits.ndim != 2 or gold.shape != (logits.shape[0],) or not len(gold):
        raise SpinnError(f"calibration needs (N, C) scores and N gold labels, N > 0; got {logits.shape}, {gold.shape}")
    if not np.isfinite(logits).all():
        raise SpinnError("calibration needs finite logits")
    return logits, gold


@dataclass(frozen=True)
class Bin:
    """One equal-width bin (low, high] of top probabilities: its pairs, their mean top probability and the
    share of them labelled right (both None when it is empty)."""

    low: float
    high: float
    count: int
    confidence: float | None
    accuracy: float | None


@dataclass(frozen=True)
class Reliability:
    """How well the top probabilities of one set of predictions match how often they are right."""

    bins: tuple[Bin, ...]
    ece: float
    """Expected calibration error: sum over bins of count / N * |accuracy - confidence|."""
    mean_confidence: float
    """The mean top probability."""

    @classmethod
    def of(cls, probabilities: np.ndarray, gold: np.ndarray, bins: int = ECE_BINS) -> Reliability:
        """Of the top probability of each pair, right when its class is the gold one."""
        probabilities, gold = _checked(probabilities, gold)
        return cls.binned(probabilities.max(axis=1), probabilities.argmax(axis=1) == gold, bins)

    @classmethod
    def binned(cls, confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> Reliability:
        """Of the probability given to each pair's answer (`confidence`, (N,)) and whether it was right."""
        edges = np.arange(bins + 1) / bins  # (bins + 1,) exactly i / bins
        # (low, high]: searchsorted's left side puts a top probability equal to an edge in the bin it closes
        index = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)  # (N,)
        counts = np.bincount(index, minlength=bins)  # (bins,)
        confidence_sums = np.bincount(index, weights=confidence, minlength=bins)  # (bins,)
        correct_sums = np.bincount(index, weights=correct, minlength=bins)  # (bins,)
        table = tuple(
            Bin(
                float(edges[b]),
                float(edges[b + 1]),
                int(counts[b]),
                float(confidence_sums[b] / counts[b]) if counts[b] else None,
                float(correct_sums[b] / counts[b]) if counts[b] else None,
            )
            for b in range(bins)
        )
        ece = float(np.abs(correct_sums - confidence_sums).sum() / len(confidence))  # sum of count/N * |acc - conf|
        return cls(table, ece, float(confidence.mean()))

    def to_json(self) -> dict:
        return {
            "ece": self.ece,
            "mean_confidence": self.mean_confidence,
            "bins": [vars(one) for one in self.bins],
        }


@dataclass(frozen=True)
class Calibration:
    """A model's probabilities on labelled pairs before (T = 1) and after its temperature."""

    temperature: float
    uncalibrated: Reliability
    calibrated: Reliability

    @classmethod
    def of(cls, logits: np.ndarray, gold: np.ndarray, temperature: float) -> Calibration:
        """From the classifier's logits: softmax(logits) and softmax(logits / temperature), what predict
        gives at that temperature, through the same arithmetic (so at T = 1 the two are equal)."""
        return cls(
            temperature, Reliability.of(softmax(logits), gold), Reliability.of(softmax(logits, temperature), gold)
        )

    @classmethod
    def in_classes(
        cls, logits: np.ndarray, class_of_label: np.ndarray, gold: np.ndarray, temperature: float
    ) -> Calibration:
        """Over a gold scheme's K classes, which the model's C labels map onto (`class_of_label`, (C,) class
        indices; `gold`, (N,) class indices): a class's probability is the sum of its labels', and a pair's
        confidence that of the class its label (the largest logit) maps to, so the bins count the scheme's
        own right answers. With the identity map (three-way), what `of` gives."""
        logits, gold = _checked(logits, gold)
        to_class = np.eye(int(class_of_label.max()) + 1)[class_of_label]  # (C, K) one-hot rows
        predicted = np.asarray(class_of_label)[logits.argmax(axis=1)]  # (N,) the label's class

        def reliability(at: float) -> Reliability:
            probabilities = softmax(logits, at) @ to_class  # (N, K)
            confidence = probabilities[np.arange(len(gold)), predicted]  # (N,)
            return Reliability.binned(confidence, predicted == gold)

        return cls(temperature, reliability(1.0), reliability(temperature))

    def summary(self) -> dict[str, float]:
        """The headline numbers, for metrics files (DVC) and MLflow."""
        return {
            "temperature": self.temperature,
            f"{UNCALIBRATED}_ece": self.uncalibrated.ece,
            f"{CALIBRATED}_ece": self.calibrated.ece,
            f"{UNCALIBRATED}_mean_confidence": self.uncalibrated.mean_confidence,
            f"{CALIBRATED}_mean_confidence": self.calibrated.mean_confidence,
        }

    def to_json(self) -> dict:
        """Everything, bins included (the report)."""
        return {
            "temperature": self.temperature,
            "ece_bins": len(self.calibrated.bins),
            UNCALIBRATED: self.uncalibrated.to_json(),
            CALIBRATED: self.calibrated.to_json(),
        }

    def describe(self) -> str:
        """One line for people: ECE and mean top probability before and after the temperature."""
        before, after = self.uncalibrated, self.calibrated
        return (
            f"expected calibration error {before.ece:.4f} at T = 1, {after.ece:.4f} at the model's "
            f"T = {self.temperature:.4f} ({len(after.bins)} equal-width bins; mean top probability "
            f"{before.mean_confidence:.4f} -> {after.mean_confidence:.4f})"
        )

    def series(self) -> tuple[tuple[str, Reliability], tuple[str, Reliability]]:
        return (UNCALIBRATED, self.uncalibrated), (CALIBRATED, self.calibrated)


def write_reliability(folder: Path, calibration: Calibration, title: str = "Reliability") -> list[Path]:
    """The reliability diagram in `folder`: RELIABILITY_PLOT drawn, and each probability set's non-empty
    bins as `<set>.csv` (DVC's plot: accuracy against confidence, a line per file)."""
    paths = reliability_files(folder)
    for name, reliability in calibration.series():
        _write_bins(paths[name], reliability)
    plot_reliability(calibration, paths[RELIABILITY_PLOT], title)
    return list(paths.values())


def reliability_files(folder: Path) -> dict[str, Path]:
    """What `write_reliability` writes, by name: known before evaluating, so a clash is refused first."""
    folder = Path(folder)
    return {
        UNCALIBRATED: folder / f"{UNCALIBRATED}.csv",
        CALIBRATED: folder / f"{CALIBRATED}.csv",
        RELIABILITY_PLOT: folder / f"{RELIABILITY_PLOT}.png",
    }


def _write_bins(path: Path, reliability: Reliability) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(BIN_COLUMNS)
        writer.writerows(
            (f"{one.low:.4f}", f"{one.high:.4f}", one.count, f"{one.confidence:.6f}", f"{one.accuracy:.6f}")
            for one in reliability.bins
            if one.count
        )


def plot_reliability(calibration: Calibration, path: Path, title: str = "Reliability") -> Path:
    """The reliability diagram as a PNG: accuracy against mean top probability per bin, before and after
    the temperature, with the diagonal a calibrated model lies on."""
    styles = {
        UNCALIBRATED: ("tab:red", "o", "T = 1"),
        CALIBRATED: ("tab:blue", "s", f"T = {calibration.temperature:.3f}"),
    }
    path = Path(path)
    with saved_figure(path, (4.8, 4.4)) as axes:
        axes.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1, label="calibrated exactly")
        for name, reliability in calibration.series():
            color, marker, temperature = styles[name]
            used = [one for one in reliability.bins if one.count]
            axes.plot(
                [one.confidence for one in used],
                [one.accuracy for one in used],
                color=color,
                marker=marker,
                label=f"{temperature}: ECE {reliability.ece:.3f}",
            )
        axes.set_xlim(0, 1)
        axes.set_ylim(0, 1)
        axes.set_xlabel(f"mean top probability ({len(calibration.calibrated.bins)} equal-width bins)")
        axes.set_ylabel("accuracy")
        axes.set_title(title)
        axes.legend(loc="upper left", fontsize="small")
    return path
