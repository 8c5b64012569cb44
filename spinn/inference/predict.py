"""predict(): a model over examples, each distinct sentence encoded once, read back once; the one inference loop.

Evaluation, labelling and `spinn trees` all call it, so a label, a score and
a drawn tree come from the same batches, the same step and the same CUDA
graphs. The pairs' distinct sentences are sorted by length and encoded in
batches of twice the pair batch size (as many sentences as a batch of pairs
holds), so padding stays low and a repeated premise costs nothing; then the
classifier reads each pair's two vectors. The outputs stay on the device
until the last batch is done, and come back in input order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy
import torch
from torch import Tensor

from spinn.data.example import Example
from spinn.ground.cores import recheck
from spinn.ground.errors import SpinnError
from spinn.inference.infer_step import InferStep
from spinn.model.batch import WIDTH_STEP, sentence_batch
from spinn.model.config import TransitionSource
from spinn.model.spinn import SPINN, transition_counts
from spinn.trees.transitions import PAD_TRANSITION, transition_count

Steps = tuple[int, ...]
SENTENCES_PER_PAIR = 2
"""A batch of B pairs holds 2B sentences: sentence batches are that size, so the GEMMs keep their shapes."""


@dataclass(frozen=True)
class Predictions:
    """What the model said about N pairs, in input order."""

    logits: numpy.ndarray  # (N, C) float32, the classifier's, before the temperature
    probabilities: numpy.ndarray  # (N, C) float32, softmax(logits / temperature)
    labels: numpy.ndarray  # (N,) int64, the most probable class (the largest logit: no temperature moves it)
    premise_transitions: list[Steps]
    """The 2n-1 transitions each premise ran on (its parse for gold; the tracker's for greedy)."""
    hypothesis_transitions: list[Steps]
    transition_steps: int = 0
    """Real steps of the sentences that came with transitions (0: none did, or the model has no tracker)."""
    transition_agreement: int = 0
    """Of those, the steps where the tracker's best legal action is the given transition."""
    temperature: float = 1.0

    @property
    def transition_accuracy(self) -> float | None:
        return self.transition_agreement / self.transition_steps if self.transition_steps else None


def predict(
    model: SPINN,
    examples: Sequence[Example],
    device: torch.device,
    batch_size: int,
    source: TransitionSource,
    *,
    step: InferStep | None = None,
    on_batch: Callable[[int], None] | None = None,
    temperature: float = 1.0,
) -> Predictions:
    """Run `model` over `examples` on `source` transitions; the batch size and order change no number.

    step: a caller that predicts often (training's dev evaluation) passes its own, so its CUDA graphs
    are kept. on_batch: told, as each batch of sentences is submitted, its pairs' worth of work (progress).
    temperature: the probabilities are softmax(logits / temperature): pass the model's own
    (`Checkpoint.softmax_temperature`, fitted on dev) so they are calibrated; the labels never depend on it."""
    if not examples:
        raise SpinnError("nothing to predict: no examples")
    if not 0 < temperature < math.inf:
        raise SpinnError(f"temperature must be a positive finite number, got {temperature}")
    step = step or InferStep(model, source)
    if step.source is not source:
        raise SpinnError(f"the inference step runs on {step.source.value} transitions, not {source.value}")
    sentences = DistinctSentences.of(examples)
    batches = sentences.batches(SENTENCES_PER_PAIR * batch_size)
    done = _progress(sentences, batches)
    was_training = model.training
    try:
        encoded = []
        for indices, pairs in zip(batches, done, strict=True):
            encoded.append(_encode(step, sentences, indices, device))
            recheck()  # auto threads follow the cores other work leaves free
            if on_batch is not None and pairs:
                on_batch(pairs)
        order = [index for batch in encoded for index in batch.indices]  # (S,) the sentences in encoding order
        logits = _classify(step, encoded, order, sentences, batch_size)
    finally:
        model.train(was_training)  # the step ran it in eval mode (no dropout, batch norm's running statistics)
    return _read_back(logits, temperature, encoded, order, sentences)


@dataclass(frozen=True)
class DistinctSentences:
    """The distinct sentences of a list of pairs, and where each pair's two sentences are among them.

    A sentence's encoding does not depend on its partner (the encoder reads each
    sentence on its own; batch norm in evaluation is per row), and NLI corpora
    repeat their premises: the 10,000 SNLI test pairs hold 3,323 distinct
    premises, and their distinct sentences 56% of their words. So each distinct
    (words, transitions) is encoded once; equal keys are equal inputs, so only
    the work changes."""

    words: list[tuple[int, ...]]
    transitions: list[tuple[int, ...]]
    premise: Tensor  # (P,) long, each pair's premise among the distinct sentences
    hypothesis: Tensor  # (P,) long

    @classmethod
    def of(cls, examples: Sequence[Example]) -> DistinctSentences:
        index: dict[tuple, int] = {}
        premise = [index.setdefault((e.premise, e.premise_transitions), len(index)) for e in examples]
        hypothesis = [index.setdefault((e.hypothesis, e.hypothesis_transitions), len(index)) for e in examples]
        words, transitions = zip(*index, strict=True)
        return cls(list(words), list(transitions), torch.tensor(premise), torch.tensor(hypothesis))

    def batches(self, size: int) -> list[list[int]]:
        """The sentences sorted by length and cut into batches of `size`: little padding, few distinct widths."""
        if size < 1:
            raise SpinnError(f"batch size must be at least 1, got {size}")
        order = sorted(range(len(self.words)), key=lambda i: (len(self.words[i]), i))
        return [order[start : start + size] for start in range(0, len(order), size)]

    def uses(self) -> Tensor:
        """(S,) how many times each distinct sentence occurs in the pairs."""
        return torch.bincount(torch.cat([self.premise, self.hypothesis]), minlength=len(self.words))


@dataclass(frozen=True)
class _Encoded:
    """One batch of sentences' encoder outputs, still on the device."""

    indices: list[int]
    vectors: Tensor  # (n, D)
    transitions: Tensor  # (n, T)
    counts: Tensor | None  # (n, 2) [real steps, agreeing steps] of each sentence (spinn.model.spinn.transition_counts)


def _encode(step: InferStep, sentences: DistinctSentences, indices: list[int], device: torch.device) -> _Encoded:
    """One batch of distinct sentences through the step's encoder; nothing is read back."""
    words = [sentences.words[i] for i in indices]
    batch = sentence_batch(words, [sentences.transitions[i] for i in indices], width_step=WIDTH_STEP)
    batch = batch.to(device, non_blocking=True)
    encoding = step.encode(batch)
    counts = None
    if encoding.transition_logits is not None:
        counts = transition_counts(encoding.transition_logits, batch.transitions)  # (n, 2)
    return _Encoded(indices, encoding.vectors, encoding.transitions, counts)


def _progress(sentences: DistinctSentences, batches: list[list[int]]) -> list[int]:
    """Pairs' worth of work each batch does: the pairs times the share of the sentences it encodes, summing
    to the pairs. Counting the pairs a batch completes would stall the bar while short sentences run (a pair
    is complete only once its long premise is) and jump at the end."""
    pairs, total = len(sentences.premise), len(sentences.words)
    done = [round(pairs * encoded / total) for encoded in accumulate(len(batch) for batch in batches)]
    return [after - before for before, after in zip([0, *done[:-1]], done, strict=True)]


def _classify(
    step: InferStep, encoded: list[_Encoded], order: list[int], sentences: DistinctSentences, batch_size: int
) -> Tensor:
    """(P, C) float32 class logits of the pairs in input order, from their sentences' vectors; on the device."""
    vectors = torch.cat([batch.vectors for batch in encoded])  # (S, D) in encoding order
    row = torch.empty(len(sentences.words), dtype=torch.long)  # (S,) where each distinct sentence lies in it
    row[order] = torch.arange(len(row))
    premise = row[sentences.premise].to(vectors.device, non_blocking=True)  # (P,)
    hypothesis = row[sentences.hypothesis].to(vectors.device, non_blocking=True)  # (P,)
    logits = []
    for start in range(0, len(premise), batch_size):
        pairs = slice(start, start + batch_size)
        logits.append(step.classify(vectors[premise[pairs]], vectors[hypothesis[pairs]]).float())  # (b, C)
    return torch.cat(logits)  # (P, C)


def _read_back(
    logits: Tensor, temperature: float, encoded: list[_Encoded], order: list[int], sentences: DistinctSentences
) -> Predictions:
    """The logits and every sentence's transitions to the host in one copy each, given to each pair; the
    probabilities are the logits' softmax at `temperature`, the labels their argmax."""
    width = max(batch.transitions.shape[1] for batch in encoded)
    ran = torch.cat([_padded(batch.transitions, width) for batch in encoded]).tolist()  # (S, T) encoding order
    steps: list[Steps] = [()] * len(sentences.words)
    for row, index in enumerate(order):
        steps[index] = _own_steps(ran[row], len(sentences.words[index]))
    logits = logits.cpu()  # (P, C)
    probabilities = torch.softmax(logits / temperature, dim=1)  # (P, C)
    real, agreeing = _agreement(encoded, sentences.uses()[order])
    return Predictions(
        logits.numpy(),
        probabilities.numpy(),
        logits.argmax(1).numpy(),  # of the logits: a softmax that rounds two top classes equal picks no other
        [steps[i] for i in sentences.premise.tolist()],
        [steps[i] for i in sentences.hypothesis.tolist()],
        int(real),
        int(agreeing),
        float(temperature),
    )


def _agreement(encoded: list[_Encoded], uses: Tensor) -> tuple[int, int]:
    """[real steps, agreeing steps] over the pairs: each distinct sentence's counts, read back once, times the
    times it occurs, `uses` (S,) in encoding order (on the host, so no batch waits for a copy to the device)."""
    if encoded[0].counts is None:
        return 0, 0
    counts = torch.cat([batch.counts for batch in encoded]).cpu()  # (S, 2) in encoding order
    real, agreeing = (counts * uses[:, None]).sum(0).tolist()
    return int(real), int(agreeing)


def _own_steps(padded: list[int], n_tokens: int) -> Steps:
    """A sentence's 2n - 1 transitions out of its right-padded row, read back once as a list for all rows."""
    return tuple(padded[: transition_count(n_tokens)])


def _padded(transitions: Tensor, width: int) -> Tensor:
    """(n, T) transitions right-padded to (n, width) with the no-op, so batches of every width stack."""
    return torch.nn.functional.pad(transitions, (0, width - transitions.shape[1]), value=PAD_TRANSITION)
