"""The tracking store is trusted only for what it holds.

A checkpoint names the MLflow run that trained it, but a file can be copied, edited or linked: `spinn
evaluate` writes its scores into that run only when the checkpoint is the one the run logged (same
digest), and `spinn train --resume` (the flow's train task calls the same function) continues a run only
when the store holds it and it was trained in this very folder, so a linked or copied last.pt never reopens
another folder's run. Each case runs the real command on a copy of the smoke model's store.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main
from spinn.model.checkpoint import load_checkpoint, save_checkpoint
from tests.helpers import SMOKE_TRAINING, one_error_line


def run_of(checkpoint: Path):
    """The MLflow run the checkpoint names, in the store MLFLOW_TRACKING_URI names now."""
    import mlflow

    return mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(load_checkpoint(checkpoint).run_id)


def tampered(source: Path, destination: Path) -> Path:
    """`source` with one weight nudged: another model that still names the run that trained `source`."""
    saved = load_checkpoint(source)
    weights = dict(saved.model_state)
    name = next(key for key, tensor in weights.items() if tensor.is_floating_point())
    weights[name] = weights[name] + 0.5
    return save_checkpoint(destination, dataclasses.replace(saved, model_state=weights))


CHECKPOINTS = {
    "tampered-copy": (lambda m, d: tampered(m.checkpoint, d / "best.pt"), False),
    "exact-copy": (lambda m, d: Path(shutil.copyfile(m.checkpoint, d / "best.pt")), True),
    "registered-uri": (lambda m, d: m.registered, True),
}
"""What `spinn evaluate --model` is given, and whether its scores belong in the training run."""


@pytest.mark.parametrize("given", CHECKPOINTS)
def test_evaluate_writes_into_the_training_run_only_the_scores_of_the_checkpoint_it_logged(
    given, smoke_model, smoke_store, tmp_path
):
    make, belongs = CHECKPOINTS[given]
    model = make(smoke_model, tmp_path)
    data = smoke_model.prepared / "test.parquet"
    output = tmp_path / "test.json"
    result = CliRunner().invoke(main, ["evaluate", "--model", str(model), "--data", str(data), "--output", str(output)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert output.is_file()
    training = run_of(smoke_model.checkpoint)
    assert ("test_accuracy" in training.data.metrics) is belongs, training.data.metrics
    assert (f"is not the checkpoint MLflow run {training.info.run_id} logged" in result.stderr) is not belongs


def smoke_train(smoke_model, output_dir: Path, *settings: str) -> list[str]:
    """`spinn train` with the smoke model's own settings (a resume must not change what the run learns)."""
    arguments = ["train", "--train", str(smoke_model.prepared / "train.parquet")]
    arguments += ["--dev", str(smoke_model.prepared / "dev.parquet"), "--output-dir", str(output_dir)]
    arguments += ["--embeddings-dir", str(smoke_model.prepared.parent / "embeddings"), "--no-register"]
    flat = {**SMOKE_TRAINING, **{f"model.{key}": value for key, value in SMOKE_TRAINING["model"].items()}}
    del flat["model"]
    for key, value in flat.items():
        arguments += ["--set", f"{key}={value}"]
    for setting in settings:
        arguments += ["--set", setting]
    return [*arguments, "--no-progress"]


def test_resuming_a_checkpoint_whose_run_is_not_in_the_store_is_one_line(smoke_model, mlflow_store, tmp_path):
    folder = tmp_path / "models"
    shutil.copytree(smoke_model.checkpoint.parent, folder)
    result = CliRunner().invoke(main, [*smoke_train(smoke_model, folder, "max_steps=42"), "--resume"])
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    run_id = load_checkpoint(folder / "last.pt").run_id
    line = one_error_line(result.stderr)
    assert line.startswith(f"error: {folder / 'last.pt'}: its MLflow run {run_id} is not in sqlite:///"), line


@pytest.mark.parametrize("how", ["linked", "copied"])
def test_resuming_another_folders_last_checkpoint_never_reopens_its_run(how, smoke_model, smoke_store, tmp_path):
    """The folder's last.pt is a link to (or a copy of) the smoke model's: its finished run stays as it is."""
    original = smoke_model.checkpoint.parent / "last.pt"
    before = run_of(original)
    folder = tmp_path / "other"
    folder.mkdir()
    if how == "linked":
        (folder / "last.pt").symlink_to(original)
    else:
        shutil.copyfile(original, folder / "last.pt")
    result = CliRunner().invoke(main, [*smoke_train(smoke_model, folder, "max_steps=42"), "--resume"])
    after = run_of(original)
    assert (after.info.status, after.data.metrics) == ("FINISHED", before.data.metrics), after.info.status
    assert after.info.end_time == before.info.end_time
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    assert f"was trained in {original.parent}, not in {folder}" in one_error_line(result.stderr)


