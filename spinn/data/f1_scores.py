"""F1 and macro F1, defined once for every score the project reports (evaluation's Metrics, a labelling
run's gold Agreement)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def f1(precision: float, recall: float) -> float:
    """Their harmonic mean; 0 when both are 0."""
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def macro_f1(f1_by_class: Mapping[str, float], over: Iterable[str]) -> float:
    """The unweighted mean F1 of the classes `over`; 0 when there are none.

    Which classes: evaluation's Metrics averages over every class of its scheme (the
    model's three labels, or a two-way corpus's two), so a class no gold row holds
    counts 0 and splits compare on one footing; a labelling run's gold Agreement
    over the classes its gold column holds, since a file of new pairs may hold a
    slice of a scheme (all its rows one class) and a class with no gold row has no
    recall to measure. The two agree whenever every class has a gold row.
    """
    classes = list(over)
    return sum(f1_by_class[name] for name in classes) / len(classes) if classes else 0.0
