"""How does training scale with ranks, and what does rank-0-only dev evaluation cost the others?

Trains the same model on the SNLI dev split (as training data, prepared as
scripts/large_batch_recipe.py does) at the same
global batch with 1 process and with N ranks under torchrun, and prints steps/s
for each, from the training stage's own pairs/s (evaluation excluded). Then
times one dev evaluation, which rank 0 runs alone while the other ranks wait at
a barrier, and prints its share of a training interval: sharding evaluation
across N ranks could save at most (N-1)/N of that share.

    .venv/bin/python scripts/ddp_scaling.py --steps 60 --ranks 2 --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from large_batch_recipe import prepare  # the same SNLI splits: dev to train on, test to score

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="Training steps per run.")
    parser.add_argument("--ranks", type=int, default=2, help="World size of the distributed run.")
    parser.add_argument("--batch-size", type=int, default=256, help="Global batch.")
    parser.add_argument("--variant", default="pi")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--eval-every", type=int, default=1000, help="The training interval between dev evaluations.")
    arguments = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="spinn-ddp-") as folder:
        folder = Path(folder)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
        os.chdir(folder)
        prepared = prepare(folder / "prepared")
        rows = []
        for processes, threads in ((1, 1), (1, arguments.ranks), (arguments.ranks, 1)):
            rows.append(train_run(prepared, folder, arguments, processes, threads))
            print(json.dumps(rows[-1]), flush=True)
        evaluation = time_evaluation(rows[0]["checkpoint"], prepared, arguments)
    print_report(rows, evaluation, arguments)


def train_run(prepared: Path, folder: Path, arguments, processes: int, threads: int) -> dict:
    from spinn.training.train import train
    from spinn.training.train_config import TrainConfig

    config = TrainConfig.build(
        {
            "model": {"variant": arguments.variant},
            "batch_size": arguments.batch_size,
            "max_steps": arguments.steps,
            "eval_every": arguments.steps + 1,  # no evaluation inside the timed steps
            "checkpoint_every": arguments.steps,
            "log_every": arguments.steps,
            "device": arguments.device,
            "threads": threads,
            "processes": processes,
            "experiment": "ddp-scaling",
        }
    )
    output = folder / f"p{processes}-t{threads}"
    result = train(
        prepared / "train.parquet",
        prepared / "dev.parquet",
        config,
        output_dir=output,
        embeddings_dir=folder / "embeddings",
        register=False,
        progress=False,
    )
    return {
        "processes": processes,
        "threads_per_process": threads,
        "steps": result.steps,
        "steps_per_second": result.pairs_per_second / arguments.batch_size,
        "pairs_per_second": result.pairs_per_second,
        "checkpoint": str(result.best_checkpoint),
    }


def time_evaluation(checkpoint: str, prepared: Path, arguments) -> dict:
    """One dev evaluation as rank 0 runs it (one process), timed on the 9,824 SNLI test pairs: a dev split
    of full SNLI's size."""
    from spinn.evaluation.evaluate import EvaluateSettings, evaluate

    start = time.perf_counter()
    scored = evaluate(
        checkpoint, prepared / "test.parquet", prepared / "test-score.json", EvaluateSettings(track=False)
    )
    return {"dev_pairs": scored.examples, "seconds": time.perf_counter() - start}


def print_report(rows: list[dict], evaluation: dict, arguments) -> None:
    print(f"{'processes':>9} {'threads each':>12} {'steps/s':>8} {'pairs/s':>8}")
    for row in rows:
        print(
            f"{row['processes']:>9} {row['threads_per_process']:>12} "
            f"{row['steps_per_second']:>8.2f} {row['pairs_per_second']:>8.0f}"
        )
    distributed = rows[-1]["steps_per_second"]
    interval = arguments.eval_every / distributed
    share = evaluation["seconds"] / (interval + evaluation["seconds"])
    print(
        f"dev evaluation on rank 0: {evaluation['dev_pairs']} pairs in {evaluation['seconds']:.1f} s; "
        f"{arguments.eval_every} steps take {interval:.0f} s at {arguments.ranks} ranks, so the others wait "
        f"{share:.1%} of the time; sharding it would save at most {share * (arguments.ranks - 1) / arguments.ranks:.1%}"
    )


if __name__ == "__main__":
    main()
