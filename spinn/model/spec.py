"""SPINN's encoder as its algorithm: the readable spec that the fused thin stack is tested equal to.

One loop over transition steps, all sentences at once. Each step:

1. gather   read the buffer top, stack second and stack top of every sentence from the node memory;
2. tracker  an LSTM over those three phrases carries the sentence's context (pi, spinn, rl);
3. choose   SHIFT or REDUCE: the parser's (gold), or the tracker's best (greedy) or sampled legal action;
4. compose  the TreeLSTM cell over (second, top) and the tracker's state, for every sentence;
5. write    the node into the step's own rows; then the stacks move: the shift phase pushes the
            buffer top's row, the reduce phase pops two rows and pushes the node's (a node is
            read later only if its step reduced).

It calls the cells as modules (spinn/model/cells.py) and autograd differentiates it; the fused
encoder (thin_stack_forward.py / thin_stack_backward.py) calls the same cells' steps over the
same rows (spinn/model/addressing.py), with the backward written out from their derivatives.

Shapes: N sentences, L words, T steps, R memory rows, D hidden, Dt tracker; a memory row is [h | c].
"""

from __future__ import annotations

import torch
from torch import Tensor

from spinn.model.addressing import BUFFER_SLOT, CHILD_READS, SLOT_NAMES, WORD_BASE, DeviceStacks
from spinn.model.cells import Reduce, Tracker
from spinn.model.encoder_run import EncoderOutput, Run
from spinn.trees.transitions import Transition


def encode(words: Tensor, cells: tuple[Reduce, Tracker | None], run: Run) -> EncoderOutput:
    """words (N*L, 2D) = [h | c] of every word slot."""
    reduce, tracker = cells
    layout = run.layout
    n, d = layout.sentences, words.shape[1] // 2
    nodes = words.new_zeros(layout.rows - layout.node_base, 2 * d)  # (T*N, 2D)
    memory = torch.cat([words.new_zeros(WORD_BASE, 2 * d), words, nodes])  # (R, 2D), addressing.Layout's rows
    stacks = DeviceStacks(run.lengths, layout)
    h = c = words.new_zeros(n, tracker.d_tracker) if tracker is not None else None  # (N, Dt)
    states, taken, legal = [], [], []
    for step in range(layout.steps):
        reads = stacks.reads()  # (N, 3) rows: [buffer top, stack second, stack top]
        rows = memory[reads]  # (N, 3, 2D): gather
        read_h, read_c = rows[:, :, :d].unbind(1), rows[:, :, d:].unbind(1)  # (N, D) each, by slot
        if tracker is not None:
            h, c = tracker({**dict(zip(SLOT_NAMES, read_h, strict=True)), Tracker.RECURRENT: h}, (c,))
            states.append(h)
        legal.append(stacks.legal())  # (N, 2)
        action = choose(run, step, h, legal[-1])  # (N,)
        node = compose(reduce, read_h, read_c, h)  # (N, 2D)
        node_rows = stacks.node_rows(step)  # (N,)
        memory = memory.index_copy(0, node_rows, node)  # write
        shift, reduce_ = action == Transition.SHIFT, action == Transition.REDUCE  # (N,) each; neither: padding
        stacks.move(shift, reduce_, reads[:, BUFFER_SLOT], node_rows)  # shift phase, reduce phase
        taken.append(action)
    roots = memory[stacks.roots(), :d]  # (N, D)
    tracked = torch.stack(states) if tracker is not None else None  # (T, N, Dt)
    return EncoderOutput(roots, tracked, torch.stack(taken, 1), torch.stack(legal), run.real)


def compose(reduce: Reduce, read_h: tuple[Tensor, ...], read_c: tuple[Tensor, ...], tracking: Tensor | None) -> Tensor:
    """The TreeLSTM over the stack second (left child) and stack top (right child) -> node (N, 2D) = [h | c].

    Every sentence composes every step (fixed shapes); the node is read later only if the step reduced."""
    inputs = {name: read_h[slot] for name, slot in zip(Reduce.CHILDREN, CHILD_READS, strict=True)}
    if reduce.d_tracker:
        inputs[Reduce.TRACKING] = tracking
    h, c = reduce(inputs, [read_c[slot] for slot in CHILD_READS])  # (N, D) each
    return torch.cat([h, c], 1)


def choose(run: Run, step: int, h: Tensor | None, legal: Tensor) -> Tensor:
    """(N,) this step's Transition.SHIFT or Transition.REDUCE per sentence (PAD_TRANSITION once it ended).

    Not differentiated: REINFORCE learns the policy from the transition logits of the states."""
    if run.gold is not None:
        return run.gold.transitions[:, step]
    return run.padded(run.chooser.choose(h.detach(), legal, step), step)
