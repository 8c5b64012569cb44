"""Training configuration: params.yaml sections, paper defaults per variant, overrides, clear errors."""

from __future__ import annotations

import pytest

from spinn.config import PAPER_OPTIMIZATION, TrainConfig, load_train_config
from spinn.errors import SpinnError
from spinn.model import PRESETS

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


def test_params_sections_and_paper_defaults(tmp_path):
    (tmp_path / "params.yaml").write_text(PARAMS)
    config = load_train_config(tmp_path / "params.yaml")
    assert config.batch_size == 64 and config.oov == "zeros"
    assert config.model.variant == "spinn" and config.model.d_hidden == 100
    assert config.model.d_tracker == PRESETS["spinn-300d"].d_tracker == 79  # the paper's tracker size
    assert (config.learning_rate, config.weight_decay) == PAPER_OPTIMIZATION["spinn"]


@pytest.mark.parametrize("variant", ["cbow", "pi-nt", "pi", "spinn"])
def test_each_variant_gets_its_paper_optimizer(variant):
    config = load_train_config(None, [f"model.variant={variant}"])
    assert (config.learning_rate, config.weight_decay) == PAPER_OPTIMIZATION[variant]
    assert config.model.variant == variant


def test_overrides_win_and_parse_as_yaml(tmp_path):
    (tmp_path / "params.yaml").write_text(PARAMS)
    config = load_train_config(tmp_path / "params.yaml", ["learning_rate=0.01", "max_steps=null",
                                                          "model.d_hidden=8", "amp=false"])
    assert config.learning_rate == 0.01 and config.max_steps is None and config.model.d_hidden == 8
    assert config.amp is False


def test_round_trip_through_a_checkpoint_dict():
    config = load_train_config(None, ["model.variant=pi", "seed=9"])
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert config.flat()["model.variant"] == "pi"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["colour=blue"], r"unknown train settings \['colour'\]"),
        (["model.depth=3"], r"unknown train.model settings \['depth'\]"),
        (["model.variant=lstm"], "variant must be one of"),
        (["oov=mean"], "oov must be one of"),
        (["batch_size=0"], "batch_size must be at least 1"),
        (["no-equals"], "expected KEY=VALUE"),
    ],
)
def test_bad_settings_are_named(overrides, message):
    with pytest.raises(SpinnError, match=message):
        load_train_config(None, overrides)


def test_bad_params_file(tmp_path):
    (tmp_path / "params.yaml").write_text("train: [unclosed")
    with pytest.raises(SpinnError, match="not valid YAML"):
        load_train_config(tmp_path / "params.yaml")
    with pytest.raises(SpinnError, match="no such params file"):
        load_train_config(tmp_path / "missing.yaml")
