"""Builders shared by test modules: the smoke corpus's pairs as plain rows, files of rows, the offline Stanza set.

Test modules import these from here, never from one another.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


def stanza_dir() -> Path:
    folder = Path(__file__).resolve().parents[2] / "shared" / "stanza" / "stanza_resources"
    if not folder.is_dir():
        pytest.skip(f"the offline Stanza models {folder} are absent (../shared is not beside this checkout)")
    return folder


def smoke_pairs(smoke_model, count: int) -> list[dict]:
    """The first `count` smoke test pairs as plain rows (id, premise, hypothesis, gold label)."""
    table = pq.read_table(smoke_model.prepared / "test.parquet", columns=["pair_id", "premise", "hypothesis", "label"])
    return [
        {"id": row["pair_id"], "premise": row["premise"], "hypothesis": row["hypothesis"], "label": row["label"]}
        for row in table.to_pylist()[:count]
    ]


def write_rows(path: Path, rows: list[dict]) -> Path:
    """`rows` as a CSV, JSONL or (any other suffix) Parquet file."""
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
