"""Issue 17's acceptance check: `spinn label` of the base commit against this checkout's, side by side.

Writes the first N real SNLI test pairs as raw text (CSV: pairID, sentence1,
sentence2, gold_label), extracts the base commit's code with `git archive`,
then runs `spinn label` (Stanza trees, no parse cache, CPU) alternately with
the old code and the new, `--rounds` times each, so both meet the same load
from whatever else shares the machine. Every run is timed end to end (the
whole command: start-up, model and parser loading, parsing, labelling). It
then checks that every run gave the same label and the same trees on every
row, and prints each run, the medians and the speed-up, and one JSON line.

    .venv/bin/python scripts/label_speed_compare.py --pairs 1000 --rounds 3 --new-args "--workers 1"

The model defaults to tests/fixtures/release-0.1.0/checkpoint.pt, a
checkpoint written by release 0.1.0, so the run also shows that old
checkpoints still load.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SNLI_TEST = SHARED / "data" / "snli" / "snli_1.0_test.jsonl.gz"
STANZA_DIR = SHARED / "stanza" / "stanza_resources"
MODEL = ROOT / "tests" / "fixtures" / "release-0.1.0" / "checkpoint.pt"
BASE = "8f30e33"


def write_pairs(path: Path, count: int) -> Path:
    with gzip.open(SNLI_TEST, "rt", encoding="utf-8") as lines, path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["pairID", "sentence1", "sentence2", "gold_label"])
        for _, line in zip(range(count), lines, strict=False):
            record = json.loads(line)
            writer.writerow([record["pairID"], record["sentence1"], record["sentence2"], record["gold_label"]])
    return path


def extract(commit: str, folder: Path) -> Path:
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def run(code: Path, source: Path, output: Path, model: Path, extra: list[str]) -> dict:
    """One `spinn label` run from `code` (first on the path); wall seconds of the whole command."""
    command = [sys.executable, "-m", "spinn.cli", "label", str(source), "--model", str(model)]
    command += ["--output", str(output), "--stanza-dir", str(STANZA_DIR), "--no-parse-cache"]
    command += ["--device", "cpu", "--parser", "stanza", *extra]
    env = {**os.environ, "PYTHONPATH": str(code)}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=code, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    return {"seconds": seconds, "report": done.stdout.strip().splitlines(), "output": output}


def rows(path: Path) -> list[tuple]:
    import pyarrow.parquet as pq

    columns = ["pair_id", "label", "premise_tree", "hypothesis_tree"]
    return [tuple(row[name] for name in columns) for row in pq.read_table(path, columns=columns).to_pylist()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base", default=BASE, help="the commit to compare with")
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--new-args", default="", help="extra `spinn label` options for the new code")
    args = parser.parse_args()
    extra = shlex.split(args.new_args)
    with tempfile.TemporaryDirectory(prefix="label-compare-") as scratch:
        folder = Path(scratch)
        source = write_pairs(folder / "snli_test.csv", args.pairs)
        codes = {"old": extract(args.base, folder / "old"), "new": ROOT}
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for round_ in range(args.rounds):
            for name, code in codes.items():
                options = extra if name == "new" else []
                result = run(code, source, folder / f"{name}-{round_}.parquet", args.model, options)
                runs[name].append(result)
                print(f"{name} round {round_ + 1}: {result['seconds']:.1f} s  ({result['report'][1]})", flush=True)
        reference = rows(runs["old"][0]["output"])
        same = all(rows(result["output"]) == reference for results in runs.values() for result in results)
        medians = {name: statistics.median(result["seconds"] for result in results) for name, results in runs.items()}
        rates = {name: f"{seconds:.1f} s ({args.pairs / seconds:.0f} pairs/s)" for name, seconds in medians.items()}
        print(
            f"{args.pairs} pairs, median end to end: old {rates['old']}, new {rates['new']}: "
            f"{medians['old'] / medians['new']:.2f}x; same labels and trees on every row: {same}"
        )
        summary = {
            "pairs": args.pairs,
            "base": args.base,
            "new_args": extra,
            "old_seconds": [result["seconds"] for result in runs["old"]],
            "new_seconds": [result["seconds"] for result in runs["new"]],
            "speedup": medians["old"] / medians["new"],
            "same_labels_and_trees": same,
            "load_average": os.getloadavg(),
            "cpus": os.cpu_count(),
        }
        print(json.dumps(summary))
        if not same:
            raise SystemExit("the labels or trees differ")


if __name__ == "__main__":
    main()
