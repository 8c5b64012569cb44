"""Does the large-batch recipe keep the paper's accuracy? Train both on the same data, same epochs, and compare.

The paper trains at batch 32; a GPU is busy only at batch 256 and more. The
large-batch recipe scales the learning rate (square-root or linear rule from
32) and its decay interval, with a linear warmup. This script trains each
recipe on the SNLI dev split (9,842 labelled pairs), selects each model on the
first 1,024 SNLI training pairs, evaluates it on SNLI test, and prints one
line per recipe and a JSON summary. It runs the real training stage (MLflow
store in a temporary folder), on whatever device `--device` names.

    .venv/bin/python scripts/large_batch_recipe.py --epochs 8 --device auto
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "snli"
RECIPES = {
    "paper, batch 32": {"batch_size": 32, "lr_scaling": "none", "warmup_pairs": 0},
    "batch 256, sqrt-scaled rate, 1 epoch warmup": {"batch_size": 256, "lr_scaling": "sqrt", "warmup_pairs": 9842},
    "batch 256, linear-scaled rate, 1 epoch warmup": {"batch_size": 256, "lr_scaling": "linear", "warmup_pairs": 9842},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--variant", default="pi")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--only", action="append", help="Run only the recipes whose name contains this.")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Any train setting for every recipe, e.g. model.d_hidden=100.",
    )
    arguments = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    results = {}
    with tempfile.TemporaryDirectory(prefix="spinn-recipe-") as folder:
        folder = Path(folder)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
        os.chdir(folder)
        prepared = prepare(folder / "prepared")
        for name, recipe in RECIPES.items():
            if arguments.only and not any(part in name for part in arguments.only):
                continue
            results[name] = run(name, recipe, prepared, folder, arguments)
            print(json.dumps({"recipe": name, **results[name]}), flush=True)
    print_table(results)


def prepare(folder: Path) -> Path:
    from spinn.data.prepare import PrepareSettings, prepare
    from spinn.data.vocab import vocab_stage

    settings = PrepareSettings(workers=1)
    prepare(SHARED / "snli_1.0_dev.jsonl.gz", folder, settings, split="train")
    prepare(SHARED / "snli_1.0_train_first1024.jsonl.gz", folder, settings, split="dev")
    prepare(SHARED / "snli_1.0_test.jsonl.gz", folder, settings, split="test")
    vocab_stage(folder / "train.parquet")
    return folder


def run(name: str, recipe: dict, prepared: Path, folder: Path, arguments) -> dict:
    from spinn.evaluation.evaluate import EvaluateSettings, evaluate
    from spinn.ground.settings import overrides_from
    from spinn.training.train import train
    from spinn.training.train_config import TrainConfig

    steps_per_epoch = -(-9842 // recipe["batch_size"])
    config = TrainConfig.build(
        {
            "model": {"variant": arguments.variant},
            **recipe,
            "max_epochs": arguments.epochs,
            "eval_every": steps_per_epoch,
            "checkpoint_every": steps_per_epoch,
            "patience": arguments.epochs,
            "device": arguments.device,
            "threads": arguments.threads,
            "experiment": "large-batch-recipe",
        },
        overrides_from(arguments.overrides),
    )
    output = folder / name.replace(" ", "_").replace(",", "")
    start = time.perf_counter()
    result = train(
        prepared / "train.parquet",
        prepared / "dev.parquet",
        config,
        output_dir=output,
        embeddings_dir=folder / "embeddings",
        register=False,
        progress=False,
        run_name=name,
    )
    seconds = time.perf_counter() - start
    scored = evaluate(
        result.best_checkpoint, prepared / "test.parquet", output / "test.json", EvaluateSettings(track=False)
    )
    return {
        "test_accuracy": scored.accuracy,
        "selection_accuracy": result.best_dev_accuracy,
        "best_step": result.best_step,
        "steps": result.steps,
        "train_pairs_per_second": result.pairs_per_second,
        "seconds": seconds,
        **recipe,
    }


def print_table(results: dict[str, dict]) -> None:
    print(f"{'recipe':<48} {'test acc':>9} {'select acc':>10} {'steps':>6} {'pairs/s':>8}")
    for name, found in results.items():
        print(
            f"{name:<48} {found['test_accuracy']:>9.4f} {found['selection_accuracy']:>10.4f} "
            f"{found['steps']:>6} {found['train_pairs_per_second']:>8.0f}"
        )


if __name__ == "__main__":
    main()
