"""`spinn prepare`: every reject reason, skips, the reject-ratio gate, formats and the schema."""

from __future__ import annotations

import gzip
import json
import os
import time
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spinn.data.corpus import TreeSource
from spinn.data.prepare import PrepareSettings, infer_split, prepare
from spinn.data.rejects import RejectReason
from spinn.data.schema import LABELS, SCHEMA_VERSION, read_pairs
from spinn.ground.errors import SpinnError
from spinn.trees.transitions import TRANSITION_NAMES, Transition, transitions_to_tree
from spinn.trees.tree import format_binary

S, R = int(Transition.SHIFT), int(Transition.REDUCE)


def record(pair_id: str, label: str = "entailment", **overrides) -> dict:
    base = {
        "gold_label": label,
        "pairID": pair_id,
        "sentence1": "A dog runs.",
        "sentence1_binary_parse": "( ( A dog ) ( runs . ) )",
        "sentence1_parse": "(ROOT (S (NP (DT A) (NN dog)) (VP (VBZ runs)) (. .)))",
        "sentence2": "Animals move.",
        "sentence2_binary_parse": "( Animals ( move . ) )",
        "sentence2_parse": "(ROOT (S (NP (NNS Animals)) (VP (VBP move)) (. .)))",
    }
    base.update(overrides)
    return {key: value for key, value in base.items() if value is not None}


# Each bad line, the reason it must be filed under, and the field it must name.
BAD_LINES: list[tuple[str, RejectReason, str | None]] = [
    ('{"gold_label": "entailment", "pairID": ', RejectReason.MALFORMED_JSON, None),
    ("[1, 2, 3]", RejectReason.MALFORMED_JSON, None),
    (json.dumps(record("m1", sentence2=None)), RejectReason.MISSING_FIELD, "sentence2"),
    (json.dumps(record("m2", gold_label=None)), RejectReason.MISSING_FIELD, "gold_label"),
    (
        json.dumps(record("m3", sentence1_binary_parse=None, sentence1_parse=None)),
        RejectReason.MISSING_FIELD,
        "sentence1_parse",
    ),
    (json.dumps(record("i1", sentence1=42)), RejectReason.INVALID_FIELD, "sentence1"),
    (json.dumps(record("u1", label="maybe")), RejectReason.UNKNOWN_LABEL, "gold_label"),
    (
        json.dumps(record("b1", sentence1_binary_parse="( ( A dog ) ( runs . )")),
        RejectReason.UNBALANCED_PARSE,
        "sentence1_binary_parse",
    ),
    (json.dumps(record("b2", sentence2_binary_parse="( )")), RejectReason.EMPTY_PARSE, "sentence2_binary_parse"),
    (
        json.dumps(record("b3", sentence2_binary_parse="( Animals move . )")),
        RejectReason.MALFORMED_PARSE,
        "sentence2_binary_parse",
    ),
    (
        json.dumps(record("l1", sentence1_binary_parse="( ( A dog ) runs )")),
        RejectReason.LEAF_MISMATCH,
        "sentence1_binary_parse",
    ),
    (
        json.dumps(record("l2", sentence2_binary_parse="( Plants ( move . ) )")),
        RejectReason.LEAF_MISMATCH,
        "sentence2_binary_parse",
    ),
]
GOOD_IDS = ["g1", "g2", "g3"]


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def mixed_file(tmp_path: Path) -> Path:
    """Good pairs interleaved with one line for every reject reason and one no-consensus pair."""
    lines = [json.dumps(record("g1"))]
    lines += [line for line, _, _ in BAD_LINES[:6]]
    lines += [json.dumps(record("g2", label="contradiction")), json.dumps(record("skip", label="-"))]
    lines += [line for line, _, _ in BAD_LINES[6:]]
    lines += ["", json.dumps(record("g3", label="neutral"))]
    return write_jsonl(tmp_path / "mixed_train.jsonl", lines)


