"""The thin stack without gradients on the CPU: only the rows that need it compute each step.

The fused training loop (thin_stack_forward.py) computes every sentence at
every step so that shapes stay fixed (CUDA graphs, a simple backward). Without
gradients on the CPU nothing needs fixed shapes, and most of that arithmetic
is wasted: a node is read later only if its step REDUCEd (n - 1 of a
sentence's 2n - 1 steps), and a sentence whose own steps are over needs no
tracker. So each step here

1. runs the tracker only for the sentences still inside their own 2n - 1 steps;
2. chooses the actions (the plan's, or the tracker's best or sampled legal one);
3. composes only the sentences that REDUCE, and writes those nodes;

with h and c in separate memories, so each GEMM reads exactly the h halves it
multiplies (no zero weight columns), and the cells' own steps
(spinn/model/cells.py) on the rows gathered. When the model chooses its own
transitions a node takes the next free memory row, so the memory holds the
nodes made, not a row per sentence and step. The rows it computes see the same
inputs and the same cells as in the full loop, so the roots, the tracker states
of the real steps and the transitions are the same
(tests/test_thin_stack_infer.py); the rows it skips were never read.

Shapes: N sentences, L words, T steps, R memory rows, D hidden, Dt tracker,
A the rows active in a step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from spinn.model.addressing import BUFFER_SLOT, CHILD_READS, READ_SLOTS, SLOT_NAMES, WORD_BASE, DeviceStacks
from spinn.model.cells import GatedCell, Reduce, Tracker
from spinn.model.encoder_run import EncoderOutput, Run
from spinn.trees.transitions import PAD_TRANSITION, REDUCE, SHIFT

INT8_MAX = 127
INT8_REDUCE_RANGE = True
"""Activations quantized to 7 bits: fbgemm's int16 accumulation cannot saturate on cores without VNNI."""
TRACKER_INT8 = False
"""The tracker stays fp32 under int8: its argmax is the tree, and int8 moves it far more than the labels."""


class Linear:
    """x -> x W^T (+ b): fp32 GEMM on the weight as it lies, or fbgemm's int8 dynamic GEMM on a packed copy
    (weights quantized once per output channel, activations per call)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, int8: bool):
        self.shape = tuple(weight.shape)  # (out, in)
        self.bias, self.weight_t, self.packed = bias, weight.t(), None
        if int8:
            self.weight_t, self.packed = None, _pack_int8(weight, bias)

    def __call__(self, x: Tensor) -> Tensor:
        """(A, in) -> (A, out)."""
        if self.packed is not None:
            return torch.ops.quantized.linear_dynamic(x, self.packed, INT8_REDUCE_RANGE)
        return x @ self.weight_t if self.bias is None else torch.addmm(self.bias, x, self.weight_t)

    def add_to(self, out: Tensor, x: Tensor) -> Tensor:
        """out (A, out) += x W^T."""
        if self.packed is not None:
            return out.add_(torch.ops.quantized.linear_dynamic(x, self.packed, INT8_REDUCE_RANGE))
        return out.addmm_(x, self.weight_t)


@dataclass(frozen=True)
class Gemms:
    """The cells' GEMMs as this loop gathers their inputs: one per input group, each on the h halves it reads."""

    tracker_reads: Linear | None  # [buffer, second, top] h (A, 3D) -> (A, 4Dt), with the bias
    tracker_recurrent: Linear | None  # h (A, Dt) -> (A, 4Dt)
    children: Linear  # [left, right] h (A, 2D) -> (A, 5D), with the bias
    tracking: Linear | None  # tracker h (A, Dt) -> (A, 5D)

    @classmethod
    def of(cls, cells: tuple[Reduce, Tracker | None], int8: bool = False) -> Gemms:
        """int8: the composition's GEMMs in int8 (never the tracker's: see TRACKER_INT8)."""
        reduce, tracker = cells
        children = _linear(reduce, Reduce.CHILDREN, True, int8)
        tracking = _linear(reduce, (Reduce.TRACKING,), False, int8) if reduce.d_tracker else None
        if tracker is None:
            return cls(None, None, children, tracking)
        reads = _linear(tracker, SLOT_NAMES, True, TRACKER_INT8)
        return cls(reads, _linear(tracker, (Tracker.RECURRENT,), False, TRACKER_INT8), children, tracking)


def _linear(cell: GatedCell, names: tuple[str, ...], with_bias: bool, int8: bool) -> Linear:
    return Linear(cell.weight(*names).detach(), cell.bias.detach() if with_bias else None, int8)


