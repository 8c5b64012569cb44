"""Examples -> padded tensors -> length-bucketed batches, the model's only input format.

A batch of B sentence pairs becomes one batch of 2B sentences (premises, then
hypotheses) so the encoder runs once per batch. Tokens are right-padded with
PAD_ID; transitions are left-padded with PAD_TRANSITION, a no-op, so every
sentence ends on the last step with its root alone on its stack and the
encoder can read all roots from one place. Length bucketing groups pairs of
similar length so the padded steps, which cost time and compute nothing, stay few.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from spinn.corpus import (LABEL_FIELD, SENTENCES, RecordProblem, TreeSource, iter_records, open_corpus,
                          sentence_transitions)
from spinn.errors import SpinnError
from spinn.schema import LABELS, NO_CONSENSUS_LABEL, read_pairs
from spinn.transitions import transition_count
from spinn.vocab import PAD_ID, Vocabulary, vocabulary_from_counts

PAD_TRANSITION = 2
"""No-op used only to left-pad batches; never stored in Parquet (not a Transition)."""

BUCKET_NOISE = 0.3
"""Spread of the random jitter (in tokens) added to lengths before sorting into buckets,
so that equal-length pairs do not always land in the same batch across epochs."""

_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")


@dataclass(frozen=True)
class Example:
    """One sentence pair as ids: what a batch is made of."""

    premise: tuple[int, ...]
    premise_transitions: tuple[int, ...]
    hypothesis: tuple[int, ...]
    hypothesis_transitions: tuple[int, ...]
    label: int | None = None

    @property
    def length(self) -> int:
        """The longer sentence sets the number of steps the pair needs."""
        return max(len(self.premise), len(self.hypothesis))


@dataclass(frozen=True)
class RawPair:
    """A pair as read from a corpus file: tokens and transitions, before any vocabulary."""

    premise: tuple[str, ...]
    premise_transitions: tuple[int, ...]
    hypothesis: tuple[str, ...]
    hypothesis_transitions: tuple[int, ...]
    label: int | None


@dataclass(frozen=True)
class Batch:
    """Padded tensors for B pairs = N = 2B sentences (rows 0..B-1 premises, B..2B-1 hypotheses)."""

    tokens: Tensor  # (N, L) long, right-padded with PAD_ID
    lengths: Tensor  # (N,) long, words per sentence
    transitions: Tensor  # (N, T) long, T = 2 max(lengths) - 1, left-padded with PAD_TRANSITION
    labels: Tensor | None  # (B,) long, index into LABELS

    @property
    def pairs(self) -> int:
        return self.tokens.shape[0] // 2

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        def move(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor.to(device, non_blocking=non_blocking)

        return Batch(move(self.tokens), move(self.lengths), move(self.transitions), move(self.labels))

    def pin_memory(self) -> Batch:
        def pin(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor.pin_memory()

        return Batch(pin(self.tokens), pin(self.lengths), pin(self.transitions), pin(self.labels))


def make_batch(examples: Sequence[Example]) -> Batch:
    """Pad a list of pairs into one Batch; checks each sentence has 2n-1 transitions, or none at all
    (tokens-only data for models that build their own trees: its rows are all padding)."""
    if not examples:
        raise SpinnError("cannot make a batch of zero examples")
    sentences = [e.premise for e in examples] + [e.hypothesis for e in examples]
    transitions = [e.premise_transitions for e in examples] + [e.hypothesis_transitions for e in examples]
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    if lengths.min() < 1:
        raise SpinnError("every sentence needs at least one token")
    for sentence, sequence in zip(sentences, transitions):
        if sequence and len(sequence) != transition_count(len(sentence)):
            raise SpinnError(f"{len(sentence)} tokens need {transition_count(len(sentence))} transitions, "
                             f"got {len(sequence)}")
    width = int(lengths.max())
    steps = transition_count(width)
    tokens = np.full((len(sentences), width), PAD_ID, dtype=np.int64)
    padded = np.full((len(sentences), steps), PAD_TRANSITION, dtype=np.int64)
    for row, (sentence, sequence) in enumerate(zip(sentences, transitions)):
        tokens[row, : len(sentence)] = sentence
        padded[row, steps - len(sequence):] = sequence
    labels = [e.label for e in examples]
    label_tensor = None if any(label is None for label in labels) else torch.tensor(labels, dtype=torch.long)
    return Batch(torch.from_numpy(tokens), torch.from_numpy(lengths), torch.from_numpy(padded), label_tensor)


def own_steps(transitions: Tensor, row: int, n_tokens: int) -> list[int]:
    """Sentence `row`'s 2n - 1 transitions out of (N, T) left-padded ones (gold, predicted or sampled)."""
    return transitions[row, transitions.shape[1] - transition_count(n_tokens):].tolist()


def bucket_batches(examples: Sequence[Example], batch_size: int, *, shuffle: bool = True,
                   seed: int = 0) -> list[list[int]]:
    """Indices of examples grouped into batches of similar length.

    Sort by (jittered) pair length, cut into batches of batch_size, then shuffle
    the order of the batches: padding stays low and every epoch still sees
    batches in a random order. With shuffle=False the order is deterministic.
    """
    if batch_size < 1:
        raise SpinnError(f"batch size must be at least 1, got {batch_size}")
    rng = random.Random(seed)
    jitter = (lambda: rng.uniform(-BUCKET_NOISE, BUCKET_NOISE)) if shuffle else (lambda: 0.0)
    order = sorted(range(len(examples)), key=lambda i: (examples[i].length + jitter(), i))
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    if shuffle:
        rng.shuffle(batches)
    return batches


def padding_fraction(batch: Batch) -> float:
    """Share of (sentence, step) cells that are padding: what bucketing keeps low."""
    return float((batch.transitions == PAD_TRANSITION).float().mean())


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
    raise SpinnError(f"{path}: expected an SNLI .jsonl/.jsonl.gz or a prepared .parquet file")


def _jsonl_pairs(path: Path) -> list[RawPair]:
    """Read through spinn.corpus, so lines are validated exactly as `spinn prepare` validates them."""
    pairs = []
    with open_corpus(path) as (stream, name):
        for line, _raw, record in iter_records(stream, name):
            try:
                if isinstance(record, RecordProblem):
                    raise record
                label = record.get(LABEL_FIELD)
                if label == NO_CONSENSUS_LABEL:
                    continue
                premise, hypothesis = (sentence_transitions(record, sentence, TreeSource.BINARY)
                                       for sentence in SENTENCES)
            except RecordProblem as problem:
                raise SpinnError(f"{path}:{line}: not an SNLI record with binary parses ({problem})") from None
            pairs.append(RawPair(tuple(premise[0]), tuple(premise[1]), tuple(hypothesis[0]), tuple(hypothesis[1]),
                                 LABELS.index(label) if label in LABELS else None))
    return pairs


def _parquet_pairs(path: Path) -> list[RawPair]:
    columns = ["label", "premise_tokens", "premise_transitions", "hypothesis_tokens", "hypothesis_transitions"]
    table = read_pairs(path, columns=columns).to_pydict()
    return [
        RawPair(tuple(p), tuple(pt), tuple(h), tuple(ht), LABELS.index(label) if label in LABELS else None)
        for label, p, pt, h, ht in zip(*(table[name] for name in columns))
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
        Example(tuple(vocabulary.encode(list(p.premise))), p.premise_transitions,
                tuple(vocabulary.encode(list(p.hypothesis))), p.hypothesis_transitions, p.label)
        for p in pairs
    ]
