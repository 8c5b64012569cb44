"""Examples -> padded tensors and their step plan -> length-bucketed batches, the model's only input format.

A batch of B sentence pairs becomes one batch of 2B sentences (premises, then
hypotheses) so the encoder runs once per batch. Tokens are right-padded with
PAD_ID to a bucket width, and transitions right-padded with PAD_TRANSITION, a
no-op: every sentence starts at step 0, so its step s sits in column s. With
gold transitions, make_batch also works out every step's memory addresses
(spinn/model/addressing.py), on the host, so the model never reads a value
back from the device. Widths are rounded up to a few bucket sizes so that
batch shapes repeat (a captured CUDA graph serves every batch of its shape);
length bucketing groups pairs of similar length so padding stays low.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from spinn.data.example import Example
from spinn.data.vocab import PAD_ID
from spinn.ground.errors import SpinnError
from spinn.model.addressing import StepPlan, gold_plan
from spinn.trees.transitions import PAD_TRANSITION, transition_count

BUCKET_NOISE = 0.3
"""Spread of the random jitter (in tokens) added to lengths before sorting into buckets,
so that equal-length pairs do not always land in the same batch across epochs."""

WIDTH_STEP = 4
"""Batch widths are rounded up to a multiple of this many words: few distinct shapes, a few padded steps."""


@dataclass(frozen=True)
class Batch:
    """Padded tensors for B pairs = N = 2B sentences (rows 0..B-1 premises, B..2B-1 hypotheses), or for N
    sentences alone (sentence_batch: no labels, no pairs), which is what inference encodes."""

    tokens: Tensor  # (N, L) long, right-padded with PAD_ID
    lengths: Tensor  # (N,) long, words per sentence
    transitions: Tensor  # (N, T) long, T = 2L - 1, right-padded with PAD_TRANSITION
    labels: Tensor | None  # (B,) long, index into LABELS
    plan: StepPlan | None = None  # the gold transitions' addresses; None when some sentence has no tree
    loss_scale: Tensor | None = None  # (2,) a rank's share of a global batch: weights of its mean losses

    @property
    def pairs(self) -> int:
        return self.tokens.shape[0] // 2

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        def move(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor.to(device, non_blocking=non_blocking)

        plan = None if self.plan is None else self.plan.to(device, non_blocking)
        tensors = (self.tokens, self.lengths, self.transitions, self.labels)
        return Batch(*(move(tensor) for tensor in tensors), plan, move(self.loss_scale))

    def pin_memory(self) -> Batch:
        """Page-locked host copies, so a loader thread can move the next batch while the device computes."""

        def pin(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor.pin_memory()

        plan = None if self.plan is None else self.plan.pin_memory()
        tensors = (self.tokens, self.lengths, self.transitions, self.labels)
        return Batch(*(pin(tensor) for tensor in tensors), plan, pin(self.loss_scale))


def bucket_width(longest: int, step: int = WIDTH_STEP) -> int:
    """The batch width for a longest sentence of `longest` words: rounded up to a multiple of `step`."""
    return -(-longest // step) * step


def make_batch(examples: Sequence[Example], *, width_step: int = 1) -> Batch:
    """Pad a list of pairs into one Batch with its step plan: premises, then hypotheses.

    Each sentence has 2n-1 transitions, or none at all (tokens-only data for
    models that build their own trees: its row is all padding, and the batch
    has no plan). width_step > 1 rounds the width up (WIDTH_STEP for batches
    whose shapes should repeat).
    """
    if not examples:
        raise SpinnError("cannot make a batch of zero examples")
    sentences = [e.premise for e in examples] + [e.hypothesis for e in examples]
    transitions = [e.premise_transitions for e in examples] + [e.hypothesis_transitions for e in examples]
    batch = sentence_batch(sentences, transitions, width_step=width_step)
    labels = [e.label for e in examples]
    label_tensor = None if any(label is None for label in labels) else torch.tensor(labels, dtype=torch.long)
    return replace(batch, labels=label_tensor)


def sentence_batch(
    sentences: Sequence[Sequence[int]], transitions: Sequence[Sequence[int]], *, width_step: int = 1
) -> Batch:
    """Pad sentences (word ids) and their transitions (2n-1 each, or none) into a Batch without labels.

    The encoder reads every sentence on its own, so this is also a batch in its
    own right: inference encodes each distinct sentence once (spinn/inference/predict.py)."""
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    if not len(lengths):
        raise SpinnError("cannot make a batch of zero sentences")
    if lengths.min() < 1:
        raise SpinnError("every sentence needs at least one token")
    for sentence, sequence in zip(sentences, transitions, strict=True):
        if sequence and len(sequence) != transition_count(len(sentence)):
            raise SpinnError(
                f"{len(sentence)} tokens need {transition_count(len(sentence))} transitions, got {len(sequence)}"
            )
    width = bucket_width(int(lengths.max()), width_step)
    steps = transition_count(width)
    tokens = np.full((len(sentences), width), PAD_ID, dtype=np.int64)  # (N, L)
    padded = np.full((len(sentences), steps), PAD_TRANSITION, dtype=np.int64)  # (N, T)
    for row, (sentence, sequence) in enumerate(zip(sentences, transitions, strict=True)):
        tokens[row, : len(sentence)] = sentence
        padded[row, : len(sequence)] = sequence
    plan = gold_plan(padded, lengths, width) if all(transitions) else None
    return Batch(torch.from_numpy(tokens), torch.from_numpy(lengths), torch.from_numpy(padded), None, plan)


def own_steps(transitions: Tensor, row: int, n_tokens: int) -> list[int]:
    """Sentence `row`'s 2n - 1 transitions out of (N, T) right-padded ones (gold, predicted or sampled)."""
    return transitions[row, : transition_count(n_tokens)].tolist()


def bucket_batches(
    examples: Sequence[Example], batch_size: int, *, shuffle: bool = True, seed: int = 0
) -> list[list[int]]:
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
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    if shuffle:
        rng.shuffle(batches)
    return batches


def padding_fraction(batch: Batch) -> float:
    """Share of (sentence, step) cells that are padding: what bucketing keeps low."""
    return float((batch.transitions == PAD_TRANSITION).float().mean())
