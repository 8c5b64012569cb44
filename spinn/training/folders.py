"""Where a training run's files live: one folder per distinct run, so no run overwrites another's model.

A run is what its inputs make it: the training settings and the bytes of its
train, dev and vocabulary files. Training is deterministic given those, so
the folder is named by their digest: a different run (another variant,
another learning rate, another corpus) gets a folder of its own and never
replaces the files an earlier run, its Prefect artifact or its MLflow run
point at; the same run again finds its own folder, which is what `--resume`
continues and what a cached pipeline stage still finds. The registry
(`models:/spinn@champion`) stays the stable name for "the model to use";
DVC's stages keep their declared `--output-dir`.

An output folder holds one run. A run holds the folder's lock while it works
(a second run there is refused, naming it) and records its MLflow run id in
it; the lock lives beside the folder (spinn.ground.io.lock_output_folder), since DVC
deletes the folder itself before it reruns the stage. A new run refuses a
folder that holds an earlier run's checkpoints unless told to `resume` or
`overwrite` it, and marks the previous holder's MLflow run KILLED when that
one died still RUNNING (before its first checkpoint, say), since nothing else
ever would.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from spinn.data.vocab import VOCAB_FILENAME
from spinn.ground.errors import SpinnError
from spinn.ground.io import FolderLock, file_digest, tidy_folder
from spinn.model.checkpoint import load_checkpoint
from spinn.training.train_config import TrainConfig

RUNS_DIR = Path("data/runs")
"""The default root of run folders (`spinn train` without --output-dir)."""
DIGEST_CHARS = 10
LAST_CHECKPOINT = "last.pt"
BEST_CHECKPOINT = "best.pt"
REPORT_NAME = "report.json"
RUN_FILES = (LAST_CHECKPOINT, BEST_CHECKPOINT, REPORT_NAME)
"""What a run leaves in its output folder; `overwrite` removes them before a new run starts."""
MLFLOW_RUN_FACT = "mlflow_run_id"
"""The fact a run records in its folder's lock, so the next run there can close it if it died."""
OUTPUT_DIR_TAG = "spinn.output_dir"
"""The MLflow run's tag naming the folder it trains in (resolved): a resume elsewhere never reopens it."""


def run_folder(root: Path, config: TrainConfig, train: Path, dev: Path, vocab: Path | None = None) -> Path:
    """`root/<variant>-<train file>-<digest>`: the digest covers the run's identity (the settings that change
    the model, TrainConfig.identity) and the input files' contents, so equal runs share a folder, different
    runs never do, and a run resumed with a larger budget finds the folder it started in. The vocabulary is
    `vocab`, else vocab.json beside the train split, where training reads it (when there is none, training
    stops at its "no vocabulary" error)."""
    settings = config.identity()
    vocab = Path(vocab) if vocab is not None else Path(train).parent / VOCAB_FILENAME
    files = {"train": train, "dev": dev, **({"vocab": vocab} if vocab.exists() else {})}
    inputs = {name: file_digest(path, "sha256") for name, path in files.items()}
    key = json.dumps({"settings": settings, "inputs": inputs}, sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:DIGEST_CHARS]
    return Path(root) / f"{config.model.variant}-{Path(train).stem}-{digest}"


def check_resumable(output_dir: Path) -> None:
    """`resume` where there is nothing to resume is a mistake (a changed setting moved the run to another
    folder, or a typo in the folder): say so rather than start a new run."""
    if not (Path(output_dir) / LAST_CHECKPOINT).exists():
        raise SpinnError(
            f"{output_dir}: no {LAST_CHECKPOINT} to resume from",
            fix=("resume", "drop {} to start a new run, or name the folder that holds the run"),
        )


def holds_finished_run(output_dir: Path, config: TrainConfig) -> bool:
    """The folder holds a run that finished with these very settings: running them again is that run, so it
    is reused (resumed, with nothing left to train) instead of refused, whatever cache pointed here or not."""
    last = Path(output_dir) / LAST_CHECKPOINT
    if not last.exists():
        return False
    saved = load_checkpoint(last)
    if saved.train_config is None or not (saved.state or {}).get("finished"):
        return False
    return config.same_run_as(TrainConfig.from_dict(saved.train_config))


def check_folder(output_dir: Path, told: bool, tracking) -> None:
    """Before any work: tidy what killed runs left, refuse an earlier run's folder unless `told` (to resume
    or overwrite it), and refuse an MLflow store we could not write to."""
    tidy_folder(output_dir)
    found = [name for name in (LAST_CHECKPOINT, BEST_CHECKPOINT) if (output_dir / name).exists()]
    if found and not told:  # a new run would replace them, however much better the earlier run was
        raise SpinnError(
            f"{output_dir}: holds {', '.join(found)} of an earlier run",
            fix=(("resume", "overwrite"), "continue it with {}, replace it with {}, or choose another output folder"),
        )
    tracking.check_writable()


def clear_run_files(output_dir: Path) -> None:
    """Remove an earlier run's files before a run that overwrites it starts."""
    for name in RUN_FILES:
        (output_dir / name).unlink(missing_ok=True)


def close_abandoned_run(lock: FolderLock, resuming: str | None, tracking) -> None:
    """Mark the folder's previous MLflow run KILLED if it is still RUNNING: we hold the folder's lock, so
    its process is gone. A run being resumed is left to go on."""
    previous = lock.previous.get(MLFLOW_RUN_FACT)
    if previous is not None and previous != resuming:
        tracking.end_abandoned_run(previous)


def folder_tags(output_dir: Path) -> dict[str, str]:
    """What a new run records about its folder, for `check_run_of_folder`."""
    return {OUTPUT_DIR_TAG: str(Path(output_dir).resolve())}


def check_run_of_folder(run_id: str, output_dir: Path, tracking) -> None:
    """Before a resume reopens `run_id` (named by the folder's last.pt): the store must hold the run, and
    the run must have been trained in this folder. A last.pt copied or linked from another folder would
    otherwise reopen that folder's run, finished or not, and write this run's steps and failure into it."""
    last = Path(output_dir) / LAST_CHECKPOINT
    tags = tracking.run_tags(run_id)
    if tags is None:
        raise SpinnError(
            f"{last}: its MLflow run {run_id} is not in {tracking.tracking_uri()}",
            fix=("overwrite", "resume with the store it was trained with (MLFLOW_TRACKING_URI), or start anew with {}"),
        )
    trained_in = tags.get(OUTPUT_DIR_TAG)
    if trained_in is not None and trained_in != str(Path(output_dir).resolve()):
        raise SpinnError(
            f"{last}: its MLflow run {run_id} was trained in {trained_in}, not in {output_dir} (a copied or linked "
            "checkpoint)",
            fix=("overwrite", "resume it in its own folder, or start a new run here with {}"),
        )
