"""The seed article's partially batched SPINN, kept only to measure the fast path against.

This is the algorithm of James Bradbury's 2017 PyTorch blog post "Recursive
Neural Networks with PyTorch": every sentence keeps its buffer and stack as
Python lists of (1, 2D) tensors; at each step the Tracker runs once on all
sentences (bundled with torch.cat) and Reduce runs once on the sentences that
REDUCE (their lefts and rights bundled, the three matmuls W_l, W_r, W_t done
separately as in the post), and the results are split back into the lists.
Premises and hypotheses are encoded in two separate passes, as in the post.

It wraps a `SPINN` and uses its modules, so both implementations run the same
weights (`spinn bench --impl reference` is like for like). One departure from
the post, needed for equal outputs: rows whose transition is the padding no-op
keep their tracker state instead of advancing it. Gold transitions only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spinn.ground.errors import SpinnError
from spinn.model.batch import Batch
from spinn.model.cells import Reduce, Tracker
from spinn.model.config import N_ACTIONS, TransitionSource
from spinn.model.spinn import SPINN, Encoding, SPINNOutput
from spinn.trees.transitions import PAD_TRANSITION, Transition

NULLS_UNDER_STACK = 2  # each stack starts with two null items so the tracker can always read two tops


class ReferenceSPINN(nn.Module):
    """Seed-article encoder around a fast SPINN's parameters; same outputs, per-example bookkeeping."""

    def __init__(self, model: SPINN):
        super().__init__()
        self.model = model

    def forward(self, batch: Batch, *, source: TransitionSource) -> SPINNOutput:
        if source is not TransitionSource.GOLD:
            raise SpinnError("the reference implementation runs on gold transitions only")
        pairs = batch.pairs
        halves = [
            self.encode(batch.tokens[part], batch.lengths[part], batch.transitions[part])
            for part in (slice(0, pairs), slice(pairs, 2 * pairs))
        ]
        logits = self.model.classifier(halves[0].vectors, halves[1].vectors)  # (B, n_classes)
        steps = batch.transitions.shape[1]
        transition_logits = None
        if halves[0].transition_logits is not None:
            lengths = batch.lengths.split(pairs)
            transition_logits = torch.cat(
                [
                    _right_aligned(half.transition_logits, size, steps)
                    for half, size in zip(halves, lengths, strict=True)
                ]
            )
        return SPINNOutput(logits, halves[0].vectors, halves[1].vectors, transition_logits, batch.transitions)

    def encode(self, tokens: Tensor, lengths: Tensor, transitions: Tensor) -> Encoding:
        """Sentence vectors of a batch of sentences: tokens (N, L), lengths (N,), transitions (N, T')."""
        reduce = self.model.encoder.reduce
        # The post's three Linear modules: the cell's weight blocks by input name, views cut once per pass.
        self._weights = {name: reduce.weight(name) for name in reduce.inputs}
        sizes = lengths.tolist()
        steps = 2 * max(sizes) - 1
        transitions = _left_aligned(transitions, sizes, steps)  # (N, T): the post pads in front, to its own length
        real = torch.arange(tokens.shape[1], device=tokens.device) < lengths[:, None]  # (N, L)
        words = self.model.embedding(tokens[real]).to(self.model.state_dtype)  # (W, 2D)
        null = words.new_zeros(1, words.shape[1])  # (1, 2D)
        buffers = [list(reversed(sentence.split(1))) for sentence in words.split(sizes)]  # pop() = next word
        stacks = [[null] * NULLS_UNDER_STACK for _ in sizes]
        tracker = self.model.encoder.tracker
        state = None
        if tracker is not None:
            zeros = words.new_zeros(len(sizes), tracker.d_tracker)
            state = (zeros, zeros)
        logits = []
        for step, step_transitions in enumerate(transitions.t().tolist()):
            trackings = [None] * len(sizes)
            if tracker is not None:
                state = self._track(buffers, stacks, state, transitions[:, step], null)
                trackings = list(state[0].split(1))  # unbundle
                if tracker.transition is not None:
                    logits.append(self._predict(buffers, stacks, state[0], transitions[:, step]))
            self._step(step_transitions, buffers, stacks, trackings)
        d = self.model.config.d_hidden
        roots = torch.cat([stack[-1] for stack in stacks])[:, :d]  # (N, D)
        return Encoding(roots, torch.stack(logits, 1) if logits else None, transitions)

    def _track(
        self, buffers: list, stacks: list, state: tuple[Tensor, Tensor], transition: Tensor, null: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The Tracker on every sentence (padding rows keep their state)."""
        d = self.model.config.d_hidden
        buffer_top = torch.cat([buffer[-1] if buffer else null for buffer in buffers])  # (N, 2D)
        top = torch.cat([stack[-1] for stack in stacks])  # (N, 2D)
        second = torch.cat([stack[-2] for stack in stacks])  # (N, 2D)
        reads = {"buffer": buffer_top[:, :d], "top": top[:, :d], "second": second[:, :d], Tracker.RECURRENT: state[0]}
        h, c = self.model.encoder.tracker(reads, (state[1],))  # (N, Dt) each
        padding = (transition == PAD_TRANSITION)[:, None]  # (N, 1)
        return torch.where(padding, state[0], h), torch.where(padding, state[1], c)

    def _predict(self, buffers: list, stacks: list, h: Tensor, transition: Tensor) -> Tensor:
        """(N, 2) transition logits, illegal actions at -inf, zeros on padding steps (as the fast path)."""
        legal = torch.tensor(
            [
                [
                    Transition(action).is_legal(len(stack) - NULLS_UNDER_STACK, len(buffer))
                    for action in range(N_ACTIONS)
                ]
                for buffer, stack in zip(buffers, stacks, strict=True)
            ],
            device=h.device,
        )  # (N, 2)
        scores = self.model.encoder.tracker.transition(h).masked_fill(~legal, float("-inf"))  # (N, 2)
        return torch.where((transition == PAD_TRANSITION)[:, None], torch.zeros_like(scores), scores)

    def _step(self, step_transitions: list[int], buffers: list, stacks: list, trackings: list) -> None:
        """Apply one transition per sentence in Python; batch the reductions into one Reduce call."""
        lefts, rights, tracked = [], [], []
        for transition, buffer, stack, tracking in zip(step_transitions, buffers, stacks, trackings, strict=True):
            if transition == Transition.SHIFT:
                stack.append(buffer.pop())
            elif transition == Transition.REDUCE:
                rights.append(stack.pop())
                lefts.append(stack.pop())
                tracked.append(tracking)
        if not rights:
            return
        reduced = iter(self._reduce(lefts, rights, tracked))
        for transition, stack in zip(step_transitions, stacks, strict=True):
            if transition == Transition.REDUCE:
                stack.append(next(reduced))

    def _reduce(self, lefts: list[Tensor], rights: list[Tensor], tracked: list) -> tuple[Tensor, ...]:
        """Reduce as in the post: bundle, three separate matmuls, TreeLSTM, unbundle."""
        reduce = self.model.encoder.reduce
        d = reduce.d_hidden
        left, right = torch.cat(lefts), torch.cat(rights)  # (R, 2D) each
        w_left, w_right = (self._weights[name] for name in Reduce.CHILDREN)  # (5D, D) each
        lstm_in = F.linear(left[:, :d], w_left, reduce.bias)  # (R, 5D)
        lstm_in = lstm_in + F.linear(right[:, :d], w_right)  # (R, 5D)
        if tracked[0] is not None:
            lstm_in = lstm_in + F.linear(torch.cat(tracked), self._weights[Reduce.TRACKING])  # (R, 5D)
        h, c = reduce.step(lstm_in, (left[:, d:], right[:, d:]))  # (R, D) each
        return torch.cat([h, c], 1).split(1)  # R x (1, 2D)


def _left_aligned(transitions: Tensor, sizes: list[int], steps: int) -> Tensor:
    """Right-padded (N, T) -> (N, steps) with each sentence's 2n - 1 steps at the end, as the post runs them."""
    aligned = transitions.new_full((len(sizes), steps), PAD_TRANSITION)
    for row, size in enumerate(sizes):
        aligned[row, steps - (2 * size - 1) :] = transitions[row, : 2 * size - 1]
    return aligned


def _right_aligned(logits: Tensor, lengths: Tensor, steps: int) -> Tensor:
    """The post's (N, T', 2) logits, own steps last -> (N, T, 2) own steps first, zeros after: the fast layout."""
    aligned = logits.new_zeros(logits.shape[0], steps, logits.shape[2])
    for row, size in enumerate(lengths.tolist()):
        count = 2 * size - 1
        aligned[row, :count] = logits[row, logits.shape[1] - count :]
    return aligned
