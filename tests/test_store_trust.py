"""Issue 32, class 3: the tracking store is trusted only for what it holds.

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
from tests.conftest import SMOKE_TRAINING
from tests.helpers import one_error_line


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
