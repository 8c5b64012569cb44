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
multiplies (no zero weight columns). The rows it computes see the same inputs
and the same cells as in the full loop, so the roots, the tracker states of
the real steps and the transitions are the same (tests/test_thin_stack_infer.py);
the rows it skips were never read.

Shapes: N sentences, L words, T steps, R memory rows, D hidden, Dt tracker,
A the rows active in a step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spinn.model.addressing import READ_SLOTS, SECOND_SLOT, TOP_SLOT, WORD_BASE, DeviceStacks
from spinn.model.cells import CHILD_SLOTS, TRACKER_READ_ORDER, lstm, tree_lstm
from spinn.model.policy import sample_actions
from spinn.model.thin_stack_forward import Run
from spinn.trees.transitions import PAD_TRANSITION, REDUCE

CHILD_ORDER = [SECOND_SLOT, TOP_SLOT]
"""The composition's input blocks, as read slots: [left child (stack second), right child (stack top)]."""


def applies(words: Tensor) -> bool:
    """This loop serves a forward pass without gradients on the CPU (data-dependent shapes: no CUDA graph)."""
    return not torch.is_grad_enabled() and words.device.type == "cpu"


def encode(
    words: Tensor,
    tracker: tuple[Tensor, Tensor] | None,
    reduce: tuple[Tensor, Tensor],
    run: Run,
    gold: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    """thin_stack_forward.encode's result without gradients: roots (N, D) and the tracker's h (T, N, Dt)
    (real steps only; the others stay zero) or None.

    words (N*L, 2D) = [h | c]; tracker = (gates.weight, gates.bias), columns [buffer, top, second, h];
    reduce = (compose.weight, compose.bias), columns [left, right, tracker]; gold (N, T) the plan's
    transitions (run.plan given), else the run's chooser picks them."""
    loop = _InferLoop(words, tracker, reduce, run, gold)
    return loop.forward()


class _InferLoop:
    """The memories and weights of one encoding, and its step loop."""

    def __init__(self, words: Tensor, tracker, reduce, run: Run, gold: Tensor | None):
        layout = run.layout
        self.run, self.n, self.d = run, layout.sentences, words.shape[1] // 2
        self.memory_h = words.new_empty(layout.rows, self.d)  # (R, D)
        self.memory_c = words.new_empty(layout.rows, self.d)  # (R, D)
        for memory, half in ((self.memory_h, 0), (self.memory_c, 1)):
            memory[:WORD_BASE].zero_()
            memory[WORD_BASE : layout.node_base].copy_(words.view(-1, 2, self.d)[:, half])
        reduce_weight, self.reduce_bias = reduce
        self.children_weight = reduce_weight[:, : CHILD_SLOTS * self.d].t()  # (2D, 5D)
        extra = reduce_weight[:, CHILD_SLOTS * self.d :]
        self.reduce_track = extra.t() if extra.shape[1] else None  # (Dt, 5D)
        self.tracker = None if tracker is None else _tracker_weights(*tracker, self.d)
        self.gold = gold

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
            if self.tracker is not None:
                h = self._track(reads, active, states, cells, step)  # (A, Dt)
            action = self._action(step, stacks, active, h)  # (N,)
            self._compose(step, reads, action, states[step + 1] if states is not None else None)
            if stacks is not None:
                stacks.apply(action, reads, step)
        run.roots = run.plan.roots if stacks is None else stacks.roots()
        roots = self.memory_h.index_select(0, run.roots)  # (N, D)
        return roots, (states[1:] if states is not None else None)

    def _tracker_buffers(self, steps: int) -> tuple[Tensor | None, Tensor | None]:
        if self.tracker is None:
            return None, None
        dt = self.tracker[1].shape[0]
        return self.memory_h.new_zeros(steps + 1, self.n, dt), self.memory_h.new_zeros(self.n, dt)  # h (T+1, N, Dt)

    def _track(self, reads: Tensor, active: Tensor, states: Tensor, cells: Tensor, step: int) -> Tensor:
        """The tracker LSTM for the active sentences over [buffer, top, second] h -> their new h (A, Dt)."""
        read_weight, recurrent_weight, bias = self.tracker
        rows = reads.index_select(0, active)[:, TRACKER_READ_ORDER].reshape(-1)  # (3A,)
        inputs = self.memory_h.index_select(0, rows).view(len(active), READ_SLOTS * self.d)  # (A, 3D)
        gates = torch.addmm(bias, inputs, read_weight)  # (A, 4Dt)
        gates.addmm_(states[step].index_select(0, active), recurrent_weight)
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

    def _compose(self, step: int, reads: Tensor, action: Tensor, tracking: Tensor | None) -> None:
        """The TreeLSTM for the sentences that REDUCE at this step, written into their node rows."""
        reducing = (action == REDUCE).nonzero().squeeze(1)  # (A,)
        if not len(reducing):
            return
        children = reads.index_select(0, reducing)[:, CHILD_ORDER].reshape(-1)  # (2A,) [left, right] rows
        h_children = self.memory_h.index_select(0, children).view(len(reducing), CHILD_SLOTS * self.d)  # (A, 2D)
        c_children = self.memory_c.index_select(0, children).view(len(reducing), CHILD_SLOTS * self.d)  # (A, 2D)
        gates = torch.addmm(self.reduce_bias, h_children, self.children_weight)  # (A, 5D)
        if self.reduce_track is not None:
            gates.addmm_(tracking.index_select(0, reducing), self.reduce_track)
        h, c = tree_lstm(gates, c_children)  # (A, D) each
        nodes = self.run.layout.node_base + step * self.n + reducing  # (A,)
        self.memory_h.index_copy_(0, nodes, h)
        self.memory_c.index_copy_(0, nodes, c)


def _tracker_weights(weight: Tensor, bias: Tensor, d: int) -> tuple[Tensor, Tensor, Tensor]:
    """(3D, 4Dt) over [buffer, top, second] h, (Dt, 4Dt) recurrent, and the bias (4Dt,)."""
    return weight[:, : READ_SLOTS * d].t(), weight[:, READ_SLOTS * d :].t(), bias
