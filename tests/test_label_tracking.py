"""A label run as an MLflow run: `spinn label --track` logs its figures to a real sqlite store, linked to the
model version it used, with drift against the model's own dev predictions.

The store is a copy of the session's smoke model store (the registered
`label-test` version 1), so the runs written here never reach other tests.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import mlflow
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from flows.artifacts import labelled_file_rows
from spinn.cli import main
from spinn.data.schema import LABELS
from spinn.evaluation.metrics import Metrics
from spinn.ground.io import file_digest
from spinn.labeling.label_settings import PROBABILITY_COLUMNS, LabelSettings
from spinn.labeling.summary import NO_REFERENCE, LabelSummary, PredictionCounts, dev_label_shares, total_variation
from spinn.labeling.track import LABELING_EXPERIMENT, OUTPUT_TAG, label_metrics
from spinn.model.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from spinn.tracking.links import ui_page, ui_url
from tests.helpers import smoke_pairs

TOLERANCE = 1e-6
CLOCK_SLACK_S = 0.01
"""The wall clock the start is read on against the monotonic one durations are read on."""
BAD_LINES = ['{"id": "broken", "premise": ', json.dumps({"id": "empty", "premise": " ", "hypothesis": "A dog ."})]
"""Two rows the reader rejects (malformed_json, empty_sentence): the rejects-by-reason metrics count them."""


@pytest.fixture
def store(smoke_model, tmp_path, monkeypatch) -> str:
    """A private copy of the smoke model's store; the new experiment's artifacts go under tmp_path."""
    database = tmp_path / "mlflow.db"
    shutil.copyfile(smoke_model.tracking_uri.removeprefix("sqlite:///"), database)
    uri = f"sqlite:///{database}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(uri)  # the registry finds logged models through mlflow's own current store
    return uri


def pairs_file(smoke_model, tmp_path: Path, count: int = 12) -> Path:
    good = [json.dumps(row) for row in smoke_pairs(smoke_model, count)]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(good[:3] + BAD_LINES + good[3:]) + "\n", encoding="utf-8")
    return path


def run_label(source: Path, model: str | Path, output: Path, *extra: str):
    arguments = ["label", str(source), "--model", str(model), "--output", str(output), "--parser", "model"]
    result = CliRunner().invoke(main, [*arguments, "--device", "cpu", "--no-progress", *extra])
    assert result.exit_code == 0, result.output
    return result


def client(store: str):
    """A client of the test's own store (mlflow's module-level URI may still name another test's)."""
    return mlflow.MlflowClient(store)


def labelling_runs(store: str):
    experiment = client(store).get_experiment_by_name(LABELING_EXPERIMENT)
    return client(store).search_runs([experiment.experiment_id])


def sentence_tokens(row: dict) -> int:
    """Tokens of a pair's two sentences: the leaves of its trees."""
    trees = row["premise_tree"] + " " + row["hypothesis_tree"]
    return len(trees.replace("(", " ").replace(")", " ").split())


def test_a_tracked_label_run_logs_its_figures_linked_to_the_model_version(smoke_model, store, tmp_path):

    source, output = pairs_file(smoke_model, tmp_path), tmp_path / "out.parquet"
    printed = run_label(source, smoke_model.registered, output, "--track").output
    [run] = labelling_runs(store)
    params, metrics, tags = run.data.params, run.data.metrics, run.data.tags
    version = client(store).get_model_version("label-test", "1")

    assert params["model"] == "models:/label-test/1" and params["model_version"] == "1"
    assert params["model_run_id"] == tags["spinn.model_run_id"] == version.run_id
    training = client(store).get_run(version.run_id).info.experiment_id
    description = tags["mlflow.note.content"]  # the links the run page shows
    assert "(#/models/label-test/versions/1?workflowType=machine_learning)" in description
    assert f"({ui_page(training, version.run_id)})" in description
    assert params["input"] == "pairs.jsonl" and params["input_sha256"] == file_digest(source, "sha256")
    assert params["parser"] == "model" == params["settings.parser"]
    assert tags[OUTPUT_TAG] == output.as_uri()
    artifacts = [artifact.path for artifact in client(store).list_artifacts(run.info.run_id)]
    assert artifacts == ["gold_agreement.json"]  # the gold agreement; a link to the output, never a copy
    assert ui_url(run.info.experiment_id, run.info.run_id) in printed

    rows = pq.read_table(output).to_pylist()
    assert metrics["rows"] == len(rows) + len(BAD_LINES) and metrics["labelled"] == len(rows)
    assert metrics["rejected_malformed_json"] == 1 == metrics["rejected_empty_sentence"]
    shares = {label: sum(row["label"] == label for row in rows) / len(rows) for label in LABELS}
    assert all(abs(metrics[f"predicted_share_{label}"] - shares[label]) < TOLERANCE for label in LABELS)
    top = sum(max(row[name] for name in PROBABILITY_COLUMNS) for row in rows) / len(rows)
    assert abs(metrics["mean_top_probability"] - top) < TOLERANCE
    tokens = sum(sentence_tokens(row) for row in rows)
    assert abs(metrics["mean_sentence_tokens"] - tokens / (2 * len(rows))) < TOLERANCE
    assert 0.0 <= metrics["oov_share"] <= 1.0 and metrics["pairs_per_second"] > 0