def _pack_int8(weight: Tensor, bias: Tensor | None):
    """fbgemm's packed int8 weight, one symmetric scale per output row (torch warns its quantized
    tensors are deprecated; the packed GEMM is what dynamic quantization runs)."""
    scales = (weight.abs().amax(1) / INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny).double()  # (out,)
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.quantize_per_channel(weight.float().contiguous(), scales, zeros, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(quantized, None if bias is None else bias.float())


def encode(words: Tensor, gemms: Gemms, cells: tuple[Reduce, Tracker | None], run: Run) -> EncoderOutput:
    """thin_stack_forward.encode's result without gradients: the tracker's states are those of the real steps
    (the others stay zero). words (N*L, 2D) = [h | c]."""
    return _InferLoop(words, gemms, cells, run).forward()


class _InferLoop:
    """The memories and weights of one encoding, and its step loop."""

    def __init__(self, words: Tensor, gemms: Gemms, cells: tuple[Reduce, Tracker | None], run: Run):
        layout = run.layout
        self.run, self.n, self.d = run, layout.sentences, words.shape[1] // 2
        self.gemms, (self.reduce, self.tracker) = gemms, cells
        # A plan's reads name the layout's node rows; nodes the loop places itself take the next free row,
        # and a sentence of at most L words makes at most L - 1 of them: a third of the layout's node rows.
        rows = layout.rows if run.gold is not None else layout.node_base + self.n * max(layout.width - 1, 0)
        self.next_node = layout.node_base
        self.memory_h = words.new_empty(rows, self.d)  # (R', D)
        self.memory_c = words.new_empty(rows, self.d)  # (R', D)
        for memory, half in ((self.memory_h, 0), (self.memory_c, 1)):
            memory[:WORD_BASE].zero_()
            memory[WORD_BASE : layout.node_base].copy_(words.view(-1, 2, self.d)[:, half])

    def forward(self) -> EncoderOutput:
        run, steps = self.run, self.run.layout.steps
        stacks = None if run.gold is not None else DeviceStacks(run.lengths, run.layout)
        if stacks is not None:
            self.taken = torch.full((steps, self.n), PAD_TRANSITION, dtype=torch.long)
            self.legal = torch.empty(steps, self.n, 2, dtype=torch.bool)
        states, cells = self._tracker_buffers(steps)
        for step in range(steps):
            reads = run.gold.plan.reads[step] if stacks is None else stacks.reads()  # (N, 3)
            active = run.real[step].nonzero().squeeze(1)  # (A,)
            h = self._track(reads, active, states, cells, step) if self.tracker is not None else None  # (A, Dt)
            action = self._action(step, stacks, active, h)  # (N,)
            nodes = self._compose(step, reads, action, states[step + 1] if states is not None else None)
            if stacks is not None:
                stacks.move(action == SHIFT, action == REDUCE, reads[:, BUFFER_SLOT], nodes)
        roots = run.gold.plan.roots if stacks is None else stacks.roots()
        h_roots = self.memory_h.index_select(0, roots)  # (N, D)
        tracked = states[1:] if states is not None else None  # (T, N, Dt)
        if stacks is None:
            return EncoderOutput(h_roots, tracked, run.gold.transitions, run.gold.plan.legal, run.real)
        return EncoderOutput(h_roots, tracked, self.taken.t(), self.legal, run.real)

    def _tracker_buffers(self, steps: int) -> tuple[Tensor | None, Tensor | None]:
        if self.tracker is None:
            return None, None
        dt = self.tracker.width
        return self.memory_h.new_zeros(steps + 1, self.n, dt), self.memory_h.new_zeros(self.n, dt)  # h (T+1, N, Dt)

    def _track(self, reads: Tensor, active: Tensor, states: Tensor, cells: Tensor, step: int) -> Tensor:
        """The tracker for the active sentences over their read rows' h -> their new h (A, Dt)."""
        rows = reads.index_select(0, active).reshape(-1)  # (3A,) in slot order
        inputs = self.memory_h.index_select(0, rows).view(len(active), READ_SLOTS * self.d)  # (A, 3D)
        gates = self.gemms.tracker_reads(inputs)  # (A, 4Dt)
        self.gemms.tracker_recurrent.add_to(gates, states[step].index_select(0, active))
        h, c = self.tracker.step(gates, (cells.index_select(0, active),))  # (A, Dt) each
        states[step + 1].index_copy_(0, active, h)
        cells.index_copy_(0, active, c)
        return h

    def _action(self, step: int, stacks: DeviceStacks | None, active: Tensor, h: Tensor | None) -> Tensor:
        """(N,) this step's actions: the parser's, or the chooser's for the active sentences (padding elsewhere)."""
        if stacks is None:
            return self.run.gold.transitions[:, step]
        self.legal[step] = stacks.legal()
        chosen = self.run.chooser.choose(h, self.legal[step].index_select(0, active), step, active)  # (A,)
        self.taken[step].index_copy_(0, active, chosen)
        return self.taken[step]

    def _compose(self, step: int, reads: Tensor, action: Tensor, tracking: Tensor | None) -> Tensor:
        """The composition for the sentences that REDUCE at this step, written into their node rows; returns
        (N,) each sentence's node row (meaningful where it reduced)."""
        reducing = (action == REDUCE).nonzero().squeeze(1)  # (A,)
        nodes = self._node_rows(step, reducing)  # (A,)
        placed = torch.zeros_like(action)  # (N,)
        placed.index_copy_(0, reducing, nodes)
        if not len(reducing):
            return placed
        children = reads.index_select(0, reducing)[:, list(CHILD_READS)].reshape(-1)  # (2A,) [left, right] rows
        h_children = self.memory_h.index_select(0, children).view(len(reducing), -1)  # (A, 2D)
        c_children = self.memory_c.index_select(0, children).view(len(reducing), len(CHILD_READS), self.d)
        gates = self.gemms.children(h_children)  # (A, 5D)
        if self.gemms.tracking is not None:
            self.gemms.tracking.add_to(gates, tracking.index_select(0, reducing))
        h, c = self.reduce.step(gates, c_children.unbind(1))  # (A, D) each
        self.memory_h.index_copy_(0, nodes, h)
        self.memory_c.index_copy_(0, nodes, c)
        return placed

    def _node_rows(self, step: int, reducing: Tensor) -> Tensor:
        """(A,) where this step's nodes go: the layout's rows for a plan, else the next free rows."""
        if self.run.gold is not None:
            return self.run.layout.node_base + step * self.n + reducing
        first, self.next_node = self.next_node, self.next_node + len(reducing)
        return torch.arange(first, self.next_node)
