"""`spinn label` fails, as prepare does, when it labelled no row; the rejects file says why."""

from __future__ import annotations

import json

from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main
from tests.helpers import smoke_pairs, write_rows


def test_label_fails_in_one_line_when_every_row_is_rejected(smoke_model, tmp_path):
    rows = [{**row, "premise": ""} for row in smoke_pairs(smoke_model, 3)]
    source = write_rows(tmp_path / "pairs.csv", rows)
    output = tmp_path / "labels.parquet"
    arguments = ["label", str(source), "--model", str(smoke_model.checkpoint), "--output", str(output)]
    result = CliRunner().invoke(main, [*arguments, "--parser", "model"])
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no row labelled: 3 of 3 rejected"), result.stderr
    rejects = tmp_path / "labels.rejects.jsonl"
    assert len(rejects.read_text(encoding="utf-8").splitlines()) == 3 and str(rejects) in lines[0]
    assert all(json.loads(line)["reason"] for line in rejects.read_text(encoding="utf-8").splitlines())


def test_label_with_one_good_row_succeeds(smoke_model, tmp_path):
    rows = smoke_pairs(smoke_model, 3)
    rows[1:] = [{**row, "premise": ""} for row in rows[1:]]
    source = write_rows(tmp_path / "pairs.csv", rows)
    arguments = ["label", str(source), "--model", str(smoke_model.checkpoint), "--output", str(tmp_path / "l.parquet")]
    result = CliRunner().invoke(main, [*arguments, "--parser", "model"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "1 labelled, 2 rejected" in result.output
