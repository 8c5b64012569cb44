"""A training run's checkpoints: `save_run` writes one, `resume_run` puts last.pt back into a run.

Everything needed to continue lives in `last.pt` (written atomically every
`checkpoint_every` steps): weights, optimizer, position in the epoch,
early-stopping state, every rank's RNG states and the MLflow run id. A
resumed run therefore ends with the same weights as one never interrupted.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from spinn.evaluation.metrics import Metrics
from spinn.ground.errors import SpinnError
from spinn.model.checkpoint import (
    Checkpoint,
    check_vocabulary,
    load_checkpoint,
    restore_rng_states,
    rng_states,
    save_checkpoint,
)
from spinn.training.build import TrainingRun
from spinn.training.distributed import Topology
from spinn.training.folders import LAST_CHECKPOINT
from spinn.training.state import TrainState, budget_spent
from spinn.training.train_config import TrainConfig


def save_run(
    run: TrainingRun, state: TrainState, path: Path, metrics: Metrics | None = None, temperature: float | None = None
) -> None:
    """Write the run as it stands to `path` (last.pt, or best.pt with the dev `metrics` that made it best and
    the softmax `temperature` fitted on them)."""
    save_checkpoint(
        path,
        Checkpoint(
            model_state=run.model.state_dict(),
            optimizer_state=run.optimizer.state_dict(),
            model_config=run.model.config.to_dict(),
            train_config=run.config.to_dict(),
            vocab=run.vocabulary.to_json(),
            step=state.step,
            state=asdict(state),
            rng=rng_states(),
            rng_ranks=run.rng_ranks or [rng_states()],
            data=run.data_hashes,
            metrics=None if metrics is None else metrics.to_json(),
            temperature=temperature,
        ),
    )


def resume_run(run: TrainingRun) -> TrainState:
    """Load last.pt into the run, refusing one made with another vocabulary or other learning settings.

    A run that stopped at its step or epoch budget goes on when the new budget
    is larger; an early-stopped run stays stopped.
    """
    path = run.output_dir / LAST_CHECKPOINT
    saved = load_checkpoint(path)  # on the CPU: load_state_dict moves what it needs; RNG states must stay
    check_vocabulary(saved, run.vocabulary.tokens, path, "this run's vocabulary")
    if saved.train_config is None or saved.state is None or saved.optimizer_state is None:
        raise SpinnError(f"{path}: holds a model only, no training state to resume from")
    _check_same_learning(TrainConfig.from_dict(saved.train_config), run.config, path)
    run.model.load_state_dict(saved.model_state)
    run.optimizer.load_state_dict(saved.optimizer_state)
    restore_rng_states(_own_rng(saved, run.topology, path))
    state = TrainState(**saved.state)
    state.finished = state.early_stopped or budget_spent(run.config, state)
    return state


def _check_same_learning(before: TrainConfig, now: TrainConfig, path: Path) -> None:
    """Refuse a resume that would change what the run learns (its identity: TrainConfig.identity)."""
    saved, current = before.identity(), now.identity()
    changed = sorted(key for key in current if saved.get(key) != current[key])
    if changed:
        raise SpinnError(
            f"{path}: was trained with other settings ({', '.join(changed)}); "
            "resume with the same config or start a new output folder"
        )


def _own_rng(saved: Checkpoint, topology: Topology, path: Path) -> dict:
    """This rank's RNG states from a checkpoint: exact at the world size that wrote it. At another world
    size the batches are shared differently anyway: every rank takes rank 0's states, and the log says
    the resumed run will not repeat the uninterrupted one bit for bit."""
    ranks = saved.rng_by_rank()
    if len(ranks) == topology.world:
        return ranks[topology.rank]
    if topology.is_main:
        tqdm.write(
            f"{path}: written by {len(ranks)} process(es), resumed on {topology.world}: training goes on "
            "from the same weights and position, but not bit for bit as the uninterrupted run would"
        )
    return ranks[0]
