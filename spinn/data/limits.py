"""How long a sentence may be: one token limit, and the character bound derived from it that every reader
applies before any tokenizer or tree reader sees the text.

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

from spinn.data.rejects import RecordProblem, RejectReason

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


def max_chars(max_tokens: int) -> int:
    """The character bound of a sentence under `max_tokens`."""
    return max_tokens * CHARS_PER_TOKEN


def check_length(text: str, field: str | None, limit: int) -> None:
    """Raise a too_long RecordProblem naming `field` when `text` has more than `limit` characters."""
    if len(text) > limit:
        raise RecordProblem(
            RejectReason.TOO_LONG, field, f"{len(text)} characters, more than the {limit} its token limit allows"
        )
