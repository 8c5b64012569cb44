"""Reading sentence-pair corpora: formats, column mapping, every reject reason, whole-file errors, tokens."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spinn.data.rejects import Reject, RejectReason
from spinn.data.sentence_pairs import (
    FORMATS,
    Columns,
    InputPair,
    detect_format,
    read_input_pairs,
    resolve_columns,
)
from spinn.ground.errors import SpinnError

HEADER = ("id", "premise", "hypothesis", "label")
ROWS = [
    ("p1", 'A man says "hi" (loudly), then leaves.', "A man speaks.", "entailment"),
    ("p2", "Two dogs run on grass.", "Animals move.", "neutral"),
    ("p3", "A woman sleeps.", "A woman runs a marathon.", "contradiction"),
    ("p4", "Kids play, laughing.", "Children are outside.", "-"),
]
DEFAULT_COLUMNS = Columns()
EXPECTED = [
    (1, "p1", 'A man says "hi" (loudly), then leaves.', "A man speaks.", "entailment"),
    (2, "p2", "Two dogs run on grass.", "Animals move.", "neutral"),
    (3, "p3", "A woman sleeps.", "A woman runs a marathon.", "contradiction"),
    (4, "p4", "Kids play, laughing.", "Children are outside.", None),
]


def write_csv(path: Path, rows: list[tuple], header: tuple = HEADER, delimiter: str = ",") -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8", newline="") as stream:
        writer = csv.writer(stream, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_tsv(path: Path, rows: list[tuple], header: tuple = HEADER) -> Path:
    lines = ["\t".join(header)] + ["\t".join(row) for row in rows]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8", newline="") as stream:
        stream.write("\n".join(lines) + "\n")
    return path


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[tuple], header: tuple = HEADER) -> Path:
    pq.write_table(pa.Table.from_pylist([dict(zip(header, row, strict=True)) for row in rows]), path)
    return path


def write_lines(path: Path, lines: list[bytes | str]) -> Path:
    path.write_bytes(b"".join(line if isinstance(line, bytes) else line.encode() for line in lines))
    return path


WRITERS = {
    "pairs.csv": write_csv,
    "pairs.csv.gz": write_csv,
    "pairs.tsv": write_tsv,
    "pairs.tsv.gz": write_tsv,
    "pairs.tab": write_tsv,
    "pairs.jsonl": lambda path, rows: write_jsonl(path, [dict(zip(HEADER, row, strict=True)) for row in rows]),
    "pairs.ndjson": lambda path, rows: write_jsonl(path, [dict(zip(HEADER, row, strict=True)) for row in rows]),
    "pairs.parquet": write_parquet,
}


def read_all(path: Path, columns: Columns = DEFAULT_COLUMNS, fmt: str | None = None) -> list[InputPair | Reject]:
    return list(read_input_pairs(path, columns, fmt))


def summary(items: list[InputPair | Reject]) -> list[tuple]:
    return [(p.row, p.pair_id, p.premise, p.hypothesis, p.label) for p in items if isinstance(p, InputPair)]


def rejects(items: list[InputPair | Reject]) -> list[tuple[int, RejectReason, str | None]]:
    return [(r.line, r.reason, r.field) for r in items if isinstance(r, Reject)]


# --------------------------------------------------------------------------- formats


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_every_format_reads_back_the_same_pairs(tmp_path: Path, name: str):
    path = WRITERS[name](tmp_path / name, ROWS)
    items = read_all(path)
    assert summary(items) == EXPECTED
    header_lines = 0 if name.endswith((".jsonl", ".ndjson", ".parquet")) else 1
    assert [item.line for item in items] == [row + header_lines for row in range(1, 5)]
    assert read_all(path) == items  # reruns give the same rows


def test_gzip_is_recognised_by_content_and_format_can_be_named(tmp_path: Path):
    path = write_csv(tmp_path / "pairs.csv.gz", ROWS).rename(tmp_path / "pairs.data")
    assert summary(read_all(path, fmt="CSV")) == EXPECTED


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("a.csv", "csv"),
        ("a.CSV", "csv"),
        ("a.tsv", "tsv"),
        ("a.tab", "tsv"),
        ("a.jsonl", "jsonl"),
        ("a.ndjson", "jsonl"),
        ("a.parquet", "parquet"),
        ("a.csv.gz", "csv"),
        ("a.tsv.gz", "tsv"),
        ("a.jsonl.gz", "jsonl"),
        ("dev.v2.jsonl", "jsonl"),
    ],
)
def test_detect_format_from_suffix(name: str, fmt: str):
    assert detect_format(Path(name)) == fmt


@pytest.mark.parametrize(("name", "fmt"), [("a.xlsx", None), ("a.parquet.gz", None), ("a", None), ("a.csv", "xml")])
def test_unknown_format_lists_the_formats(name: str, fmt: str | None):
    with pytest.raises(SpinnError, match=", ".join(FORMATS)):
        detect_format(Path(name), fmt)


def test_explicit_format_overrides_the_suffix():
    assert detect_format(Path("a.txt"), "tsv") == "tsv"


# --------------------------------------------------------------------------- columns


def test_snli_column_names_are_detected(tmp_path: Path):
    snli = {
        "gold_label": "neutral",
        "pairID": "3416050480.jpg#4r1n",
        "sentence1": "A person on a horse.",
        "sentence2": "A person trains a horse.",
        "sentence1_binary_parse": "( ( A person ) ( on ( a horse ) ) )",
    }
    path = write_jsonl(tmp_path / "snli.jsonl", [snli, {**snli, "pairID": "x2", "gold_label": "-"}])
    assert summary(read_all(path)) == [
        (1, "3416050480.jpg#4r1n", "A person on a horse.", "A person trains a horse.", "neutral"),
        (2, "x2", "A person on a horse.", "A person trains a horse.", None),
    ]


def test_custom_column_names(tmp_path: Path):
    path = write_csv(
        tmp_path / "custom.csv",
        [("u7", "One.", "Two.", "contradiction", "extra")],
        header=("uid", "p", "h", "y", "notes"),
    )
    items = read_all(path, Columns(premise="p", hypothesis="h", id="uid", label="y"))
    assert summary(items) == [(1, "u7", "One.", "Two.", "contradiction")]


def test_no_id_column_numbers_rows_and_no_label_column_gives_none(tmp_path: Path):
    path = write_tsv(
        tmp_path / "bare.tsv", [("A.", "B."), ("C.", "D."), ("E.", "F.")], header=("sentence1", "sentence2")
    )
    assert summary(read_all(path)) == [
        (1, "1", "A.", "B.", None),
        (2, "2", "C.", "D.", None),
        (3, "3", "E.", "F.", None),
    ]


@pytest.mark.parametrize(
    ("written", "label"),
    [
        ("Entailment", "entailment"),
        (" NEUTRAL ", "neutral"),
        ("-", None),
        ("", None),
        ("contradiction", "contradiction"),
    ],
)
def test_labels_are_case_insensitive_and_dash_or_empty_means_none(tmp_path: Path, written: str, label: str | None):
    path = write_csv(tmp_path / "labels.csv", [("a", "P.", "H.", written)])
    assert summary(read_all(path)) == [(1, "a", "P.", "H.", label)]


def test_resolve_columns_prefers_the_first_conventional_name():
    resolved = resolve_columns(
        ["pairID", "sentence1", "premise", "hypothesis", "id", "gold_label"], Columns(), Path("f.csv")
    )
    assert resolved == Columns(premise="premise", hypothesis="hypothesis", id="id", label="gold_label")


def test_resolve_columns_leaves_absent_optional_columns_none():
    resolved = resolve_columns(["sentence1", "sentence2"], Columns(), Path("f.csv"))
    assert resolved == Columns(premise="sentence1", hypothesis="sentence2", id=None, label=None)


def test_a_named_optional_column_must_exist():
    with pytest.raises(SpinnError, match=r"f\.csv: no label column \(looked for 'y'\)"):
        resolve_columns(["premise", "hypothesis"], Columns(label="y"), Path("f.csv"))


def test_sentences_and_ids_are_stripped_and_json_number_ids_become_strings(tmp_path: Path):
    path = write_jsonl(
        tmp_path / "ids.jsonl",
        [
            {"id": 7, "premise": "  A dog.\n", "hypothesis": "\tAn animal. "},
            {"id": " x ", "premise": "B.", "hypothesis": "C."},
        ],
    )
    assert summary(read_all(path)) == [(1, "7", "A dog.", "An animal.", None), (2, "x", "B.", "C.", None)]


# --------------------------------------------------------------------------- rejects


def good(pair_id: str, **overrides) -> str:
    record = {"id": pair_id, "premise": "A dog runs.", "hypothesis": "An animal moves.", "label": "entailment"}
    record.update(overrides)
    return json.dumps({key: value for key, value in record.items() if value != "<absent>"}) + "\n"


def test_jsonl_rejects_every_bad_line_and_keeps_the_good_ones(tmp_path: Path):
    lines: list[bytes | str] = [
        good("a"),  # 1 good
        '{"id": "b", "premise": \n',  # 2 malformed JSON
        "\n",  # 3 blank: no row
        '["a", "list"]\n',  # 4 not an object
        good("c", premise=5),  # 5 number premise
        good("d", hypothesis="<absent>"),  # 6 no hypothesis
        good("e", premise=None),  # 7 null premise
        good("f", premise="   "),  # 8 whitespace premise
        good("g", label="maybe"),  # 9 a gold value in no scheme: kept, as given
        good("a"),  # 10 duplicate id
        b'{"id": "h", "premise": "caf\xe9", "hypothesis": "x"}\n',  # 11 latin-1 byte
        good("i", hypothesis=["a", "list"]),  # 12 list hypothesis
        good("j", label=1),  # 13 a number label (a 0/1 scheme): kept, as text
        good("k", id=None),  # 14 null id
        good("l"),  # 15 good
        "   \n",  # 16 blank
        good("m", label="Contradiction"),  # 17 good
    ]
    path = write_lines(tmp_path / "mixed.jsonl", lines)
    items = read_all(path)
    assert [(p.row, p.line, p.pair_id, p.label) for p in items if isinstance(p, InputPair)] == [
        (1, 1, "a", "entailment"),
        (8, 9, "g", "maybe"),
        (12, 13, "j", "1"),
        (14, 15, "l", "entailment"),
        (15, 17, "m", "contradiction"),
    ]
    assert rejects(items) == [
        (2, RejectReason.MALFORMED_JSON, None),
        (4, RejectReason.MALFORMED_JSON, None),
        (5, RejectReason.INVALID_FIELD, "premise"),
        (6, RejectReason.MISSING_FIELD, "hypothesis"),
        (7, RejectReason.MISSING_FIELD, "premise"),
        (8, RejectReason.EMPTY_SENTENCE, "premise"),
        (10, RejectReason.DUPLICATE_ID, "id"),
        (11, RejectReason.MALFORMED_ENCODING, None),
        (12, RejectReason.INVALID_FIELD, "hypothesis"),
        (14, RejectReason.MISSING_FIELD, "id"),
    ]
    assert len(items) == sum(1 for line in lines if line.strip())  # nothing lost
    # the id each rejected row names at the top level: None where the line is unreadable or its id is
    # missing; a duplicate names the id it repeats
    ids = [item.pair_id for item in items if isinstance(item, Reject)]
    assert ids == [None, None, "c", "d", "e", "f", "a", None, "i", None]
    reject = next(r for r in items if isinstance(r, Reject) and r.reason is RejectReason.DUPLICATE_ID)
    assert reject.file == str(path)
    assert reject.raw == good("a").rstrip("\n")
    assert json.loads(reject.to_json())["reason"] == "duplicate_id"


def test_a_reject_is_a_plain_record_of_every_field_and_its_json_is_that_record():
    raw = '{"premise": "Un café .", "label": "maybe"}'
    reject = Reject("pairs.jsonl", 9, RejectReason.UNKNOWN_LABEL, "label", "unknown label 'maybe'", raw)
    assert reject.to_dict() == {
        "file": "pairs.jsonl",
        "line": 9,
        "pair_id": None,
        "reason": "unknown_label",
        "field": "label",
        "message": "unknown label 'maybe'",
        "raw": raw,
    }
    assert json.loads(reject.to_json()) == reject.to_dict()
    assert "café" in reject.to_json()  # people read rejects files: text stays as written


def test_a_rejected_row_of_a_file_without_ids_is_named_by_its_row_number_as_its_output_row_would_be(tmp_path):
    rows = [("A dog runs.", "x"), ("", "An animal moves.")]
    path = write_csv(tmp_path / "pairs.csv", rows, ("premise", "hypothesis"))
    items = read_all(path)
    assert [item.pair_id for item in items] == ["1", "2"] and isinstance(items[1], Reject)
    assert json.loads(items[1].to_json())["pair_id"] == "2"


def test_csv_rejects_bad_rows_and_reads_multi_line_fields(tmp_path: Path):
    lines: list[bytes | str] = [
        "id,premise,hypothesis,label\n",  # 1 header
        "a,A dog runs.,An animal moves.,entailment\n",  # 2 good, row 1
        "b,Too few fields\n",  # 3 short row
        'c,"A quoted\n',  # 4 multi-line field starts
        'premise, with a comma",Something.,neutral\n',  # 5 ... and ends
        "\n",  # 6 blank: no row
        "d,One,Two,entailment,extra\n",  # 7 long row
        b"e,Caf\xe9 au lait.,A drink.,neutral\n",  # 8 latin-1 byte
        "f,,Empty premise.,neutral\n",  # 9 empty premise
        "a,Again.,Duplicate id.,neutral\n",  # 10 duplicate id
        "g,Fine.,Still fine.,unsure\n",  # 11 a gold value in no scheme: kept
        "h,Last.,Good.,contradiction",  # 12 good, no final newline
    ]
    path = write_lines(tmp_path / "mixed.csv", lines)
    items = read_all(path)
    assert [(p.row, p.line, p.pair_id, p.premise) for p in items if isinstance(p, InputPair)] == [
        (1, 2, "a", "A dog runs."),
        (3, 4, "c", "A quoted\npremise, with a comma"),
        (8, 11, "g", "Fine."),
        (9, 12, "h", "Last."),
    ]
    assert rejects(items) == [
        (3, RejectReason.MALFORMED_ROW, None),
        (7, RejectReason.MALFORMED_ROW, None),
        (8, RejectReason.MALFORMED_ENCODING, None),
        (9, RejectReason.EMPTY_SENTENCE, "premise"),
        (10, RejectReason.DUPLICATE_ID, "id"),
    ]
    assert len(items) == 9  # data rows: 11 lines after the header, one blank, one row over two lines
    assert items[1].raw == "b,Too few fields"
    assert "2 csv fields, the header has 4" in items[1].message


def test_csv_error_becomes_a_malformed_row(tmp_path: Path):
    """A field past csv's own size limit (a bare CR, which csv also refused, now ends a line)."""
    path = write_lines(tmp_path / "big.csv", ["premise,hypothesis\n", "A" * 200_000 + ",C\n", "D,E\n"])
    items = read_all(path)
    assert rejects(items) == [(2, RejectReason.MALFORMED_ROW, None)]
    assert summary(items) == [(2, "2", "D", "E", None)]


