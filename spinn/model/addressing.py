"""Where every step of an encoding reads and writes in the node memory, so the model never asks the host.

Both encoders (spinn/model/spec.py, and the fused spinn/model/thin_stack_forward.py)
keep every node vector of a batch in one memory with a fixed row for everything
it will ever hold:

    row 0                          zeros: what an empty buffer or stack slot reads
    rows 1 .. N*L                  word j of sentence n at 1 + n*L + j (padding words never read)
    rows 1 + N*L + t*N + n         the node composed for sentence n at step t

Every sentence starts at step 0 and runs its own 2n - 1 steps; each step, every
sentence reads three rows (buffer top, stack second, stack top: the tracker's
inputs, and the second and top are the left and right children of a REDUCE) and
writes its composition to its own node row, which is read later only if the
step reduced. So for gold transitions all addresses depend on the transitions
alone: `gold_plan` works them out in numpy when the batch is made, ahead of the
model, and the encoder runs with no data-dependent control flow and no host
syncs. When the model chooses its own transitions (spinn without a parser, rl
sampling), `DeviceStacks` keeps the same stacks as tensors on the device and
works out each step's addresses with masks, again without a sync.

On a CPU nothing needs fixed shapes, and a row per sentence and step wastes
most of the composition (only a REDUCE's node is ever read): `gold_plan`
gives a gold plan a second set of addresses (`StepPlan.compact`, worked out
with the rest) where the nodes take consecutive rows, step by step, one per
REDUCE:

    rows 1 + N*L + m               the m-th REDUCE of the batch, in step order
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from spinn.ground.errors import SpinnError
from spinn.trees.transitions import REDUCE, SHIFT

ZERO_ROW = 0
WORD_BASE = 1
READ_SLOTS = 3
"""Rows each sentence reads per step: buffer top, stack second (left child), stack top (right child)."""
BUFFER_SLOT, SECOND_SLOT, TOP_SLOT = range(READ_SLOTS)
SLOT_NAMES = ("buffer", "second", "top")
"""The read slots in order, by the names the tracker gives those inputs (spinn/model/cells.py)."""
CHILD_READS = (SECOND_SLOT, TOP_SLOT)
"""A REDUCE's left and right child, in the composition's order: the stack second and the stack top."""
PLANES = 2
H_PLANE, C_PLANE = range(PLANES)
"""A node is its h and its c: the fused loops keep them as two planes of the memory, (2, R, D)."""


@dataclass(frozen=True)
class Layout:
    """The memory of a batch of `sentences` sentences padded to `width` words, run for `steps` steps."""

    sentences: int  # N
    width: int  # L
    steps: int  # T

    @property
    def node_base(self) -> int:
        return WORD_BASE + self.sentences * self.width

    @property
    def rows(self) -> int:
        return self.node_base + self.steps * self.sentences

    @classmethod
    def of(cls, tokens: Tensor, steps: int) -> Layout:
        return cls(tokens.shape[0], tokens.shape[1], steps)


@dataclass(frozen=True)
class CompactNodes:
    """A gold plan's addresses with a node row only for each REDUCE, for a loop that composes only those."""

    counts: list[int]  # (T,) the REDUCEs of each step: the rows it composes (host numbers, no device read)
    reducers: Tensor  # (M,) long: the sentence of each node, step after step
    children: Tensor  # (M, 2) long: the rows of each node's [left, right] child
    reads: Tensor  # (T, N, 3) long: the plan's reads, node rows renamed
    roots: Tensor  # (N,) long
    rows: int  # R' = N*L + M + 1: the memory's rows


def child_counts(counts: list[int]) -> list[int]:
    """The children's rows each step of a compact loop reads: [left, right] of each of its nodes."""
    return [len(CHILD_READS) * count for count in counts]


class ChildRows(NamedTuple):
    """One (2, 2M, D) buffer of the compact loop's nodes' [left, right] children, both planes (what the forward
    gathers and the backward scatters), and its views, cut once."""

    both: tuple[Tensor, ...]  # (2, 2k, D) per step: a step's gather or scatter-add, both planes in one op
    h: tuple[Tensor, ...]  # (k, 2D) per step: [left | right] h, a GEMM's operand or output
    c: tuple[Tensor, ...]  # (k, 2, D) per step: [left, right] c
    h_rows: Tensor  # (M, 2D)
    c_rows: Tensor  # (M, 2, D)

    @classmethod
    def of(cls, like: Tensor, counts: list[int], d: int) -> ChildRows:
        buffer = like.new_empty(PLANES, len(CHILD_READS) * sum(counts), d)  # (2, 2M, D)
        h_rows = buffer[H_PLANE].view(-1, len(CHILD_READS) * d)  # (M, 2D)
        c_rows = buffer[C_PLANE].view(-1, len(CHILD_READS), d)  # (M, 2, D)
        return cls(buffer.split(child_counts(counts), 1), h_rows.split(counts), c_rows.split(counts), h_rows, c_rows)


