"""Which variant should ship? pi, spinn and rl trained on one budget, scored on parser trees and on their own.

Issue 21 item 3: the shipped default should label without a parser if that
costs little accuracy. This script trains `pi`, `spinn` and `rl` (300D, the same
steps and batch) on SNLI dev (9,842 labelled pairs), selects each on the first
half of SNLI test, and reports on the second half:

- pi on gold parses, pi on Stanza trees from raw text (`spinn label --parser stanza`),
- spinn on gold parses, spinn on its own trees from raw text (`--parser model`),
- rl on its own trees from raw text,

with accuracy and end-to-end labelling pairs/s (the label stage from raw text,
Stanza from a local model set, no parse cache). It runs the real stages (MLflow
store in a temporary folder) on the CPU, one torch thread per process.

    .venv/bin/python scripts/parser_free_quality.py --steps 150 --batch-size 64
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SNLI = SHARED / "data" / "snli"
STANZA_DIR = SHARED / "stanza" / "stanza_resources"
VARIANTS = ("pi", "spinn", "rl")
ROWS = (  # (variant, tree source): gold = the corpus's parses, stanza / model = labelled from raw text
    ("pi", "gold"),
    ("pi", "stanza"),
    ("spinn", "gold"),
    ("spinn", "model"),
    ("rl", "model"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="Training steps per model (the budget).")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--d-hidden", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=50, help="Steps between selections on test's first half.")
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="spinn-parser-free-") as folder:
        folder = Path(folder)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
        os.chdir(folder)
        prepared, raw = prepare(folder)
        checkpoints = {variant: train_variant(variant, prepared, folder, arguments) for variant in VARIANTS}
        results = [score(variant, trees, checkpoints[variant], prepared, raw, folder) for variant, trees in ROWS]
    budget = f"{arguments.steps} steps of {arguments.batch_size} pairs, {arguments.d_hidden}D, GloVe 6B 50d"
    print(json.dumps({"budget": budget, "results": results}))
    print_table(results, budget)


def prepare(folder: Path) -> tuple[Path, Path]:
    """SNLI dev as train; test cut in halves (select / report) as prepared Parquet, and the report half raw."""
    import pyarrow.parquet as pq

    from spinn.data.prepare import PrepareSettings, prepare
    from spinn.data.vocab import vocab_stage

    prepared = folder / "prepared"
    settings = PrepareSettings(workers=1)
    prepare(SNLI / "snli_1.0_dev.jsonl.gz", prepared, settings, split="train")
    prepare(SNLI / "snli_1.0_test.jsonl.gz", prepared, settings, split="test")
    vocab_stage(prepared / "train.parquet")
    test = pq.read_table(prepared / "test.parquet")
    half = test.num_rows // 2
    pq.write_table(test.slice(0, half), prepared / "select.parquet")
    pq.write_table(test.slice(half), prepared / "report.parquet")
    return prepared, write_raw(set(test.slice(half).column("pair_id").to_pylist()), folder / "report.jsonl")


def write_raw(pair_ids: set[str], path: Path) -> Path:
    """The report half as raw sentence pairs with gold labels: what a user would hand to `spinn label`."""
    with gzip.open(SNLI / "snli_1.0_test.jsonl.gz", "rt", encoding="utf-8") as lines, path.open("w") as out:
        for line in lines:
            row = json.loads(line)
            if row["pairID"] in pair_ids:
                pair = {"id": row["pairID"], "premise": row["sentence1"], "hypothesis": row["sentence2"]}
                out.write(json.dumps({**pair, "label": row["gold_label"]}) + "\n")
    return path


def train_variant(variant: str, prepared: Path, folder: Path, arguments) -> Path:
    from spinn.training.train import train
    from spinn.training.train_config import TrainConfig

    config = TrainConfig.build(
        {
            "model": {"variant": variant, "d_hidden": arguments.d_hidden},
            "batch_size": arguments.batch_size,
            "max_steps": arguments.steps,
            "eval_every": arguments.eval_every,
            "checkpoint_every": arguments.eval_every,
            "patience": arguments.steps,
            "device": "cpu",
            "threads": arguments.threads,
            "experiment": "parser-free-quality",
        }
    )
    started = time.perf_counter()
    result = train(
        prepared / "train.parquet",
        prepared / "select.parquet",
        config,
        output_dir=folder / variant,
        embeddings_dir=folder / "embeddings",
        register=False,
        progress=False,
        run_name=variant,
    )
    print(f"{variant}: trained {result.steps} steps in {time.perf_counter() - started:.0f} s", flush=True)
    return result.best_checkpoint


def score(variant: str, trees: str, checkpoint: Path, prepared: Path, raw: Path, folder: Path) -> dict:
    """Accuracy on the report half: on the corpus's parses (evaluate), or labelled from raw text (label)."""
    if trees == "gold":
        from spinn.evaluation.evaluate import EvaluateSettings, evaluate

        metrics = evaluate(
            checkpoint,
            prepared / "report.parquet",
            folder / f"{variant}-gold.json",
            EvaluateSettings(transitions="gold", track=False, device="cpu"),
        )
        return {"variant": variant, "trees": "gold parses", "accuracy": metrics.accuracy, "pairs_per_second": None}
    return label_raw(variant, trees, checkpoint, raw, folder)


def label_raw(variant: str, parser: str, checkpoint: Path, raw: Path, folder: Path) -> dict:
    import pyarrow.parquet as pq

    from spinn.labeling.label import label
    from spinn.labeling.label_settings import LabelSettings
    from spinn.parsing.parser_settings import ParserSettings

    parsing = ParserSettings(stanza_dir=STANZA_DIR, cache_path=None, device="cpu")
    output = folder / f"{variant}-{parser}.parquet"
    summary = label(raw, checkpoint, output, LabelSettings(parser=parser, device="cpu", parsing=parsing))
    rows = pq.read_table(output, columns=["label", "gold_label"]).to_pylist()
    scored = [row for row in rows if row["gold_label"] in ("entailment", "neutral", "contradiction")]
    accuracy = sum(row["label"] == row["gold_label"] for row in scored) / len(scored)
    trees = "Stanza trees, raw text" if parser == "stanza" else "own trees, raw text"
    return {"variant": variant, "trees": trees, "accuracy": accuracy, "pairs_per_second": summary.pairs_per_second}


def print_table(results: list[dict], budget: str) -> None:
    print(f"budget: {budget}; trained on SNLI dev, selected on test[:half], reported on test[half:]")
    print(f"| {'model':<6} | {'trees':<24} | {'accuracy':>8} | {'pairs/s':>8} |")
    print(f"|{'-' * 8}|{'-' * 26}|{'-' * 10}|{'-' * 10}|")
    for found in results:
        rate = f"{found['pairs_per_second']:,.0f}" if found["pairs_per_second"] else "-"
        print(f"| {found['variant']:<6} | {found['trees']:<24} | {found['accuracy']:>8.4f} | {rate:>8} |")


if __name__ == "__main__":
    main()
