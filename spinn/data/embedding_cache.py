"""The aligned-matrix cache: one `.npy` per exact set of inputs, found again without reading the source.

The key digests everything that changes the matrix (the source's identity, the
vocabulary, the OOV policy and seed), so one key means one exact matrix; the
metadata file is written last, so its presence means the entry is complete.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy

from spinn.data.glove import VECTOR_DTYPE
from spinn.data.vocab import Vocabulary
from spinn.ground.io import atomic_path

CACHE_FORMAT = "spinn.embeddings"
CACHE_VERSION = 1
CACHE_DIGEST_CHARS = 24
"""Digest characters in a cache file name; the full digest is checked inside the metadata file."""


def cache_key(identity: dict, vocabulary: Vocabulary, oov: str, seed: int) -> str:
    """Digest every input that changes the matrix, so one key means one exact matrix."""
    inputs = {
        "format": CACHE_FORMAT,
        "version": CACHE_VERSION,
        "source": identity,
        "tokens": list(vocabulary.tokens),
        "lowercase": vocabulary.lowercase,
        "oov": oov,
        "seed": seed,
    }
    return hashlib.sha256(json.dumps(inputs, ensure_ascii=False, sort_keys=True).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """One cached matrix (`.npy`) and its metadata (`.json`, written last: its presence means complete)."""

    matrix_path: Path
    meta_path: Path
    key: str

    @classmethod
    def at(cls, cache_dir: Path, label: str, key: str) -> CacheEntry:
        stem = f"{label}-{key[:CACHE_DIGEST_CHARS]}"
        return cls(cache_dir / f"{stem}.npy", cache_dir / f"{stem}.json", key)

    def load(self, rows: int) -> tuple[numpy.ndarray, dict] | None:
        """Return the cached matrix and counts, or None when absent, partial or not this key's."""
        try:
            meta = json.loads(self.meta_path.read_text(encoding="utf-8"))
            counts = {"found": int(meta["found"]), "skipped_lines": int(meta["skipped_lines"])}
            matrix = numpy.load(self.matrix_path, allow_pickle=False)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if meta.get("key") != self.key or matrix.dtype != VECTOR_DTYPE or matrix.ndim != 2 or matrix.shape[0] != rows:
            return None
        return matrix, counts

    def save(self, matrix: numpy.ndarray, counts: dict) -> None:
        """Write the matrix, then the metadata, each atomically, so a reader never sees half an entry."""
        with atomic_path(self.matrix_path) as temporary, temporary.open("wb") as handle:
            numpy.save(handle, matrix, allow_pickle=False)
        meta = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "key": self.key, **counts}
        with atomic_path(self.meta_path) as temporary:
            temporary.write_text(json.dumps(meta, indent=0), encoding="utf-8")
