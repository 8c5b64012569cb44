"""The prepared-pairs Parquet schema: defined here once, versioned in its metadata.

Every stage that reads or writes `data/prepared/<split>.parquet` goes through
this module, so a change of layout is one edit and one version bump, and a
file written by another version is refused with a clear message instead of
failing deep inside training. An optional column (GOLD_FIELD) needs no bump: a
reader that does not know it never reads it, and a file without it means what
every file meant before it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spinn.ground.errors import SpinnError
from spinn.ground.io import settle
from spinn.ground.paths import refuse_special_file
from spinn.trees.transitions import TRANSITION_NAMES

SCHEMA_VERSION = "1"
LABELS: tuple[str, ...] = ("entailment", "neutral", "contradiction")
NO_CONSENSUS_LABEL = "-"

META_VERSION = b"spinn.schema_version"
META_TRANSITIONS = b"spinn.transitions"
META_LABELS = b"spinn.labels"
META_SOURCE = b"spinn.source"
META_TREES = b"spinn.trees"
META_LABEL_SCHEME = b"spinn.label_scheme"

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
GOLD_COLUMN = "gold"
GOLD_FIELD = pa.field(GOLD_COLUMN, pa.string(), nullable=True)
"""Optional: each pair's gold value as its corpus gave it, in the corpus's own scheme (`spinn parse` writes it,
with the scheme in META_LABEL_SCHEME). `label` holds only the model's three classes, for training: a two-way
pair's `not_entailment` is kept here, and `spinn evaluate` scores it. A file without the column (`spinn
prepare`'s, and every older one) has its labels as its gold, three-way."""


def pair_schema(source: str = "", trees: str = "", label_scheme: str | None = None) -> pa.Schema:
    """The schema with its metadata: version, transition and label names, provenance; with a `label_scheme`
    (as `spinn parse` was told it: a scheme's name, or auto), also the GOLD_FIELD column in that scheme."""
    metadata = {
        META_VERSION: SCHEMA_VERSION.encode(),
        META_TRANSITIONS: json.dumps(TRANSITION_NAMES).encode(),
        META_LABELS: json.dumps(list(LABELS)).encode(),
        META_SOURCE: source.encode(),
        META_TREES: trees.encode(),
    }
    if label_scheme is None:
        return pa.schema(PAIR_FIELDS, metadata=metadata)
    return pa.schema((*PAIR_FIELDS, GOLD_FIELD), metadata={**metadata, META_LABEL_SCHEME: label_scheme.encode()})


def gold_scheme(schema: pa.Schema) -> str | None:
    """The scheme a file's GOLD_COLUMN is in, as `spinn parse` was told it (a file that does not say: `auto`,
    found from the values, as spinn.data.label_schemes.AUTO); None for a file without that column, whose labels
    are its gold (three-way)."""
    if schema.get_field_index(GOLD_COLUMN) < 0:
        return None
    return (schema.metadata or {}).get(META_LABEL_SCHEME, b"").decode() or "auto"


def check_pair_schema(schema: pa.Schema, path: Path) -> None:
    """Refuse a file that is not prepared pairs of this schema version, naming what differs."""
    metadata = schema.metadata or {}
    version = metadata.get(META_VERSION, b"").decode() or "none"
    if version != SCHEMA_VERSION:
        raise SpinnError(
            f"{path}: prepared-pairs schema version {version}, expected {SCHEMA_VERSION}; "
            "rerun `spinn prepare` with this version"
        )
    for expected in (*PAIR_FIELDS, *([GOLD_FIELD] if schema.get_field_index(GOLD_COLUMN) >= 0 else [])):
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
    read_pair_schema(path)
    return pq.read_table(path, columns=columns)


def read_pair_schema(path: Path) -> pa.Schema:
    """A prepared-pairs file's schema, with its metadata, once checked (and the file's publication finished)."""
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
    return schema
