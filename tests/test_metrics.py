"""Evaluation metrics on a hand-built prediction set whose right answers are worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spinn.evaluation.metrics import confusion_matrix, plot_confusion, score
from spinn.ground.errors import SpinnError

E, N, C = 0, 1, 2  # entailment, neutral, contradiction (LABELS order)

# 10 examples: gold E E E E N N N C C C
GOLD = np.array([E, E, E, E, N, N, N, C, C, C])
PRED = np.array([E, E, E, N, N, N, C, C, C, E])


def test_confusion_rows_gold_columns_predicted():
    assert confusion_matrix(GOLD, PRED).tolist() == [[3, 1, 0], [0, 2, 1], [1, 0, 2]]


def test_scores_match_hand_computation():
    metrics = score(GOLD, PRED, transition_accuracy=0.9)
    assert metrics.accuracy == pytest.approx(7 / 10)
    per_class = metrics.per_class()
    # entailment: predicted E 4 times (3 right); gold E 4 times (3 found)
    assert per_class["entailment"].precision == pytest.approx(3 / 4)
    assert per_class["entailment"].recall == pytest.approx(3 / 4)
    # neutral: predicted N 3 times (2 right); gold N 3 times (2 found)
    assert per_class["neutral"].f1 == pytest.approx(2 / 3)
    # contradiction: predicted C 3 times (2 right); gold C 3 times (2 found)
    assert per_class["contradiction"].support == 3
    assert metrics.macro_f1 == pytest.approx((0.75 + 2 / 3 + 2 / 3) / 3)


def test_json_is_stable_and_complete():
    metrics = score(GOLD, PRED, transition_accuracy=0.9)
    data = metrics.to_json()
    assert list(data) == [
        "accuracy",
        "macro_f1",
        "examples",
        "transition_accuracy",
        "per_class",
        "predicted_shares",
        "confusion_matrix",
    ]
    assert metrics.summary() == {key: data[key] for key in ("accuracy", "macro_f1", "examples", "transition_accuracy")}
    assert data["examples"] == 10
    assert data["confusion_matrix"]["labels"] == ["entailment", "neutral", "contradiction"]
    assert json.loads(json.dumps(data)) == data
    assert "transition_accuracy" not in score(GOLD, PRED).to_json()


def test_a_class_never_predicted_has_zero_precision_not_an_error():
    metrics = score(np.array([E, N]), np.array([E, E]))
    assert metrics.per_class()["neutral"].precision == 0.0
    assert metrics.per_class()["contradiction"].f1 == 0.0


def test_bad_inputs_are_refused():
    with pytest.raises(SpinnError, match="2 gold labels but 3 predictions"):
        confusion_matrix(np.array([0, 1]), np.array([0, 1, 2]))
    with pytest.raises(SpinnError, match="class indices"):
        confusion_matrix(np.array([0, 3]), np.array([0, 1]))


def test_plot_is_a_png(tmp_path):
    path = plot_confusion(score(GOLD, PRED), tmp_path / "plots" / "confusion.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluation_and_gold_agreement_share_one_macro_f1_and_differ_only_by_classes_without_gold():
    """Metrics averages over every class, Agreement over the classes the gold holds: with every class in the
    gold the two give the same figure; a class no gold row holds counts 0 in Metrics only."""
    from spinn.data.label_schemes import THREE_WAY, agreement

    names = ("entailment", "neutral", "contradiction")
    rows = [(names[gold], names[predicted]) for gold, predicted in zip(GOLD, PRED, strict=True)]
    assert agreement(rows, THREE_WAY).macro_f1 == pytest.approx(score(GOLD, PRED).macro_f1)
    no_contradiction = GOLD != C
    sliced = agreement([row for row, keep in zip(rows, no_contradiction, strict=True) if keep], THREE_WAY)
    metrics = score(GOLD[no_contradiction], PRED[no_contradiction])
    assert metrics.per_class()["contradiction"].f1 == 0.0
    assert metrics.macro_f1 == pytest.approx(sliced.macro_f1 * 2 / 3)


def test_a_figure_is_written_and_closed_even_when_drawing_fails(tmp_path):
    import matplotlib.pyplot as plt

    from spinn.evaluation.figures import saved_figure

    before = set(plt.get_fignums())
    with saved_figure(tmp_path / "deep" / "drawn.png", (2.0, 2.0)) as axes:
        axes.plot([0, 1], [1, 0])
    assert (tmp_path / "deep" / "drawn.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="bad data"), saved_figure(tmp_path / "failed.png", (2.0, 2.0)):
        raise ValueError("bad data")
    assert not (tmp_path / "failed.png").exists() and set(plt.get_fignums()) == before
