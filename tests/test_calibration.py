"""Calibrated confidence: the fitted temperature, expected calibration error, and the probabilities it moves.

Hand-made logits whose best temperature is known, a hand-counted ECE, and real
models (the smoke model, release 0.1.0's checkpoint) through predict, evaluate
and label: the labels never change, only the probabilities do.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from spinn.data.schema import LABELS
from spinn.evaluation.calibration import (
    CALIBRATED,
    UNCALIBRATED,
    Calibration,
    Reliability,
    fit_temperature,
    negative_log_likelihood,
    softmax,
)
from spinn.ground.errors import SpinnError
from spinn.model.checkpoint import load_checkpoint, save_checkpoint

RELEASE = Path(__file__).parent / "fixtures" / "release-0.1.0"
CALIBRATED_PAIRS = 20_000


def calibrated_set(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Logits and gold labels drawn from softmax(logits): calibrated by construction, so T = 1 is best."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, size=(CALIBRATED_PAIRS, len(LABELS)))  # (N, C)
    cumulative = softmax(logits).cumsum(axis=1)  # (N, C)
    gold = (rng.random((CALIBRATED_PAIRS, 1)) > cumulative).sum(axis=1)  # (N,) a draw from each row
    return logits, gold


@pytest.mark.parametrize("scale", [0.5, 1.0, 2.0, 3.0])
def test_logits_scaled_from_a_calibrated_set_are_fitted_the_scale_back(scale):
    """Twice a calibrated set's logits is twice as confident: T = 2 undoes it (and T = 1/2 the opposite)."""
    logits, gold = calibrated_set()
    assert fit_temperature(logits * scale, gold) == pytest.approx(scale, rel=0.03)


def test_the_fitted_temperature_minimises_the_dev_nll():
    logits, gold = calibrated_set(1)
    logits = logits * 2.0 + 0.3  # a shift of every logit changes no probability
    fitted = fit_temperature(logits, gold)
    best = negative_log_likelihood(logits, gold, fitted)
    assert all(best <= negative_log_likelihood(logits, gold, fitted * factor) for factor in (0.98, 1.02, 0.5, 2.0))


def test_logits_that_say_nothing_keep_temperature_one():
    assert fit_temperature(np.zeros((6, 3)), np.array([0, 1, 2, 0, 1, 2])) == 1.0


def test_calibration_refuses_what_it_cannot_fit():
    with pytest.raises(SpinnError, match="finite"):
        fit_temperature(np.array([[np.nan, 0.0, 0.0]]), np.array([0]))
    with pytest.raises(SpinnError, match="N gold labels"):
        fit_temperature(np.zeros((2, 3)), np.array([0]))


def test_ece_of_a_hand_counted_case():
    """Five pairs in 15 bins of width 1/15 (counted from 0): top probabilities 0.95, 0.95 (right, wrong) share
    bin 14 (accuracy 0.5, confidence 0.95); 0.5 right is bin 7 (|1 - 0.5|); 0.4 and 0.38, both wrong, share
    bin 5 (0.4 is its upper edge: bins are (low, high]), confidence 0.39, accuracy 0.
    ECE = 2/5 * 0.45 + 1/5 * 0.5 + 2/5 * 0.39 = 0.436."""
    probabilities = np.array(
        [[0.95, 0.03, 0.02], [0.95, 0.03, 0.02], [0.25, 0.5, 0.25], [0.3, 0.3, 0.4], [0.31, 0.31, 0.38]]
    )
    gold = np.array([0, 1, 1, 0, 0])
    reliability = Reliability.of(probabilities, gold)
    assert reliability.ece == pytest.approx(2 / 5 * 0.45 + 1 / 5 * 0.5 + 2 / 5 * 0.39)
    assert reliability.mean_confidence == pytest.approx((0.95 + 0.95 + 0.5 + 0.4 + 0.38) / 5)
    used = {index: bin for index, bin in enumerate(reliability.bins) if bin.count}
    assert sorted(used) == [5, 7, 14] and len(reliability.bins) == 15
    assert (used[5].count, used[5].confidence, used[5].accuracy) == (2, pytest.approx(0.39), 0.0)
    assert (used[7].count, used[7].confidence, used[7].accuracy) == (1, 0.5, 1.0)
    assert (used[14].count, used[14].confidence, used[14].accuracy) == (2, 0.95, 0.5)
    assert used[5].high == pytest.approx(0.4) and all(bin.accuracy is None for bin in reliability.bins[:5])