def read_rejects(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_every_reject_reason_is_filed_and_good_rows_go_on(mixed_file, tmp_path):
    out = tmp_path / "prepared"
    summary = prepare(mixed_file, out, PrepareSettings(max_reject_ratio=1.0))
    assert summary.split == "train"
    assert (summary.read, summary.written, summary.skipped) == (len(BAD_LINES) + 4, 3, 1)
    assert summary.rejected_total == len(BAD_LINES)
    table = read_pairs(out / "train.parquet")
    assert table["pair_id"].to_pylist() == GOOD_IDS
    assert table["label"].to_pylist() == ["entailment", "contradiction", "neutral"]
    rejects = read_rejects(out / "train.rejects.jsonl")
    expected = [(reason.value, field) for _, reason, field in BAD_LINES]
    assert [(r["reason"], r["field"]) for r in rejects] == expected
    ids = [None, None, "m1", "m2", "m3", "i1", "u1", "b1", "b2", "b3", "l1", "l2"]  # None: not a JSON object
    assert [r["pair_id"] for r in rejects] == ids  # top level, beside file, line, field and reason
    raw_lines = mixed_file.read_text(encoding="utf-8").splitlines()
    for reject in rejects:
        assert reject["file"] == str(mixed_file)
        assert raw_lines[reject["line"] - 1] == reject["raw"]  # nothing lost: the line is kept verbatim
        assert reject["message"]


def test_every_reject_reason_has_a_case():
    covered = {reason for _, reason, _ in BAD_LINES}
    untested_here = {RejectReason.MALFORMED_ENCODING, RejectReason.MALFORMED_ROW, RejectReason.DUPLICATE_ID}  # below
    raw_pairs_only = {
        RejectReason.EMPTY_SENTENCE,
        RejectReason.TOO_LONG,
        RejectReason.PARSE_FAILED,
    }  # no parse in the row: tests/test_sentence_pairs.py, test_label.py
    assert covered | untested_here | raw_pairs_only == set(RejectReason)


def test_rows_hold_tokens_transitions_and_source_lines(mixed_file, tmp_path):
    prepare(mixed_file, tmp_path, PrepareSettings(max_reject_ratio=1.0))
    row = read_pairs(tmp_path / "train.parquet").to_pylist()[0]
    assert row["premise"] == "A dog runs."
    assert row["premise_tokens"] == ["A", "dog", "runs", "."]
    assert row["premise_transitions"] == [S, S, R, S, S, R, R]
    assert row["hypothesis_transitions"] == [S, S, S, R, R]
    assert row["source_line"] == 1


def test_reject_ratio_gate_publishes_rejects_but_not_parquet(mixed_file, tmp_path):
    out = tmp_path / "prepared"
    with pytest.raises(SpinnError, match=r"12 of 16 lines rejected.*max_reject_ratio 1\.00%") as error:
        prepare(mixed_file, out)
    assert "\n" not in str(error.value)
    assert not (out / "train.parquet").exists()
    assert len(read_rejects(out / "train.rejects.jsonl")) == len(BAD_LINES)
    assert sorted(p.name for p in out.iterdir()) == ["train.rejects.jsonl"]  # no temporary files left


def test_failed_run_keeps_the_previous_parquet(mixed_file, tmp_path):
    good = write_jsonl(tmp_path / "train.jsonl", [json.dumps(record("g1"))])
    out = tmp_path / "prepared"
    prepare(good, out)
    before = (out / "train.parquet").read_bytes()
    with pytest.raises(SpinnError):
        prepare(mixed_file, out, split="train")
    assert (out / "train.parquet").read_bytes() == before


def test_nary_trees_are_binarized(tmp_path):
    path = write_jsonl(tmp_path / "dev.jsonl", [json.dumps(record("n1", sentence1_binary_parse=None))])
    prepare(path, tmp_path)
    row = read_pairs(tmp_path / "dev.parquet").to_pylist()[0]
    tree = transitions_to_tree(row["premise_tokens"], row["premise_transitions"])
    assert format_binary(tree) == "( ( A dog ) ( runs . ) )"


def test_trees_option_forces_a_source(tmp_path):
    # The n-ary parse here has a flat NP, so binarizing it gives a different tree than the binary parse.
    flat = record("f1", sentence1_binary_parse="( A ( dog ( runs . ) ) )")
    path = write_jsonl(tmp_path / "dev.jsonl", [json.dumps(flat)])
    prepare(path, tmp_path / "binary", PrepareSettings(trees=TreeSource.BINARY))
    prepare(path, tmp_path / "nary", PrepareSettings(trees=TreeSource.NARY))
    as_binary = read_pairs(tmp_path / "binary" / "dev.parquet")["premise_transitions"].to_pylist()[0]
    as_nary = read_pairs(tmp_path / "nary" / "dev.parquet")["premise_transitions"].to_pylist()[0]
    assert as_binary == [S, S, S, S, R, R, R]
    assert as_nary == [S, S, R, S, S, R, R]


def test_forcing_binary_without_binary_parse_is_a_missing_field(tmp_path):
    lines = [json.dumps(record("n1", sentence2_binary_parse=None)), json.dumps(record("g1"))]
    path = write_jsonl(tmp_path / "dev.jsonl", lines)
    summary = prepare(path, tmp_path, PrepareSettings(trees=TreeSource.BINARY, max_reject_ratio=1.0))
    assert summary.rejected == {"missing_field": 1}


def test_text_format_with_header_and_bad_rows(tmp_path):
    header = [
        "gold_label",
        "sentence1_binary_parse",
        "sentence2_binary_parse",
        "sentence1_parse",
        "sentence2_parse",
        "sentence1",
        "sentence2",
        "captionID",
        "pairID",
    ]
    good = record("t1")
    row = [good.get(name, "cap") for name in header]
    lines = ["\t".join(header), "\t".join(row), "\t".join(row[:4])]
    path = tmp_path / "snli_1.0_test.txt"
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"neutral\t\xff\xfe broken\n")
    summary = prepare(path, tmp_path, PrepareSettings(max_reject_ratio=1.0))
    assert summary.split == "test" and summary.written == 1
    rejects = read_rejects(tmp_path / "test.rejects.jsonl")
    assert [(r["reason"], r["line"]) for r in rejects] == [("malformed_row", 3), ("malformed_encoding", 4)]


