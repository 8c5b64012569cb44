"""Reading NLI corpora in SNLI / MultiNLI format, one validated pair per line.

Both corpora ship the same fields as JSON lines (`.jsonl`) and as tab-separated
text with a header (`.txt`), plain, gzipped, or inside the official zip. Each
line becomes either a `Pair` (tokens and shift/reduce transitions for both
sentences) or a `Reject` that says which line and field failed and why, so a
bad line never stops the good ones and is never silently lost.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, Any

from spinn.data.limits import (
    DEFAULT_MAX_TOKENS,
    PARSE_CHARS_PER_CHAR,
    Inflation,
    check_length,
    check_members,
    max_chars,
    max_line_bytes,
    too_long_line,
)
from spinn.data.rejects import RecordProblem, RejectReason, not_text
from spinn.data.schema import LABELS, NO_CONSENSUS_LABEL
from spinn.data.text_lines import Overlong, bounded_lines
from spinn.ground.errors import SpinnError
from spinn.ground.paths import refuse_special_file
from spinn.trees.binarize import binarize
from spinn.trees.transitions import read_binary_parse, tree_to_transitions
from spinn.trees.tree import CLOSE, OPEN, TreeError, parse_ptb

LABEL_FIELD = "gold_label"
ID_FIELD = "pairID"
SENTENCES = ("sentence1", "sentence2")
BINARY_SUFFIX = "_binary_parse"
NARY_SUFFIX = "_parse"
TSV_SEPARATOR = "\t"
GZIP_SUFFIX = ".gz"
JSONL_SUFFIXES = (".jsonl", ".json")
TEXT_SUFFIXES = (".txt", ".tsv")
_VALID_LABELS = frozenset(LABELS)
_PTB_LEAF = re.compile(r"([^\s()]+)\)")


class TreeSource(str, Enum):
    """Which bracketing a sentence's tree comes from."""

    AUTO = "auto"  # the binary parse when present, else the binarized n-ary parse
    BINARY = "binary"
    NARY = "nary"


@dataclass(frozen=True, slots=True)
class Pair:
    pair_id: str
    label: str
    premise: str
    hypothesis: str
    premise_tokens: list[str]
    hypothesis_tokens: list[str]
    premise_transitions: list[int]
    hypothesis_transitions: list[int]
    source_line: int


@dataclass(frozen=True, slots=True)
class Skip:
    """A well-formed line deliberately left out (gold label `-`: no annotator consensus)."""

    line: int


# --------------------------------------------------------------------------- reading lines