def test_drift_is_measured_against_the_dev_shares_training_logged(smoke_model, store, tmp_path):
    """The training run's `dev_predicted_share_*` (logged by training at each dev evaluation) at the best step
    are the reference the label run's drift is measured against."""

    run_label(pairs_file(smoke_model, tmp_path), smoke_model.registered, tmp_path / "out.parquet", "--track")
    [run] = labelling_runs(store)
    training = client(store).get_run(run.data.params["model_run_id"])
    best_step = int(training.data.tags["best_step"])
    dev = {
        label: next(
            point.value
            for point in client(store).get_metric_history(training.info.run_id, f"dev_predicted_share_{label}")
            if point.step == best_step
        )
        for label in LABELS
    }
    assert abs(sum(dev.values()) - 1.0) < TOLERANCE
    shares = {label: run.data.metrics[f"predicted_share_{label}"] for label in LABELS}
    assert abs(run.data.metrics["drift"] - total_variation(shares, dev)) < TOLERANCE


def test_a_model_without_dev_scores_labels_with_drift_skipped_and_a_note(smoke_model, store, tmp_path):
    saved = replace(load_checkpoint(smoke_model.checkpoint), metrics=None)  # as last.pt, or before any dev evaluation
    checkpoint = save_checkpoint(tmp_path / "no-dev.pt", saved)
    printed = run_label(pairs_file(smoke_model, tmp_path), checkpoint, tmp_path / "out.parquet", "--track").output
    [run] = labelling_runs(store)
    assert NO_REFERENCE in printed and NO_REFERENCE in run.data.tags["mlflow.note.content"]
    assert "drift" not in run.data.metrics and run.data.metrics["labelled"] > 0
    assert "model_version" not in run.data.params  # a checkpoint file has no registered version


def test_without_track_the_cli_logs_nothing(smoke_model, store, tmp_path):
    run_label(pairs_file(smoke_model, tmp_path), smoke_model.checkpoint, tmp_path / "out.parquet")
    assert client(store).get_experiment_by_name(LABELING_EXPERIMENT) is None


def test_dev_label_shares_are_the_confusion_matrix_columns():
    metrics = Metrics(((3, 1, 0), (0, 2, 2), (1, 0, 1)))  # rows gold, columns predicted: 4, 3, 3 of 10
    saved = Checkpoint(model_state={}, model_config={}, vocab={}, step=1, metrics=metrics.to_json())
    assert dev_label_shares(saved) == pytest.approx({"entailment": 0.4, "neutral": 0.3, "contradiction": 0.3})
    assert dev_label_shares(replace(saved, metrics=None)) is None
    assert dev_label_shares(replace(saved, metrics={})) is None


def test_total_variation_distance():
    assert total_variation({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}) == 0.0
    assert total_variation({"a": 1.0}, {"b": 1.0}) == 1.0
    assert total_variation({"a": 0.6, "b": 0.4}, {"a": 0.3, "b": 0.7}) == pytest.approx(0.3)


SUMMARY_STARTED_AT = 1_795_000_000.0
"""When the hand-made summaries' run began (2026-11-18, seconds since the epoch)."""


