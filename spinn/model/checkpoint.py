"""Checkpoints: one self-describing file, written atomically, read without unpickling code.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts:
weights, optimizer and scheduler state, the model and training configs, the
vocabulary, the step and epoch position, the best dev metric and the RNG
states, so a killed run resumes exactly and `spinn evaluate` / `spinn label`
need nothing else. Only such plain data is saved, so every load uses
`torch.load(weights_only=True)`, which refuses anything that would run code.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Self

import torch

from spinn.ground.children import deferred_interrupts
from spinn.ground.errors import SpinnError, refused_checkpoint
from spinn.ground.io import atomic_path
from spinn.ground.paths import refuse_special_file

CHECKPOINT_FORMAT = "spinn.checkpoint"
CHECKPOINT_VERSION = 1
REQUIRED_FIELDS = ("model_state", "model_config", "vocab", "step")
"""The fields without a default: what loading a model needs."""

DEV_SHARES_KEY = "predicted_shares"
"""The key of `Checkpoint.metrics` that keeps the share of each label the model predicted on dev (labelling
runs measure drift against it); training writes it, labelling reads it."""


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint holds, by name: the fields a model needs first, then what resuming training needs.

    Configs, the training state and the scores stay plain dicts (their types live in layers above the model);
    a model-only checkpoint leaves the training fields None. The file is `to_dict()`: the same self-describing
    dict as ever, so every checkpoint written before this record (release 0.1.0's too) still reads."""

    model_state: dict[str, torch.Tensor]
    model_config: dict[str, Any]
    vocab: dict[str, Any]  # Vocabulary.to_json()
    step: int
    optimizer_state: dict[str, Any] | None = None
    train_config: dict[str, Any] | None = None
    state: dict[str, Any] | None = None  # the training loop's TrainState, as a dict
    rng: dict[str, Any] | None = None  # rank 0's random states (release 0.1.0 had only these)
    rng_ranks: list[dict[str, Any]] | None = None  # every rank's random states
    data: dict[str, str] | None = None  # the data's digests, as logged to MLflow
    metrics: dict[str, Any] | None = None  # dev scores of the step saved, when it was evaluated
    temperature: float | None = None
    """What the classifier's logits are divided by before the softmax, fitted on dev after training
    (spinn.evaluation.calibration); None (checkpoints from before calibration): 1.0, the raw softmax."""

    def to_dict(self) -> dict[str, Any]:
        """The file's contents: the format header, then every field (only plain data: weights_only loads it)."""
        return {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, **_field_values(self)}

    @classmethod
    def from_dict(cls, contents: Any, source: Path | str) -> Self:
        """Check the header and the model's fields, naming what is wrong; keys no field names (0.1.0's
        scheduler_state) are left behind."""
        if not isinstance(contents, dict) or contents.get("format") != CHECKPOINT_FORMAT:
            raise SpinnError(f"{source}: not a spinn checkpoint (no '{CHECKPOINT_FORMAT}' header)")
        if contents.get("version") != CHECKPOINT_VERSION:
            raise SpinnError(f"{source}: checkpoint version {contents.get('version')}, expected {CHECKPOINT_VERSION}")
        missing = [name for name in REQUIRED_FIELDS if name not in contents]
        if missing:
            raise SpinnError(f"{source}: checkpoint lacks {', '.join(missing)}")
        _check_temperature(contents.get("temperature"), source)
        return cls(**{field.name: contents[field.name] for field in fields(cls) if field.name in contents})

    @property
    def run_id(self) -> str | None:
        """The MLflow run that trained it, when it was tracked."""
        return (self.state or {}).get("run_id")

    @property
    def softmax_temperature(self) -> float:
        """The temperature predict applies: the fitted one, or 1.0 for a checkpoint that has none."""
        return 1.0 if self.temperature is None else float(self.temperature)

    @property
    def tokens(self) -> list[str]:
        """The vocabulary's words, by id."""
        return list(self.vocab["tokens"])

    def rng_by_rank(self) -> list[dict[str, Any]]:
        """Every saving rank's random states, rank 0 first (a checkpoint from before rng_ranks: rank 0's)."""
        if self.rng_ranks:
            return self.rng_ranks
        if self.rng is None:
            raise SpinnError("checkpoint has no random states: it cannot resume training")
        return [self.rng]


def _check_temperature(temperature: Any, source: Path | str) -> None:
    """None, or a positive finite number: anything else would turn every probability into nonsense."""
    if temperature is None:
        return
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 < temperature < math.inf:
        raise SpinnError(f"{source}: checkpoint field temperature is {temperature!r}, not a positive finite number")


def _field_values(record: Checkpoint) -> dict[str, Any]:
    """The fields as they are: dataclasses.asdict would deep-copy every weight tensor."""
    return {field.name: getattr(record, field.name) for field in fields(record)}


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> Path:
    """Write the checkpoint atomically: a crash leaves the previous file intact, and an interrupt (Ctrl-C, an
    orphaned command's hang-up) arriving as it is written stops the command once it is published."""
    path = Path(path)
    with deferred_interrupts(), atomic_path(path) as temporary, temporary.open("wb") as stream:
        # A Python file, not a path: torch then reports a full disk as the OSError it is, where its own
        # writer says only "unexpected pos".
        torch.save(checkpoint.to_dict(), stream)
    return path


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint safely (weights_only) and check it is one of ours, naming what is wrong."""
    path = refuse_special_file(Path(path))
    if not path.is_file():
        raise SpinnError(f"{path}: no such checkpoint")
    try:
        contents = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises many types for unreadable or unsafe files
        raise refused_checkpoint(path, error) from None
    return Checkpoint.from_dict(contents, path)


def check_vocabulary(checkpoint: Checkpoint, tokens: Sequence[str], path: Path, other: str) -> None:
    """Refuse to pair a checkpoint with data encoded by another vocabulary: ids would mean other words."""
    saved = checkpoint.tokens
    if saved != list(tokens):
        first = next(
            (i for i, (a, b) in enumerate(zip(saved, tokens, strict=False)) if a != b), min(len(saved), len(tokens))
        )
        raise SpinnError(
            f"{path}: checkpoint vocabulary ({len(saved)} words) differs from {other} ({len(tokens)} words) "
            f"from id {first}; use the vocabulary the model was trained with"
        )


def rng_states() -> dict[str, Any]:
    """Every random stream training draws from, as plain data."""
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Put every random stream back. torch wants CPU byte tensors, whatever device or dtype the
    checkpoint's tensors came back as (a load with map_location="cuda" moves them too)."""
    random.setstate(_as_python_state(states["python"]))
    torch.set_rng_state(_byte_state(states["torch"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_byte_state(state) for state in states["cuda"]])


def _byte_state(state: torch.Tensor) -> torch.Tensor:
    return state.to(device="cpu", dtype=torch.uint8)


def _as_python_state(state: Any) -> tuple:
    """weights_only loading gives back lists where random.getstate() had tuples."""
    version, internal, gauss = state
    return version, tuple(internal), gauss
