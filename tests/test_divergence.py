"""A model that is not finite is never checkpointed as best, registered or used to label."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main
from spinn.ground.errors import SpinnError
from spinn.model.checkpoint import load_checkpoint, save_checkpoint
from spinn.training.divergence import check_loss, check_weights
from spinn.training.train import train
from spinn.training.train_config import TrainConfig
from tests.helpers import TINY_MODEL, smoke_pairs, write_rows

DIVERGING = 1e30
"""A learning rate that is finite (so the settings accept it) and sends the weights to NaN in a few steps."""


def test_check_loss_and_weights_refuse_only_what_is_not_finite(tmp_path):
    check_loss(1.5, 3, tmp_path)
    for loss in (float("nan"), float("inf")):
        with pytest.raises(SpinnError, match="diverged by step 3"):
            check_loss(loss, 3, tmp_path)
    model = torch.nn.Linear(2, 2)
    check_weights(model, 4, tmp_path)
    with torch.no_grad():
        model.bias[1] = float("nan")
    with pytest.raises(SpinnError, match="diverged by step 4: the model's weights are not finite"):
        check_weights(model, 4, tmp_path)


def test_a_diverging_run_stops_keeping_only_finite_checkpoints(smoke_model, tmp_path, monkeypatch):
    shutil.copyfile(smoke_model.tracking_uri.removeprefix("sqlite:///"), tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    config = TrainConfig.build(
        {
            "model": {"variant": "pi", **TINY_MODEL},
            "learning_rate": DIVERGING,
            "batch_size": 16,
            "max_steps": 40,
            "eval_every": 4,
            "log_every": 1,
            "checkpoint_every": 1,
            "device": "cpu",
            "threads": 1,
            "experiment": "diverge",
            "registered_model": "diverge",
        }
    )
    prepared, output = smoke_model.prepared, tmp_path / "run"
    with pytest.raises(SpinnError, match=r"training diverged by step \d+: .*last\.pt keeps the last finite"):
        train(
            prepared / "train.parquet",
            prepared / "dev.parquet",
            config,
            output_dir=output,
            embeddings_dir=tmp_path / "embeddings",
            progress=False,
        )
    assert (output / "last.pt").is_file()
    for checkpoint in output.glob("*.pt"):
        weights = load_checkpoint(checkpoint).model_state
        assert all(tensor.isfinite().all() for tensor in weights.values()), checkpoint


def test_label_refuses_a_model_whose_weights_are_not_finite(smoke_model, tmp_path):
    saved = load_checkpoint(smoke_model.checkpoint)
    nan = {
        name: torch.full_like(tensor, float("nan")) if tensor.is_floating_point() else tensor
        for name, tensor in saved.model_state.items()
    }
    model = save_checkpoint(tmp_path / "nan.pt", dataclasses.replace(saved, model_state=nan))
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 3))
    output = tmp_path / "labels.parquet"
    result = CliRunner().invoke(
        main, ["label", str(source), "--model", str(model), "--output", str(output), "--parser", "model"]
    )
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    line = result.stderr.strip().splitlines()
    assert len(line) == 1 and line[0].startswith(f"error: {model}: weights are not finite")
    assert not output.exists()