def test_gzip_and_zip_member_inputs(tmp_path):
    lines = "\n".join(json.dumps(record(i)) for i in GOOD_IDS) + "\n"
    gz = tmp_path / "snli_1.0_dev.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as stream:
        stream.write(lines)
    archive = tmp_path / "snli_1.0.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("snli_1.0/snli_1.0_dev.jsonl", lines)
        bundle.writestr("snli_1.0/snli_1.0_test.jsonl", lines)
    assert prepare(gz, tmp_path / "a").written == 3
    summary = prepare(archive, tmp_path / "b", member="snli_1.0_test.jsonl")
    assert summary.split == "test" and summary.written == 3
    assert summary.source == f"{archive}:snli_1.0/snli_1.0_test.jsonl"
    with pytest.raises(SpinnError, match="holds 2 corpus files"):
        prepare(archive, tmp_path / "c")
    with pytest.raises(SpinnError, match="not found"):
        prepare(archive, tmp_path / "c", member="nope.jsonl")


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("snli_1.0_train.jsonl", "train"),
        ("snli_1.0_dev.jsonl.gz", "dev"),
        ("multinli_1.0_dev_matched.txt", "dev_matched"),
        ("multinli_1.0_dev_mismatched.jsonl", "dev_mismatched"),
        ("snli_1.0_train_first1024.jsonl.gz", "train_first1024"),
        ("pairs.jsonl", "pairs"),
    ],
)
def test_split_names(name, split):
    assert infer_split(name) == split


def test_schema_is_explicit_and_versioned(mixed_file, tmp_path):
    prepare(mixed_file, tmp_path, PrepareSettings(max_reject_ratio=1.0))
    schema = pq.read_schema(tmp_path / "train.parquet")
    metadata = {key.decode(): value.decode() for key, value in schema.metadata.items()}
    assert metadata["spinn.schema_version"] == SCHEMA_VERSION
    assert json.loads(metadata["spinn.transitions"]) == TRANSITION_NAMES
    assert json.loads(metadata["spinn.labels"]) == list(LABELS)
    assert metadata["spinn.source"] == str(mixed_file)
    assert str(schema.field("premise_transitions").type) == "list<element: int8>"


def test_wrong_schema_is_refused_by_name(tmp_path):
    import pyarrow as pa

    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1]}), path)
    with pytest.raises(SpinnError, match=r"other\.parquet: prepared-pairs schema version none"):
        read_pairs(path)
    text = tmp_path / "text.parquet"
    text.write_text("not parquet")
    with pytest.raises(SpinnError, match="not a Parquet file"):
        read_pairs(text)


def test_real_snli_dev(snli_dev, tmp_path):
    summary = prepare(snli_dev, tmp_path)
    assert (summary.read, summary.written, summary.skipped, summary.rejected_total) == (10000, 9842, 158, 0)
    table = read_pairs(tmp_path / "dev.parquet")
    assert table.num_rows == 9842
    assert set(table["label"].to_pylist()) == set(LABELS)
    lines = table["source_line"].to_pylist()
    assert lines == sorted(lines) and len(set(lines)) == len(lines)


