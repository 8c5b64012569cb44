"""A trained model back in memory: from a checkpoint file or an MLflow model URI, on the chosen device.

Evaluation, labelling, `spinn trees`, the served model and the benchmark all
start here. The checkpoint is read with weights_only and the model rebuilt
from its own config and vocabulary, so loading never runs code from the
file; weights that are not finite are refused here, once, for all of them.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from spinn.data.vocab import Vocabulary
from spinn.ground.errors import SpinnError, misfit_weights
from spinn.model.checkpoint import Checkpoint, load_checkpoint
from spinn.model.config import SPINNConfig
from spinn.model.spinn import SPINN


@dataclass(frozen=True)
class LoadedModel:
    model: SPINN
    vocabulary: Vocabulary
    checkpoint: Path
    saved: Checkpoint  # what the file holds beside the weights: configs, training state, scores


def resolve_device(device: str) -> torch.device:
    """`auto` is the GPU when there is one; `cuda` without one is a user error, not a crash."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpinnError("device cuda: this torch build sees no CUDA device")
    return torch.device(device)


def check_finite(weights: dict[str, torch.Tensor], path: Path) -> None:
    """Refuse weights that are not finite, naming the first such tensor: one infinite weight scores a third
    of any split and one NaN word vector all of it, and both label, draw and serve whatever comes out."""
    for name, tensor in weights.items():
        if tensor.is_floating_point():
            bad = int((~tensor.isfinite()).sum())
            if bad:
                raise SpinnError(
                    f"{path}: weights are not finite ({name} holds {bad} NaN or infinite "
                    f"value{'' if bad == 1 else 's'}); retrain, or use an earlier checkpoint of the run"
                )


def load_model(reference: str | Path, device: torch.device, workdir: Path | None = None) -> LoadedModel:
    """Rebuild a model from a checkpoint path or an MLflow model URI."""
    from spinn.tracking.logged_models import download_checkpoint
    from spinn.tracking.store import is_model_uri

    if is_model_uri(str(reference)):
        checkpoint = download_checkpoint(str(reference), Path(workdir or tempfile.mkdtemp(prefix="spinn-model-")))
    else:
        checkpoint = Path(reference)
    saved = load_checkpoint(checkpoint)
    check_finite(saved.model_state, checkpoint)
    config = SPINNConfig.from_dict(saved.model_config)
    vocabulary = Vocabulary.from_json(saved.vocab, str(checkpoint))
    model = SPINN(config, torch.zeros(len(vocabulary), config.d_embed))
    try:
        model.load_state_dict(saved.model_state)
    except RuntimeError:
        raise misfit_weights(checkpoint, model.state_dict(), saved.model_state) from None
    return LoadedModel(model.to(device).eval(), vocabulary, checkpoint, saved)
