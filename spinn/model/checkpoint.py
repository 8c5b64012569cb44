"""Checkpoints: one self-describing file, written atomically, read without unpickling code.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts:
weights, optimizer and scheduler state, the model and training configs, the
vocabulary, the step and epoch position, the best dev metric and the RNG
states, so a killed run resumes exactly and `spinn evaluate` / `spinn label`
need nothing else. Only such plain data is saved, so every load uses
`torch.load(weights_only=True)`, which refuses anything that would run code.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from spinn.errors import SpinnError
from spinn.io import atomic_path

CHECKPOINT_FORMAT = "spinn.checkpoint"
CHECKPOINT_VERSION = 1
REQUIRED_KEYS = ("format", "version", "model_state", "model_config", "vocab", "step")


def save_checkpoint(path: Path, contents: dict[str, Any]) -> Path:
    """Write `contents` plus the format header atomically: a crash leaves the previous file intact."""
    path = Path(path)
    with atomic_path(path) as temporary, temporary.open("wb") as stream:
        # A Python file, not a path: torch then reports a full disk as the OSError it is, where its own
        # writer says only "unexpected pos".
        torch.save({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, **contents}, stream)
    return path


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely (weights_only) and check it is one of ours, naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise SpinnError(f"{path}: no such checkpoint")
    try:
        contents = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises many types for unreadable or unsafe files
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SpinnError(f"{path}: not a readable spinn checkpoint ({first_line})") from None
    if not isinstance(contents, dict) or contents.get("format") != CHECKPOINT_FORMAT:
        raise SpinnError(f"{path}: not a spinn checkpoint (no '{CHECKPOINT_FORMAT}' header)")
    if contents.get("version") != CHECKPOINT_VERSION:
        raise SpinnError(f"{path}: checkpoint version {contents.get('version')}, expected {CHECKPOINT_VERSION}")
    missing = [key for key in REQUIRED_KEYS if key not in contents]
    if missing:
        raise SpinnError(f"{path}: checkpoint lacks {', '.join(missing)}")
    return contents


def check_vocabulary(contents: dict[str, Any], tokens: Sequence[str], path: Path, other: str) -> None:
    """Refuse to pair a checkpoint with data encoded by another vocabulary: ids would mean other words."""
    saved = contents["vocab"]["tokens"]
    if list(saved) != list(tokens):
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
