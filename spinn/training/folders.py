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
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from spinn.io import file_digest
from spinn.training.config import TrainConfig

RUNS_DIR = Path("data/runs")
"""The default root of run folders (`spinn train` without --output-dir)."""
BOOKKEEPING = ("experiment", "registered_model", "alias", "threads")
"""Settings that name where a run is recorded or how many threads it may use, not what it trains."""
DIGEST_CHARS = 10


def run_folder(root: Path, config: TrainConfig, train: Path, dev: Path, vocab: Path | None = None) -> Path:
    """`root/<variant>-<train file>-<digest>`: the digest covers the settings that change the model and the
    input files' contents, so equal runs share a folder and different runs never do."""
    settings = {key: value for key, value in config.to_dict().items() if key not in BOOKKEEPING}
    files = {"train": train, "dev": dev, "vocab": vocab}
    inputs = {name: file_digest(path, "sha256") for name, path in files.items() if path is not None}
    key = json.dumps({"settings": settings, "inputs": inputs}, sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:DIGEST_CHARS]
    return Path(root) / f"{config.model.variant}-{Path(train).stem}-{digest}"
