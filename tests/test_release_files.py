"""Users' files survive new releases: what release 0.1.0 wrote still loads and predicts the same.

tests/fixtures/release-0.1.0 holds a checkpoint, its vocabulary and config,
prepared pairs and the model's predictions on them, all written by the 0.1.0
code (see its README). A registered `models:/...@champion` of that release is
the same files in an MLflow run's `model/` folder, registered as 0.1.0 did.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spinn.data.pairs import encode_pairs, read_raw_pairs
from spinn.data.schema import read_pairs
from spinn.data.vocab import Vocabulary
from spinn.model.batch import make_batch
from spinn.model.checkpoint import load_checkpoint
from spinn.model.config import TransitionSource
from spinn.model.loading import load_model
from spinn.trees.transitions import PAD_TRANSITION
from tests.helpers import RELEASE, register_as_release_0_1_0

PROBABILITY_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((RELEASE / "expected.json").read_text())


def predictions(reference: str | Path) -> dict[str, dict]:
    loaded = load_model(reference, torch.device("cpu"))
    batch = make_batch(encode_pairs(read_raw_pairs(RELEASE / "pairs.parquet"), loaded.vocabulary))
    found = {}
    with torch.no_grad():
        for mode, source in (("gold", TransitionSource.GOLD), ("predicted", TransitionSource.GREEDY)):
            output = loaded.model(batch, source=source)
            found[mode] = {"probabilities": torch.softmax(output.logits.double(), 1), "transitions": output.transitions}
    return found


def assert_same_predictions(found: dict, expected: dict) -> None:
    for mode in ("gold", "predicted"):
        probabilities = torch.tensor(expected[mode]["probabilities"], dtype=torch.float64)
        difference = (found[mode]["probabilities"] - probabilities).abs().max().item()
        assert difference <= PROBABILITY_TOLERANCE, f"{mode}: probabilities moved by {difference:.2g}"
        old, new = torch.tensor(expected[mode]["transitions"]), found[mode]["transitions"]
        assert [row[row != PAD_TRANSITION].tolist() for row in old] == [
            row[row != PAD_TRANSITION].tolist() for row in new
        ], f"{mode}: other transitions ran (padding aside, whatever its layout)"


def test_the_checkpoint_loads_and_predicts_the_same(expected):
    saved = load_checkpoint(RELEASE / "checkpoint.pt")
    assert (saved.step, saved.run_id, len(saved.rng_by_rank())) == (6, "25b22f7708004c40ac2439735f0c6d91", 1)
    raw = torch.load(RELEASE / "checkpoint.pt", weights_only=True)
    rewritten = saved.to_dict()
    assert set(raw) - set(rewritten) == {"scheduler_state"}  # 0.1.0's scheduler: the only key left behind
    assert set(rewritten) - set(raw) == {"rng_ranks", "temperature"}  # added since, None for a file that lacks them
    assert (rewritten["rng_ranks"], rewritten["temperature"], saved.softmax_temperature) == (None, None, 1.0)
    for key in ("format", "version", "step", "state", "vocab", "model_config", "train_config", "data", "metrics"):
        assert rewritten[key] == raw[key], key
    assert all(torch.equal(tensor, raw["model_state"][name]) for name, tensor in rewritten["model_state"].items())
    assert_same_predictions(predictions(RELEASE / "checkpoint.pt"), expected)


def test_the_vocabulary_and_prepared_pairs_read():
    vocabulary = Vocabulary.load(RELEASE / "vocab.json")
    assert vocabulary.tokens == load_model(RELEASE / "checkpoint.pt", torch.device("cpu")).vocabulary.tokens
    assert read_pairs(RELEASE / "pairs.parquet").num_rows == len(read_raw_pairs(RELEASE / "pairs.parquet")) == 24


def test_a_version_registered_by_that_release_loads_through_its_alias(expected, mlflow_store):
    """0.1.0 logged checkpoint.pt, vocab.json and config.json under the run's model/ folder and registered
    that folder; an alias on that version must still serve the same model."""
    register_as_release_0_1_0(f"sqlite:///{mlflow_store}")
    assert_same_predictions(predictions("models:/spinn@champion"), expected)
