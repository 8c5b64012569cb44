"""Sentence pairs as the model's inputs: tokens and transitions read from a corpus, then word ids.

`read_raw_pairs` reads an SNLI-format JSONL file (its binary parses, validated
as `spinn prepare` validates them) or a prepared Parquet split, each pair with
its gold value in the file's own scheme (`split_gold_scheme`); `encode_pairs`
maps words to vocabulary ids, giving the `Example`s that batches are made of.
Here, not in the model, is where corpora are read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spinn.data.corpus import LABEL_FIELD, SENTENCES, TreeSource, iter_records, open_corpus, sentence_transitions
from spinn.data.example import Example
from spinn.data.rejects import RecordProblem
from spinn.data.schema import GOLD_COLUMN, LABELS, NO_CONSENSUS_LABEL, gold_scheme, read_pair_schema, read_pairs
from spinn.data.vocab import Vocabulary, vocabulary_from_counts
from spinn.ground.errors import SpinnError

_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")


@dataclass(frozen=True)
class RawPair:
    """A pair as read from a corpus file: tokens and transitions, before any vocabulary."""

    premise: tuple[str, ...]
    premise_transitions: tuple[int, ...]
    hypothesis: tuple[str, ...]
    hypothesis_transitions: tuple[int, ...]
    label: int | None
    """The model's class, for training: None where the gold value is none of them (or there is none)."""
    gold: str | None = None
    """The gold value as the file gives it, in its own scheme (`split_gold_scheme`): the label's name in a
    three-way file, `not_entailment` in a GLUE one."""


def read_raw_pairs(path: Path) -> list[RawPair]:
    """Pairs of an SNLI-format .jsonl(.gz) (binary parses) or of a prepared .parquet file.

    JSONL lines with gold label '-' are skipped, as `spinn prepare` does.
    """
    path = Path(path)
    if not path.exists():
        raise SpinnError(f"{path}: no such file")
    if path.name.endswith(".parquet"):
        return _parquet_pairs(path)
    if path.name.endswith(_JSONL_SUFFIXES):
        return _jsonl_pairs(path)
    raise SpinnError(
        f"{path}: expected an SNLI .jsonl/.jsonl.gz or a prepared .parquet file (sentence pairs without parses: "
        "`spinn parse` them first)"
    )


def split_gold_scheme(path: Path) -> str | None:
    """The scheme `read_raw_pairs`' gold values are in, as `spinn parse` was told it (auto: to be found from
    the values); None when the gold values are the model's three classes (an SNLI file, `spinn prepare`'s
    splits)."""
    path = Path(path)
    return gold_scheme(read_pair_schema(path)) if path.name.endswith(".parquet") else None


def _jsonl_pairs(path: Path) -> list[RawPair]:
    """Read through spinn.data.corpus, so lines are validated exactly as `spinn prepare` validates them."""
    pairs = []
    with open_corpus(path) as (stream, name):
        for line, _raw, record in iter_records(stream, name):
            try:
                if isinstance(record, RecordProblem):
                    raise record
                label = record.get(LABEL_FIELD)
                if label == NO_CONSENSUS_LABEL:
                    continue
                premise, hypothesis = (
                    sentence_transitions(record, sentence, TreeSource.BINARY) for sentence in SENTENCES
                )
            except RecordProblem as problem:
                raise SpinnError(f"{path}:{line}: not an SNLI record with binary parses ({problem})") from None
            pairs.append(
                RawPair(
                    tuple(premise[0]),
                    tuple(premise[1]),
                    tuple(hypothesis[0]),
                    tuple(hypothesis[1]),
                    LABELS.index(label) if label in LABELS else None,
                    label,
                )
            )
    return pairs


def _parquet_pairs(path: Path) -> list[RawPair]:
    columns = ["label", "premise_tokens", "premise_transitions", "hypothesis_tokens", "hypothesis_transitions"]
    with_gold = split_gold_scheme(path) is not None
    table = read_pairs(path, columns=[*columns, *([GOLD_COLUMN] if with_gold else [])]).to_pydict()
    gold = table[GOLD_COLUMN] if with_gold else table["label"]  # a file without a gold column: its labels
    return [
        RawPair(tuple(p), tuple(pt), tuple(h), tuple(ht), LABELS.index(label) if label in LABELS else None, value)
        for label, p, pt, h, ht, value in zip(*(table[name] for name in columns), gold, strict=True)
    ]


def corpus_vocabulary(pairs: Iterable[RawPair], lowercase: bool = True) -> Vocabulary:
    """A vocabulary of every word in these pairs (for benchmarks and tests without a prepared split)."""
    counts: Counter[str] = Counter()
    for pair in pairs:
        counts.update(word.lower() if lowercase else word for word in pair.premise + pair.hypothesis)
    return vocabulary_from_counts(counts.items(), lowercase=lowercase)


def encode_pairs(pairs: Iterable[RawPair], vocabulary: Vocabulary) -> list[Example]:
    """Map words to ids; transitions and labels pass through unchanged."""
    return [
        Example(
            tuple(vocabulary.encode(list(p.premise))),
            p.premise_transitions,
            tuple(vocabulary.encode(list(p.hypothesis))),
            p.hypothesis_transitions,
            p.label,
        )
        for p in pairs
    ]
