"""Each training run has its own folder: equal runs share one, different runs never do."""

from __future__ import annotations

from pathlib import Path

import pytest

from spinn.model.config import DEFAULT_VARIANT
from spinn.training.folders import run_folder
from spinn.training.train_config import TrainConfig


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    files = []
    for name, text in (("train.parquet", "train rows"), ("dev.parquet", "dev rows"), ("vocab.json", "[]")):
        (tmp_path / name).write_text(text, encoding="utf-8")
        files.append(tmp_path / name)
    return tuple(files)


def folder(root: Path, inputs, **settings) -> Path:
    return run_folder(root, TrainConfig.build(settings), *inputs)


def test_the_same_run_finds_the_same_folder(tmp_path, inputs):
    first = folder(tmp_path / "runs", inputs, learning_rate=0.001)
    assert first == folder(tmp_path / "runs", inputs, learning_rate=0.001)
    assert first.parent == tmp_path / "runs" and first.name.startswith(f"{DEFAULT_VARIANT}-train-")


def test_settings_that_change_the_model_change_the_folder(tmp_path, inputs):
    base = folder(tmp_path, inputs)
    assert folder(tmp_path, inputs, learning_rate=0.001) != base
    assert folder(tmp_path, inputs, model={"variant": "spinn"}).name.startswith("spinn-train-")
    assert folder(tmp_path, inputs, batch_size=64) != base


def test_where_a_run_is_recorded_does_not_change_its_folder(tmp_path, inputs):
    base = folder(tmp_path, inputs)
    assert folder(tmp_path, inputs, experiment="elsewhere", registered_model="other", alias="best", threads=1) == base


def test_other_data_gets_another_folder(tmp_path, inputs):
    base = folder(tmp_path, inputs)
    inputs[0].write_text("other train rows", encoding="utf-8")
    assert folder(tmp_path, inputs) != base


def test_the_vocabulary_beside_the_train_split_is_part_of_the_identity_when_none_is_named(tmp_path, inputs):
    """`spinn train` names no vocabulary and reads vocab.json beside the train split; README says the digest
    covers the vocabulary's bytes. It did not: a tokens-only split with a new vocab.json found the earlier
    run's folder ("holds this run, finished; reusing it"), then failed on a vocabulary mismatch. A named
    vocabulary and the same file found beside the split give one folder (CLI and flow agree)."""
    train, dev, vocab = inputs
    base = run_folder(tmp_path, TrainConfig.build({}), train, dev)
    assert base == run_folder(tmp_path, TrainConfig.build({}), train, dev, vocab)
    vocab.write_text('["<pad>", "<unk>", "dog"]', encoding="utf-8")
    assert run_folder(tmp_path, TrainConfig.build({}), train, dev) != base
