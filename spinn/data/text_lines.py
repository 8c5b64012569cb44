"""Physical lines of a text file, read in bounded blocks, as every text reader takes them (the sentence-pair
readers' CSV, TSV and JSON lines, the corpus reader of prepare, the word-vector reader).

Lines are cut from blocks of BLOCK_BYTES, so a line longer than its reader's bound is never held whole: it
comes back as an `Overlong`, its first bytes and its length in characters, which the reader rejects as
too_long (a 50 MB line, or a file with no line end at all, had been read whole into memory first). A gzip
stream is unpacked only so far (spinn.data.limits.Inflation). The pair readers take lines as `Line`s: the
file is read as bytes (gunzipped when its content is gzip, whatever its name), and each line is decoded on
its own, so one bad byte spoils one row only: bytes that are not UTF-8, or a NUL byte, mark that line for
rejection. There a line ends at a line feed, a CR LF or a bare CR (old Mac files, some exports).
"""

from __future__ import annotations

import codecs
import gzip
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, NamedTuple

from spinn.data.limits import Inflation
from spinn.data.rejects import RAW_EXCERPT_CHARS
from spinn.ground.errors import SpinnError

GZIP_MAGIC = b"\x1f\x8b"  # gzip is recognised by content, whatever the file's name
UTF8_BOM = b"\xef\xbb\xbf"
NUL = b"\x00"
LF, CR = b"\n", b"\r"
READ_ERRORS = (OSError, EOFError, zlib.error)
BLOCK_BYTES = 1 << 16
"""How much is read at a time: lines are cut from blocks this size."""
EXCERPT_BYTES = 4 * RAW_EXCERPT_CHARS
"""What an over-long line keeps of its start: enough bytes for a reject's excerpt in any UTF-8 text."""


class Overlong(NamedTuple):
    """A line longer than its reader's bound, never held whole."""

    start: bytes
    """Its first EXCERPT_BYTES bytes."""
    chars: int
    """Its length in characters (an undecodable byte counts as one), its line end left out."""
    limit: int
    """The bound it passed, in bytes."""

    def excerpt(self) -> str:
        return self.start.decode("utf-8", errors="replace")[:RAW_EXCERPT_CHARS]


class Line(NamedTuple):
    number: int
    text: str  # decoded, newline kept; undecodable bytes shown as U+FFFD; an over-long line's excerpt
    encoding_error: str | None
    overlong: Overlong | None = None


@contextmanager
def open_bytes(path: Path) -> Iterator[IO[bytes]]:
    """The file as bytes, gunzipped when its content is gzip (only so far: Inflation)."""
    with open(path, "rb") as stream:
        gzipped = stream.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        stream.seek(0)
        size = os.fstat(stream.fileno()).st_size
        yield Inflation(gzip.GzipFile(fileobj=stream), path, size) if gzipped else stream


def text_lines(stream: IO[bytes], path: Path, limit: int) -> Iterator[Line]:
    """Physical lines (ending at LF, CR LF or a bare CR), numbered from 1, each decoded on its own (a first
    line's UTF-8 BOM dropped); a line over `limit` bytes comes as its excerpt, with `overlong` set."""
    try:
        for number, raw in enumerate(bounded_lines(stream, limit, bare_cr=True), start=1):
            if isinstance(raw, Overlong):
                yield Line(number, raw.excerpt(), None, raw)
            else:
                yield _decoded(number, raw.removeprefix(UTF8_BOM) if number == 1 else raw)
    except READ_ERRORS as error:
        raise SpinnError(f"{path}: cannot read: {error}") from None


def bounded_lines(stream: IO[bytes], limit: int, *, bare_cr: bool) -> Iterator[bytes | Overlong]:
    """The stream's lines, each with its end, read BLOCK_BYTES at a time; a line longer than `limit` bytes
    as an `Overlong`. A line ends at a line feed, and with `bare_cr` also at a CR no line feed follows."""
    line, held = _Growing(limit), b""
    while True:
        block = stream.read(BLOCK_BYTES)
        data = held + block
        held = b""
        if block and bare_cr and data.endswith(CR):  # its line feed may start the next block
            data, held = data[:-1], CR
        for piece in _pieces(data, bare_cr):
            line.add(piece)
            if piece.endswith((LF, CR) if bare_cr else LF):
                yield line.taken()
                line = _Growing(limit)
        if not block:
            if line.size:
                yield line.taken()
            return


def _pieces(data: bytes, bare_cr: bool) -> list[bytes]:
    """`data` cut after each line end, ends kept; the last piece may be a line's start without its end."""
    if bare_cr:
        return data.splitlines(keepends=True)
    pieces = [part + LF for part in data.split(LF)]
    pieces[-1] = pieces[-1][:-1]
    return [piece for piece in pieces if piece]


class _Growing:
    """One line as its pieces come: held while within the bound, then only its start and its length."""

    def __init__(self, limit: int) -> None:
        self.limit, self.size, self.held, self.chars, self.ending = limit, 0, bytearray(), 0, 0
        self.decoder: codecs.IncrementalDecoder | None = None

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        self.ending = len(piece) - len(piece.rstrip(b"\r\n"))  # the last piece's: the line's end
        if self.decoder is not None:
            self.chars += len(self.decoder.decode(piece))
            return
        self.held += piece
        if len(self.held) > self.limit:
            self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            self.chars = len(self.decoder.decode(bytes(self.held)))
            del self.held[EXCERPT_BYTES:]

    def taken(self) -> bytes | Overlong:
        if self.decoder is None:
            return bytes(self.held)
        self.chars += len(self.decoder.decode(b"", final=True))
        return Overlong(bytes(self.held), self.chars - self.ending, self.limit)


def _decoded(number: int, raw: bytes) -> Line:
    """A line as text; a NUL byte or bytes that are not UTF-8 make it a line to reject, not the file."""
    if NUL in raw:
        text = raw.replace(NUL, b"").decode("utf-8", errors="replace")
        return Line(number, text, f"holds a NUL byte at byte {raw.index(NUL) + 1}: not text")
    try:
        return Line(number, raw.decode("utf-8"), None)
    except UnicodeDecodeError as error:
        return Line(number, raw.decode("utf-8", errors="replace"), f"not UTF-8: {error.reason}")
