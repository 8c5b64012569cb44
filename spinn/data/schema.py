"""The prepared-pairs Parquet schema: defined here once, versioned in its metadata.

Every stage that reads or writes `data/prepared/<split>.parquet` goes through
this module, so a change of layout is one edit and one version bump, and a
file written by another version is refused with a clear message instead of
failing deep inside training.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spinn.errors import SpinnError
from spinn.io import settle
from spinn.paths import refuse_special_file
from spinn.trees.transitions import TRANSITION_NAMES

SCHEMA_VERSION = "1"
LABELS: tuple[str, ...] = ("entailment", "neutral", "contradiction")
NO_CONSENSUS_LABEL = "-"

META_VERSION = b"spinn.schema_version"
META_TRANSITIONS = b"spinn.transitions"
META_LABELS = b"spinn.labels"
META_SOURCE = b"spinn.source"
META_TREES = b"spinn.trees"

_TOKENS = pa.list_(pa.string())
_TRANSITIONS = pa.list_(pa.int8())

PAIR_FIELDS: tuple[pa.Field, ...] = (
    pa.field("pair_id", pa.string(), nullable=False),
    pa.field("label", pa.string(), nullable=True),  # null for unlabelled corpora
    pa.field("premise", pa.string(), nullable=False),
    pa.field("hypothesis", pa.string(), nullable=False),
    pa.field("premise_tokens", _TOKENS, nullable=False),
    pa.field("hypothesis_tokens", _TOKENS, nullable=False),
    pa.field("premise_transitions", _TRANSITIONS, nullable=False),
    pa.field("hypothesis_transitions", _TRANSITIONS, nullable=False),
    pa.field("source_line", pa.int64(), nullable=False),
)


def pair_schema(source: str = "", trees: str = "") -> pa.Schema:
    """The schema with its metadata: version, transition and label names, provenance."""
    metadata = {
        META_VERSION: SCHEMA_VERSION.encode(),
        META_TRANSITIONS: json.dumps(TRANSITION_NAMES).encode(),
        META_LABELS: json.dumps(list(LABELS)).encode(),
        META_SOURCE: source.encode(),
        META_TREES: trees.encode(),
    }
    return pa.schema(PAIR_FIELDS, metadata=metadata)


def check_pair_schema(schema: pa.Schema, path: Path) -> None:
    """Refuse a file that is not prepared pairs of this schema version, naming what differs."""
    metadata = schema.metadata or {}
    version = metadata.get(META_VERSION, b"").decode() or "none"
    if version != SCHEMA_VERSION:
        raise SpinnError(
            f"{path}: prepared-pairs schema version {version}, expected {SCHEMA_VERSION}; "
            "rerun `spinn prepare` with this version"
        )
    for expected in PAIR_FIELDS:
        index = schema.get_field_index(expected.name)
        if index < 0:
            raise SpinnError(f"{path}: column {expected.name!r} is missing")
        if not schema.field(index).type.equals(expected.type):
            raise SpinnError(
                f"{path}: column {expected.name!r} has type {schema.field(index).type}, expected {expected.type}"
            )
    stored = json.loads(metadata.get(META_TRANSITIONS, b"{}"))
    if stored != TRANSITION_NAMES:
        raise SpinnError(f"{path}: transition codes {stored}, expected {TRANSITION_NAMES}")


def read_pairs(path: Path, columns: list[str] | None = None) -> pa.Table:
    """Read a prepared-pairs file after checking its schema (and finishing its publication, if a killed
    `spinn prepare` left that half done: the rejects beside it then match it)."""
    path = Path(path)
    settle(path)
    if not path.exists():
        raise SpinnError(f"{path}: no such file")
    refuse_special_file(path)
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as error:
        raise SpinnError(f"{path}: not a Parquet file ({error})") from None
    check_pair_schema(schema, path)
    return pq.read_table(path, columns=columns)
