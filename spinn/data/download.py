"""Fetch an official NLI corpus archive into data/raw, verified and safely extracted.

The archives are large (SNLI ~94 MB, MultiNLI ~227 MB) and come from academic
servers that drop connections, so the download resumes from a `.part` file, and
nothing reaches the final name until its checksum matches. Extraction refuses
archives whose members would escape the target folder ("zip slip") before it
writes a single byte, and writes every member atomically, so an interrupted run
never leaves a half file that a later stage would mistake for data.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import stat
import sys
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import BinaryIO, ClassVar, Literal

import requests
import urllib3
from pydantic import Field, field_validator, model_validator
from tqdm import tqdm

from spinn.errors import SpinnError, redact
from spinn.io import atomic_path, file_digest, plain_file_name, publishing
from spinn.settings import Settings, env_default

DEFAULT_RAW_DIR = Path("data/raw")
CHUNK_SIZE = 1 << 20
"""Bytes per read/write: large enough to be fast, small enough to keep memory flat."""
CONNECT_TIMEOUT_S = 15.0
READ_TIMEOUT_S = 60.0
HTTP_TIMEOUT = (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
HTTP_OK = 200
HTTP_PARTIAL_CONTENT = 206
HTTP_RANGE_NOT_SATISFIABLE = 416
HTTP_SERVER_ERROR = 500
RETRYABLE_STATUSES = frozenset({408, 425, 429})
"""Request timeout, too early, too many requests: the server asks to come back later."""
FETCH_ATTEMPTS = 2
"""One try that resumes the `.part`, and one fresh start if the server's reply shows the part is unusable."""
PART_SUFFIX = ".part"
TEMP_SUFFIX = ".tmp"
MARKER_TEMPLATE = ".{filename}.extracted"
MACOS_JUNK_PREFIX = "__MACOSX/"
DIGEST_HEX_LENGTHS = {"sha256": 64, "md5": 32}
HEX_DIGITS = re.compile(r"[0-9a-f]+")
DRIVE_LETTER = re.compile(r"^[A-Za-z]:")
CONTENT_RANGE_START = re.compile(r"bytes\s+(\d+)-")
UNIX_MODE_SHIFT = 16
"""A zip entry keeps its Unix mode (file type bits included) in the high 16 bits of external_attr."""


class DownloadError(SpinnError):
    """A download, verification or extraction failure, always reported on one line.

    `retryable` marks failures that trying again can fix (the network, a busy
    server); orchestrators retry only those, never a wrong checksum or a 404.
    """

    def __init__(self, message: str, *, retryable: bool = False, fix: tuple[str, str] | None = None) -> None:
        """Collapse any whitespace run so messages quoting server text stay one line."""
        super().__init__(redact(" ".join(message.split())), fix=fix)
        self.retryable = retryable


@dataclass(frozen=True)
class Checksum:
    """The digest an archive must have; parsed once so comparisons are exact."""

    algorithm: str
    hexdigest: str

    @classmethod
    def parse(cls, text: str) -> Checksum:
        """Accept 'sha256:<hex>', 'md5:<hex>' or a bare digest whose length says which."""
        cleaned = text.strip().lower()
        algorithm, sep, digest = cleaned.partition(":")
        if not sep:
            digest = cleaned
            algorithm = next((name for name, length in DIGEST_HEX_LENGTHS.items() if length == len(digest)), "")
        expected_length = DIGEST_HEX_LENGTHS.get(algorithm)
        if expected_length is None or len(digest) != expected_length or not HEX_DIGITS.fullmatch(digest):
            raise DownloadError(
                f"checksum {text!r}: expected 'sha256:' + 64 hex digits or 'md5:' + 32 hex digits "
                "(a bare 64- or 32-hex digest also works)"
            )
        return cls(algorithm, digest)

    def __str__(self) -> str:
        """Render in the same form `parse` reads back, for markers and messages."""
        return f"{self.algorithm}:{self.hexdigest}"


@dataclass(frozen=True)
class Corpus:
    """Where an official corpus archive lives and what it must hash to."""

    name: str
    url: str
    filename: str
    checksum: Checksum
    splits: dict[str, str]
    """The pipeline's train / dev / test splits -> their files inside the archive."""


