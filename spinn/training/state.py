"""Where a training run stands (`TrainState`, saved in every checkpoint) and what it ends with (`TrainResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spinn.training.train_config import TrainConfig


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint so a resumed run picks up exactly here."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_dev_accuracy: float = -1.0
    best_step: int = 0
    evals_since_best: int = 0
    last_eval_step: int = -1
    finished: bool = False
    early_stopped: bool = False
    run_id: str | None = None
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    """Wall time of dev evaluation (and the temperature's fit), apart from training's."""
    train_pairs: int = 0
    model_version: str | None = None
    registered_best_step: int = -1


@dataclass
class TrainResult:
    """What `train` returns (and rank 0 leaves in result.json for a relaunching process)."""

    run_id: str
    steps: int
    best_step: int
    best_dev_accuracy: float
    best_checkpoint: Path
    last_checkpoint: Path
    model_version: str | None
    promoted: bool
    train_seconds: float
    pairs_per_second: float
    dev_metrics: dict[str, Any] = field(default_factory=dict)
    temperature: float = 1.0
    """best.pt's softmax temperature, fitted on dev (spinn.evaluation.calibration)."""
    eval_seconds: float = 0.0


def budget_spent(config: TrainConfig, state: TrainState) -> bool:
    """The step or epoch budget is used up (a resumed run with a larger budget goes on)."""
    return state.epoch >= config.max_epochs or (config.max_steps is not None and state.step >= config.max_steps)
