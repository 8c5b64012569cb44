"""Training that has diverged stops: no checkpoint, best model or registration is made from weights that are
not finite (issue 22, class 3).

Checking every step would cost a host sync per step, which the sync-free step exists to avoid. So the loss
is checked where the loop already reads its metrics back (once per log interval: a NaN anywhere in the
window shows in the sum), and the weights, with one reduction, before every evaluation and checkpoint.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from spinn.ground.errors import SpinnError
from spinn.model.checkpoint import load_checkpoint
from spinn.training.folders import LAST_CHECKPOINT

LOWER = "lower the learning rate"


def check_loss(loss: float, step: int, output_dir: Path) -> None:
    """Stop when the summed training loss of the window ending at `step` is NaN or infinite."""
    if not math.isfinite(loss):
        raise SpinnError(f"training diverged by step {step}: the training loss is {loss}; {_kept(output_dir)}")


def check_weights(model: torch.nn.Module, step: int, output_dir: Path) -> None:
    """Stop when any weight is NaN or infinite: one device reduction and one host read."""
    finite = torch.stack([parameter.isfinite().all() for parameter in model.parameters()]).all()
    if not bool(finite):
        raise SpinnError(f"training diverged by step {step}: the model's weights are not finite; {_kept(output_dir)}")


def _kept(output_dir: Path) -> str:
    """What the run keeps to go back to: its last.pt (only finite weights are ever saved), or nothing."""
    last = Path(output_dir) / LAST_CHECKPOINT
    if not last.is_file():
        return f"it diverged before its first checkpoint, so none was kept; {LOWER}"
    return f"{last} keeps the last finite checkpoint (step {load_checkpoint(last).step}); {LOWER}"