def test_csv_header_with_byte_order_mark(tmp_path: Path):
    path = write_lines(tmp_path / "bom.csv", [b"\xef\xbb\xbfid,premise,hypothesis\n", "x,P.,H.\n"])
    assert summary(read_all(path)) == [(1, "x", "P.", "H.", None)]


def test_tsv_has_no_quoting(tmp_path: Path):
    path = write_lines(tmp_path / "quotes.tsv", ["premise\thypothesis\n", 'He said "stop.\tA "word".\n', "B.\tC.\n"])
    assert summary(read_all(path)) == [(1, "1", 'He said "stop.', 'A "word".', None), (2, "2", "B.", "C.", None)]


def test_parquet_rejects_and_raw_rows(tmp_path: Path):
    table = pa.table(
        {
            "id": [1, 2, 3, 1],
            "premise": ["A.", None, "C.", "D."],
            "hypothesis": ["B.", "X.", " ", "E."],
            "extra": [[1], [2], [3], [4]],
        }
    )
    path = tmp_path / "rows.parquet"
    pq.write_table(table, path)
    items = read_all(path)
    assert summary(items) == [(1, "1", "A.", "B.", None)]
    assert rejects(items) == [
        (2, RejectReason.MISSING_FIELD, "premise"),
        (3, RejectReason.EMPTY_SENTENCE, "hypothesis"),
        (4, RejectReason.DUPLICATE_ID, "id"),
    ]
    assert json.loads(items[1].raw) == {"premise": None, "hypothesis": "X.", "id": 2}


