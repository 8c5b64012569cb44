"""`processes` > 1 outside torchrun: start torchrun on this node, and read back what its rank 0 trained.

The config travels as a params file of its own, so every rank builds exactly
this config; rank 0 leaves its TrainResult in the output folder (RESULT_NAME)
for the process that launched the job.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path

import yaml

from spinn.data.embeddings import DEFAULT_CACHE_DIR
from spinn.ground.io import atomic_path
from spinn.training import distributed
from spinn.training.state import TrainResult
from spinn.training.train_config import TrainConfig

RESULT_NAME = "result.json"
"""What rank 0 leaves for the process that launched a distributed run: the TrainResult."""


def write_result(result: TrainResult, output_dir: Path) -> None:
    with atomic_path(output_dir / RESULT_NAME) as temporary:
        temporary.write_text(json.dumps(asdict(result), default=str, indent=2), encoding="utf-8")


def read_result(output_dir: Path) -> TrainResult:
    data = json.loads((Path(output_dir) / RESULT_NAME).read_text(encoding="utf-8"))
    for name in ("best_checkpoint", "last_checkpoint"):
        data[name] = Path(data[name])
    return TrainResult(**data)


def train_distributed(
    train_path: Path,
    dev_path: Path,
    config: TrainConfig,
    output_dir: Path,
    *,
    vocab_path: Path | None = None,
    embeddings_dir: Path = DEFAULT_CACHE_DIR,
    resume: bool = False,
    overwrite: bool = False,
    run_name: str | None = None,
    register: bool = True,
    progress: bool = True,
    report_every_s: float | None = None,
) -> TrainResult:
    """Run `spinn train` under torchrun with `config.processes` ranks on this node, and read rank 0's result."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spinn-distributed-") as folder:
        params = Path(folder) / "params.yaml"
        settings = config.to_dict()
        embeddings = settings.pop("embeddings")
        params.write_text(yaml.safe_dump({"train": settings, "embeddings": embeddings}), encoding="utf-8")
        arguments = [
            "--config",
            str(params),
            "--train",
            str(train_path),
            "--dev",
            str(dev_path),
            "--output-dir",
            str(output_dir),
            "--embeddings-dir",
            str(embeddings_dir),
        ]
        arguments += ["--vocab", str(vocab_path)] if vocab_path is not None else []
        arguments += ["--resume"] if resume else []
        arguments += ["--overwrite"] if overwrite else []
        arguments += ["--run-name", run_name] if run_name else []
        arguments += [] if register else ["--no-register"]
        arguments += [] if progress else ["--no-progress"]
        arguments += ["--report-every", str(report_every_s)] if report_every_s is not None else []
        (output_dir / RESULT_NAME).unlink(missing_ok=True)
        distributed.launch(config.processes, arguments)
    return read_result(output_dir)