@dataclass(frozen=True)
class StepPlan:
    """The addresses of gold transitions, and which steps are real; tensors on one device."""

    reads: Tensor  # (T, N, 3) long: [buffer top, stack second, stack top] rows read at each step
    roots: Tensor  # (N,) long: each sentence's root row after its last step
    legal: Tensor  # (T, N, 2) bool: SHIFT and REDUCE legal before the step (masks the tracker's logits)
    real: Tensor  # (T, N) bool: the step is one of the sentence's own 2n - 1
    compact: CompactNodes | None = None  # the same addresses with a node row only per REDUCE; CPU plans only

    def to(self, device: torch.device | str, non_blocking: bool = False) -> StepPlan:
        """The plan on the device; the compact addresses stay only on a CPU, the one loop that reads them."""
        compact = self.compact if torch.device(device).type == "cpu" else None
        return StepPlan(*(tensor.to(device, non_blocking=non_blocking) for tensor in self.tensors()), compact)

    def pin_memory(self) -> StepPlan:
        """Pinned for a copy to a GPU, which has no use for the compact addresses."""
        return StepPlan(*(tensor.pin_memory() for tensor in self.tensors()))

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.reads, self.roots, self.legal, self.real


def real_steps(lengths: np.ndarray, steps: int) -> np.ndarray:
    """(T, N) bool: step t is real for a sentence of n words when t < 2n - 1."""
    return np.arange(steps)[:, None] < (2 * lengths - 1)[None, :]


def device_real_steps(lengths: Tensor, steps: int) -> Tensor:
    """(T, N) bool on the lengths' device, as `real_steps`: for transitions chosen on the device."""
    return torch.arange(steps, device=lengths.device)[:, None] < (2 * lengths - 1)[None, :]


def gold_plan(transitions: np.ndarray, lengths: np.ndarray, width: int) -> StepPlan:
    """Simulate the stacks of gold transitions (N, T), right-padded with a no-op, in numpy.

    One vectorized update per step over all N sentences (about T x 15 numpy calls
    for a whole batch), done on the host while the device works on the previous batch.
    """
    sentences, steps = transitions.shape
    layout = Layout(sentences, width, steps)
    rows = np.arange(sentences)
    stack = np.full((sentences, width + 1), ZERO_ROW, dtype=np.int64)  # the last column is scratch
    depth = np.zeros(sentences, dtype=np.int64)
    position = np.zeros(sentences, dtype=np.int64)
    reads = np.empty((steps, sentences, READ_SLOTS), dtype=np.int64)
    legal = np.empty((steps, sentences, 2), dtype=bool)
    for step in range(steps):
        reads[step] = _reads(stack, depth, position, lengths, rows, width)
        legal[step] = _legal(depth, position, lengths)
        action = transitions[:, step]
        _check_legal(action, legal[step], step)
        _apply(stack, depth, position, action, reads[step], layout.node_base + step * sentences + rows, rows, width)
    roots = stack[:, 0].copy()
    return StepPlan(
        torch.from_numpy(reads),
        torch.from_numpy(roots),
        torch.from_numpy(legal),
        torch.from_numpy(real_steps(lengths, steps)),
        _compact(transitions, reads, roots, layout),
    )


def _compact(transitions: np.ndarray, reads: np.ndarray, roots: np.ndarray, layout: Layout) -> CompactNodes:
    """Rename a plan's nodes: REDUCE m of the batch, in step order, gets row node_base + m; the rows of steps
    that did not REDUCE are never read, so they need none."""
    reducing = transitions.T == REDUCE  # (T, N)
    steps, sentences = np.nonzero(reducing)  # (M,) each, step-major
    renamed = np.arange(layout.rows)  # every row of the full layout -> its compact row
    renamed[layout.node_base + steps * layout.sentences + sentences] = layout.node_base + np.arange(len(steps))
    compact_reads = renamed[reads]  # (T, N, 3)
    children = compact_reads[steps, sentences][:, list(CHILD_READS)]  # (M, 2)
    return CompactNodes(
        reducing.sum(1).tolist(),
        torch.from_numpy(sentences),
        torch.from_numpy(np.ascontiguousarray(children)),
        torch.from_numpy(compact_reads),
        torch.from_numpy(renamed[roots]),
        layout.node_base + len(steps),
    )


