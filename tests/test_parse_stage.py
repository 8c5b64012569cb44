"""`spinn parse`: raw sentence pairs -> prepared Parquet that the rest of the pipeline reads like `spinn prepare`'s."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from spinn.cli import main
from spinn.data.pairs import read_raw_pairs
from spinn.data.schema import read_pairs
from spinn.trees.transitions import check_transitions
from tests.helpers import smoke_pairs, stanza_dir, write_rows

pytestmark = pytest.mark.stanza


def test_parse_writes_prepared_pairs_and_rejects_that_evaluate_reads(smoke_model, tmp_path, monkeypatch):
    rows = smoke_pairs(smoke_model, 20)
    rows.insert(3, {"id": "blank", "premise": "A dog runs .", "hypothesis": " ", "label": "neutral"})
    source = write_rows(tmp_path / "pairs.csv", rows)
    result = CliRunner().invoke(
        main,
        [
            "parse",
            str(source),
            "--output-dir",
            str(tmp_path / "prepared"),
            "--split",
            "new",
            "--stanza-dir",
            str(stanza_dir()),
            "--parser-device",
            "cpu",
            "--parse-cache",
            str(tmp_path / "parses.sqlite"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "read 21  written 20" in result.output and "rejected empty_sentence: 1" in result.output

    table = read_pairs(tmp_path / "prepared" / "new.parquet").to_pylist()
    assert [row["pair_id"] for row in table] == [row["id"] for row in rows if row["id"] != "blank"]
    for row in table:
        check_transitions(row["premise_transitions"], len(row["premise_tokens"]))
    reject = json.loads((tmp_path / "prepared" / "new.rejects.jsonl").read_text())
    where = (reject["line"], reject["pair_id"], reject["field"], reject["reason"])
    assert where == (5, "blank", "hypothesis", "empty_sentence")
    assert len(read_raw_pairs(tmp_path / "prepared" / "new.parquet")) == 20

    monkeypatch.chdir(tmp_path)
    scored = CliRunner().invoke(
        main,
        [
            "evaluate",
            "--model",
            str(smoke_model.checkpoint),
            "--data",
            str(tmp_path / "prepared" / "new.parquet"),
            "--no-track",
            "--device",
            "cpu",
        ],
    )
    assert scored.exit_code == 0, scored.output
    assert json.loads((tmp_path / "metrics.json").read_text())["examples"] == 20
