"""The word vocabulary: token <-> id, built from a prepared training split.

Ids 0 and 1 are the padding and unknown tokens, so batches can pad with 0 and
any word unseen in training maps to one shared id. Order after them is by
frequency, then alphabetical, so the same data always yields the same ids
(checkpoints record the vocabulary and are refused against another).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from spinn.data.schema import read_pairs
from spinn.data.split_files import with_partner
from spinn.ground.errors import SpinnError, SpinnWarning
from spinn.ground.io import atomic_path, publishing
from spinn.ground.settings import Settings

PAD = "<pad>"
UNK = "<unk>"
SPECIALS: tuple[str, ...] = (PAD, UNK)
PAD_ID = SPECIALS.index(PAD)
UNK_ID = SPECIALS.index(UNK)
VOCAB_FORMAT = "spinn.vocab"
VOCAB_VERSION = 1
VOCAB_FILENAME = "vocab.json"
TOKEN_COLUMNS = ("premise_tokens", "hypothesis_tokens")
MOSTLY_UNKNOWN = 0.5
"""Past this share of tokens outside its vocabulary a model reads mostly <unk>: what it outputs means little
(a 100% unknown file was labelled 50/50 entailment without a word)."""


@dataclass(frozen=True)
class Vocabulary:
    """An immutable token list with its lookup table and the options that made it."""

    tokens: tuple[str, ...]
    counts: tuple[int, ...]
    lowercase: bool
    min_freq: int
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.tokens[: len(SPECIALS)] != SPECIALS:
            raise SpinnError(f"a vocabulary must start with {SPECIALS}, not {self.tokens[: len(SPECIALS)]}")
        object.__setattr__(self, "index", {token: i for i, token in enumerate(self.tokens)})

    def __len__(self) -> int:
        return len(self.tokens)

    def normalize(self, token: str) -> str:
        return token.lower() if self.lowercase else token

    def encode(self, tokens: list[str]) -> list[int]:
        """Ids of the tokens, unknown words as UNK_ID."""
        return [self.index.get(self.normalize(token), UNK_ID) for token in tokens]

    def to_json(self) -> dict:
        return {
            "format": VOCAB_FORMAT,
            "version": VOCAB_VERSION,
            "lowercase": self.lowercase,
            "min_freq": self.min_freq,
            "specials": list(SPECIALS),
            "tokens": list(self.tokens),
            "counts": list(self.counts),
        }

    def save(self, path: Path) -> Path:
        with atomic_path(Path(path)) as temporary:
            temporary.write_text(json.dumps(self.to_json(), ensure_ascii=False, indent=0), encoding="utf-8")
        return Path(path)

    @classmethod
    def load(cls, path: Path) -> Vocabulary:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SpinnError(f"{path}: no such vocabulary file") from None
        except json.JSONDecodeError as error:
            raise SpinnError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
        return cls.from_json(data, str(path))

    @classmethod
    def from_json(cls, data: object, source: str) -> Vocabulary:
        """The inverse of to_json, for vocab.json files and checkpoints alike."""
        if not isinstance(data, dict) or data.get("format") != VOCAB_FORMAT or data.get("version") != VOCAB_VERSION:
            raise SpinnError(f"{source}: not a {VOCAB_FORMAT} version {VOCAB_VERSION} file")
        return cls(tuple(data["tokens"]), tuple(data["counts"]), data["lowercase"], data["min_freq"])


def build_vocabulary(
    train: Path, *, lowercase: bool = True, min_freq: int = 1, max_size: int | None = None
) -> Vocabulary:
    """Count the words of both sentences in a prepared split and keep the frequent ones."""
    if min_freq < 1:
        raise SpinnError(f"min_freq must be at least 1, got {min_freq}")
    table = read_pairs(train, columns=list(TOKEN_COLUMNS))
    words = pa.chunked_array(
        [chunk for column in TOKEN_COLUMNS for chunk in pc.list_flatten(table[column]).chunks],
        type=pa.string(),
    )
    if lowercase:
        words = pc.utf8_lower(words)
    counted = pc.value_counts(words)
    counts = zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist(), strict=True)
    return vocabulary_from_counts(counts, lowercase=lowercase, min_freq=min_freq, max_size=max_size)


def vocabulary_from_counts(
    counts: Iterable[tuple[str, int]], *, lowercase: bool, min_freq: int = 1, max_size: int | None = None
) -> Vocabulary:
    """Specials, then the words seen at least min_freq times by frequency, ties alphabetical."""
    kept = sorted(
        ((token, count) for token, count in counts if count >= min_freq and token not in SPECIALS),
        key=lambda item: (-item[1], item[0]),
    )
    if max_size is not None:
        kept = kept[: max(0, max_size - len(SPECIALS))]
    tokens = SPECIALS + tuple(token for token, _ in kept)
    frequencies = (0,) * len(SPECIALS) + tuple(count for _, count in kept)
    return Vocabulary(tokens, frequencies, lowercase, min_freq)


class VocabSettings(Settings):
    """Which words the vocabulary keeps."""

    section: ClassVar[str] = "vocab"

    lowercase: bool = Field(True, json_schema_extra={"cli": "--lowercase/--keep-case"})
    """Fold case."""
    min_freq: int = Field(1, ge=1)
    """Keep words seen at least this often."""
    max_size: int | None = Field(None, ge=len(SPECIALS))
    """Keep at most this many entries, specials included (default: no limit)."""


def vocab_stage(
    train: Path, output: Path | None = None, settings: VocabSettings | None = None
) -> tuple[Vocabulary, Path]:
    """Build the vocabulary of a prepared split and save it (default: vocab.json beside it)."""
    train, settings = Path(train), settings or VocabSettings()
    output = Path(output or train.parent / VOCAB_FILENAME)
    with publishing((output,), inputs=with_partner(train)):
        vocabulary = build_vocabulary(
            train, lowercase=settings.lowercase, min_freq=settings.min_freq, max_size=settings.max_size
        )
        return vocabulary, vocabulary.save(output)


def unknown_count(sentences: Iterable[Sequence[int]]) -> tuple[int, int]:
    """(tokens, tokens that are UNK_ID) over encoded sentences."""
    tokens = unknown = 0
    for ids in sentences:
        tokens += len(ids)
        unknown += sum(1 for token in ids if token == UNK_ID)
    return tokens, unknown


def warn_if_mostly_unknown(source: str | Path, share: float | None) -> None:
    """A SpinnWarning naming `source` when more than MOSTLY_UNKNOWN of its tokens are unknown to the model."""
    if share is not None and share > MOSTLY_UNKNOWN:
        message = f"{source}: {share:.0%} of its tokens are not in the model's vocabulary, so its results mean little"
        warnings.warn(SpinnWarning(message), stacklevel=2)
