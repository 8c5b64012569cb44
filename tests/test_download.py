"""Tests for spinn.data.download and spinn.data.fetch: every path runs offline against a local HTTP server."""

from __future__ import annotations

import hashlib
import io
import random
import stat
import zipfile
from pathlib import Path

import pytest

from spinn.data.download import CORPORA, DownloadResult, download_corpus, extract_zip
from spinn.data.fetch import Checksum, DownloadError
from spinn.ground.errors import SpinnError
from tests.httpserver import LocalServer

pytestmark = pytest.mark.integration

SNLI = "snli_1.0.zip"
SNLI_PATH = "/mirror/" + SNLI
PAYLOAD_BYTES = 96 * 1024
CUT_AFTER = 10_000
MEMBERS = {
    "snli_1.0/": b"",
    "snli_1.0/README.txt": b"Stanford Natural Language Inference corpus (test fixture)\n",
    "snli_1.0/snli_1.0_dev.jsonl": random.Random(0).randbytes(PAYLOAD_BYTES),
}
FILE_MEMBERS = sum(1 for name in MEMBERS if not name.endswith("/"))


def make_zip(members: dict[str, bytes], *, junk: bool = False) -> bytes:
    """Build a stored (uncompressed) zip in memory, so byte offsets inside it are predictable."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as bundle:
        for name, data in members.items():
            bundle.writestr(name, data)
        if junk:
            bundle.writestr("__MACOSX/snli_1.0/._README.txt", b"resource fork")
    return buffer.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def spec(data: bytes) -> str:
    return "sha256:" + sha256(data)


def listing(folder: Path) -> set[str]:
    """Every path under `folder`, relative, so tests can check nothing unexpected was written."""
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


def assert_one_line(error: pytest.ExceptionInfo[SpinnError]) -> str:
    message = str(error.value)
    assert "\n" not in message and "\r" not in message
    return message


ARCHIVE = make_zip(MEMBERS, junk=True)


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    return tmp_path / "data" / "raw"


def fetch(server: LocalServer, raw: Path, data: bytes = ARCHIVE, **overrides: object) -> DownloadResult:
    """Download the SNLI fixture from the local server, with the checksum of `data` unless overridden."""
    options: dict[str, object] = {"url": server.url(SNLI_PATH), "checksum": spec(data), "progress": False}
    options.update(overrides)
    return download_corpus("snli", raw, **options)  # type: ignore[arg-type]


def test_fresh_download_verifies_and_extracts(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    result = fetch(server, raw)
    assert result == DownloadResult(archive=raw / SNLI, extracted_to=raw, fetched=True, members=FILE_MEMBERS)
    assert (raw / SNLI).read_bytes() == ARCHIVE
    for name, data in MEMBERS.items():
        if not name.endswith("/"):
            assert (raw / name).read_bytes() == data
    assert not (raw / (SNLI + ".part")).exists()
    assert not (raw / "__MACOSX").exists()
    assert (raw / f".{SNLI}.extracted").read_text().splitlines()[0] == spec(ARCHIVE)
    assert not any(name.endswith(".tmp") for name in listing(raw))
    assert [(r.method, r.path, r.range) for r in server.requests] == [("GET", SNLI_PATH, None)]


@pytest.mark.parametrize("name", sorted(CORPORA))
def test_each_official_corpus_downloads_under_its_own_filename(server: LocalServer, raw: Path, name: str) -> None:
    filename = CORPORA[name].filename
    url = server.serve("/" + filename, ARCHIVE)
    result = download_corpus(name, raw, url=url, checksum=spec(ARCHIVE), extract=False, progress=True)
    assert result.archive == raw / filename
    assert result.archive.read_bytes() == ARCHIVE
    assert result.members == 0
    assert not (raw / "snli_1.0").exists()


def test_rerun_makes_no_request(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    fetch(server, raw)
    readme = raw / "snli_1.0/README.txt"
    extracted_mtime = readme.stat().st_mtime_ns
    seen = len(server.requests)
    result = fetch(server, raw)
    assert result.fetched is False
    assert result.members == 0
    assert len(server.requests) == seen
    assert readme.stat().st_mtime_ns == extracted_mtime


def test_rerun_restores_a_deleted_member_without_a_request(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    fetch(server, raw)
    data = raw / "snli_1.0/snli_1.0_dev.jsonl"
    data.unlink()
    seen = len(server.requests)
    result = fetch(server, raw)
    assert result.fetched is False and result.members == FILE_MEMBERS
    assert len(server.requests) == seen
    assert data.read_bytes() == MEMBERS["snli_1.0/snli_1.0_dev.jsonl"]


def test_resume_after_cut_sends_range_and_rebuilds_identical_archive(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    server.cut(SNLI_PATH, after=CUT_AFTER)
    with pytest.raises(SpinnError, match="resume") as error:
        fetch(server, raw)
    assert SNLI in assert_one_line(error)
    part = raw / (SNLI + ".part")
    assert part.stat().st_size == CUT_AFTER
    assert not (raw / SNLI).exists()
    result = fetch(server, raw)
    assert result.fetched is True
    assert server.requests[-1].range == f"bytes={CUT_AFTER}-"
    assert (raw / SNLI).read_bytes() == ARCHIVE
    assert not part.exists()


def test_server_ignoring_range_after_cut_restarts_from_zero(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    server.cut(SNLI_PATH, after=CUT_AFTER)
    with pytest.raises(SpinnError):
        fetch(server, raw)
    server.ignore_range()
    fetch(server, raw)
    assert server.requests[-1].range == f"bytes={CUT_AFTER}-"
    assert (raw / SNLI).read_bytes() == ARCHIVE


def test_complete_part_answered_with_416_is_verified_and_promoted(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    raw.mkdir(parents=True)
    (raw / (SNLI + ".part")).write_bytes(ARCHIVE)
    fetch(server, raw)
    assert [r.range for r in server.requests] == [f"bytes={len(ARCHIVE)}-"]
    assert (raw / SNLI).read_bytes() == ARCHIVE


def test_oversized_part_answered_with_416_starts_over(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    raw.mkdir(parents=True)
    (raw / (SNLI + ".part")).write_bytes(ARCHIVE + b"trailing garbage")
    fetch(server, raw)
    assert [r.range for r in server.requests] == [f"bytes={len(ARCHIVE) + 16}-", None]
    assert (raw / SNLI).read_bytes() == ARCHIVE


def test_checksum_mismatch_names_file_and_digests_and_removes_part(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    wrong = "0" * 64
    with pytest.raises(SpinnError) as error:
        fetch(server, raw, checksum="sha256:" + wrong)
    message = assert_one_line(error)
    assert SNLI in message
    assert f"expected {wrong}" in message
    assert f"got {sha256(ARCHIVE)}" in message
    assert server.url(SNLI_PATH) in message
    assert not (raw / SNLI).exists()
    assert not (raw / (SNLI + ".part")).exists()


def test_mismatching_refetch_leaves_verified_archive_untouched(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    fetch(server, raw)
    archive = raw / SNLI
    before = archive.stat().st_mtime_ns
    other = make_zip({"snli_1.0/README.txt": b"something else"})
    server.serve(SNLI_PATH, other)
    with pytest.raises(SpinnError, match="mismatch"):
        fetch(server, raw, checksum=spec(b"neither of them"))
    assert archive.read_bytes() == ARCHIVE
    assert archive.stat().st_mtime_ns == before
    assert not (raw / (SNLI + ".part")).exists()


def test_corrupt_existing_archive_is_replaced_once_new_bytes_verify(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    raw.mkdir(parents=True)
    (raw / SNLI).write_bytes(b"not the archive")
    result = fetch(server, raw)
    assert result.fetched is True
    assert (raw / SNLI).read_bytes() == ARCHIVE


def test_http_404_names_url_and_writes_nothing(server: LocalServer, raw: Path) -> None:
    with pytest.raises(SpinnError) as error:
        fetch(server, raw)
    message = assert_one_line(error)
    assert server.url(SNLI_PATH) in message
    assert "404" in message and SNLI in message
    assert not (raw / SNLI).exists()
    assert not (raw / (SNLI + ".part")).exists()


def test_http_500_after_cut_keeps_partial_bytes(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    server.cut(SNLI_PATH, after=CUT_AFTER)
    with pytest.raises(SpinnError):
        fetch(server, raw)
    server.fail(SNLI_PATH, 500)
    with pytest.raises(SpinnError) as error:
        fetch(server, raw)
    message = assert_one_line(error)
    assert "500" in message and server.url(SNLI_PATH) in message and "resume" in message
    assert (raw / (SNLI + ".part")).stat().st_size == CUT_AFTER
    server.heal(SNLI_PATH)
    fetch(server, raw)
    assert (raw / SNLI).read_bytes() == ARCHIVE


def test_unreachable_server_is_one_line_error(raw: Path) -> None:
    with LocalServer() as gone:
        url = gone.url(SNLI_PATH)
    with pytest.raises(SpinnError) as error:
        download_corpus("snli", raw, url=url, checksum=spec(ARCHIVE), progress=False)
    message = assert_one_line(error)
    assert url in message and SNLI in message
    assert not (raw / SNLI).exists()


def test_an_unknown_host_is_not_retryable(raw: Path) -> None:
    """A name that does not resolve (offline, or misspelt) will not heal by waiting: no retries are spent on it.
    `.invalid` never resolves (RFC 2606)."""
    with pytest.raises(DownloadError) as error:
        download_corpus(
            "snli", raw, url="http://spinn-test.invalid" + SNLI_PATH, checksum=spec(ARCHIVE), progress=False
        )
    message = assert_one_line(error)
    assert "cannot resolve spinn-test.invalid" in message and "local copy" in message
    assert error.value.retryable is False
    assert not (raw / SNLI).exists()


def test_a_refused_connection_is_retryable(raw: Path) -> None:
    with LocalServer() as gone:
        url = gone.url(SNLI_PATH)
    with pytest.raises(DownloadError) as error:
        download_corpus("snli", raw, url=url, checksum=spec(ARCHIVE), progress=False)
    assert error.value.retryable is True


def test_local_file_is_copied_and_verified(tmp_path: Path, raw: Path) -> None:
    source = tmp_path / "copy.zip"
    source.write_bytes(ARCHIVE)
    result = download_corpus("snli", raw, file=source, checksum=spec(ARCHIVE), progress=False)
    assert result.fetched is True and result.members == FILE_MEMBERS
    assert (raw / SNLI).read_bytes() == ARCHIVE
    assert listing(raw) == {SNLI, f".{SNLI}.extracted", *(name.rstrip("/") for name in MEMBERS)}


def test_local_file_with_wrong_bytes_is_refused(tmp_path: Path, raw: Path) -> None:
    source = tmp_path / "copy.zip"
    source.write_bytes(ARCHIVE[:-1])
    with pytest.raises(SpinnError) as error:
        download_corpus("snli", raw, file=source, checksum=spec(ARCHIVE), progress=False)
    message = assert_one_line(error)
    assert SNLI in message and sha256(ARCHIVE) in message and str(source) in message
    assert listing(raw) == set()


def test_local_file_checked_against_official_checksum_by_default(tmp_path: Path, raw: Path) -> None:
    source = tmp_path / "copy.zip"
    source.write_bytes(ARCHIVE)
    with pytest.raises(SpinnError, match=CORPORA["snli"].checksum.hexdigest):
        download_corpus("snli", raw, file=source, progress=False)
    assert listing(raw) == set()


def test_missing_local_file_is_clear_error(tmp_path: Path, raw: Path) -> None:
    missing = tmp_path / "nowhere.zip"
    with pytest.raises(SpinnError) as error:
        download_corpus("snli", raw, file=missing, progress=False)
    message = assert_one_line(error)
    assert str(missing) in message and SNLI in message


def test_unknown_corpus_lists_known_names(raw: Path) -> None:
    with pytest.raises(SpinnError) as error:
        download_corpus("snly", raw)
    message = assert_one_line(error)
    assert "snly" in message and "snli" in message and "multinli" in message
    assert not raw.exists()


def test_official_corpora_match_published_sources() -> None:
    assert CORPORA["snli"].url == "https://nlp.stanford.edu/projects/snli/snli_1.0.zip"
    assert CORPORA["snli"].checksum == Checksum.parse(
        "afb3d70a5af5d8de0d9d81e2637e0fb8c22d1235c2749d83125ca43dab0dbd3e"
    )
    assert CORPORA["multinli"].filename == "multinli_1.0.zip"
    assert CORPORA["multinli"].checksum.algorithm == "sha256"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sha256:" + "ab" * 32, Checksum("sha256", "ab" * 32)),
        ("SHA256:" + "AB" * 32, Checksum("sha256", "ab" * 32)),
        ("  " + "cd" * 32 + "\n", Checksum("sha256", "cd" * 32)),
        ("md5:981c3df556bbaea3f17f752456d0088c", Checksum("md5", "981c3df556bbaea3f17f752456d0088c")),
        ("981c3df556bbaea3f17f752456d0088c", Checksum("md5", "981c3df556bbaea3f17f752456d0088c")),
    ],
)
def test_checksum_parse_accepts(text: str, expected: Checksum) -> None:
    assert Checksum.parse(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "sha256:",
        "sha1:" + "a" * 40,
        "sha256:" + "a" * 32,
        "md5:" + "a" * 64,
        "a" * 40,
        "g" * 64,
        "sha256:" + "g" * 64,
        "sha256:\n" + "a" * 64,
        "crc32:deadbeef",
    ],
)
def test_checksum_parse_rejects(text: str) -> None:
    with pytest.raises(SpinnError, match="expected 'sha256:'") as error:
        Checksum.parse(text)
    assert_one_line(error)


def test_md5_checksum_is_honoured(server: LocalServer, raw: Path) -> None:
    server.serve(SNLI_PATH, ARCHIVE)
    result = fetch(server, raw, checksum=hashlib.md5(ARCHIVE).hexdigest())
    assert (raw / f".{SNLI}.extracted").read_text().splitlines()[0] == "md5:" + hashlib.md5(ARCHIVE).hexdigest()
    assert result.members == FILE_MEMBERS


def symlink_entry(name: str, target: str) -> tuple[zipfile.ZipInfo, bytes]:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info, target.encode()


@pytest.mark.parametrize("kind", ["parent", "absolute", "symlink", "backslash", "drive"])
def test_unsafe_member_refuses_whole_archive(tmp_path: Path, raw: Path, kind: str) -> None:
    outside = tmp_path / "outside" / "evil.txt"
    names = {
        "parent": "../evil.txt",
        "absolute": str(outside),
        "symlink": "snli_1.0/link",
        "backslash": "..\\evil.txt",
        "drive": "C:/evil.txt",
    }
    bad = names[kind]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr("snli_1.0/README.txt", b"safe member written first")
        if kind == "symlink":
            bundle.writestr(*symlink_entry(bad, str(outside)))
        else:
            bundle.writestr(bad, b"evil")
    data = buffer.getvalue()
    source = tmp_path / "hostile.zip"
    source.write_bytes(data)
    with pytest.raises(SpinnError) as error:
        download_corpus("snli", raw, file=source, checksum=spec(data), progress=False)
    message = assert_one_line(error)
    assert repr(bad) in message and SNLI in message
    assert listing(raw) == {SNLI}
    assert not outside.exists()
    assert not (tmp_path / "evil.txt").exists() and not (raw.parent / "evil.txt").exists()


def test_extract_zip_counts_files_and_skips_macos_junk(tmp_path: Path) -> None:
    archive = tmp_path / SNLI
    archive.write_bytes(ARCHIVE)
    target = tmp_path / "out"
    assert len(extract_zip(archive, target)) == FILE_MEMBERS
    assert listing(target) == {name.rstrip("/") for name in MEMBERS}


def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def flipped(data: bytes) -> bytes:
    """Flip one byte inside the stored payload, so only the CRC check can notice."""
    middle = data.index(MEMBERS["snli_1.0/snli_1.0_dev.jsonl"]) + PAYLOAD_BYTES // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


@pytest.mark.parametrize("damage", [truncated, flipped])
def test_corrupt_zip_names_archive_and_writes_no_marker(server: LocalServer, raw: Path, damage) -> None:
    broken = damage(ARCHIVE)
    server.serve(SNLI_PATH, broken)
    with pytest.raises(SpinnError) as error:
        fetch(server, raw, data=broken)
    message = assert_one_line(error)
    assert SNLI in message and "corrupt zip" in message
    assert not (raw / f".{SNLI}.extracted").exists()
    assert (raw / SNLI).read_bytes() == broken
    assert not (raw / "snli_1.0/snli_1.0_dev.jsonl").exists()
    assert not any(name.endswith(".tmp") for name in listing(raw))


def test_url_and_file_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SpinnError, match="not both"):
        download_corpus("snli", tmp_path, url="http://127.0.0.1:9/x.zip", file=tmp_path / "x.zip")
    assert list(tmp_path.iterdir()) == []
