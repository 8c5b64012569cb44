"""Gold label schemes: a corpus's gold labels read in the scheme they come in, and scored in it.

A model predicts three classes (entailment, neutral, contradiction), but many
NLI corpora label two: `entailment` / `not_entailment` (GLUE's RTE, QNLI,
WNLI), `entails` / `neutral` (SciTail), `entailment` / `non-entailment`
(HANS). Scored as three-way, every row of the second class was refused and
the rest scored as if it were accuracy: the recall of one class. Here a
scheme names its classes and maps the model's three labels onto them (a
two-way scheme: entailment against neutral and contradiction together), and
the agreement (accuracy, per-class precision, recall and F1, macro F1, the
confusion) is counted in the corpus's own classes.

A scheme is found from the gold values a file holds (`auto`), or named: one
of SCHEMES, or the file's own class names separated by `/` in the model's
order: two (`yes/no`: entailment first, then the rest) or three (`0/1/2`:
entailment, neutral, contradiction). A gold value outside the scheme is
counted and warned of; it never keeps a pair from being labelled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spinn.data import f1_scores
from spinn.data.schema import LABELS
from spinn.ground.errors import SpinnError

ENTAILMENT = LABELS[0]
AUTO = "auto"
THREE_WAY = "three-way"
"""The model's own classes: the scheme of a split whose labels are its gold (SNLI, `spinn prepare`'s)."""
SEPARATOR = "/"
NO_GOLD = "none"
"""The label column named `none`: the file's gold labels, if any, are ignored."""


@dataclass(frozen=True)
class LabelScheme:
    """A corpus's gold classes, and which of them each of the model's labels means."""

    name: str
    classes: tuple[str, ...]
    """The gold values, lower case, in report order."""
    from_model: Mapping[str, str]
    """The model's label -> the class it counts as."""

    def describe(self) -> str:
        return f"{self.name}: {' / '.join(self.classes)}"


def two_way(name: str, entails: str, rest: str) -> LabelScheme:
    """Entailment against the rest: the model's neutral and contradiction both count as `rest`."""
    return LabelScheme(name, (entails, rest), {label: entails if label == ENTAILMENT else rest for label in LABELS})


def three_way(name: str, classes: tuple[str, ...]) -> LabelScheme:
    return LabelScheme(name, classes, dict(zip(LABELS, classes, strict=True)))


SCHEMES: dict[str, LabelScheme] = {
    scheme.name: scheme
    for scheme in (
        three_way(THREE_WAY, LABELS),
        two_way("glue", "entailment", "not_entailment"),
        two_way("hans", "entailment", "non-entailment"),
        two_way("scitail", "entails", "neutral"),
    )
}
"""The schemes `auto` recognises, in the order it prefers them when a file's values fit several."""


def named_scheme(name: str) -> LabelScheme:
    """A scheme by name (SCHEMES), or spelled out as its class names: `yes/no`, `0/1/2`."""
    if name in SCHEMES:
        return SCHEMES[name]
    classes = tuple(value.strip().lower() for value in name.split(SEPARATOR))
    if len(classes) not in (2, 3) or "" in classes or len(set(classes)) != len(classes):
        raise SpinnError(
            f"label scheme {name!r}: expected {AUTO}, one of {', '.join(SCHEMES)}, or two or three distinct class "
            f"names separated by {SEPARATOR!r} in the model's order (yes/no: entailment first; 0/1/2: entailment, "
            "neutral, contradiction)"
        )
    return two_way(name, *classes) if len(classes) == 2 else three_way(name, classes)


def checked_scheme(name: str | None) -> str | None:
    """`name` as a setting gives it, once it is known to name a scheme (None and `auto`: found from the values)."""
    if name not in (None, AUTO):
        named_scheme(name)
    return name


def found_scheme(gold: Mapping[str, int]) -> LabelScheme | None:
    """The known scheme that covers most of the gold rows (`gold`: value -> rows); None when none covers any."""
    covered = {name: sum(gold.get(value, 0) for value in scheme.classes) for name, scheme in SCHEMES.items()}
    best = max(covered, key=lambda name: covered[name])  # max keeps the first of equals: SCHEMES' order
    return SCHEMES[best] if covered[best] else None


