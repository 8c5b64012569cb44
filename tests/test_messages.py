"""Messages name the right thing. A run that diverges before its first checkpoint does not
point at a last.pt it never wrote; a NUL byte in a UTF-8 file spoils its row, not the file's name for its
encoding; bare-CR line ends count every row, in every text format of the pairs reader. (A full disk naming
its file and device is tests/test_disk_full.py, over the CLI's one handler.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from spinn.cli import main
from tests.helpers import one_error_line, tiny_train_arguments

DIVERGING = "learning_rate=1e30"
"""Finite, so the settings take it, and the weights are NaN within a few steps."""


@pytest.mark.parametrize(("checkpoint_every", "kept"), [(1000, False), (1, True)])
def test_a_diverged_run_names_the_checkpoint_it_kept_or_says_it_kept_none(
    checkpoint_every, kept, smoke_model, mlflow_store, tmp_path
):
    output = tmp_path / "run"
    settings = (DIVERGING, "max_steps=40", "log_every=1", "eval_every=4", f"checkpoint_every={checkpoint_every}")
    result = CliRunner().invoke(main, tiny_train_arguments(smoke_model.prepared, output, *settings))
    assert result.exit_code == 1, (result.output, result.exception)
    line = one_error_line(result.stderr)
    assert line.startswith("error: training diverged by step ")
    assert (output / "last.pt").exists() is kept
    if kept:
        assert re.search(rf"{output / 'last.pt'} keeps the last finite checkpoint \(step \d+\)", line), line
    else:
        assert "last.pt" not in line and "before its first checkpoint, so none was kept" in line, line


# ----------------------------------------------------------------------------- the pairs reader's text

ROWS = 300


def text_file(path: Path, ending: str, rows: list[tuple[str, str]]) -> Path:
    """`rows` in the text format `path`'s suffix names, every line ended by `ending`."""
    if path.suffix == ".jsonl":
        lines = [json.dumps({"premise": premise, "hypothesis": hypothesis}) for premise, hypothesis in rows]
    else:
        separator = "\t" if path.suffix == ".tsv" else ","
        lines = [f"premise{separator}hypothesis", *(f"{p}{separator}{h}" for p, h in rows)]
    path.write_bytes("".join(line + ending for line in lines).encode("utf-8"))
    return path


@pytest.mark.parametrize("ending", ["\r", "\r\n", "\n"])
@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_every_line_ending_counts_every_row(suffix, ending, tmp_path):
    from spinn.data.sentence_pairs import InputPair, read_input_pairs

    rows = [(f"A dog runs {index}.", f"An animal moves {index}.") for index in range(ROWS)]
    found = list(read_input_pairs(text_file(tmp_path / f"pairs{suffix}", ending, rows)))
    assert all(isinstance(item, InputPair) for item in found) and len(found) == ROWS
    assert [pair.premise for pair in found] == [premise for premise, _ in rows]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_a_nul_byte_in_utf8_text_spoils_its_row_not_the_files_encoding(suffix, tmp_path):
    from spinn.data.rejects import Reject
    from spinn.data.sentence_pairs import InputPair, read_input_pairs

    rows = [("A dog runs.", "Dogs run."), ("A cat\x00 sleeps.", "A cat rests."), ("Birds fly.", "Birds move.")]
    path = text_file(tmp_path / f"pairs{suffix}", "\n", rows)
    path.write_bytes(path.read_bytes().replace(b"\\u0000", b"\x00"))  # JSON writes the byte escaped
    found = list(read_input_pairs(path))
    assert [item.premise for item in found if isinstance(item, InputPair)] == ["A dog runs.", "Birds fly."]
    (reject,) = [item for item in found if isinstance(item, Reject)]
    assert reject.line == (2 if suffix == ".jsonl" else 3) and "UTF-16" not in reject.message
    assert reject.reason.value in ("malformed_encoding", "malformed_json"), reject


def test_a_file_of_wide_text_without_a_bom_is_still_named_so(tmp_path):
    from spinn.data.sentence_pairs import read_input_pairs
    from spinn.ground.errors import SpinnError

    path = tmp_path / "pairs.csv"
    path.write_bytes("premise,hypothesis\nA dog runs.,Dogs run.\n".encode("utf-16-le"))
    with pytest.raises(SpinnError, match="UTF-16 or UTF-32 text without a BOM"):
        list(read_input_pairs(path))