def test_parquet_non_string_sentence_column_is_invalid(tmp_path: Path):
    path = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"premise": [1.5], "hypothesis": ["H."]}), path)
    assert rejects(read_all(path)) == [(1, RejectReason.INVALID_FIELD, "premise")]


def test_a_bad_first_jsonl_line_does_not_hide_the_columns(tmp_path: Path):
    path = write_lines(tmp_path / "late.jsonl", ["not json\n", good("a")])
    items = read_all(path)
    assert rejects(items) == [(1, RejectReason.MALFORMED_JSON, None)]
    assert summary(items) == [(2, "a", "A dog runs.", "An animal moves.", "entailment")]


# --------------------------------------------------------------------------- whole-file errors


@pytest.mark.parametrize("name", ["absent.csv", "absent.jsonl", "absent.parquet"])
def test_missing_file_raises_when_called(tmp_path: Path, name: str):
    with pytest.raises(SpinnError, match=r"absent\.\w+: no such file"):
        read_input_pairs(tmp_path / name)  # not iterated: the check is eager


def test_missing_premise_column_names_the_file_and_its_columns(tmp_path: Path):
    path = write_csv(tmp_path / "cols.csv", [("a", "b", "c")], header=("text_a", "hypothesis", "gold"))
    with pytest.raises(SpinnError) as raised:
        read_input_pairs(path)
    message = str(raised.value)
    assert str(path) in message
    assert "'premise' or 'sentence1'" in message
    assert "'text_a', 'hypothesis', 'gold'" in message