CORPORA: dict[str, Corpus] = {
    "snli": Corpus(
        name="snli",
        url="https://nlp.stanford.edu/projects/snli/snli_1.0.zip",
        filename="snli_1.0.zip",
        checksum=Checksum("sha256", "afb3d70a5af5d8de0d9d81e2637e0fb8c22d1235c2749d83125ca43dab0dbd3e"),
        splits={"train": "snli_1.0_train.jsonl", "dev": "snli_1.0_dev.jsonl", "test": "snli_1.0_test.jsonl"},
    ),
    "multinli": Corpus(
        name="multinli",
        url="https://cims.nyu.edu/~sbowman/multinli/multinli_1.0.zip",
        filename="multinli_1.0.zip",
        checksum=Checksum("sha256", "049f507b9e36b1fcb756cfd5aeb3b7a0cfcb84bf023793652987f7e7e0957822"),
        # MultiNLI's test labels are not public: the mismatched dev set is the held-out test.
        splits={
            "train": "multinli_1.0_train.jsonl",
            "dev": "multinli_1.0_dev_matched.jsonl",
            "test": "multinli_1.0_dev_mismatched.jsonl",
        },
    ),
}


@dataclass(frozen=True)
class DownloadResult:
    """What `download_corpus` did, so the CLI can report it without re-reading disk."""

    archive: Path
    extracted_to: Path
    fetched: bool
    members: int


CorpusName = Literal["snli", "multinli"]


