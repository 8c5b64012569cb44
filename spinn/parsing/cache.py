"""The parse cache: every parse in SQLite, keyed by (parser model, text), shared by processes and runs.

NLI data repeats itself (each premise has several hypotheses), and reruns and
overlapping corpora meet the same sentences again, so a parse is kept once it
is made. The key's model id is a hash of the model files actually loaded,
never their path, so a new model is never served an old model's trees.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from spinn.ground.errors import SpinnError
from spinn.parsing.protocol import Parsed

CACHE_TIMEOUT_S = 60.0  # how long a writer waits for another process's transaction
CACHE_LOOKUP_CHUNK = 500  # texts per SELECT, well under SQLite's bound-parameter limit

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS parses (
    model_id TEXT NOT NULL,
    text TEXT NOT NULL,
    tokens TEXT NOT NULL,
    transitions TEXT NOT NULL,
    binary_parse TEXT NOT NULL,
    PRIMARY KEY (model_id, text)
) WITHOUT ROWID
"""
_INSERT = "INSERT OR REPLACE INTO parses VALUES (?, ?, ?, ?, ?)"


class ParseCache:
    """Parses in SQLite, keyed by (model_id, text), as JSON text; safe to share between processes (WAL)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A Dask or Prefect worker may call from different threads, one at a time.
        self._db = sqlite3.connect(path, timeout=CACHE_TIMEOUT_S, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            with self._db:
                self._db.execute(_CREATE_TABLE)
        except sqlite3.DatabaseError as error:
            self._db.close()
            raise SpinnError(f"parse cache {path} is unusable: {error}") from error

    def get(self, model_id: str, texts: list[str]) -> Iterator[tuple[str, Parsed]]:
        for start in range(0, len(texts), CACHE_LOOKUP_CHUNK):
            chunk = texts[start : start + CACHE_LOOKUP_CHUNK]
            rows = self._db.execute(
                f"SELECT text, tokens, transitions, binary_parse FROM parses "
                f"WHERE model_id = ? AND text IN ({', '.join('?' * len(chunk))})",
                [model_id, *chunk],
            )
            for text, tokens, transitions, binary_parse in rows:
                yield text, Parsed(json.loads(tokens), json.loads(transitions), binary_parse)

    def put(self, model_id: str, parses: dict[str, Parsed]) -> None:
        with self._db:  # one transaction per batch
            self._db.executemany(
                _INSERT,
                [
                    (
                        model_id,
                        text,
                        json.dumps(parsed.tokens, ensure_ascii=False),
                        json.dumps(parsed.transitions),
                        parsed.binary_parse,
                    )
                    for text, parsed in parses.items()
                ],
            )

    def close(self) -> None:
        self._db.close()
