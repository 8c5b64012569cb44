"""A sentence too long for the token limit is rejected as too_long, with its line, by every
reader, before any tokenizer or tree reader sees it; and prepare keeps a UTF-8-BOM file's first row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from spinn.cli import main
from spinn.data.limits import DEFAULT_MAX_TOKENS, PARSE_CHARS_PER_CHAR, TEXT_MAX_TOKENS, max_chars
from spinn.data.prepare import PrepareSettings, prepare
from spinn.data.rejects import Reject, RejectReason
from spinn.data.sentence_pairs import InputPair, read_input_pairs
from spinn.labeling.induced_trees import PAIRS_OUTPUT_SUFFIX
from tests.helpers import snli_line

SHORT = ("A dog runs.", "An animal moves.")
HUGE = "x" * (max_chars(max(DEFAULT_MAX_TOKENS, TEXT_MAX_TOKENS)) + 1)
"""One word no whitespace splits: a word count lets it through; only a character bound stops it."""
HUGE_PARSE = "( " + "x" * (max_chars(DEFAULT_MAX_TOKENS) * PARSE_CHARS_PER_CHAR) + " . )"


def write_pairs(path: Path, rows: list[tuple[str, str]]) -> Path:
    """`rows` in the format `path`'s suffix names, a header first where the format has one."""
    if path.suffix == ".parquet":
        pq.write_table(pa.table({"premise": [p for p, _ in rows], "hypothesis": [h for _, h in rows]}), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({"premise": p, "hypothesis": h}) + "\n" for p, h in rows))
    else:
        separator = "\t" if path.suffix == ".tsv" else ","
        path.write_text("".join(f"{p}{separator}{h}\n" for p, h in [("premise", "hypothesis"), *rows]))
    return path


FIRST_DATA_LINE = {".csv": 2, ".tsv": 2, ".jsonl": 1, ".parquet": 1}


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_every_pairs_reader_rejects_a_too_long_sentence_by_characters(suffix, tmp_path):
    path = write_pairs(tmp_path / f"pairs{suffix}", [SHORT, (HUGE, "Short."), SHORT[::-1]])
    items = list(read_input_pairs(path))
    kept = [item for item in items if isinstance(item, InputPair)]
    (reject,) = [item for item in items if isinstance(item, Reject)]
    assert [pair.premise for pair in kept] == [SHORT[0], SHORT[1]]
    assert (reject.reason, reject.field) == (RejectReason.TOO_LONG, "premise")
    assert reject.line == FIRST_DATA_LINE[suffix] + 1


@pytest.mark.parametrize("huge_field", ["sentence1", "sentence1_binary_parse"])
def test_prepare_rejects_a_too_long_sentence_or_parse_before_reading_its_tree(huge_field, tmp_path):
    records = [json.loads(snli_line(str(i))) for i in range(300)]
    records[1][huge_field] = HUGE_PARSE if huge_field.endswith("_parse") else HUGE
    corpus = tmp_path / "dev.jsonl"
    corpus.write_text("".join(json.dumps(record) + "\n" for record in records))
    summary = prepare(corpus, tmp_path / "out", PrepareSettings(workers=1))
    assert (summary.written, dict(summary.rejected)) == (299, {RejectReason.TOO_LONG.value: 1})
    (reject,) = [json.loads(line) for line in summary.rejects.read_text().splitlines()]
    assert (reject["line"], reject["field"]) == (2, huge_field)


def test_prepare_keeps_the_first_row_of_a_utf8_bom_file(tmp_path):
    corpus = tmp_path / "dev.jsonl"
    lines = [snli_line(str(i)) for i in range(3)]
    corpus.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    summary = prepare(corpus, tmp_path / "out", PrepareSettings(workers=1))
    assert (summary.read, summary.written, summary.rejected_total) == (3, 3, 0)
    assert pq.read_table(summary.output).column("pair_id").to_pylist() == ["0", "1", "2"]


NEW_TEXT_COMMANDS = {
    "label": lambda source, model, out: ["label", source, "--model", model, "--output", str(out), "--parser", "model"],
    "trees": lambda source, model, out: ["trees", source, "--model", model, "--output", str(out)],
}
"""Each command that reads a pairs file with a model (bench-label runs label's own stage)."""
OUTPUT_SUFFIX = {"label": ".parquet", "trees": PAIRS_OUTPUT_SUFFIX}
SMALL_LIMIT = 3
"""A `--max-tokens` under the default, so only the limit given (not the default's) rejects the long word."""
SMALL_PAIR = ("A dog.", "Dogs run.")


@pytest.mark.parametrize("command", NEW_TEXT_COMMANDS)
def test_label_and_trees_bound_a_sentence_by_the_token_limit_given(command, smoke_model, tmp_path):
    long_word = "y" * (max_chars(SMALL_LIMIT) + 1)
    source = write_pairs(tmp_path / "pairs.csv", [SMALL_PAIR, (long_word, "Short.")])
    out = tmp_path / f"out{OUTPUT_SUFFIX[command]}"
    arguments = NEW_TEXT_COMMANDS[command](str(source), str(smoke_model.checkpoint), out)
    result = CliRunner().invoke(main, [*arguments, "--max-tokens", str(SMALL_LIMIT)])
    assert result.exit_code == 0, (result.output, result.exception)
    if command == "trees":  # the trees of the kept pair: the long word's pair is skipped
        (record,) = [json.loads(line) for line in out.read_text().splitlines()]
        assert record["pair_id"] == "1" and long_word not in out.read_text()
        return
    assert pq.read_table(out).column("premise").to_pylist() == [SMALL_PAIR[0]]
    (reject,) = [json.loads(line) for line in (tmp_path / "out.rejects.jsonl").read_text().splitlines()]
    assert reject["reason"] == RejectReason.TOO_LONG and "characters" in json.dumps(reject)