def summary_of(labels: list[str], top: list[float], dev_shares: dict[str, float] | None) -> LabelSummary:
    counts = PredictionCounts()
    counts.labels.update(labels)
    counts.top_probability_sum = sum(top)
    return LabelSummary(
        Path("out.parquet"),
        Path("out.rejects.jsonl"),
        "model.pt",
        "model",
        rows=len(labels) + 1,
        labelled=len(labels),
        rejected=1,
        shards=1,
        shards_reused=0,
        reasons={"too_long": 1},
        parse_seconds=0.5,
        model_seconds=0.25,
        tokens=10 * 2 * len(labels),
        unknown_tokens=len(labels),
        seconds=2.0,
        started_at=SUMMARY_STARTED_AT,
        predicted=counts,
        dev_shares=dev_shares,
    )


def test_label_metrics_and_the_artifact_row_show_the_same_figures_rounded():
    labels = ["entailment"] * 5 + ["neutral"] * 2 + ["contradiction"]
    summary = summary_of(labels, [0.9] * 8, {"entailment": 0.375, "neutral": 0.25, "contradiction": 0.375})
    metrics = label_metrics(summary)
    assert metrics["predicted_share_entailment"] == 0.625 and metrics["predicted_share_contradiction"] == 0.125
    assert metrics["rejected_too_long"] == 1 and metrics["pairs_per_second"] == 4.5
    assert metrics["mean_top_probability"] == pytest.approx(0.9) and metrics["mean_sentence_tokens"] == 10.0
    assert metrics["oov_share"] == 0.05 and metrics["drift"] == pytest.approx(0.25)

    [row] = labelled_file_rows({"pairs.csv": {"status": "done", "rows": 9, "metrics": metrics}})
    assert (row["entailment"], row["neutral"], row["contradiction"]) == ("62.5%", "25.0%", "12.5%")
    assert (row["OOV tokens"], row["mean top probability"], row["drift"]) == ("5.0%", 0.9, 0.25)
    assert row["pairs/s"] == 4 and row["tokens per sentence"] == 10.0


def test_a_run_without_a_dev_reference_has_no_drift_figure():
    metrics = label_metrics(summary_of(["neutral"], [0.5], None))
    assert "drift" not in metrics and metrics["predicted_share_neutral"] == 1.0


def test_ui_links_open_the_model_training_view():
    assert ui_url("3", "abc") == "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    assert ui_url("3").endswith("/#/experiments/3?workflowType=machine_learning")


def test_a_version_that_is_a_logged_model_is_an_input_of_the_label_run(smoke_model, store):
    """A version registered from an MLflow 3 logged model: the label run records that model as its input, and
    its id as a param and a tag."""
    from spinn.labeling.track import log_label_run

    training = client(store).get_model_version("label-test", "1").run_id
    experiment = client(store).get_run(training).info.experiment_id
    logged = client(store).create_logged_model(experiment, name="spinn", source_run_id=training)
    version = mlflow.register_model(f"models:/{logged.model_id}", "label-test")
    summary = replace(summary_of(["neutral"] * 4, [0.8] * 4, None), model=f"models:/label-test/{version.version}")

    tracked = log_label_run(summary, LabelSettings())
    run = client(store).get_run(tracked.run_id)
    assert [found.model_id for found in run.inputs.model_inputs] == [logged.model_id]
    assert run.data.params["model_id"] == logged.model_id == run.data.tags["spinn.model_id"]
    assert run.info.run_name == f"label pairs with label-test/{version.version}"
    assert run.data.tags["mlflow.source.type"] == "LOCAL"


def test_a_label_run_starts_in_mlflow_when_the_labelling_began(smoke_model, store, tmp_path):
    """The run's start is the instant `label()` began, not the moment it was logged (MLflow's calls before it
    took seconds on busy cores): the UI shows the labelling's own duration."""
    from spinn.labeling.label import label
    from spinn.labeling.track import log_label_run

    settings = LabelSettings(parser="model", device="cpu")
    before = time.time()
    summary = label(pairs_file(smoke_model, tmp_path), smoke_model.checkpoint, tmp_path / "out.parquet", settings)
    after = time.time()
    assert before <= summary.started_at and summary.started_at + summary.seconds <= after + CLOCK_SLACK_S

    run = client(store).get_run(log_label_run(summary, settings).run_id)
    assert run.info.start_time == round(summary.started_at * 1000)
