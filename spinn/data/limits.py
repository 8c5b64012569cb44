"""How much input may be: a sentence's token limit and the character bound derived from it that every reader
applies before any tokenizer or tree reader sees the text, the bound of a whole line derived from it, and how
far a zip archive or a gzip stream may expand.

A 5 MB "sentence" kept Stanza's tokenizer busy for twenty minutes, and one in a
prepared split made each training step take 37 s. Counting tokens needs a
tokenizer, so each reader first bounds the text by characters: a sentence
longer than CHARS_PER_TOKEN characters per allowed token cannot be within the
token limit, and is rejected as too_long with its line, before any costly
work. The factor is generous (English tokens average under 6 characters, a
URL is one token), so the character bound never rejects what the token limit
would keep.
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path
from typing import IO, Annotated

from pydantic import AfterValidator, Field

from spinn.data.rejects import RecordProblem, RejectReason
from spinn.ground.errors import SpinnError
from spinn.ground.memory import gib, usable_memory

DEFAULT_MAX_TOKENS = 100
"""Tokens a sentence of a training corpus may have (`spinn prepare --max-tokens`); SNLI's longest sentences
have about 80."""
TEXT_MAX_TOKENS = 256
"""Tokens a sentence of new text may have (`spinn label`, `spinn parse`, `spinn trees`: `--max-tokens`).
Premises of several sentences (a news paragraph, MultiNLI's fiction and government prose) run past 100
tokens: at 100, 13% of a news corpus's pairs were refused. Memory grows with it: labelling 512 pairs whose
premises all had 100 / 256 / 512 tokens with a 300D model (batch 256, CPU) peaked at 0.8 / 1.4 / 2.4 GiB."""
CHARS_PER_TOKEN = 50
"""Characters allowed per token of the limit before any tokenizer runs."""
PARSE_CHARS_PER_CHAR = 4
"""A bracketed parse holds its sentence plus brackets and part-of-speech tags: at most this many times longer."""
BYTES_PER_CHARACTER = 240
"""What a sentence's character costs in memory on its way through the tokenizer, trees and batches (a
100 MB line took 22.8 GB)."""
SENTENCE_SHARE = 8
"""A sentence at the token limit may take at most 1/SENTENCE_SHARE of the memory."""
MAX_TOKENS_LIMIT = max(DEFAULT_MAX_TOKENS, usable_memory() // (BYTES_PER_CHARACTER * CHARS_PER_TOKEN * SENTENCE_SHARE))
"""The largest token limit this machine's memory holds."""
MAX_EXPANSION = 100
"""A zip member may expand to at most this many times its compressed size: text corpora deflate three- to
tenfold, a zip bomb a thousandfold."""
SMALL_MEMBER_BYTES = 2**20
"""A member (or a gzip stream) this small may expand as it likes: nothing it holds can fill a disk or memory."""
LINE_SENTENCES = 24
"""A line (one record) may hold this many sentences at the token limit: an SNLI line holds two sentences and
four parses of up to PARSE_CHARS_PER_CHAR times their length (18), and its ids and labels."""
UTF8_MAX_BYTES = 4
"""The most bytes one character takes in UTF-8: a line's bound in bytes never cuts what its characters allow."""


def _within_memory(tokens: int) -> int:
    if tokens > MAX_TOKENS_LIMIT:
        raise ValueError(
            f"must be at most {MAX_TOKENS_LIMIT}: a sentence that long could take more than 1/{SENTENCE_SHARE} of "
            f"this machine's memory ({gib(usable_memory())})"
        )
    return tokens


MaxTokens = Annotated[int, Field(ge=1), AfterValidator(_within_memory)]
"""The type of every token-limit setting (prepare, the parser, trees): at least 1, at most MAX_TOKENS_LIMIT."""


def check_members(archive: Path, members: list[zipfile.ZipInfo], *, extract_to: Path | None = None) -> None:
    """Refuse, before anything is read or written, a zip whose members expand more than MAX_EXPANSION times
    (zipfile reads no more than a member's declared size, so the declared sizes are what can come out), or
    whose members would not fit on the disk they are extracted to."""
    for info in members:
        if info.file_size > SMALL_MEMBER_BYTES and info.file_size > MAX_EXPANSION * max(info.compress_size, 1):
            ratio = info.file_size // max(info.compress_size, 1)
            raise SpinnError(
                f"{archive}: member {info.filename!r} expands to {info.file_size} bytes, {ratio} times its "
                f"compressed size (at most {MAX_EXPANSION}): a zip bomb, or no corpus archive; nothing read"
            )
    if extract_to is not None:
        existing = next(folder for folder in (extract_to, *extract_to.parents) if folder.exists())
        total, free = sum(info.file_size for info in members), shutil.disk_usage(existing).free
        if total > free:
            raise SpinnError(
                f"{archive}: its members take {gib(total)}, more than the {gib(free)} free where they would be "
                f"extracted ({extract_to}); nothing extracted"
            )


def max_chars(max_tokens: int) -> int:
    """The character bound of a sentence under `max_tokens`."""
    return max_tokens * CHARS_PER_TOKEN


def max_line_bytes(max_tokens: int) -> int:
    """The bytes a line may take before it is rejected as too_long without being read whole."""
    return LINE_SENTENCES * max_chars(max_tokens) * UTF8_MAX_BYTES


def too_long_line(chars: int, limit: int) -> RecordProblem:
    """The reject of a line longer than `limit` bytes; `chars`, its length, goes to the reject's raw_chars."""
    problem = RecordProblem(
        RejectReason.TOO_LONG,
        None,
        f"a line of {chars} characters, more than a line may take at this token limit ({limit} bytes); "
        "it was not read whole",
    )
    problem.raw_chars = chars
    return problem


class Inflation:
    """A gzip stream (`read` only) that stops, in one line, once it has given more than MAX_EXPANSION times
    the `compressed` bytes it came from: a gzip bomb unpacks only that far (gzip, unlike zip, declares no
    size to check first). Text corpora unpack three- to tenfold."""

    def __init__(self, stream: IO[bytes], path: Path, compressed: int) -> None:
        self.stream, self.path, self.given = stream, path, 0
        self.bound = max(SMALL_MEMBER_BYTES, MAX_EXPANSION * compressed)
        self.compressed = compressed

    def read(self, size: int) -> bytes:
        data = self.stream.read(size)
        self.given += len(data)
        if self.given > self.bound:
            raise SpinnError(
                f"{self.path}: unpacks to more than {MAX_EXPANSION} times its {self.compressed} compressed bytes "
                f"(stopped at {self.given} bytes): a gzip bomb, or no corpus"
            )
        return data


def check_length(text: str, field: str | None, limit: int) -> None:
    """Raise a too_long RecordProblem naming `field` when `text` has more than `limit` characters."""
    if len(text) > limit:
        raise RecordProblem(
            RejectReason.TOO_LONG, field, f"{len(text)} characters, more than the {limit} its token limit allows"
        )
