"""`rl` end to end without parse data: tokens-only pairs -> training -> induced trees -> labelling."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from spinn.cli import main
from spinn.data.schema import read_pairs
from spinn.trees.transitions import parse_binary
from tests.helpers import TINY_MODEL_SETTINGS, set_options, smoke_pairs, write_rows

pytestmark = pytest.mark.e2e

TINY_RL = set_options((*TINY_MODEL_SETTINGS, "max_steps=12", "eval_every=6", "log_every=3", "threads=1"))


def run(arguments: list[str]) -> str:
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def tokens_only(smoke_model, tmp_path, mlflow_store):
    """Train and dev splits of raw smoke pairs, stored as tokens with no trees (`spinn parse --trees none`)."""
    rows = smoke_pairs(smoke_model, 120)
    for split, part in (("train", rows[:100]), ("dev", rows[100:])):
        source = write_rows(tmp_path / f"{split}.csv", part)
        run(["parse", str(source), "--trees", "none", "--split", split, "--output", str(tmp_path / "prepared")])
    run(["vocab", str(tmp_path / "prepared" / "train.parquet")])
    return tmp_path


def test_rl_trains_on_tokens_only_and_labels_with_its_own_trees(tokens_only):
    table = read_pairs(tokens_only / "prepared" / "train.parquet").to_pylist()
    assert all(row["premise_transitions"] == [] for row in table)
    prepared = tokens_only / "prepared"
    output = run(
        [
            "train",
            "--variant",
            "rl",
            "--train",
            str(prepared / "train.parquet"),
            "--dev",
            str(prepared / "dev.parquet"),
            "--device",
            "cpu",
            "--no-register",
            "--output-dir",
            "data/models",
            *TINY_RL,
        ]
    )
    assert "best dev accuracy" in output

    sentences = tokens_only / "sentences.txt"
    sentences.write_text("A man is playing a guitar .\nTwo dogs run .\n", encoding="utf-8")
    run(
        [
            "trees",
            "--model",
            "data/models/best.pt",
            "--input",
            str(sentences),
            "--output",
            "trees.txt",
            "--html",
            "trees.html",
        ]
    )
    assert (tokens_only / "trees.html").read_text(encoding="utf-8").count("<svg") == 2
    trees = (tokens_only / "trees.txt").read_text().splitlines()
    assert [parse_binary(tree).leaves() for tree in trees] == [
        line.split() for line in sentences.read_text().splitlines()
    ]

    run(["trees", str(tokens_only / "dev.csv"), "--model", "data/models/best.pt", "--output", "pair_trees.jsonl"])
    dev_rows = pq.read_table(tokens_only / "prepared" / "dev.parquet").to_pylist()
    records = [json.loads(line) for line in (tokens_only / "pair_trees.jsonl").read_text().splitlines()]
    assert [record["pair_id"] for record in records] == [row["pair_id"] for row in dev_rows], "every pair, by its id"
    drawn = [
        tuple(parse_binary(record[side]).leaves()) for record in records for side in ("premise_tree", "hypothesis_tree")
    ]
    assert drawn == [tuple(row[side]) for row in dev_rows for side in ("premise_tokens", "hypothesis_tokens")]

    run(
        [
            "label",
            str(tokens_only / "dev.csv"),
            "--model",
            "data/models/best.pt",
            "--output",
            "labels.parquet",
            "--device",
            "cpu",
        ]
    )
    rows = pq.read_table(tokens_only / "labels.parquet").to_pylist()
    assert len(rows) == 20 and {row["parser"] for row in rows} == {"model"}


def test_a_model_that_needs_trees_refuses_tokens_only_data(tokens_only):
    prepared = tokens_only / "prepared"
    result = CliRunner().invoke(
        main,
        [
            "train",
            "--variant",
            "pi",
            "--train",
            str(prepared / "train.parquet"),
            "--dev",
            str(prepared / "dev.parquet"),
            "--device",
            "cpu",
            "--no-register",
            *TINY_RL,
        ],
    )
    assert result.exit_code == 1 and "have no tree" in result.output