def test_calibration_over_a_two_way_scheme_sums_the_labels_and_scores_the_answer_the_model_gave():
    """Entailment against the rest (neutral, contradiction -> class 1). Probabilities (0.5, 0.3, 0.2): the
    label entailment, class 0, confidence 0.5, gold 0: right. (0.4, 0.35, 0.25): the label entailment, so
    the answer is class 0 at 0.4 (not the summed rest's 0.6), gold 1: wrong. (0.1, 0.6, 0.3): neutral, class 1
    at 0.6 + 0.3 = 0.9, gold 1: right. Three bins of one pair: ECE = (0.5 + 0.4 + 0.1) / 3."""
    probabilities = np.array([[0.5, 0.3, 0.2], [0.4, 0.35, 0.25], [0.1, 0.6, 0.3]])
    calibration = Calibration.in_classes(np.log(probabilities), np.array([0, 1, 1]), np.array([0, 1, 1]), 1.0)
    for reliability in (calibration.uncalibrated, calibration.calibrated):
        assert reliability.ece == pytest.approx(1 / 3)
        assert reliability.mean_confidence == pytest.approx((0.5 + 0.4 + 0.9) / 3)
        used = [(bin.count, bin.confidence, bin.accuracy) for bin in reliability.bins if bin.count]
        assert used == [(1, pytest.approx(0.4), 0.0), (1, pytest.approx(0.5), 1.0), (1, pytest.approx(0.9), 1.0)]


def test_calibration_in_the_identity_scheme_is_the_three_way_one():
    """Three-way splits are scored in the identity scheme: its calibration is `of`'s, to the last bit."""
    logits, gold = calibrated_set(3)
    for temperature in (1.0, 1.7):
        assert Calibration.in_classes(logits, np.arange(len(LABELS)), gold, temperature) == Calibration.of(
            logits, gold, temperature
        )


def test_calibration_of_a_calibrated_set_is_small_and_scaling_then_fitting_restores_it():
    logits, gold = calibrated_set(2)
    overconfident = logits * 2.0
    temperature = fit_temperature(overconfident, gold)
    calibration = Calibration.of(overconfident, gold, temperature)
    assert calibration.uncalibrated.ece > 0.1 > 0.02 > calibration.calibrated.ece
    assert calibration.uncalibrated.mean_confidence > calibration.calibrated.mean_confidence
    assert set(calibration.summary()) == {
        "temperature",
        f"{UNCALIBRATED}_ece",
        f"{CALIBRATED}_ece",
        f"{UNCALIBRATED}_mean_confidence",
        f"{CALIBRATED}_mean_confidence",
    }


# ----------------------------------------------------------------------------- real models


def with_temperature(checkpoint: Path, temperature: float | None, path: Path) -> Path:
    """A copy of `checkpoint` with its temperature set (None: as before calibration)."""
    return save_checkpoint(path, dataclasses.replace(load_checkpoint(checkpoint), temperature=temperature))


def test_predict_divides_the_logits_and_keeps_every_label(smoke_model):
    """On a real trained model: softmax(logits / T), the same argmax at every temperature."""
    from spinn.evaluation.evaluate import read_examples
    from spinn.inference.predict import predict
    from spinn.model.config import TransitionSource
    from spinn.model.loading import load_model

    loaded = load_model(smoke_model.checkpoint, torch.device("cpu"))
    examples = read_examples(smoke_model.prepared / "test.parquet", loaded.vocabulary)
    plain = predict(loaded.model, examples, torch.device("cpu"), 32, TransitionSource.GREEDY)
    assert np.allclose(plain.probabilities, softmax(plain.logits), atol=1e-6)
    for temperature in (0.5, 2.0, 7.0):
        scaled = predict(
            loaded.model, examples, torch.device("cpu"), 32, TransitionSource.GREEDY, temperature=temperature
        )
        assert np.array_equal(scaled.labels, plain.labels) and np.array_equal(scaled.logits, plain.logits)
        assert np.allclose(scaled.probabilities, softmax(plain.logits, temperature), atol=1e-6)
    with pytest.raises(SpinnError, match="temperature"):
        predict(loaded.model, examples[:2], torch.device("cpu"), 32, TransitionSource.GREEDY, temperature=0.0)


