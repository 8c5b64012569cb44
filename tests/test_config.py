"""Training configuration: params.yaml sections, paper defaults per variant, overrides, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from spinn.ground.errors import SpinnError
from spinn.ground.settings import overrides_from
from spinn.model.config import DEFAULT_VARIANT, SPINNConfig
from spinn.model.presets import PRESETS
from spinn.training.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
RELEASE_0_1 = Path(__file__).parent / "fixtures" / "release-0.1.0"
PARAMS = """
embeddings:
  source: glove-6b-50d
  oov: zeros
train:
  batch_size: 64
  model:
    variant: spinn
    d_hidden: 100
"""


def load(path: Path | None = None, *overrides: str) -> TrainConfig:
    return TrainConfig.from_params(path, overrides_from(overrides))


def test_params_sections_and_paper_defaults(tmp_path):
    (tmp_path / "params.yaml").write_text(PARAMS)
    config = load(tmp_path / "params.yaml")
    assert config.batch_size == 64 and config.embeddings.oov == "zeros"
    assert config.model.variant == "spinn" and config.model.d_hidden == 100
    assert config.model.d_tracker == PRESETS["spinn"].model.d_tracker == 79  # the paper's tracker size
    assert (config.learning_rate, config.weight_decay) == (
        PRESETS["spinn"].learning_rate,
        PRESETS["spinn"].weight_decay,
    )


@pytest.mark.parametrize("variant", ["cbow", "pi-nt", "pi", "spinn", "rl"])
def test_each_variant_gets_its_paper_optimizer(variant):
    config = load(None, f"model.variant={variant}")
    assert (config.learning_rate, config.weight_decay) == (
        PRESETS[variant].learning_rate,
        PRESETS[variant].weight_decay,
    )
    assert config.model.variant == variant


def test_overrides_win_and_parse_as_yaml(tmp_path):
    (tmp_path / "params.yaml").write_text(PARAMS)
    config = load(tmp_path / "params.yaml", "learning_rate=0.01", "max_steps=null", "model.d_hidden=8", "amp=false")
    assert config.learning_rate == 0.01 and config.max_steps is None and config.model.d_hidden == 8
    assert config.amp is False


def test_round_trip_through_a_checkpoint_dict():
    config = load(None, "model.variant=pi", "seed=9")
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert config.flat()["model.variant"] == "pi" and config.flat()["embeddings.source"] == "glove-6b-50d"


def test_a_model_and_a_training_run_default_to_the_variant_params_yaml_ships():
    """One default variant: a model config and a training run left without one agree, on params.yaml's."""
    shipped = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["train"]["model"]["variant"]
    assert SPINNConfig().variant == TrainConfig().model.variant == load(None).model.variant == DEFAULT_VARIANT
    assert DEFAULT_VARIANT == shipped
    preset = PRESETS[DEFAULT_VARIANT]
    assert (TrainConfig().learning_rate, TrainConfig().weight_decay) == (preset.learning_rate, preset.weight_decay)


def test_a_saved_config_names_its_variant_so_the_default_never_decides_it():
    """Checkpoints keep loading whatever the default: every saved config, 0.1.0's too, names its variant."""
    stored = json.loads((RELEASE_0_1 / "config.json").read_text())
    assert stored["model"]["variant"] == TrainConfig.from_dict(stored).model.variant
    for variant in PRESETS:
        saved = load(None, f"model.variant={variant}").to_dict()
        assert saved["model"]["variant"] == variant == TrainConfig.from_dict(saved).model.variant


def test_a_release_0_1_config_reads_with_its_vectors_settings():
    """0.1 stored the word-vector settings as flat train fields; they come back as the embeddings section."""
    stored = json.loads((RELEASE_0_1 / "config.json").read_text())
    assert {"embeddings", "oov", "embeddings_seed"} <= set(stored) and isinstance(stored["embeddings"], str)
    config = TrainConfig.from_dict(stored)
    assert (config.embeddings.source, config.embeddings.oov, config.embeddings.seed) == (
        stored["embeddings"],
        stored["oov"],
        stored["embeddings_seed"],
    )
    assert config.model.d_hidden == stored["model"]["d_hidden"] and config.batch_size == stored["batch_size"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["colour=blue"], r"colour: unknown setting"),
        (["model.depth=3"], r"model.depth: unknown setting"),
        (["model.variant=lstm"], r"model.variant: must be 'pi-nt', 'pi', 'spinn', 'rl' or 'cbow'"),
        (["embeddings.oov=mean"], r"embeddings.oov: must be 'zeros' or 'random'"),
        (["batch_size=0"], r"batch_size: must be at least 1 \(got 0\)"),
        (["batch_size=many"], r"batch_size: must be a number of pairs or 'auto' \(got 'many'\)"),
        (["no-equals"], "expected KEY=VALUE"),
    ],
)
def test_bad_settings_are_named(overrides, message):
    with pytest.raises(SpinnError, match=message):
        load(None, *overrides)


def test_bad_params_file(tmp_path):
    (tmp_path / "params.yaml").write_text("train: [unclosed")
    with pytest.raises(SpinnError, match="not valid YAML"):
        load(tmp_path / "params.yaml")
    with pytest.raises(SpinnError, match="no such params file"):
        load(tmp_path / "missing.yaml")
