"""Reading new sentence-pair corpora (no parses) from CSV, TSV, JSON lines or Parquet.

A corpus to label with a trained model arrives as plain sentence pairs, in
whatever shape the tool that made it writes: a spreadsheet export, a TSV dump,
JSON lines, Parquet from a data frame. This module turns any of them into one
stream, in file order, with one item per data row: an `InputPair`, or a
`Reject` that names the file, line, field and reason. A bad row never stops the
good ones and is never silently lost, so pairs + rejects always add up to the
rows read. Each row keeps a stable 1-based number, the unit that labelling
shards on, and the physical line a person can open the file at.

Reading streams: memory stays flat apart from the set of ids already seen
(needed to refuse duplicates). Problems with the whole file (missing, not
readable, no premise or hypothesis column) raise `SpinnError` as soon as
`read_input_pairs` is called, before any row is read.

No parser runs here, and no tokenizer: `spinn.trees.tokenize` cuts the
sentences into SNLI's tokens where they are labelled.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, get_args

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import AfterValidator, Field

from spinn.data.column_sidecar import over_sidecar
from spinn.data.label_schemes import NO_GOLD, checked_scheme
from spinn.data.limits import TEXT_MAX_TOKENS, check_length, max_chars, max_line_bytes, too_long_line
from spinn.data.rejects import RecordProblem, Reject, RejectReason, not_text, reject_pair_id
from spinn.data.schema import NO_CONSENSUS_LABEL
from spinn.data.text_lines import NUL, READ_ERRORS, Line, open_bytes, text_lines
from spinn.ground.errors import SpinnError
from spinn.ground.paths import refuse_special_file
from spinn.ground.settings import Settings

Format = Literal["csv", "tsv", "jsonl", "parquet"]
FORMATS: tuple[str, ...] = get_args(Format)
SUFFIX_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
}
TEXT_FORMATS = ("csv", "tsv", "jsonl")  # the formats that may also come gzipped
GZIP_SUFFIX = ".gz"
PARQUET_MAGIC = b"PAR1"
WIDE_TEXT_BOMS = {
    b"\xff\xfe\x00\x00": "UTF-32",
    b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe": "UTF-16",
    b"\xfe\xff": "UTF-16",
}
"""Byte order marks of the wide encodings a spreadsheet may save as "Unicode text" (longest first)."""
SNIFF_BYTES = 4096
"""How much of a text file is looked at to tell its kind: enough to hold several rows of any export."""
WIDE_TEXT_NUL_SHARE = 4
"""Text whose sniffed start is a quarter NUL bytes or more is UTF-16 (about half NULs for Latin text) or
UTF-32 (three quarters), read without its BOM; a few NULs in UTF-8 text are bad bytes of their rows."""

PREMISE_COLUMNS = ("premise", "sentence1", "sentence_A")
HYPOTHESIS_COLUMNS = ("hypothesis", "sentence2", "sentence_B")
ID_COLUMNS = ("id", "pair_id", "pairID", "pair_ID", "index")  # index: GLUE's TSV files
LABEL_COLUMNS = ("label", "gold_label", "gold", "entailment_label", "entailment_judgment")  # the last three: SICK
SCHEME_CLI = {"cli": "--label-scheme"}

# CSV follows RFC 4180 (quoted fields may hold delimiters, quotes and newlines).
# TSV has no quoting at all, as in SNLI, MultiNLI and GLUE: a `"` is just a character.
DIALECTS: dict[str, dict[str, Any]] = {
    "csv": {"delimiter": ","},
    "tsv": {"delimiter": "\t", "quoting": csv.QUOTE_NONE},
}
JSONL_KEY_SAMPLE_ROWS = 1_000
"""JSON lines have no header: the keys of this many leading objects stand in for one."""
PARQUET_BATCH_ROWS = 8_192


class Columns(Settings):
    """Which columns hold the pair; None picks the first conventional name the file has."""

    premise: str | None = Field(None, json_schema_extra={"cli": "--premise-column"})
    """The premise column (default: premise, else sentence1)."""
    hypothesis: str | None = Field(None, json_schema_extra={"cli": "--hypothesis-column"})
    """The hypothesis column (default: hypothesis, else sentence2)."""
    id: str | None = Field(None, json_schema_extra={"cli": "--id-column"})
    """The pair id column (default: id, pair_id or pairID when present, else the row number)."""
    label: str | None = Field(None, json_schema_extra={"cli": "--label-column"})
    """Gold labels, optional (default: label, gold_label, gold, entailment_label or entailment_judgment; none)."""
    label_scheme: Annotated[str | None, AfterValidator(checked_scheme)] = Field(None, json_schema_extra=SCHEME_CLI)
    """Gold classes: auto (found from the values), three-way, glue, hans, scitail, or the file's own in the model's
    order (yes/no: entailment, the rest; 0/1/2). A value outside it is warned of, and its pair labelled."""


@dataclass(frozen=True)
class InputPair:
    """One valid sentence pair as read, before any parsing or tokenizing."""

    row: int  # 1-based data row (header and blank lines excluded), stable across reruns: the unit of sharding
    line: int  # physical line where the row starts in a text file (header counted); for parquet, equal to row
    pair_id: str
    premise: str
    hypothesis: str
    label: str | None  # the gold value as given, lower case (any scheme), or None (no label column, empty, "-")


class _Row(NamedTuple):
    """One data row as read, before validation: its values, or the problem reading it."""

    row: int
    line: int
    raw: str
    values: Mapping[str, Any] | RecordProblem


@dataclass(frozen=True)
class _Reader:
    available: Callable[[Path, int], list[str]]  # the file's column names (a text line at most so many bytes)
    rows: Callable[[Path, Columns, int], Iterator[_Row]]


# --------------------------------------------------------------------------- public entry points


def readable_suffixes() -> tuple[str, ...]:
    """Every file-name ending `detect_format` accepts (lower case; names are matched case-blind):
    each suffix in SUFFIX_FORMATS, and the gzipped forms of the text ones.

    Tools that pick files up by name (the label-pairs inbox) take this list, so
    they read exactly what the readers can, no more and no less.
    """
    gzipped = (suffix + GZIP_SUFFIX for suffix, fmt in SUFFIX_FORMATS.items() if fmt in TEXT_FORMATS)
    return (*SUFFIX_FORMATS, *gzipped)


def detect_format(path: Path, fmt: str | None = None) -> str:
    """The format named by `fmt`, else the one the file name's suffix implies (`.gz` allowed for text)."""
    if fmt is not None:
        if fmt.lower() not in FORMATS:
            raise SpinnError(f"{path}: unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
        return fmt.lower()
    name = Path(path).name.lower()
    stem = name.removesuffix(GZIP_SUFFIX)
    detected = SUFFIX_FORMATS.get(Path(stem).suffix)
    if detected is None or (stem != name and detected not in TEXT_FORMATS):
        raise SpinnError(
            f"{path}: cannot tell the format from the file name; expected a suffix among "
            f"{', '.join(SUFFIX_FORMATS)} ({GZIP_SUFFIX} allowed for text), or name one of {', '.join(FORMATS)}"
        )
    return detected


def read_input_pairs(
    path: Path, columns: Columns | None = None, fmt: str | None = None, *, max_tokens: int = TEXT_MAX_TOKENS
) -> Iterator[InputPair | Reject]:
    """One `InputPair` or `Reject` per data row, in file order; whole-file problems raise SpinnError now.
    A sentence longer than `max_tokens` allows in characters is rejected as too_long, before any tokenizer, and
    so is a line longer than a line may be (spinn.data.limits.max_line_bytes), before it is read whole."""
    path = refuse_special_file(Path(path))
    if not path.is_file():
        raise SpinnError(f"{path}: no such file")
    columns = over_sidecar(path, columns or Columns())
    detected = detect_format(path, fmt)
    _check_content(path, detected)
    reader, line_bytes = _READERS[detected], max_line_bytes(max_tokens)
    resolved = resolve_columns(reader.available(path, line_bytes), columns, path)
    return _validated(path, resolved, reader.rows(path, resolved, line_bytes), max_chars(max_tokens))


def resolve_columns(available: Sequence[str], columns: Columns, path: Path) -> Columns:
    """The concrete column names; in the result, a None id or label means the file has none."""
    names = list(available)
    return Columns(
        premise=_find_column(names, columns.premise, PREMISE_COLUMNS, "premise", path, required=True),
        hypothesis=_find_column(names, columns.hypothesis, HYPOTHESIS_COLUMNS, "hypothesis", path, required=True),
        id=_find_column(names, columns.id, ID_COLUMNS, "id", path, required=False),
        label=_find_column(names, columns.label, LABEL_COLUMNS, "label", path, required=False),
        label_scheme=columns.label_scheme,
    )


def _find_column(
    available: list[str], given: str | None, conventional: tuple[str, ...], role: str, path: Path, required: bool
) -> str | None:
    """The column for one role; a column named explicitly must exist, as must a required one; an optional one
    named `none` is none (--label-column none: the gold labels ignored)."""
    if given == NO_GOLD and not required:
        return None
    looked_for = (given,) if given is not None else conventional
    found = next((name for name in looked_for if name in available), None)
    if found is None and (required or given is not None):
        raise SpinnError(
            f"{path}: no {role} column (looked for {' or '.join(map(repr, looked_for))}); "
            f"the file has {', '.join(map(repr, available)) or 'no columns'}"
        )
    return found


def _check_content(path: Path, fmt: str) -> None:
    """Refuse a file whose bytes are not what its name says: Parquet named .csv, or text in UTF-16 or
    UTF-32 (a spreadsheet's "Unicode text"), which the text readers would take apart byte by byte and
    reject row by row, or fail on with csv's unrelated hint about newline modes."""
    if fmt not in TEXT_FORMATS:
        return
    try:
        with open_bytes(path) as stream:
            start = stream.read(SNIFF_BYTES)
    except READ_ERRORS as error:
        raise SpinnError(f"{path}: cannot read: {error}") from None
    if start.startswith(PARQUET_MAGIC):
        raise SpinnError(f"{path}: is a Parquet file, not {fmt}; name it .parquet")
    encoding = next((name for bom, name in WIDE_TEXT_BOMS.items() if start.startswith(bom)), None)
    if encoding is not None:
        raise SpinnError(f"{path}: is {encoding} text; save it as UTF-8")
    if start.count(NUL) * WIDE_TEXT_NUL_SHARE >= len(start) > 0:  # a stray NUL spoils its own row only
        raise SpinnError(f"{path}: holds NUL bytes: UTF-16 or UTF-32 text without a BOM, or no text; save it as UTF-8")


# --------------------------------------------------------------------------- validating rows


def _validated(path: Path, columns: Columns, rows: Iterator[_Row], limit: int) -> Iterator[InputPair | Reject]:
    seen: set[str] = set()
    for row in rows:
        yield _pair_or_reject(path, columns, row, seen, limit)


def _pair_or_reject(path: Path, columns: Columns, row: _Row, seen: set[str], limit: int) -> InputPair | Reject:
    """Validate one row; the first problem found becomes its Reject. Only kept pairs claim their id."""
    try:
        if isinstance(row.values, RecordProblem):
            raise row.values
        premise = _sentence(row.values, columns.premise, limit)
        hypothesis = _sentence(row.values, columns.hypothesis, limit)
        label = _label(row.values, columns.label)
        pair_id = _pair_id(row.values, columns.id, row.row)
        if pair_id in seen:
            raise RecordProblem(RejectReason.DUPLICATE_ID, columns.id, f"id {pair_id!r} was seen earlier in the file")
    except RecordProblem as problem:
        return Reject.of(problem, str(path), row.line, row.raw, reject_pair_id(row.values, columns.id, row.row))
    seen.add(pair_id)
    return InputPair(row.row, row.line, pair_id, premise, hypothesis, label)


def _present(values: Mapping[str, Any], column: str) -> Any:
    value = values.get(column)
    if value is None:
        raise RecordProblem(RejectReason.MISSING_FIELD, column, f"field {column!r} is missing")
    return value


def _invalid(column: str, value: Any, expected: str) -> RecordProblem:
    return RecordProblem(
        RejectReason.INVALID_FIELD, column, f"field {column!r} is a {type(value).__name__}, expected {expected}"
    )


def _sentence(values: Mapping[str, Any], column: str, limit: int) -> str:
    value = _present(values, column)
    if not isinstance(value, str):
        raise not_text(column, value)
    check_length(value, column, limit)
    sentence = value.strip()
    if not sentence:
        raise RecordProblem(RejectReason.EMPTY_SENTENCE, column, f"field {column!r} is empty")
    return sentence


def _label(values: Mapping[str, Any], column: str | None) -> str | None:
    """The gold value, lower case, in any scheme (spinn.data.label_schemes scores it), never a reason to reject
    the row; empty and "-" (no consensus) mean unlabelled."""
    value = values.get(column) if column is not None else None
    if value is None or isinstance(value, bool | dict | list):
        return None
    label = str(value).strip().lower()
    return None if label in ("", NO_CONSENSUS_LABEL) else label


def _pair_id(values: Mapping[str, Any], column: str | None, row: int) -> str:
    if column is None:
        return str(row)
    value = _present(values, column)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _invalid(column, value, "a string or an integer")
    pair_id = str(value).strip()
    if not pair_id:
        raise RecordProblem(RejectReason.MISSING_FIELD, column, f"field {column!r} is empty")
    return pair_id


# --------------------------------------------------------------------------- csv and tsv


class LineFeed:
    """Feeds lines to csv.reader and keeps those it took, so each row knows its lines."""

    def __init__(self, lines: Iterator[Line]):
        self._lines = lines
        self.taken: list[Line] = []
        self.count = 0

    def __iter__(self) -> LineFeed:
        return self

    def __next__(self) -> str:
        line = next(self._lines)
        self.taken.append(line)
        self.count = line.number
        return "\n" if line.overlong else line.text  # an excerpt is no row: the csv reader sees a blank line

    def take(self) -> list[Line]:
        taken, self.taken = self.taken, []
        return taken


@contextmanager
def _delimited(path: Path, fmt: str, line_bytes: int) -> Iterator[tuple[Iterator[list[str]], LineFeed, list[str]]]:
    """An open csv reader past the header, its line feed, and the header."""
    with open_bytes(path) as stream:
        feed = LineFeed(text_lines(stream, path, line_bytes))
        reader = csv.reader(feed, **DIALECTS[fmt])
        yield reader, feed, _header(reader, feed, path)


def _header(reader: Iterator[list[str]], feed: LineFeed, path: Path) -> list[str]:
    try:
        header = next(reader, None)
    except csv.Error as error:
        raise SpinnError(f"{path}: unreadable header row: {error}") from None
    lines = feed.take()
    overlong = next((line.overlong for line in lines if line.overlong), None)
    if overlong:
        raise SpinnError(f"{path}: line 1: {too_long_line(overlong.chars, overlong.limit)}; expected a header row")
    if not header:
        raise SpinnError(f"{path}: empty file; expected a header row naming the columns")
    if any(line.encoding_error for line in lines):
        raise SpinnError(f"{path}: the header row is not UTF-8")
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise SpinnError(f"{path}: the header names {', '.join(map(repr, duplicates))} more than once")
    return header


def _delimited_columns(path: Path, line_bytes: int, fmt: str) -> list[str]:
    with _delimited(path, fmt, line_bytes) as (_, _, header):
        return header


def _delimited_rows(path: Path, columns: Columns, line_bytes: int, fmt: str) -> Iterator[_Row]:
    """Data rows; blank lines are not rows. A quoted field may span lines: the row's line is its first."""
    del columns  # every field of a row is read anyway
    with _delimited(path, fmt, line_bytes) as (reader, feed, header):
        row = 0
        while True:
            start = feed.count + 1
            try:
                fields: list[str] | csv.Error = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                fields = error
            lines = feed.take()
            raw = "".join(line.text for line in lines).rstrip("\r\n")
            if raw.strip() or any(line.overlong for line in lines):
                row += 1
                yield _Row(row, start, raw, _delimited_values(fields, header, lines, fmt))


def _delimited_values(
    fields: list[str] | csv.Error, header: list[str], lines: list[Line], fmt: str
) -> Mapping[str, str] | RecordProblem:
    overlong = [line.overlong for line in lines if line.overlong]
    if overlong:  # the row's length: its over-long lines' and the others'
        chars = sum(part.chars for part in overlong) + sum(len(line.text) for line in lines if not line.overlong)
        return too_long_line(chars, overlong[0].limit)
    encoding_error = next((line.encoding_error for line in lines if line.encoding_error), None)
    if encoding_error:
        return RecordProblem(RejectReason.MALFORMED_ENCODING, None, encoding_error)
    if isinstance(fields, csv.Error):
        return RecordProblem(RejectReason.MALFORMED_ROW, None, f"malformed {fmt} row: {fields}")
    if len(fields) != len(header):
        return RecordProblem(
            RejectReason.MALFORMED_ROW, None, f"{len(fields)} {fmt} fields, the header has {len(header)}"
        )
    return dict(zip(header, fields, strict=True))


# --------------------------------------------------------------------------- json lines


def _jsonl_records(path: Path, line_bytes: int) -> Iterator[tuple[Line, dict[str, Any] | RecordProblem]]:
    """Each non-blank line with its JSON object or the problem reading it."""
    with open_bytes(path) as stream:
        for line in text_lines(stream, path, line_bytes):
            if line.overlong or line.text.strip():
                yield line, _json_object(line)


def _json_object(line: Line) -> dict[str, Any] | RecordProblem:
    if line.overlong:
        return too_long_line(line.overlong.chars, line.overlong.limit)
    if line.encoding_error:
        return RecordProblem(RejectReason.MALFORMED_ENCODING, None, line.encoding_error)
    try:
        value = json.loads(line.text)
    except json.JSONDecodeError as error:
        return RecordProblem(RejectReason.MALFORMED_JSON, None, f"malformed JSON: {error.msg} at column {error.colno}")
    if not isinstance(value, dict):
        return RecordProblem(RejectReason.MALFORMED_JSON, None, f"a JSON {type(value).__name__}, expected an object")
    return value


def _jsonl_columns(path: Path, line_bytes: int) -> list[str]:
    """The keys of the leading objects, in first-seen order: one bad first line must not hide the columns."""
    keys: dict[str, None] = {}
    sampled = 0
    for _, value in _jsonl_records(path, line_bytes):
        if isinstance(value, dict):
            keys.update(dict.fromkeys(value))
            sampled += 1
            if sampled == JSONL_KEY_SAMPLE_ROWS:
                break
    return list(keys)


def _jsonl_rows(path: Path, columns: Columns, line_bytes: int) -> Iterator[_Row]:
    del columns  # a JSON line is parsed whole
    for row, (line, value) in enumerate(_jsonl_records(path, line_bytes), start=1):
        yield _Row(row, line.number, line.text.rstrip("\r\n"), value)


# --------------------------------------------------------------------------- parquet


@contextmanager
def _parquet_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except (pa.ArrowException, OSError) as error:
        raise SpinnError(f"{path}: not a readable Parquet file ({error})") from None


def _parquet_columns(path: Path, _line_bytes: int) -> list[str]:
    with _parquet_errors(path):
        return pq.read_schema(path).names


def _parquet_rows(path: Path, columns: Columns, _line_bytes: int) -> Iterator[_Row]:
    """Rows in record batches, reading only the columns in use; `raw` is the row as JSON."""
    needed = list(
        dict.fromkeys(
            name for name in (columns.premise, columns.hypothesis, columns.id, columns.label) if name is not None
        )
    )
    row = 0
    with _parquet_errors(path):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=needed):
            for values in batch.to_pylist():
                row += 1
                yield _Row(row, row, json.dumps(values, ensure_ascii=False, default=str), values)


_READERS = {
    "csv": _Reader(partial(_delimited_columns, fmt="csv"), partial(_delimited_rows, fmt="csv")),
    "tsv": _Reader(partial(_delimited_columns, fmt="tsv"), partial(_delimited_rows, fmt="tsv")),
    "jsonl": _Reader(_jsonl_columns, _jsonl_rows),
    "parquet": _Reader(_parquet_columns, _parquet_rows),
}
