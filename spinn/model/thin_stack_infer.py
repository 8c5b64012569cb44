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
multiplies (no zero weight columns). When the model chooses its own transitions
a node takes the next free memory row, so the memory holds the nodes made, not
a row per sentence and step. The rows it computes see the same inputs
and the same cells as in the full loop, so the roots, the tracker states of
the real steps and the transitions are the same (tests/test_thin_stack_infer.py);
the rows it skips were never read.

Shapes: N sentences, L words, T steps, R memory rows, D hidden, Dt tracker,
A the rows active in a step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from spinn.model.addressing import BUFFER_SLOT, READ_SLOTS, SECOND_SLOT, TOP_SLOT, WORD_BASE, DeviceStacks
from spinn.model.cells import CHILD_SLOTS, REDUCE_GATES, TRACKER_READ_ORDER, lstm, tree_lstm
from spinn.model.policy import sample_actions
from spinn.model.thin_stack_forward import Run
from spinn.trees.transitions import PAD_TRANSITION, REDUCE, SHIFT

CHILD_ORDER = [SECOND_SLOT, TOP_SLOT]
"""The composition's input blocks, as read slots: [left child (stack second), right child (stack top)]."""
INT8_MAX = 127
INT8_REDUCE_RANGE = True
"""Activations quantized to 7 bits: fbgemm's int16 accumulation cannot saturate on cores without VNNI."""
TRACKER_INT8 = False
"""The tracker stays fp32 under int8: its argmax is the tree. Measured on SNLI test (10,000 pairs, a
300D spinn model, classifier int8 too): all-int8 kept 94.6% of the trees and 98.2% of the labels, an fp32
tracker 99.2% and 98.8%; with the classifier fp32 as well (SPINN.quantize_int8), 99.2% and 99.5%."""


def applies(words: Tensor) -> bool:
    """This loop serves a forward pass without gradients on the CPU (data-dependent shapes: no CUDA graph), in
    the model's own dtype: under CPU autocast the fused loop, which keeps the cell state fp32, runs instead."""
    return not torch.is_grad_enabled() and words.device.type == "cpu" and not torch.is_autocast_enabled("cpu")


class Linear:
    """x -> x W^T (+ b): fp32 GEMM on the weight as it lies, or fbgemm's int8 dynamic GEMM on a packed copy.

    int8 (`int8=True`): weights quantized once per output channel, activations per call; about 3x the fp32
    GEMM on AVX2 cores, for CPU labelling that accepts labels that agree with fp32 on nearly every pair."""

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
class Cells:
    """The cells' GEMMs, split by input block so each reads only the h halves it multiplies."""

    tracker_read: Linear | None  # [buffer, top, second] h (A, 3D) -> (A, 4Dt), with the bias
    tracker_recurrent: Linear | None  # h (A, Dt) -> (A, 4Dt)
    children: Linear  # [left, right] h (A, 2D) -> (A, 5D), with the bias
    tracking: Linear | None  # tracker h (A, Dt) -> (A, 5D)

    @classmethod
    def of(cls, tracker: tuple[Tensor, Tensor] | None, reduce: tuple[Tensor, Tensor], int8: bool = False) -> Cells:
        """tracker = (gates.weight, gates.bias), columns [buffer, top, second, h]; reduce = (compose.weight,
        compose.bias), columns [left, right, tracker]; int8: the composition's GEMMs in int8 (never the
        tracker's: see TRACKER_INT8)."""
        reduce_weight, reduce_bias = reduce
        d = reduce_weight.shape[0] // REDUCE_GATES
        children = Linear(reduce_weight[:, : CHILD_SLOTS * d], reduce_bias, int8)
        extra = reduce_weight[:, CHILD_SLOTS * d :]
        tracking = Linear(extra, None, int8) if extra.shape[1] else None
        if tracker is None:
            return cls(None, None, children, tracking)
        weight, bias = tracker
        read = Linear(weight[:, : READ_SLOTS * d], bias, TRACKER_INT8)
        return cls(read, Linear(weight[:, READ_SLOTS * d :], None, TRACKER_INT8), children, tracking)