class DownloadSettings(Settings):
    """Which corpus, and where its archive comes from."""

    section: ClassVar[str] = "download"

    corpus: CorpusName = "snli"
    """The official corpus to fetch."""
    archive: str | None = None
    """The archive's file name in the raw folder (default: the official one, e.g. snli_1.0.zip)."""
    url: str | None = Field(default_factory=env_default("SPINN_DOWNLOAD_URL"))
    """A mirror of the archive instead of the official address."""
    file: Path | None = Field(default_factory=env_default("SPINN_DOWNLOAD_FILE"), validate_default=True)
    """A local copy of the archive instead of fetching it."""
    checksum: str | None = Field(default_factory=env_default("SPINN_DOWNLOAD_CHECKSUM"))
    """Expected digest, sha256:HEX or md5:HEX (default: the published one)."""

    @field_validator("checksum")
    @classmethod
    def _checksum_parses(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Checksum.parse(value)
            except DownloadError as error:
                raise ValueError(str(error)) from None
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DownloadSettings:
        if self.url is not None and self.file is not None:
            raise ValueError("give url (a mirror) or file (a local copy), not both")
        return self

    @property
    def archive_name(self) -> str:
        return self.archive or lookup_corpus(self.corpus).filename


def download(
    raw_dir: Path, settings: DownloadSettings, *, extract: bool = True, progress: bool = True
) -> DownloadResult:
    """The download stage: the corpus's verified archive in raw_dir (and its members, with extract)."""
    return download_corpus(
        settings.corpus,
        raw_dir,
        url=settings.url,
        file=settings.file,
        checksum=settings.checksum,
        archive=settings.archive_name,
        extract=extract,
        progress=progress,
    )


def download_corpus(
    name: str,
    raw_dir: Path = DEFAULT_RAW_DIR,
    *,
    url: str | None = None,
    file: Path | None = None,
    checksum: str | None = None,
    archive: str | None = None,
    extract: bool = True,
    progress: bool = True,
) -> DownloadResult:
    """Make sure `raw_dir` holds the verified archive of corpus `name` and, optionally, its members.

    A mirror (`url`) or local copy (`file`) replaces the official source but not
    the published checksum, unless `checksum` overrides it too.
    """
    corpus = lookup_corpus(name)
    if url is not None and file is not None:
        raise DownloadError(f"{corpus.filename}: give a mirror URL or a local file, not both")
    expected = Checksum.parse(checksum) if checksum is not None else corpus.checksum
    raw_dir = Path(raw_dir)
    archive = raw_dir / plain_file_name(archive or corpus.filename, "archive")
    with publishing((archive,), inputs=(file,) if file is not None else ()):
        fetched = ensure_archive(archive, expected, url=url or corpus.url, file=file, progress=progress)
        members = extract_once(archive, raw_dir, expected) if extract else 0
    return DownloadResult(archive=archive, extracted_to=raw_dir, fetched=fetched, members=members)


def lookup_corpus(name: str) -> Corpus:
    """Resolve a corpus name, listing the known ones so a typo is easy to fix."""
    corpus = CORPORA.get(name.strip().lower())
    if corpus is None:
        raise DownloadError(f"unknown corpus {name!r}: expected one of {', '.join(sorted(CORPORA))}")
    return corpus


def ensure_archive(archive: Path, checksum: Checksum, *, url: str, file: Path | None, progress: bool) -> bool:
    """Fetch or copy the archive unless a verified one is already there; return whether bytes moved.

    An existing archive that fails verification stays in place until the new
    bytes verify, so a bad mirror can never make things worse.
    """
    if archive.is_file() and verify(archive, checksum):
        return False
    if file is not None:
        copy_local(Path(file), archive, checksum)
    else:
        fetch_url(url, archive, checksum, progress)
    return True


def part_path(dest: Path) -> Path:
    """Name the resumable partial file, next to the final one so os.replace stays atomic."""
    return dest.with_name(dest.name + PART_SUFFIX)


def verify(path: Path, checksum: Checksum) -> bool:
    """Tell whether `path` has the expected digest, for callers that decide what to do next."""
    return file_digest(path, checksum.algorithm) == checksum.hexdigest


def fetch_url(url: str, dest: Path, checksum: Checksum | None, progress: bool = True) -> None:
    """Download `url` to `dest` through a resumable `.part` file, promoting it only once verified.

    A rerun asks for the missing tail with a Range header. A 416 reply means the
    part may already be complete (verify it) or is longer than the file (start
    over); a 206 that does not start where the part ends also starts over.
    With no checksum (a user's own URL), a finished body is promoted as it is,
    and a 416 means "complete" only when the server's total size equals the part's.
    """
    part = part_path(dest)
    for _attempt in range(FETCH_ATTEMPTS):
        offset = part.stat().st_size if part.exists() else 0
        with open_stream(url, dest, offset) as response:
            if offset and response.status_code == HTTP_RANGE_NOT_SATISFIABLE:
                if part_complete(part, response, checksum):
                    break
                part.unlink()
                continue
            if response.status_code == HTTP_PARTIAL_CONTENT and range_start(response) != offset:
                part.unlink(missing_ok=True)
                continue
            check_status(response, url, dest, offset)
            append = response.status_code == HTTP_PARTIAL_CONTENT
            stream_to_part(response, part, url, dest, append=append, offset=offset, progress=progress)
            break
    else:
        raise DownloadError(
            f"{dest.name}: {url} kept answering ranges that do not match the partial download; "
            "expected a 200 or 206 reply"
        )
    if checksum is None:
        os.replace(part, dest)
    else:
        promote(part, dest, checksum, source=url)


def part_complete(part: Path, response: requests.Response, checksum: Checksum | None) -> bool:
    """After a 416: is the part the whole file? By its checksum, else by the server's stated size."""
    if checksum is not None:
        return verify(part, checksum)
    _, _, total = response.headers.get("Content-Range", "").rpartition("/")
    return total.isdigit() and int(total) == part.stat().st_size


def open_stream(url: str, dest: Path, offset: int) -> requests.Response:
    """Start the GET, asking only for bytes after `offset`, and turn network failures into one line.

    Accept-Encoding is pinned to identity so byte offsets refer to the file
    itself, not to a compressed transfer of it.
    """
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        return requests.get(url, headers=headers, stream=True, timeout=HTTP_TIMEOUT)
    except requests.RequestException as exc:
        if name_not_resolved(exc):  # offline, or a misspelt host: waiting will not bring the name back
            host = urllib3.util.parse_url(url).host
            raise DownloadError(
                f"{dest.name}: cannot resolve {host} (no network, or no such host); without internet, "
                f"give a local copy of the archive or a reachable mirror{kept_note(dest, offset)}",
                fix=("file", "a local copy of the archive goes in {}"),
            ) from exc
        raise DownloadError(
            f"{dest.name}: cannot reach {url} ({type(exc).__name__}: {exc}); expected the archive"
            f"{kept_note(dest, offset)}",
            retryable=True,
        ) from exc


def name_not_resolved(error: BaseException) -> bool:
    """Whether a failed request failed on its host name (DNS), anywhere in the chain of causes."""
    pending, seen = [error], set()
    while pending:
        item = pending.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, urllib3.exceptions.NameResolutionError | socket.gaierror):
            return True
        pending += [getattr(item, "reason", None), item.__cause__, item.__context__]
        pending += [argument for argument in item.args if isinstance(argument, BaseException)]
    return False