def test_missing_hypothesis_key_in_every_json_object(tmp_path: Path):
    path = write_jsonl(tmp_path / "cols.jsonl", [{"premise": "A."}, {"premise": "B.", "note": 1}])
    with pytest.raises(SpinnError, match=r"no hypothesis column .*'premise', 'note'"):
        read_input_pairs(path)


def test_custom_premise_column_absent(tmp_path: Path):
    path = write_parquet(tmp_path / "cols.parquet", ROWS)
    with pytest.raises(SpinnError, match=r"no premise column \(looked for 'text'\); the file has 'id', 'premise'"):
        read_input_pairs(path, Columns(premise="text"))


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("broken.parquet", b"not parquet at all", "not a readable Parquet file"),
        ("empty.csv", b"", "empty file"),
        ("dupes.csv", b"premise,premise,hypothesis\n", "more than once"),
    ],
)
def test_unreadable_files(tmp_path: Path, name: str, content: bytes, problem: str):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(SpinnError, match=problem):
        read_input_pairs(path)


def test_unknown_format_of_an_existing_file(tmp_path: Path):
    path = tmp_path / "pairs.xlsx"
    path.write_bytes(b"")
    with pytest.raises(SpinnError, match=r"pairs\.xlsx: cannot tell the format"):
        read_input_pairs(path)