# ----------------------------------------------------------------------------- a finished run is a record

SHORT = ("max_steps=4", "eval_every=2", "checkpoint_every=2", "log_every=1")
LONGER = ("max_steps=8", *SHORT[1:])


def record_of(run_id: str) -> tuple:
    """What a finished run says it did: status, end time, metrics, and every train_loss point."""
    import mlflow

    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(run_id)
    losses = [(point.step, point.value) for point in client.get_metric_history(run_id, "train_loss")]
    return run.info.status, run.info.end_time, run.data.metrics, losses


def runs_in(experiment: str) -> list:
    import mlflow

    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def test_resuming_a_finished_run_with_a_larger_budget_goes_on_in_a_new_linked_run(smoke_model, mlflow_store, tmp_path):
    """README's `--set max_steps=12 --resume`: the finished run stays as it ended; the new one, in the same
    experiment, names it and logs the steps after its last, and the curves for DVC span both."""
    import csv

    import mlflow

    folder, metrics = tmp_path / "models", tmp_path / "metrics"
    first = CliRunner().invoke(main, smoke_train(smoke_model, folder, *SHORT))
    assert first.exit_code == 0, (first.output, first.exception)
    finished = load_checkpoint(folder / "last.pt").run_id
    before = record_of(finished)
    longer = [*smoke_train(smoke_model, folder, *LONGER), "--resume", "--metrics-dir", str(metrics)]
    result = CliRunner().invoke(main, longer)
    assert result.exit_code == 0, (result.output, result.exception)
    assert record_of(finished) == before and before[0] == "FINISHED"
    resumed = load_checkpoint(folder / "last.pt").run_id
    assert resumed != finished and load_checkpoint(folder / "last.pt").step == 8
    new = mlflow.MlflowClient().get_run(resumed)
    old = mlflow.MlflowClient().get_run(finished)
    assert new.info.status == "FINISHED" and new.info.experiment_id == old.info.experiment_id
    assert new.data.tags["spinn.resumed_from"] == finished
    assert new.info.run_name == f"{old.info.run_name} continued at step 4"
    note = new.data.tags["mlflow.note.content"]  # the run's description in MLflow's UI
    assert finished in note and old.info.run_name in note
    assert [step for step, _ in record_of(resumed)[3]] == [5, 6, 7, 8]
    assert {run.info.run_id for run in runs_in(SMOKE_TRAINING["experiment"])} == {finished, resumed}
    with (metrics / "train_curve.csv").open(encoding="utf-8") as handle:
        assert [int(row["step"]) for row in csv.DictReader(handle)] == list(range(1, 9))


def test_the_same_finished_run_again_opens_no_mlflow_run(smoke_model, mlflow_store, tmp_path):
    """Asked for the very run the folder holds, finished: it is the result, and its MLflow run is not reopened
    (reopening it had made it RUNNING, then FINISHED at a new end time)."""
    folder = tmp_path / "models"
    assert CliRunner().invoke(main, smoke_train(smoke_model, folder, *SHORT)).exit_code == 0
    finished = load_checkpoint(folder / "last.pt").run_id
    before = record_of(finished)
    for again in (smoke_train(smoke_model, folder, *SHORT), [*smoke_train(smoke_model, folder, *SHORT), "--resume"]):
        result = CliRunner().invoke(main, again)
        assert result.exit_code == 0, (result.output, result.exception)
        assert f"MLflow run {finished}" in result.output or finished in result.output, result.output
    assert record_of(finished) == before
    assert [run.info.run_id for run in runs_in(SMOKE_TRAINING["experiment"])] == [finished]


@pytest.mark.parametrize("status", ["RUNNING", "FAILED", "KILLED"])
def test_a_run_that_did_not_finish_is_resumed_in_its_own_mlflow_run(status, smoke_model, mlflow_store, tmp_path):
    """What resume is for: a run killed (RUNNING in the store: nothing ended it), failed or marked KILLED goes
    on in the MLflow run it started, its steps after the ones it logged."""
    import mlflow

    folder = tmp_path / "models"
    assert CliRunner().invoke(main, smoke_train(smoke_model, folder, *SHORT)).exit_code == 0
    run_id = load_checkpoint(folder / "last.pt").run_id
    client = mlflow.MlflowClient()
    client.update_run(run_id, status=status)
    result = CliRunner().invoke(main, [*smoke_train(smoke_model, folder, *LONGER), "--resume"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert load_checkpoint(folder / "last.pt").run_id == run_id
    assert [run.info.run_id for run in runs_in(SMOKE_TRAINING["experiment"])] == [run_id]
    assert [step for step, _ in record_of(run_id)[3]] == list(range(1, 9)) and record_of(run_id)[0] == "FINISHED"