def range_start(response: requests.Response) -> int | None:
    """Read where a 206 body starts, to be sure it continues the part rather than overlapping it."""
    match = CONTENT_RANGE_START.match(response.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


def check_status(response: requests.Response, url: str, dest: Path, offset: int) -> None:
    """Stop on any reply that is not the archive, keeping received bytes for the next run."""
    if response.status_code not in (HTTP_OK, HTTP_PARTIAL_CONTENT):
        raise DownloadError(
            f"{dest.name}: HTTP {response.status_code} {response.reason} from {url}; "
            f"expected 200 OK with the archive{kept_note(dest, offset)}",
            retryable=response.status_code in RETRYABLE_STATUSES or response.status_code >= HTTP_SERVER_ERROR,
        )


def kept_note(dest: Path, offset: int) -> str:
    """Say that earlier bytes survive, so the user knows a rerun will not start from zero."""
    if not offset:
        return ""
    return f"; {offset} bytes kept in {part_path(dest).name}, rerun to resume"


def stream_to_part(
    response: requests.Response,
    part: Path,
    url: str,
    dest: Path,
    *,
    append: bool,
    offset: int,
    progress: bool,
) -> None:
    """Write the body to the part file, fsync it, and report a cut connection as resumable.

    A 200 reply (server ignored Range) rewrites the part from zero; a 206 appends.
    """
    start = offset if append else 0
    length = response.headers.get("Content-Length")
    body_bytes = int(length) if length and length.isdigit() else None
    total = start + body_bytes if body_bytes is not None else None
    received = 0
    with part.open("ab" if append else "wb") as handle, progress_bar(dest.name, total, start, progress) as bar:
        try:
            for chunk in body_chunks(response):
                handle.write(chunk)
                received += len(chunk)
                bar.update(len(chunk))
        except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            sync(handle)
            raise DownloadError(
                f"{dest.name}: connection to {url} broke after {start + received} bytes "
                f"({type(exc).__name__}); partial download kept, rerun to resume",
                retryable=True,
            ) from exc
        sync(handle)
    if body_bytes is not None and received < body_bytes:
        raise DownloadError(
            f"{dest.name}: {url} sent {start + received} of {total} bytes; partial download kept, rerun to resume",
            retryable=True,
        )


def body_chunks(response: requests.Response) -> Iterator[bytes]:
    """Yield the body exactly as sent, each read as soon as it arrives.

    `iter_content` decodes, and while decoding urllib3 buffers reads until a
    whole chunk is full; a cut connection then discards that buffer, losing up
    to a chunk of bytes that resuming must fetch again. Raw reads lose nothing,
    and raw bytes are what the checksum and Range offsets refer to anyway.
    """
    return response.raw.stream(CHUNK_SIZE, decode_content=False)


def progress_bar(label: str, total: int | None, initial: int, enabled: bool) -> tqdm:
    """Show byte progress on stderr, staying quiet when asked or when stderr is not a terminal."""
    return tqdm(
        total=total,
        initial=initial,
        desc=label,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=not enabled or not sys.stderr.isatty(),
    )


def sync(handle: BinaryIO) -> None:
    """Push written bytes to disk, so what we verify is what survives a crash."""
    handle.flush()
    os.fsync(handle.fileno())


def promote(part: Path, dest: Path, checksum: Checksum, *, source: str, what: str = "partial download") -> None:
    """Verify the finished part and atomically give it the final name, or delete it.

    A mismatching part can never become right by resuming, so it is removed;
    whatever already sits under the final name is left untouched.
    """
    actual = file_digest(part, checksum.algorithm)
    if actual != checksum.hexdigest:
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"{dest.name}: {checksum.algorithm} mismatch: expected {checksum.hexdigest}, got {actual} "
            f"(from {source}); {what} removed",
            fix=(
                "checksum",
                f"if that is the archive you mean (not the official one), give {{}} {checksum.algorithm}:{actual}",
            ),
        )
    os.replace(part, dest)