def test_worker_processes_give_the_same_output_as_one(snli_dev, tmp_path, monkeypatch):
    import spinn.data.prepare as prepare_module

    monkeypatch.setattr(prepare_module, "CHUNK_LINES", 700)  # many chunks, many in flight
    with gzip.open(snli_dev, "rt", encoding="utf-8") as stream:
        lines = stream.read().splitlines()[:3000]
    for position, (bad, _, _) in zip(range(5, 3000, 401), BAD_LINES, strict=False):
        lines.insert(position, bad)
    corpus = write_jsonl(tmp_path / "dev.jsonl", lines)
    one = prepare(corpus, tmp_path / "one", PrepareSettings(workers=1))
    two = prepare(corpus, tmp_path / "two", PrepareSettings(workers=2))
    assert (one.read, one.written, one.skipped, one.rejected) == (two.read, two.written, two.skipped, two.rejected)
    assert one.rejected_total == 8
    assert read_pairs(one.output).equals(read_pairs(two.output))
    assert (tmp_path / "one/dev.rejects.jsonl").read_text() == (tmp_path / "two/dev.rejects.jsonl").read_text()


# ----------------------------------------------------------------------------- nothing good in, nothing out


@pytest.mark.parametrize(
    "lines", [[], [json.dumps(record("s1", label="-"))], ["not json"]], ids=["empty", "all skipped", "all rejected"]
)
def test_an_input_with_no_valid_pair_is_an_error_and_the_earlier_output_stays(tmp_path, lines):
    out = tmp_path / "prepared"
    earlier = write_jsonl(tmp_path / "good.jsonl", [json.dumps(record("g1")), "not json"])
    prepare(earlier, out, PrepareSettings(max_reject_ratio=1.0), split="train")
    before = {name: (out / name).read_bytes() for name in ("train.parquet", "train.rejects.jsonl")}
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(line + "\n" for line in lines))
    with pytest.raises(SpinnError, match=r"bad\.jsonl: no valid pairs .* left as they were"):
        prepare(bad, out, PrepareSettings(max_reject_ratio=1.0), split="train")
    assert {name: (out / name).read_bytes() for name in before} == before


# ----------------------------------------------------------------------------- duplicate pair ids


def test_a_pair_id_seen_before_is_rejected_as_a_duplicate_even_in_another_chunk(tmp_path, monkeypatch):
    import spinn.data.prepare as prepare_module

    monkeypatch.setattr(prepare_module, "CHUNK_LINES", 2)
    lines = [json.dumps(record(pair_id)) for pair_id in ("g1", "g2", "g3", "g1", "g2")]
    summary = prepare(write_jsonl(tmp_path / "dev.jsonl", lines), tmp_path, PrepareSettings(max_reject_ratio=1.0))
    assert read_pairs(tmp_path / "dev.parquet")["pair_id"].to_pylist() == ["g1", "g2", "g3"]
    rejects = read_rejects(tmp_path / "dev.rejects.jsonl")
    where = [(r["line"], r["reason"], r["field"]) for r in rejects]
    assert where == [(line, "duplicate_id", "pairID") for line in (4, 5)]
    assert rejects[0]["raw"] == lines[3] and "line 1" in rejects[0]["message"]
    assert [r["pair_id"] for r in rejects] == ["g1", "g2"]
    assert summary.rejected == {"duplicate_id": 2}


# ----------------------------------------------------------------------------- housekeeping


def test_temporaries_a_killed_prepare_left_go_at_the_next_start(tmp_path):
    out = tmp_path / "prepared"
    out.mkdir()
    stale = out / ".train.parquet.ab12cd34.tmp"
    stale.write_bytes(b"half a file")
    days_ago = time.time() - 3 * 24 * 60 * 60
    os.utime(stale, (days_ago, days_ago))
    prepare(write_jsonl(tmp_path / "train.jsonl", [json.dumps(record("g1"))]), out)
    assert sorted(path.name for path in out.iterdir()) == ["train.parquet", "train.rejects.jsonl"]


class Killed(BaseException):
    """The process dies here, as far as the code that runs can tell: no `except Exception` catches it."""


