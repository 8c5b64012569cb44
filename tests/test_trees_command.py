"""`spinn trees`: every tree joins back to the sentence it came from, by line or by the row's pair id.

The model is the session's small spinn model trained on the smoke corpus; the
inputs are that corpus's test pairs, with a hand-made bad row in the middle
that both `spinn label` and `spinn trees` leave out, so a row that shifted
would show.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main
from spinn.labeling.induced_trees import TreesSettings, induce_trees
from spinn.labeling.label import label
from spinn.labeling.label_settings import LabelSettings
from spinn.trees.tokenize import tokenize
from spinn.trees.transitions import parse_binary
from tests.helpers import smoke_pairs, write_rows

PAIRS = 9
BAD_ROW = 4
"""Where the row with an empty premise goes: rows after it keep their own row numbers and ids."""
CPU = TreesSettings(device="cpu")


def rows_with_a_bad_one(smoke_model, id_column: str | None) -> list[dict]:
    rows = smoke_pairs(smoke_model, PAIRS)
    rows.insert(BAD_ROW, {**rows[0], "id": "empty-premise", "premise": ""})
    for row in rows:
        identity = row.pop("id")
        if id_column is not None:
            row[id_column] = identity
    return rows


@pytest.mark.parametrize(
    ("name", "id_column"), [("pairs.csv", "pairID"), ("pairs.jsonl", None)], ids=["csv-ids", "jsonl-row-numbers"]
)
def test_every_tree_joins_back_to_its_row_by_the_pair_id_label_gives(name, id_column, smoke_model, tmp_path):
    rows = rows_with_a_bad_one(smoke_model, id_column)
    source = write_rows(tmp_path / name, rows)
    label(source, smoke_model.checkpoint, tmp_path / "labels.parquet", LabelSettings(parser="model", device="cpu"))
    written = induce_trees(smoke_model.checkpoint, source, tmp_path / "trees.jsonl", CPU)

    records = [json.loads(line) for line in (tmp_path / "trees.jsonl").read_text(encoding="utf-8").splitlines()]
    labelled = pq.read_table(tmp_path / "labels.parquet").to_pylist()
    keys = ("pair_id", "row", "premise_tree", "hypothesis_tree")
    assert [tuple(record[key] for key in keys) for record in records] == [
        tuple(row[key] for key in keys) for row in labelled
    ]
    assert len(records) == PAIRS and written == 2 * PAIRS
    for record in records:
        row = rows[record["row"] - 1]  # the reader's 1-based data row
        assert record["pair_id"] == (row[id_column] if id_column else str(record["row"]))
        assert parse_binary(record["premise_tree"]).leaves() == tokenize(row["premise"])
        assert parse_binary(record["hypothesis_tree"]).leaves() == tokenize(row["hypothesis"])


def test_a_text_file_keeps_its_lines_blank_ones_included(smoke_model, tmp_path):
    lines = [row["premise"] for row in smoke_pairs(smoke_model, 3)]
    lines.insert(1, "")
    source = tmp_path / "sentences.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert induce_trees(smoke_model.checkpoint, source, tmp_path / "trees.txt", CPU) == len(lines) - 1
    trees = (tmp_path / "trees.txt").read_text(encoding="utf-8").splitlines()
    assert len(trees) == len(lines) and trees[1] == ""
    assert [parse_binary(tree).leaves() for tree in trees if tree] == [tokenize(line) for line in lines if line]


def test_the_trees_of_a_pairs_file_go_to_json_lines(smoke_model, tmp_path):
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 2))
    output = tmp_path / "trees.txt"
    arguments = ["trees", str(source), "--model", str(smoke_model.checkpoint), "--output", str(output)]
    result = CliRunner().invoke(main, arguments)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == EXIT_USER_ERROR, result.output
    assert len(lines) == 1 and lines[0].startswith(f"error: {output}: ") and ".jsonl" in lines[0]
    assert not output.exists()
