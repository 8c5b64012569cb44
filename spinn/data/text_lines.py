"""Physical lines of a text file, as every text reader of sentence pairs takes them (CSV, TSV, JSON lines).

The file is read as bytes (gunzipped when its content is gzip, whatever its name), and each line is decoded
on its own, so one bad byte spoils one row only: bytes that are not UTF-8, or a NUL byte, mark that line for
rejection. A line ends at a line feed, a CR LF or a bare CR (old Mac files, some exports): reading bytes
splits at line feeds only, and a file of bare CRs would be one line, its rows lost or merged.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, NamedTuple

from spinn.errors import SpinnError

GZIP_MAGIC = b"\x1f\x8b"  # gzip is recognised by content, whatever the file's name
UTF8_BOM = b"\xef\xbb\xbf"
NUL = b"\x00"
BARE_CR = re.compile(rb"(?<=\r)(?!\n)")
"""The place after a CR that ends a line by itself (no line feed follows)."""
READ_ERRORS = (OSError, EOFError, zlib.error)


class Line(NamedTuple):
    number: int
    text: str  # decoded, newline kept; undecodable bytes shown as U+FFFD
    encoding_error: str | None


@contextmanager
def open_bytes(path: Path) -> Iterator[IO[bytes]]:
    """The file as bytes, gunzipped when its content is gzip."""
    with open(path, "rb") as stream:
        gzipped = stream.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        stream.seek(0)
        yield gzip.GzipFile(fileobj=stream) if gzipped else stream


def text_lines(stream: IO[bytes], path: Path) -> Iterator[Line]:
    """Physical lines, numbered from 1, each decoded on its own (a first line's UTF-8 BOM dropped)."""
    number = 0
    try:
        for chunk in stream:
            for raw in _at_bare_cr(chunk):
                number += 1
                yield _decoded(number, raw.removeprefix(UTF8_BOM) if number == 1 else raw)
    except READ_ERRORS as error:
        raise SpinnError(f"{path}: cannot read: {error}") from None


def _at_bare_cr(chunk: bytes) -> list[bytes]:
    """`chunk` (up to a line feed) split after each CR that no line feed follows, each part keeping its end."""
    if b"\r" not in chunk:
        return [chunk]
    return [part for part in BARE_CR.split(chunk) if part]


def _decoded(number: int, raw: bytes) -> Line:
    """A line as text; a NUL byte or bytes that are not UTF-8 make it a line to reject, not the file."""
    if NUL in raw:
        text = raw.replace(NUL, b"").decode("utf-8", errors="replace")
        return Line(number, text, f"holds a NUL byte at byte {raw.index(NUL) + 1}: not text")
    try:
        return Line(number, raw.decode("utf-8"), None)
    except UnicodeDecodeError as error:
        return Line(number, raw.decode("utf-8", errors="replace"), f"not UTF-8: {error.reason}")