def killed_after_the_first_of(finals: set[Path]):
    """An os.replace that dies (raises Killed) when asked to move a second file over one of `finals`."""
    replace, moved = os.replace, []

    def replace_or_die(source, destination):
        if Path(destination) in finals:
            if moved:
                raise Killed
            moved.append(destination)
        replace(source, destination)

    return replace_or_die


def test_a_reader_never_sees_the_new_parquet_beside_the_old_rejects(tmp_path, monkeypatch):
    """The writer dies between its two renames; the next reader (read_pairs) gets the new pair whole."""
    out, reference = tmp_path / "prepared", tmp_path / "reference"
    source = tmp_path / "train.jsonl"
    write_jsonl(source, [json.dumps(record("g1")), "not json"])
    prepare(source, out, PrepareSettings(max_reject_ratio=1.0))
    write_jsonl(source, [json.dumps(record("g1")), json.dumps(record("g2")), "not json", "[1]"])
    prepare(source, reference, PrepareSettings(max_reject_ratio=1.0))
    monkeypatch.setattr(os, "replace", killed_after_the_first_of({out / "train.parquet", out / "train.rejects.jsonl"}))
    with pytest.raises(Killed):
        prepare(source, out, PrepareSettings(max_reject_ratio=1.0))
    monkeypatch.undo()
    assert read_pairs(out / "train.parquet").equals(read_pairs(reference / "train.parquet"))
    assert (out / "train.rejects.jsonl").read_text() == (reference / "train.rejects.jsonl").read_text()


def test_spinn_parse_publishes_its_pair_the_same_way(tmp_path, monkeypatch):
    """`spinn parse` writes the same pair (trees `none`: tokens only, no Stanza needed here)."""
    from spinn.parsing.parse import ParseSettings, parse_pairs

    source, out, reference = tmp_path / "pairs.csv", tmp_path / "out", tmp_path / "reference"
    tokens_only = ParseSettings(trees="none")
    source.write_text("id,premise,hypothesis\n1,A dog runs .,An animal moves .\n2,,empty\n", encoding="utf-8")
    parse_pairs(source, out, tokens_only, split="new")
    source.write_text("id,premise,hypothesis\n1,A dog runs .,An animal moves .\n2,A cat .,\n3,,x\n", encoding="utf-8")
    parse_pairs(source, reference, tokens_only, split="new")
    finals = {out / "new.parquet", out / "new.rejects.jsonl"}
    monkeypatch.setattr(os, "replace", killed_after_the_first_of(finals))
    with pytest.raises(Killed):
        parse_pairs(source, out, tokens_only, split="new")
    monkeypatch.undo()
    assert read_pairs(out / "new.parquet").equals(read_pairs(reference / "new.parquet"))
    assert (out / "new.rejects.jsonl").read_text() == (reference / "new.rejects.jsonl").read_text()


# ----------------------------------------------------------------------------- workers end with a killed parent

WORKERS_UP_TIMEOUT_S = 120
WORKERS_GONE_TIMEOUT_S = 15
"""Workers poll their parent every spinn.ground.children.PARENT_POLL_S; a loaded two-core machine adds the rest."""


def children_of(pid: int) -> set[int]:
    """The live processes whose parent is `pid` (Linux /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.slow
def test_prepare_workers_end_when_prepare_is_killed(tmp_path):
    """SIGKILL `spinn prepare --workers 2` while its workers convert: none of them outlives it."""
    import signal
    import subprocess
    import sys

    from spinn.data.prepare import CHUNK_LINES

    lines = [json.dumps(record(str(i))) for i in range(CHUNK_LINES * 6)]
    corpus = write_jsonl(tmp_path / "train.jsonl", lines)
    command = [str(Path(sys.executable).with_name("spinn")), "prepare", str(corpus), "--workers", "2"]
    parent = subprocess.Popen([*command, "--output-dir", str(tmp_path / "out")], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + WORKERS_UP_TIMEOUT_S
    workers: set[int] = set()
    while len(workers) < 2 and time.monotonic() < deadline and parent.poll() is None:
        workers = children_of(parent.pid)
        time.sleep(0.1)
    assert len(workers) >= 2, "the workers never started"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + WORKERS_GONE_TIMEOUT_S
    while alive(workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = alive(workers)
    for pid in survivors:  # the test's own strays, so a failure leaves nothing running
        os.kill(pid, signal.SIGKILL)
    assert not survivors