def copy_local(src: Path, dest: Path, checksum: Checksum) -> None:
    """Copy a local archive next to `dest` under a temporary name, then verify and promote it.

    The temporary name is distinct from the HTTP `.part`, so switching to a
    local copy never destroys a resumable download.
    """
    if not src.is_file():
        raise DownloadError(f"{src}: no such file; expected a local copy of {dest.name}")
    temp = temp_sibling(dest)
    try:
        with src.open("rb") as source, temp.open("xb") as target:
            shutil.copyfileobj(source, target, CHUNK_SIZE)
            sync(target)
        promote(temp, dest, checksum, source=str(src), what="temporary copy")
    finally:
        temp.unlink(missing_ok=True)


def temp_sibling(dest: Path) -> Path:
    """Pick an unused hidden name in dest's folder, so os.replace onto dest is atomic."""
    return dest.with_name(f".{dest.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def marker_path(archive: Path, target: Path) -> Path:
    """Name the file that records which archive version was extracted into `target`."""
    return target / MARKER_TEMPLATE.format(filename=archive.name)


def extract_once(archive: Path, target: Path, checksum: Checksum) -> int:
    """Extract unless the marker says this exact archive was extracted and its files are all still there.

    The marker (the checksum, then one extracted file per line) is written only
    after every member landed, so an interrupted or failed extraction, or a
    deleted data file, is redone on the next run. Returns members written.
    """
    marker = marker_path(archive, target)
    if marker.is_file():
        recorded = marker.read_text(encoding="utf-8").splitlines()
        if recorded[:1] == [str(checksum)] and all((target / name).is_file() for name in recorded[1:]):
            return 0
    names = extract_zip(archive, target)
    with atomic_path(marker) as temporary:
        temporary.write_text("\n".join([str(checksum), *names]) + "\n", encoding="utf-8")
    return len(names)


def extract_zip(archive: Path, target: Path) -> list[str]:
    """Extract every safe member of `archive` into `target`, refusing the whole archive if one is unsafe.

    Returns the names of the files written (directories left out).

    All names are checked before anything is written, so a hostile archive
    leaves the folder exactly as it was.
    """
    try:
        with zipfile.ZipFile(archive) as bundle:
            members = [info for info in bundle.infolist() if not is_junk(info)]
            plan = [(info, member_destination(info, target, archive)) for info in members]
            for info, destination in plan:
                write_member(bundle, info, destination, archive)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise DownloadError(
            f"{archive.name}: corrupt zip archive ({exc}); expected a readable zip, "
            "delete it and rerun to fetch it again"
        ) from exc
    return [info.filename for info in members if not info.is_dir()]


def is_junk(info: zipfile.ZipInfo) -> bool:
    """Skip macOS resource-fork folders, which hold no corpus data."""
    return info.filename.startswith(MACOS_JUNK_PREFIX)


def member_destination(info: zipfile.ZipInfo, target: Path, archive: Path) -> Path:
    """Map a member name to a path inside `target`, or refuse it if it could land anywhere else."""
    name = info.filename
    windows = PureWindowsPath(name)
    parts = re.split(r"[\\/]", name)
    problem = None
    if is_symlink(info):
        problem = "is a symbolic link"
    elif PurePosixPath(name).is_absolute() or windows.is_absolute() or name.startswith("\\"):
        problem = "has an absolute path"
    elif DRIVE_LETTER.match(name) or windows.drive:
        problem = "names a drive"
    elif ".." in parts:
        problem = "climbs out with '..'"
    root = target.resolve()
    destination = (root / name).resolve()
    if problem is None and not destination.is_relative_to(root):
        problem = "resolves outside the target folder"
    if problem is not None:
        raise DownloadError(
            f"{archive.name}: member {name!r} {problem}; expected every member inside {target}, nothing extracted"
        )
    return destination


def is_symlink(info: zipfile.ZipInfo) -> bool:
    """Detect symlink entries, which could point extraction anywhere on disk."""
    return stat.S_ISLNK(info.external_attr >> UNIX_MODE_SHIFT)


def write_member(bundle: zipfile.ZipFile, info: zipfile.ZipInfo, destination: Path, archive: Path) -> None:
    """Write one member atomically, so a crash never leaves a truncated data file under its real name."""
    try:
        if info.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
            return
        destination.parent.mkdir(parents=True, exist_ok=True)
        with bundle.open(info) as source, atomic_path(destination) as temporary, temporary.open("wb") as handle:
            shutil.copyfileobj(source, handle, CHUNK_SIZE)
    except OSError as exc:
        raise DownloadError(
            f"{archive.name}: cannot write member {info.filename!r} to {destination} ({exc}); "
            "expected a writable folder"
        ) from exc
