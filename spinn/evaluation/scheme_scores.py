"""A split's gold values in their own scheme, and a model's predictions scored against them.

A prepared split keeps each pair's gold value as its corpus gave it (`spinn
parse`: `not_entailment` for GLUE) beside the model's three-way training
label. `spinn evaluate` scores in that scheme with the rules `spinn label`
follows (spinn.data.label_schemes: the model's label mapped onto the scheme's
classes, counted by the one `agreement`); a three-way split is scored in the
identity scheme, so its figures are what they always were. The probability of
a scheme's class is the sum of the model's labels that map to it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy

from spinn.data.example import Example
from spinn.data.label_schemes import AUTO, ENTAILMENT, THREE_WAY, Agreement, agreement, gold_value, outside_words
from spinn.data.pairs import encode_pairs, read_raw_pairs, split_gold_scheme
from spinn.data.schema import LABELS
from spinn.data.vocab import Vocabulary
from spinn.evaluation.calibration import Calibration
from spinn.evaluation.metrics import Metrics
from spinn.ground.errors import SpinnError
from spinn.inference.predict import Predictions


@dataclass(frozen=True)
class GoldSplit:
    """The pairs of a split that have a gold value, as the model's examples, with those values and the scheme
    to score them in (a name `agreement` takes: auto, one of SCHEMES, or spelled out as `yes/no`)."""

    path: Path
    examples: list[Example]
    gold: list[str]  # per example
    scheme: str

    def gold_rows(self) -> Counter[str]:
        """Pairs by gold value (as schemes name classes: lower case)."""
        return Counter(gold_value(value) for value in self.gold)


def read_gold_split(path: Path, vocabulary: Vocabulary, scheme: str | None = None) -> GoldSplit:
    """The split's pairs with gold, encoded with the model's vocabulary. `scheme` as the settings name it;
    None or auto: the one the split was parsed with (`spinn parse --label-scheme`, itself auto: found from
    the values), three-way where the split's labels are its gold. Refused (one line) when no gold value is
    in the scheme: evaluate needs gold it can score."""
    path = Path(path)
    pairs = [pair for pair in read_raw_pairs(path) if pair.gold is not None]
    if not pairs:
        raise SpinnError(f"{path}: no pair has a gold label, and evaluate needs gold (`spinn label` labels pairs)")
    chosen = (split_gold_scheme(path) or THREE_WAY) if scheme in (None, AUTO) else scheme
    split = GoldSplit(path, encode_pairs(pairs, vocabulary), [pair.gold for pair in pairs], chosen)
    if agreement(((value, ENTAILMENT) for value in split.gold), chosen) is None:  # what the model says: no matter
        values = ", ".join(f"{value!r} {rows}" for value, rows in split.gold_rows().most_common(10))
        where = "a known scheme" if chosen == AUTO else f"the {chosen} scheme"
        raise SpinnError(
            f"{path}: none of its gold labels ({values}) is in {where}, and evaluate needs gold it can score: "
            "name their scheme with --label-scheme (e.g. yes/no, entailment first; 0/1/2)"
        )
    return split


@dataclass(frozen=True)
class Judged:
    """Predictions set against a split's gold values in their scheme: the agreement, counted as `spinn label`
    counts it, and for the pairs whose gold value is in the scheme their gold and predicted classes (indices
    into the scheme's classes) and the classifier's logits."""

    agreement: Agreement
    gold: numpy.ndarray  # (M,) int64
    predicted: numpy.ndarray  # (M,) int64
    logits: numpy.ndarray  # (M, C) float32
    class_of_label: numpy.ndarray  # (C,) int64: the scheme's class of each of the model's labels
    temperature: float

    @classmethod
    def of(cls, split: GoldSplit, found: Predictions) -> Judged:
        labels = [LABELS[index] for index in found.labels]
        agreed = agreement(zip(split.gold, labels, strict=True), split.scheme)
        classes = agreed.scheme.classes  # read_gold_split saw a gold value in them: agreed is no None
        class_of_label = numpy.array([classes.index(agreed.scheme.from_model[label]) for label in LABELS])
        gold = [gold_value(value) for value in split.gold]
        scored = numpy.array([value in classes for value in gold])  # (N,) gold in the scheme
        gold_classes = numpy.array([classes.index(value) for value in gold if value in classes], dtype=numpy.int64)
        predicted = class_of_label[found.labels[scored]]  # (M,)
        return cls(agreed, gold_classes, predicted, found.logits[scored], class_of_label, found.temperature)

    def metrics(self, transition_accuracy: float | None, bracket_f1: float | None, oov_share: float | None) -> Metrics:
        """The scores in the scheme's classes (the agreement's confusion), with the calibration over them."""
        scheme = self.agreement.scheme
        confusion = tuple(
            tuple(self.agreement.confusion[gold][said] for said in scheme.classes) for gold in scheme.classes
        )
        calibration = Calibration.in_classes(self.logits, self.class_of_label, self.gold, self.temperature)
        return Metrics(confusion, scheme.classes, transition_accuracy, bracket_f1, oov_share, calibration, scheme.name)

    def rows(self) -> Iterator[tuple[str, str]]:
        """(actual, predicted) class names of the scored pairs, in input order: DVC's confusion plot."""
        classes = self.agreement.scheme.classes
        return ((classes[gold], classes[said]) for gold, said in zip(self.gold, self.predicted, strict=True))

    def unscored_warning(self, split: GoldSplit) -> str | None:
        """The warning for gold values outside the scheme (left out of every figure), as `spinn label` words it."""
        return outside_words(self.agreement, split.gold_rows(), str(split.path), no_gold=False)
