"""`spinn label`: every input row comes out once, labels do not depend on batch size, a killed job resumes exactly.

The model is the session's small spinn model trained on the smoke corpus; the
inputs are that corpus's test pairs written as CSV, JSONL and Parquet, plus
hand-made bad rows. Stanza runs for real from ../shared/stanza.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spinn.errors import SpinnError
from spinn.label import LabelSettings, label, parts_folder, rejects_file
from spinn.parse import ParserSettings
from spinn.schema import LABELS
from spinn.transitions import parse_binary

TOLERANCE = 1e-5
KILL_SHARD_SIZE = 25
KILL_AFTER_SHARDS = 2
POLL_S = 0.05
LABEL_TIMEOUT_S = 300


def stanza_dir() -> Path:
    folder = Path(__file__).resolve().parents[2] / "shared" / "stanza" / "stanza_resources"
    if not folder.is_dir():
        pytest.skip(f"the offline Stanza models {folder} are absent (../shared is not beside this checkout)")
    return folder


def smoke_pairs(smoke_model, count: int) -> list[dict]:
    """The first `count` smoke test pairs as plain rows (id, premise, hypothesis, gold label)."""
    table = pq.read_table(smoke_model.prepared / "test.parquet", columns=["pair_id", "premise", "hypothesis", "label"])
    return [{"id": row["pair_id"], "premise": row["premise"], "hypothesis": row["hypothesis"], "label": row["label"]}
            for row in table.to_pylist()[:count]]


def write_rows(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def settings(tmp_path: Path, **overrides) -> LabelSettings:
    parsing = ParserSettings(stanza_dir=stanza_dir(), cache_path=tmp_path / "parses.sqlite", device="cpu")
    return LabelSettings(**{"parsing": parsing, "device": "cpu", **overrides})


def read_output(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_every_row_comes_out_once_with_its_id_label_probabilities_and_trees(smoke_model, tmp_path, suffix):
    rows = smoke_pairs(smoke_model, 30)
    source = write_rows(tmp_path / f"pairs{suffix}", rows)
    summary = label(source, smoke_model.checkpoint, tmp_path / "out.parquet", settings(tmp_path, parser="model"))
    labelled = read_output(tmp_path / "out.parquet")
    assert summary.labelled == len(labelled) == len(rows) and summary.rejected == 0
    assert [row["pair_id"] for row in labelled] == [row["id"] for row in rows]
    for row, given in zip(labelled, rows):
        probabilities = [row[f"p_{name}"] for name in LABELS]
        assert sum(probabilities) == pytest.approx(1.0, abs=1e-5)
        assert row["label"] == LABELS[probabilities.index(max(probabilities))]
        assert row["gold_label"] == given["label"] and row["parser"] == "model"
        assert parse_binary(row["premise_tree"]).leaves() == given["premise"].replace(".", " .").split()
        assert str(smoke_model.checkpoint) in row["model"]


def test_stanza_trees_feed_the_model_and_are_recorded(smoke_model, tmp_path):
    from spinn.parse import SentenceParser

    rows = smoke_pairs(smoke_model, 12)
    label(write_rows(tmp_path / "pairs.jsonl", rows), smoke_model.checkpoint, tmp_path / "out.parquet",
          settings(tmp_path))
    labelled = read_output(tmp_path / "out.parquet")
    parser = SentenceParser(ParserSettings(stanza_dir=stanza_dir(), cache_path=tmp_path / "parses.sqlite"))
    parsed = parser.parse(row["premise"] for row in rows)
    assert parser.stats.parsed == 0  # the labelling run cached every parse
    parser.close()
    assert [row["premise_tree"] for row in labelled] == [parsed[row["premise"]].binary_parse for row in rows]
    assert {row["parser"] for row in labelled} == {"stanza"}


@pytest.mark.parametrize("parser", ["stanza", "model"])
def test_labels_do_not_depend_on_batch_size(smoke_model, tmp_path, parser):
    source = write_rows(tmp_path / "pairs.parquet", smoke_pairs(smoke_model, 60))
    one = label(source, smoke_model.checkpoint, tmp_path / "one.parquet", settings(tmp_path, parser=parser,
                                                                                   batch_size=1))
    many = label(source, smoke_model.checkpoint, tmp_path / "many.parquet", settings(tmp_path, parser=parser,
                                                                                     batch_size=256))
    assert one.labelled == many.labelled == 60
    first, second = read_output(tmp_path / "one.parquet"), read_output(tmp_path / "many.parquet")
    assert [row["label"] for row in first] == [row["label"] for row in second]
    assert [row["premise_tree"] for row in first] == [row["premise_tree"] for row in second]
    for a, b in zip(first, second):
        for name in LABELS:
            assert abs(a[f"p_{name}"] - b[f"p_{name}"]) <= TOLERANCE


def test_bad_rows_are_listed_with_reasons_while_good_rows_are_labelled(smoke_model, tmp_path):
    good = smoke_pairs(smoke_model, 5)
    lines = [json.dumps(row) for row in good[:2]]
    lines += ['{"id": "broken", "premise": ',  # not JSON
              json.dumps({"id": "empty", "premise": "  ", "hypothesis": "A dog runs ."}),
              json.dumps({"id": "long", "premise": " ".join(["dog"] * 40) + " .", "hypothesis": "A dog runs ."}),
              json.dumps({"id": "nohyp", "premise": "A dog runs ."}),
              json.dumps(good[2]),
              json.dumps({**good[3], "id": good[0]["id"]})]  # duplicate id
    source = tmp_path / "pairs.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    parsing = ParserSettings(stanza_dir=stanza_dir(), cache_path=tmp_path / "p.sqlite", device="cpu", max_tokens=20)
    summary = label(source, smoke_model.checkpoint, tmp_path / "out.parquet",
                    LabelSettings(parsing=parsing, device="cpu"))
    rejects = [json.loads(line) for line in rejects_file(tmp_path / "out.parquet").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [
        (3, "malformed_json"), (4, "empty_sentence"), (5, "too_long"), (6, "missing_field"), (8, "duplicate_id")]
    assert [row["pair_id"] for row in read_output(tmp_path / "out.parquet")] == [r["id"] for r in good[:3]]
    assert summary.rows == len(lines) == summary.labelled + summary.rejected


def test_a_registered_model_is_named_by_its_resolved_version(smoke_model, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", smoke_model.tracking_uri)
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 5))
    summary = label(source, smoke_model.registered, tmp_path / "out.parquet", settings(tmp_path, parser="model"))
    assert summary.model == "models:/label-test/1"
    assert {row["model"] for row in read_output(tmp_path / "out.parquet")} == {"models:/label-test/1"}


def label_command(source: Path, output: Path, smoke_model, tmp_path: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "spinn"), "label", str(source), "--model", str(smoke_model.checkpoint),
            "--output", str(output), "--shard-size", str(KILL_SHARD_SIZE), "--batch-size", "8", "--device", "cpu",
            "--stanza-dir", str(stanza_dir()), "--parse-cache", str(tmp_path / "parses.sqlite")]


@pytest.mark.slow
def test_a_killed_job_resumes_without_duplicates_or_gaps(smoke_model, tmp_path):
    rows = smoke_pairs(smoke_model, 200)
    rows[7]["premise"] = ""  # one reject, so rejects are checked for exactness too
    source = write_rows(tmp_path / "pairs.jsonl", rows)
    output = tmp_path / "out.parquet"
    command = label_command(source, output, smoke_model, tmp_path)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + LABEL_TIMEOUT_S
    while len(list(parts_folder(output).glob("labels-*.parquet"))) < KILL_AFTER_SHARDS:
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(POLL_S)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not output.exists()
    done = subprocess.run(command, capture_output=True, text=True, timeout=LABEL_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert "reused from an earlier run" in done.stdout and " 0 reused" not in done.stdout
    labelled = [row["pair_id"] for row in read_output(output)]
    rejected = [json.loads(line)["row"] for line in rejects_file(output).read_text().splitlines()]
    assert rejected == [8]
    assert labelled == [row["id"] for index, row in enumerate(rows) if index != 7]


def test_resuming_with_other_arguments_is_refused(smoke_model, tmp_path):
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 10))
    output = tmp_path / "out.parquet"
    label(source, smoke_model.checkpoint, output, settings(tmp_path, parser="model", shard_size=4))
    with pytest.raises(SpinnError, match="holds shards of another run .*shard_size"):
        label(source, smoke_model.checkpoint, output, settings(tmp_path, parser="model", shard_size=5))