@dataclass(frozen=True)
class Agreement:
    """How often the model agrees with a corpus's gold labels, counted in the corpus's scheme."""

    scheme: LabelScheme
    confusion: dict[str, dict[str, int]]
    """gold class -> predicted class (the model's label mapped into the scheme) -> rows."""
    outside: dict[str, int]
    """Gold values outside the scheme -> rows (labelled all the same, left out of every figure)."""

    @property
    def pairs(self) -> int:
        return sum(sum(row.values()) for row in self.confusion.values())

    @property
    def correct(self) -> int:
        return sum(self.confusion[name][name] for name in self.scheme.classes)

    @property
    def accuracy(self) -> float:
        return self.correct / self.pairs

    def precision(self, name: str) -> float:
        predicted = sum(self.confusion[gold][name] for gold in self.scheme.classes)
        return self.confusion[name][name] / predicted if predicted else 0.0

    def recall(self, name: str) -> float:
        gold = sum(self.confusion[name].values())
        return self.confusion[name][name] / gold if gold else 0.0

    def f1(self, name: str) -> float:
        return f1_scores.f1(self.precision(name), self.recall(name))

    @property
    def macro_f1(self) -> float:
        """Over the classes the gold labels hold (spinn.data.f1_scores.macro_f1 says why)."""
        present = [name for name in self.scheme.classes if sum(self.confusion[name].values())]
        return f1_scores.macro_f1({name: self.f1(name) for name in present}, over=present)

    def to_json(self) -> dict:
        return {
            "scheme": self.scheme.name,
            "classes": list(self.scheme.classes),
            "pairs": self.pairs,
            "accuracy": self.accuracy,
            "macro_f1": self.macro_f1,
            "per_class": {
                name: {"precision": self.precision(name), "recall": self.recall(name), "f1": self.f1(name)}
                for name in self.scheme.classes
            },
            "confusion": self.confusion,
            "outside_the_scheme": self.outside,
        }

    def report(self) -> list[str]:
        """The accuracy line, then per gold class its F1 and what the model said: `  gold neutral (F1 ...) -> ...`."""
        lines = [
            f"accuracy against the file's gold labels ({self.scheme.describe()}): {self.accuracy:.4f} on "
            f"{self.pairs} pairs; macro F1 {self.macro_f1:.4f}"
        ]
        for gold in self.scheme.classes:
            said = ", ".join(f"{predicted} {self.confusion[gold][predicted]}" for predicted in self.scheme.classes)
            lines.append(f"  gold {gold} (F1 {self.f1(gold):.4f}) -> {said}")
        return lines


def agreement(
    gold_predicted: Mapping[tuple[str, str], int] | Iterable[tuple[str | None, str | None]], scheme: str = AUTO
) -> Agreement | None:
    """Count (gold value, model label) pairs in the scheme named (`auto`: found from the gold values); None when
    no row has a gold value in the scheme. Values are matched case-blind; rows without gold are left out."""
    counts = gold_predicted if isinstance(gold_predicted, Mapping) else Counter(gold_predicted)
    counts = Counter(
        {(gold_value(gold), predicted): n for (gold, predicted), n in counts.items() if gold and predicted}
    )
    gold_rows = Counter()
    for (gold, _), rows in counts.items():
        gold_rows[gold] += rows
    chosen = found_scheme(gold_rows) if scheme == AUTO else named_scheme(scheme)
    if chosen is None:
        return None
    confusion = {gold: dict.fromkeys(chosen.classes, 0) for gold in chosen.classes}
    for (gold, predicted), rows in counts.items():
        if gold in confusion:
            confusion[gold][chosen.from_model[predicted]] += rows
    outside = {gold: rows for gold, rows in sorted(gold_rows.items()) if gold not in confusion}
    if not any(sum(row.values()) for row in confusion.values()):
        return None
    return Agreement(chosen, confusion, outside)


def gold_value(value: object) -> str:
    """A gold value as schemes name their classes: `Entailment ` is `entailment`."""
    return str(value).strip().lower()


def outside_words(
    found: Agreement | None, gold_rows: Mapping[str, int], source: str, *, no_gold: bool = True
) -> str | None:
    """The warning for gold values that were not scored, naming `source` and the counts; None when all were.
    `no_gold`: the command has --no-gold to offer (`spinn evaluate`, which needs gold, has not)."""
    outside = found.outside if found is not None else dict(gold_rows)
    if not outside:
        return None
    values = ", ".join(f"{value!r} {rows}" for value, rows in list(outside.items())[:10])
    where = f"outside the {found.scheme.describe()} scheme" if found is not None else "in no known scheme"
    return (
        f"{source}: {sum(outside.values())} rows have gold labels {where} ({values}); they are labelled and left "
        "out of the accuracy: name the scheme with --label-scheme (e.g. yes/no, entailment first)"
        + (", or --no-gold" if no_gold else "")
    )


def three_way_label(value: str | None, scheme: str | None = None) -> str | None:
    """The model's own class for a gold value, where a three-way scheme gives one (`0` under `0/1/2` is
    entailment); None for no gold, a two-way class (not_entailment is neutral or contradiction) or a value
    outside the scheme: what a prepared split, which holds the model's classes, can keep."""
    if value is None:
        return None
    chosen = SCHEMES[THREE_WAY] if scheme in (None, AUTO) else named_scheme(scheme)
    if len(chosen.classes) != len(LABELS):
        return None
    return dict(zip(chosen.classes, LABELS, strict=True)).get(value)