def _pack_int8(weight: Tensor, bias: Tensor | None):
    """fbgemm's packed int8 weight, one symmetric scale per output row (torch warns its quantized
    tensors are deprecated; the packed GEMM is what dynamic quantization runs)."""
    scales = (weight.abs().amax(1) / INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny).double()  # (out,)
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.quantize_per_channel(weight.float().contiguous(), scales, zeros, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(quantized, None if bias is None else bias.float())


def encode(words: Tensor, cells: Cells, run: Run, gold: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """thin_stack_forward.encode's result without gradients: roots (N, D) and the tracker's h (T, N, Dt)
    (real steps only; the others stay zero) or None.

    words (N*L, 2D) = [h | c]; gold (N, T) the plan's transitions (run.plan given), else the run's
    chooser picks them."""
    return _InferLoop(words, cells, run, gold).forward()


class _InferLoop:
    """The memories and weights of one encoding, and its step loop."""

    def __init__(self, words: Tensor, cells: Cells, run: Run, gold: Tensor | None):
        layout = run.layout
        self.run, self.n, self.d = run, layout.sentences, words.shape[1] // 2
        # A plan's reads name the layout's node rows; nodes the loop places itself take the next free row,
        # and a sentence of at most L words makes at most L - 1 of them: a third of the layout's node rows.
        rows = layout.rows if run.plan is not None else layout.node_base + self.n * max(layout.width - 1, 0)
        self.next_node = layout.node_base
        self.memory_h = words.new_empty(rows, self.d)  # (R', D)
        self.memory_c = words.new_empty(rows, self.d)  # (R', D)
        for memory, half in ((self.memory_h, 0), (self.memory_c, 1)):
            memory[:WORD_BASE].zero_()
            memory[WORD_BASE : layout.node_base].copy_(words.view(-1, 2, self.d)[:, half])
        self.cells, self.gold = cells, gold

    def forward(self) -> tuple[Tensor, Tensor | None]:
        run, steps = self.run, self.run.layout.steps
        stacks = None if run.plan is not None else DeviceStacks(run.lengths, run.layout)
        if stacks is not None:
            run.chooser.taken = torch.full((steps, self.n), PAD_TRANSITION, dtype=torch.long)
            run.chooser.legal = torch.empty(steps, self.n, 2, dtype=torch.bool)
        states, cells = self._tracker_buffers(steps)
        for step in range(steps):
            reads = run.plan.reads[step] if stacks is None else stacks.reads()  # (N, 3)
            active = run.real[step].nonzero().squeeze(1)  # (A,)
            h = None
            if self.cells.tracker_read is not None:
                h = self._track(reads, active, states, cells, step)  # (A, Dt)
            action = self._action(step, stacks, active, h)  # (N,)
            nodes = self._compose(step, reads, action, states[step + 1] if states is not None else None)
            if stacks is not None:
                stacks.move(action == SHIFT, action == REDUCE, reads[:, BUFFER_SLOT], nodes)
        run.roots = run.plan.roots if stacks is None else stacks.roots()
        roots = self.memory_h.index_select(0, run.roots)  # (N, D)
        return roots, (states[1:] if states is not None else None)

    def _tracker_buffers(self, steps: int) -> tuple[Tensor | None, Tensor | None]:
        if self.cells.tracker_recurrent is None:
            return None, None
        dt = self.cells.tracker_recurrent.shape[1]
        return self.memory_h.new_zeros(steps + 1, self.n, dt), self.memory_h.new_zeros(self.n, dt)  # h (T+1, N, Dt)

    def _track(self, reads: Tensor, active: Tensor, states: Tensor, cells: Tensor, step: int) -> Tensor:
        """The tracker LSTM for the active sentences over [buffer, top, second] h -> their new h (A, Dt)."""
        rows = reads.index_select(0, active)[:, TRACKER_READ_ORDER].reshape(-1)  # (3A,)
        inputs = self.memory_h.index_select(0, rows).view(len(active), READ_SLOTS * self.d)  # (A, 3D)
        gates = self.cells.tracker_read(inputs)  # (A, 4Dt)
        self.cells.tracker_recurrent.add_to(gates, states[step].index_select(0, active))
        h, c = lstm(gates, cells.index_select(0, active))  # (A, Dt) each
        states[step + 1].index_copy_(0, active, h)
        cells.index_copy_(0, active, c)
        return h

    def _action(self, step: int, stacks: DeviceStacks | None, active: Tensor, h: Tensor | None) -> Tensor:
        """(N,) this step's actions: the plan's, or the chooser's for the active sentences (padding elsewhere)."""
        if stacks is None:
            return self.gold[:, step]
        chooser = self.run.chooser
        legal = stacks.legal()  # (N, 2)
        chooser.legal[step] = legal
        scores = torch.addmm(chooser.bias, h, chooser.weight.t())  # (A, 2)
        scores = scores.masked_fill(~legal.index_select(0, active), float("-inf"))
        if chooser.uniforms is None:
            chosen = scores.argmax(1)  # (A,)
        else:
            chosen = sample_actions(scores, chooser.uniforms[:, step].index_select(0, active))
        chooser.taken[step].index_copy_(0, active, chosen)
        return chooser.taken[step]

    def _compose(self, step: int, reads: Tensor, action: Tensor, tracking: Tensor | None) -> Tensor:
        """The TreeLSTM for the sentences that REDUCE at this step, written into their node rows; returns
        (N,) each sentence's node row (meaningful where it reduced)."""
        reducing = (action == REDUCE).nonzero().squeeze(1)  # (A,)
        nodes = self._node_rows(step, reducing)  # (A,)
        placed = torch.zeros_like(action)  # (N,)
        placed.index_copy_(0, reducing, nodes)
        if not len(reducing):
            return placed
        children = reads.index_select(0, reducing)[:, CHILD_ORDER].reshape(-1)  # (2A,) [left, right] rows
        h_children = self.memory_h.index_select(0, children).view(len(reducing), CHILD_SLOTS * self.d)  # (A, 2D)
        c_children = self.memory_c.index_select(0, children).view(len(reducing), CHILD_SLOTS * self.d)  # (A, 2D)
        gates = self.cells.children(h_children)  # (A, 5D)
        if self.cells.tracking is not None:
            self.cells.tracking.add_to(gates, tracking.index_select(0, reducing))
        h, c = tree_lstm(gates, c_children)  # (A, D) each
        self.memory_h.index_copy_(0, nodes, h)
        self.memory_c.index_copy_(0, nodes, c)
        return placed

    def _node_rows(self, step: int, reducing: Tensor) -> Tensor:
        """(A,) where this step's nodes go: the layout's rows for a plan, else the next free rows."""
        if self.run.plan is not None:
            return self.run.layout.node_base + step * self.n + reducing
        first, self.next_node = self.next_node, self.next_node + len(reducing)
        return torch.arange(first, self.next_node)
