"""Why an input row was not used: the reasons, the record that says so, and the exception that carries one.

Every reader (SNLI-format corpora, new sentence pairs, the parser) turns a bad
row into a `Reject` naming the file, line, pair id, field and reason, written
to a rejects file beside the output while the good rows go on; nothing is
dropped silently. The reason values are what users find in those files. The
pair id is a top-level field of every record (null when the row has none), so
rejects join back to the input and to the outputs' `pair_id` column (`jq
.pair_id`) without parsing the raw line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class RejectReason(str, Enum):
    """Why a line was not turned into a pair; the values appear in rejects files."""

    MALFORMED_ENCODING = "malformed_encoding"
    MALFORMED_JSON = "malformed_json"
    MALFORMED_ROW = "malformed_row"
    MISSING_FIELD = "missing_field"
    INVALID_FIELD = "invalid_field"
    UNKNOWN_LABEL = "unknown_label"
    EMPTY_PARSE = "empty_parse"
    UNBALANCED_PARSE = "unbalanced_parse"
    MALFORMED_PARSE = "malformed_parse"
    LEAF_MISMATCH = "leaf_mismatch"
    EMPTY_SENTENCE = "empty_sentence"
    TOO_LONG = "too_long"
    PARSE_FAILED = "parse_failed"
    DUPLICATE_ID = "duplicate_id"


RAW_EXCERPT_CHARS = 4096
"""A reject keeps this much of its raw line (an SNLI line with both parses is about 2,000 characters): a
100 MB line is not copied whole into the rejects file, nor kept whole in memory until it is written."""


@dataclass(frozen=True, slots=True)
class Reject:
    file: str
    line: int
    reason: RejectReason
    field: str | None
    message: str
    raw: str
    """The raw line, or its first RAW_EXCERPT_CHARS characters when longer (then `raw_chars` is its length)."""
    pair_id: str | None = None
    """The row's id as the output's `pair_id` column would hold it; None when the row has no readable id."""
    raw_chars: int | None = None

    def __post_init__(self) -> None:
        if len(self.raw) > RAW_EXCERPT_CHARS:
            object.__setattr__(self, "raw_chars", self.raw_chars or len(self.raw))
            object.__setattr__(self, "raw", self.raw[:RAW_EXCERPT_CHARS])

    def to_dict(self) -> dict[str, str | int | None]:
        """The record as rejects files hold it (the reason as its value), for callers that add to it."""
        return {
            "file": self.file,
            "line": self.line,
            "pair_id": self.pair_id,
            "reason": self.reason.value,
            "field": self.field,
            "message": self.message,
            "raw": self.raw,
            **({"raw_chars": self.raw_chars} if self.raw_chars is not None else {}),
        }

    @classmethod
    def of(cls, problem: RecordProblem, file: str, line: int, raw: str, pair_id: str | None) -> Reject:
        """The reject of a row whose reading raised `problem` (one about a line too long to read whole carries
        the line's length: `raw` is its excerpt)."""
        return cls(file, line, problem.reason, problem.field, str(problem), raw, pair_id, problem.raw_chars)

    def to_json(self) -> str:
        """One line of a rejects file; text stays as written (not \\u-escaped), since people read these files."""
        return json.dumps(self.to_dict(), ensure_ascii=False)


def reject_pair_id(values: Mapping[str, Any] | Exception, column: str | None, row: int) -> str | None:
    """The id a rejected row's output row would have had: its id value as the readers accept one (a non-empty
    string or integer, stripped), the row number when the file has no id column (the readers' id then),
    None when the row could not be read (`values` is the problem) or its id is missing or unreadable."""
    if column is None:
        return str(row)
    value = values.get(column) if isinstance(values, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return str(value).strip() or None


class RecordProblem(Exception):
    """Raised while converting one record; becomes a Reject for that line."""

    raw_chars: int | None = None
    """The length of a line kept only as an excerpt (spinn.data.text_lines.Overlong)."""

    def __init__(self, reason: RejectReason, field: str | None, message: str):
        super().__init__(message)
        self.reason = reason
        self.field = field


def not_text(field: str, value: Any) -> RecordProblem:
    """The reject of a sentence (or parse) field that holds no text, said as what it holds: `field 'premise'
    is a number, not text` (JSON's Infinity and 7, a Parquet float column), never read as the text "inf"."""
    return RecordProblem(RejectReason.INVALID_FIELD, field, f"field {field!r} is {_kind(value)}, not text")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return f"a {type(value).__name__}"