@contextmanager
def open_corpus(path: Path, member: str | None = None) -> Iterator[tuple[IO[bytes], str]]:
    """Open a corpus file as bytes, and say its logical name (`.gz` and zip members unwrapped).

    Damaged gzip data shows only as the block reads it, so the block runs
    inside this context: such an error becomes one line naming the file."""
    path = Path(path)
    if not path.exists():
        raise SpinnError(f"{path}: no such file")
    if path.is_dir():
        raise SpinnError(f"{path}: is a folder, not a corpus file")
    refuse_special_file(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            name = _zip_member(archive, path, member)
            info = archive.getinfo(name)
            check_members(path, [info])
            with archive.open(name) as stream, _gzip_errors(path, name):
                yield _maybe_gunzip(stream, f"{path}:{name}", info.file_size), name
        return
    if member is not None:
        raise SpinnError(f"{path}: a member {member!r} was named but the file is not a zip archive")
    with open(path, "rb") as stream, _gzip_errors(path, path.name):
        yield _maybe_gunzip(stream, str(path), path.stat().st_size), path.name


def _maybe_gunzip(stream: IO[bytes], name: str, size: int) -> IO[bytes]:
    """A `.gz` stream unpacked, only so far (Inflation: `size` is its compressed bytes); others as they are."""
    return Inflation(gzip.GzipFile(fileobj=stream), Path(name), size) if name.endswith(GZIP_SUFFIX) else stream


@contextmanager
def _gzip_errors(path: Path, name: str) -> Iterator[None]:
    """gzip's errors while the block reads a `.gz` stream, as one line: BadGzipFile and zlib.error for
    damaged data, EOFError for a cut-off file (which click would report as a bare "Aborted!")."""
    if not name.endswith(GZIP_SUFFIX):
        yield
        return
    try:
        yield
    except (gzip.BadGzipFile, zlib.error) as error:
        raise SpinnError(f"{path}: damaged gzip data ({error})") from None
    except EOFError:
        raise SpinnError(f"{path}: the gzip data ends early (a truncated file?)") from None


def _zip_member(archive: zipfile.ZipFile, path: Path, member: str | None) -> str:
    """The member to read: the one named (a full path or a unique file name), else the only data file."""
    names = [name for name in archive.namelist() if not name.endswith("/") and "__MACOSX" not in name]
    if member is not None:
        matches = [name for name in names if name == member or name.rsplit("/", 1)[-1] == member]
        if len(matches) != 1:
            raise SpinnError(f"{path}: member {member!r} {'is ambiguous' if matches else 'not found'}")
        return matches[0]
    data = [name for name in names if _corpus_format(name) is not None]
    if len(data) != 1:
        raise SpinnError(f"{path}: archive holds {len(data)} corpus files; name the member to read")
    return data[0]


def _corpus_format(name: str) -> str | None:
    stem = name.removesuffix(GZIP_SUFFIX)
    if stem.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if stem.endswith(TEXT_SUFFIXES):
        return "txt"
    return None


@dataclass(frozen=True)
class LineFormat:
    """How to read one line: JSON, or tab-separated values under the file's header."""

    header: tuple[str, ...] | None  # None for JSON lines


def corpus_lines(
    stream: IO[bytes], name: str, max_tokens: int = DEFAULT_MAX_TOKENS
) -> tuple[LineFormat, Iterator[tuple[int, bytes | Overlong]]]:
    """The file's line format and its data lines as (1-based line number, raw bytes), a line longer than a
    line may be at `max_tokens` (max_line_bytes) as its Overlong, never read whole.

    Lines stay undecoded so that decoding and parsing, the costly part, can run
    in worker processes; a `.txt` file's header is read here, once.
    """
    corpus_format = _corpus_format(name)
    if corpus_format is None:
        raise SpinnError(f"{name}: unknown corpus format; expected .jsonl or .txt (optionally .gz)")
    lines = _without_bom(enumerate(bounded_lines(stream, max_line_bytes(max_tokens), bare_cr=False), start=1))
    if corpus_format == "jsonl":
        return LineFormat(None), lines
    first = next(lines, None)
    if first is not None and isinstance(first[1], Overlong):
        raise SpinnError(f"{name}: line 1: {too_long_line(first[1].chars, first[1].limit)}; expected a header")
    header = first[1].decode("utf-8", errors="replace").rstrip("\r\n").split(TSV_SEPARATOR) if first else []
    return LineFormat(tuple(header)), lines


def _without_bom(lines: Iterator[tuple[int, bytes | Overlong]]) -> Iterator[tuple[int, bytes | Overlong]]:
    """The lines with a UTF-8 byte order mark taken off the first (an editor's "UTF-8 with BOM"), so that
    first row, valid, is kept as the other readers keep it."""
    for number, raw in lines:
        yield number, raw.removeprefix(codecs.BOM_UTF8) if number == 1 and isinstance(raw, bytes) else raw


def read_record(raw: bytes | Overlong, line_format: LineFormat) -> tuple[str, dict[str, Any] | RecordProblem] | None:
    """(the line as text, its record or the problem reading it); None for a blank line."""
    if isinstance(raw, Overlong):
        return raw.excerpt(), too_long_line(raw.chars, raw.limit)
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as error:
        shown = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        return shown, RecordProblem(RejectReason.MALFORMED_ENCODING, None, f"not UTF-8: {error.reason}")
    if not text.strip():
        return None
    if line_format.header is None:
        return text, _json_record(text)
    return text, _tsv_record(text, line_format.header)


def iter_records(stream: IO[bytes], name: str) -> Iterator[tuple[int, str, dict[str, Any] | RecordProblem]]:
    """Yield (line number, raw text, record or the problem reading it) for each non-blank line; a line longer
    than the default token limit allows is a too_long problem, never read whole."""
    line_format, lines = corpus_lines(stream, name)
    for number, raw in lines:
        read = read_record(raw, line_format)
        if read is not None:
            yield number, read[0], read[1]


def _json_record(text: str) -> dict[str, Any] | RecordProblem:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        return RecordProblem(RejectReason.MALFORMED_JSON, None, f"malformed JSON: {error.msg} at column {error.colno}")
    if not isinstance(record, dict):
        return RecordProblem(RejectReason.MALFORMED_JSON, None, f"a JSON {type(record).__name__}, expected an object")
    return record


def _tsv_record(text: str, header: tuple[str, ...]) -> dict[str, Any] | RecordProblem:
    values = text.split(TSV_SEPARATOR)
    if len(values) != len(header):
        return RecordProblem(
            RejectReason.MALFORMED_ROW, None, f"{len(values)} tab-separated columns, header has {len(header)}"
        )
    return {key: value for key, value in zip(header, values, strict=True) if value not in ("", "n/a")}


# --------------------------------------------------------------------------- records to pairs


def pair_from_record(
    record: dict[str, Any], line: int, trees: TreeSource, max_tokens: int = DEFAULT_MAX_TOKENS
) -> Pair | Skip:
    """Validate one record and build its pair; raise RecordProblem naming the field at fault. A sentence
    longer than `max_tokens` allows in characters is too_long before its tree is read."""
    label = _required_text(record, LABEL_FIELD)
    if label == NO_CONSENSUS_LABEL:
        return Skip(line)
    if label not in _VALID_LABELS:
        raise RecordProblem(
            RejectReason.UNKNOWN_LABEL,
            LABEL_FIELD,
            f"unknown label {label!r}; expected one of {', '.join(LABELS)} or '-'",
        )
    pair_id = _required_text(record, ID_FIELD)
    premise, hypothesis = (_required_text(record, field) for field in SENTENCES)
    for field, text in zip(SENTENCES, (premise, hypothesis), strict=True):
        check_length(text, field, max_chars(max_tokens))
    premise_tokens, premise_transitions = sentence_transitions(record, SENTENCES[0], trees, max_tokens)
    hypothesis_tokens, hypothesis_transitions = sentence_transitions(record, SENTENCES[1], trees, max_tokens)
    return Pair(
        pair_id,
        label,
        premise,
        hypothesis,
        premise_tokens,
        hypothesis_tokens,
        premise_transitions,
        hypothesis_transitions,
        line,
    )


def _required_text(record: dict[str, Any], field: str) -> str:
    value = record.get(field)
    if value is None or value == "":
        raise RecordProblem(RejectReason.MISSING_FIELD, field, f"field {field!r} is missing")
    if not isinstance(value, str):
        raise not_text(field, value)
    return value


def sentence_transitions(
    record: dict[str, Any], sentence: str, trees: TreeSource, max_tokens: int = DEFAULT_MAX_TOKENS
) -> tuple[list[str], list[int]]:
    """Tokens and transitions of one sentence, from the bracketing `trees` selects.

    When the record carries both bracketings, their words must agree: a parse
    whose leaves differ from its twin's is a sign of a broken line.
    """
    binary_field, nary_field = sentence + BINARY_SUFFIX, sentence + NARY_SUFFIX
    binary, nary = record.get(binary_field), record.get(nary_field)
    use_binary = trees is TreeSource.BINARY or (trees is TreeSource.AUTO and binary)
    field = binary_field if use_binary else nary_field
    text = binary if use_binary else nary
    if not text:
        raise RecordProblem(RejectReason.MISSING_FIELD, field, f"field {field!r} is missing")
    if not isinstance(text, str):
        raise not_text(field, text)
    check_length(text, field, max_chars(max_tokens) * PARSE_CHARS_PER_CHAR)
    tokens, transitions = _read_tree(text, field, binary=bool(use_binary))
    twin_field, twin = (nary_field, nary) if use_binary else (binary_field, binary)
    if isinstance(twin, str) and twin:
        _check_leaves(tokens, field, twin, twin_field, twin_is_binary=not use_binary)
    return tokens, transitions


def _read_tree(text: str, field: str, binary: bool) -> tuple[list[str], list[int]]:
    try:
        if binary:
            return read_binary_parse(text)
        tree = parse_ptb(text)
        return tree.leaves(), [int(transition) for transition in tree_to_transitions(binarize(tree))]
    except TreeError as error:
        raise RecordProblem(RejectReason(error.problem.value), field, f"{field}: {error}") from None


def _check_leaves(tokens: list[str], field: str, twin: str, twin_field: str, twin_is_binary: bool) -> None:
    twin_tokens = [t for t in twin.split() if t not in (OPEN, CLOSE)] if twin_is_binary else _PTB_LEAF.findall(twin)
    if twin_tokens != tokens:
        detail = (
            f"{len(tokens)} leaves but {twin_field} has {len(twin_tokens)}"
            if len(twin_tokens) != len(tokens)
            else f"leaf {_first_difference(tokens, twin_tokens)} differs from {twin_field}"
        )
        raise RecordProblem(RejectReason.LEAF_MISMATCH, field, f"{field}: {detail}")


def _first_difference(left: list[str], right: list[str]) -> str:
    index = next(i for i, (a, b) in enumerate(zip(left, right, strict=False)) if a != b)
    return f"{index + 1} ({left[index]!r} vs {right[index]!r})"
