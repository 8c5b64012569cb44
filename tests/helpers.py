"""Builders more than one test module uses: tiny models, and seeded synthetic batches that need no ../shared."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from spinn.data.example import Example
from spinn.data.pairs import corpus_vocabulary, encode_pairs, read_raw_pairs
from spinn.model.batch import Batch, make_batch
from spinn.model.config import TREE_VARIANTS, SPINNConfig, TransitionSource
from spinn.model.policy import draw_uniforms
from spinn.model.spinn import SPINN, random_vectors
from spinn.trees.transitions import REDUCE, SHIFT

TOLERANCE = 1e-10
"""float64: two encoders of the same arithmetic differ only in the order of their sums."""
TINY = {"d_embed": 8, "d_hidden": 6, "d_tracker": 5, "mlp_layers": 1, "mlp_dim": 10, "use_batch_norm": True}
CASES = [(variant, source) for variant in TREE_VARIANTS for source in SPINNConfig(variant=variant, **TINY).sources]
"""Every tree variant with every transition source it can run."""
CASE_IDS = [f"{variant}-{source.value}" for variant, source in CASES]


def random_transitions(rng: random.Random, words: int) -> tuple[int, ...]:
    """A valid shift/reduce sequence of 2n - 1 steps over n words: a random binary tree."""
    sequence, depth, shifted = [], 0, 0
    while len(sequence) < 2 * words - 1:
        if shifted < words and (depth < 2 or rng.random() < 0.5):
            sequence.append(SHIFT)
            depth, shifted = depth + 1, shifted + 1
        else:
            sequence.append(REDUCE)
            depth -= 1
    return tuple(sequence)


def synthetic_batch(pairs: int = 10, vocab_size: int = 30, longest: int = 9, seed: int = 0) -> tuple[Batch, int]:
    """A seeded batch of pairs with random lengths (1 to `longest` words), ids, trees and labels, and the
    vocabulary size."""
    rng = random.Random(seed)

    def sentence() -> tuple[tuple[int, ...], tuple[int, ...]]:
        words = rng.randint(1, longest)
        return tuple(rng.randrange(2, vocab_size) for _ in range(words)), random_transitions(rng, words)

    examples = [Example(*sentence(), *sentence(), rng.randrange(3)) for _ in range(pairs)]
    return make_batch(examples), vocab_size


def tiny_model(variant: str, vocab_size: int, **config) -> SPINN:
    """A float64 model of TINY's sizes, seeded, in training mode."""
    torch.manual_seed(0)
    settings = {**TINY, **config}
    return SPINN(SPINNConfig(variant=variant, **settings), random_vectors(vocab_size, settings["d_embed"])).double()


def uniforms_for(batch: Batch, source: TransitionSource) -> torch.Tensor | None:
    """Fixed uniform draws for a sampled run (None for the other sources)."""
    if source is not TransitionSource.SAMPLED:
        return None
    generator = torch.Generator().manual_seed(1)
    return draw_uniforms(batch.tokens.shape[0], batch.transitions.shape[1], batch.tokens.device, generator)


def dev_batch(snli_dev: Path, pairs: int = 24) -> tuple[Batch, int]:
    """A batch of the first real SNLI dev pairs (mixed lengths), and the size of their vocabulary."""
    raw = read_raw_pairs(snli_dev)[:pairs]
    vocabulary = corpus_vocabulary(raw)
    return make_batch(encode_pairs(raw, vocabulary)), len(vocabulary)