def _reads(stack, depth, position, lengths, rows, width) -> np.ndarray:
    buffer = np.where(position < lengths, WORD_BASE + rows * width + np.minimum(position, width - 1), ZERO_ROW)
    top = np.where(depth >= 1, stack[rows, np.maximum(depth - 1, 0)], ZERO_ROW)
    second = np.where(depth >= 2, stack[rows, np.maximum(depth - 2, 0)], ZERO_ROW)
    return np.stack([buffer, second, top], 1)  # (N, 3)


def _legal(depth, position, lengths) -> np.ndarray:
    return np.stack([position < lengths, depth >= 2], 1)  # (N, 2) in Transition order


def _check_legal(action: np.ndarray, legal: np.ndarray, step: int) -> None:
    illegal = ((action == SHIFT) & ~legal[:, SHIFT]) | ((action == REDUCE) & ~legal[:, REDUCE])
    if illegal.any():
        row = int(np.flatnonzero(illegal)[0])
        raise SpinnError(f"sentence {row} of the batch has an illegal transition at step {step}")


def _apply(stack, depth, position, action, reads, nodes, rows, width) -> None:
    """SHIFT pushes the buffer top; REDUCE replaces the two top items by the step's node; a no-op does nothing."""
    shift, reduce = action == SHIFT, action == REDUCE
    column = np.where(shift, depth, np.where(reduce, depth - 2, width))
    stack[rows, column] = np.where(shift, reads[:, BUFFER_SLOT], nodes)
    depth += shift.astype(np.int64) - reduce.astype(np.int64)
    position += shift.astype(np.int64)


class DeviceStacks:
    """The same stacks as tensors on the device, for transitions the model chooses step by step."""

    def __init__(self, lengths: Tensor, layout: Layout):
        n, device = lengths.shape[0], lengths.device
        self.lengths, self.layout = lengths, layout
        self.rows = torch.arange(n, device=device)
        self.words = WORD_BASE + self.rows * layout.width  # (N,) row of each sentence's first word
        self.stack = torch.full((n, layout.width + 1), ZERO_ROW, dtype=torch.long, device=device)
        self.depth = torch.zeros(n, dtype=torch.long, device=device)
        self.position = torch.zeros(n, dtype=torch.long, device=device)
        self.below_top = torch.arange(2, 0, -1, device=device)  # (2,) depth offsets of [second, top]; no host copy

    def reads(self) -> Tensor:
        """(N, 3) rows the next step reads: [buffer top, stack second, stack top]."""
        buffer = torch.where(self.position < self.lengths, self.words + self.position, ZERO_ROW)  # (N,)
        slots = self.depth[:, None] - self.below_top  # (N, 2)
        tops = torch.where(slots >= 0, self.stack.gather(1, slots.clamp(min=0)), ZERO_ROW)  # (N, 2)
        return torch.cat([buffer[:, None], tops], 1)  # (N, 3)

    def legal(self) -> Tensor:
        """(N, 2) SHIFT and REDUCE legal now."""
        return torch.stack([self.position < self.lengths, self.depth >= 2], 1)

    def apply(self, action: Tensor, reads: Tensor, step: int) -> None:
        """Run the step's actions (N,): SHIFT, REDUCE or the padding no-op."""
        self.move(action == SHIFT, action == REDUCE, reads[:, BUFFER_SLOT], self.node_rows(step))

    def node_rows(self, step: int) -> Tensor:
        """(N,) the rows where step `step` writes each sentence's composition."""
        return self.layout.node_base + step * self.layout.sentences + self.rows

    def move(self, shift: Tensor, reduce: Tensor, buffer_top: Tensor, node: Tensor) -> None:
        """The shift phase pushes the buffer top's row; the reduce phase pops two rows and pushes the node's.

        shift, reduce (N,) bool, neither for a padding step; buffer_top, node (N,) rows."""
        column = torch.where(shift, self.depth, torch.where(reduce, self.depth - 2, self.layout.width))  # (N,)
        pushed = torch.where(shift, buffer_top, node)  # (N,)
        self.stack.scatter_(1, column[:, None], pushed[:, None])
        self.depth = self.depth + shift.long() - reduce.long()
        self.position = self.position + shift.long()

    def roots(self) -> Tensor:
        return self.stack[:, 0]