def test_a_release_0_1_0_checkpoint_predicts_at_temperature_one(tmp_path):
    """Old checkpoints have no temperature: they load, evaluate and report T = 1 (nothing moved)."""
    from spinn.evaluation.evaluate import EvaluateSettings, evaluate

    saved = load_checkpoint(RELEASE / "checkpoint.pt")
    assert saved.temperature is None and saved.softmax_temperature == 1.0
    settings = EvaluateSettings(device="cpu", track=False)
    metrics = evaluate(RELEASE / "checkpoint.pt", RELEASE / "pairs.parquet", tmp_path / "m.json", settings)
    summary = json.loads((tmp_path / "m.json").read_text())
    assert summary["temperature"] == 1.0 and summary["calibrated_ece"] == summary["uncalibrated_ece"]
    assert metrics.calibration.calibrated == metrics.calibration.uncalibrated


def test_a_checkpoint_with_a_temperature_that_is_no_number_is_refused(tmp_path):
    for wrong in (0.0, -1.0, float("nan"), float("inf"), "2"):
        path = with_temperature(RELEASE / "checkpoint.pt", wrong, tmp_path / "wrong.pt")
        with pytest.raises(SpinnError, match=r"wrong\.pt: checkpoint field temperature is .*not a positive finite"):
            load_checkpoint(path)


def test_evaluate_reports_ece_before_and_after_with_a_reliability_diagram(smoke_model, smoke_store, tmp_path):
    """The model's temperature is applied; ECE at T = 1 and at it goes to metrics, the report, the MLflow
    run (metrics and the diagram's files) and the reliability folder (a PNG and a CSV per probability set)."""
    import mlflow

    from spinn.evaluation.evaluate import EvaluateSettings, evaluate

    saved = load_checkpoint(smoke_model.checkpoint)
    assert saved.temperature is not None and saved.temperature > 0  # training fitted one
    test = smoke_model.prepared / "test.parquet"
    folder = tmp_path / "reliability"
    settings = EvaluateSettings(device="cpu")
    metrics = evaluate(smoke_model.checkpoint, test, tmp_path / "test.json", settings, reliability=folder)
    summary = json.loads((tmp_path / "test.json").read_text())
    assert summary["temperature"] == saved.temperature
    assert summary["uncalibrated_ece"] == metrics.calibration.uncalibrated.ece
    assert summary["calibrated_ece"] == metrics.calibration.calibrated.ece
    report = json.loads((tmp_path / "test_report.json").read_text())
    assert report["calibration"]["ece_bins"] == 15
    assert (folder / "reliability.png").read_bytes()[:4] == b"\x89PNG"
    for name, reliability in metrics.calibration.series():
        with (folder / f"{name}.csv").open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        assert sum(int(row["count"]) for row in rows) == metrics.examples
        assert [int(row["count"]) for row in rows] == [bin.count for bin in reliability.bins if bin.count]
    client = mlflow.MlflowClient()
    run = client.get_run(saved.run_id)
    assert run.data.metrics["test_calibrated_ece"] == pytest.approx(metrics.calibration.calibrated.ece)
    assert run.data.metrics["test_temperature"] == pytest.approx(saved.temperature)
    logged = {item.path for item in client.list_artifacts(saved.run_id, "test/reliability")}
    assert logged == {f"test/reliability/{name}" for name in ("reliability.png", "calibrated.csv", "uncalibrated.csv")}


def test_spinn_label_writes_the_models_calibrated_probabilities_and_the_same_labels(smoke_model, tmp_path):
    """The labelling path (spinn label and the pyfunc share labelled_rows) applies the checkpoint's temperature."""
    from spinn.labeling.label import label
    from spinn.labeling.label_settings import LabelSettings

    table = pq.read_table(smoke_model.prepared / "test.parquet", columns=["pair_id", "premise", "hypothesis"])
    source = tmp_path / "pairs.parquet"
    pq.write_table(table.slice(0, 40), source)
    outputs = {}
    for temperature in (None, 2.5):
        model = with_temperature(smoke_model.checkpoint, temperature, tmp_path / f"model-{temperature}.pt")
        output = tmp_path / f"labels-{temperature}.parquet"
        label(source, model, output, LabelSettings(parser="model", device="cpu").replace(parsing={"cache_path": None}))
        outputs[temperature] = pq.read_table(output).to_pandas()
    plain, scaled = outputs[None], outputs[2.5]
    assert list(plain["label"]) == list(scaled["label"])
    columns = [f"p_{name}" for name in LABELS]
    expected = softmax(np.log(plain[columns].to_numpy(dtype=np.float64)), 2.5)  # log p = logits + a constant
    assert np.allclose(scaled[columns].to_numpy(), expected, atol=1e-5)
    assert not np.allclose(scaled[columns].to_numpy(), plain[columns].to_numpy(), atol=1e-3)
