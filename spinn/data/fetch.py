"""One file fetched from a URL or copied from disk, verified by its checksum, resumable after a cut.

Corpus archives and word-vector files are large and come from servers that
drop connections, so a download resumes from a `.part` file beside the final
name, and nothing reaches the final name until its checksum matches (or, with
no checksum, until the body is complete). Every failure is a `DownloadError`
on one line, marked `retryable` when trying again can fix it.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import shutil
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import requests
import urllib3
from tqdm import tqdm

from spinn.ground.errors import SpinnError, redact
from spinn.ground.io import file_digest
from spinn.ground.paths import refuse_special_file

CHUNK_SIZE = 1 << 20
"""Bytes per read/write: large enough to be fast, small enough to keep memory flat."""
CONNECT_TIMEOUT_S = 15.0
READ_TIMEOUT_S = 60.0
HTTP_TIMEOUT = (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
TIMEOUT_VARIABLE = "SPINN_DOWNLOAD_TIMEOUT"
"""Seconds a download waits to connect and for each next bytes, for both (default: HTTP_TIMEOUT)."""
MAX_TIMEOUT_S = 3600.0
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
DIGEST_HEX_LENGTHS = {"sha256": 64, "md5": 32}
HEX_DIGITS = re.compile(r"[0-9a-f]+")
CONTENT_RANGE_START = re.compile(r"bytes\s+(\d+)-")


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
        try:
            fetch_url(url, archive, checksum, progress)
        except DownloadError as error:
            better = _unverified_in_place(archive, checksum, error)
            if better is None:
                raise
            raise better from error
    return True


def _unverified_in_place(archive: Path, checksum: Checksum, error: DownloadError) -> DownloadError | None:
    """Offline (the fetch could not resolve its host) beside an archive already in place that did not verify:
    the likely fix is that archive's own checksum (a local SNLI-shaped copy), so the error says so."""
    if (error.fix or (None,))[0] != "file" or not archive.is_file():
        return None
    actual = f"{checksum.algorithm}:{file_digest(archive, checksum.algorithm)}"
    return DownloadError(
        f"{archive} is in place but does not match {checksum}, and fetching the official one failed: {error}",
        fix=("checksum", f"if {archive.name} is the archive you mean, give {{}} {actual}"),
    )


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
    timeout = http_timeout()
    try:
        return requests.get(url, headers=headers, stream=True, timeout=timeout)
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
            f"{kept_note(dest, offset)}{timeout_note(exc, timeout)}",
            retryable=True,
        ) from exc


def http_timeout() -> tuple[float, float]:
    """(connect, read) seconds: TIMEOUT_VARIABLE's for both when the user set it, else HTTP_TIMEOUT."""
    text = os.environ.get(TIMEOUT_VARIABLE)
    if not text:
        return HTTP_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT_S:  # NaN fails this too
        raise DownloadError(f"{TIMEOUT_VARIABLE}={text!r}: expected seconds, more than 0 and at most {MAX_TIMEOUT_S:g}")
    return seconds, seconds


def timeout_note(error: BaseException, timeout: tuple[float, float]) -> str:
    """For a server that did not answer in time: how long was waited, and the variable that sets it."""
    if not isinstance(error, requests.Timeout):
        return ""
    return f"; it waited {max(timeout):g} s, and {TIMEOUT_VARIABLE} (seconds) sets how long"


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
                f"({type(exc).__name__}); partial download kept, rerun to resume"
                f"{timeout_note(exc, http_timeout())}",
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
    refuse_special_file(src)
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
