"""SPINN's encoder as its algorithm: the readable spec that the fused thin stack is tested equal to.

One loop over transition steps, all sentences at once. Each step:

1. gather   read the buffer top, stack second and stack top of every sentence from the node memory;
2. tracker  an LSTM over those three phrases carries the sentence's context (pi, spinn, rl);
3. choose   SHIFT or REDUCE: the parser's (gold), or the tracker's best (greedy) or sampled legal action;
4. compose  the TreeLSTM cell over (second, top) and the tracker's state, for every sentence;
5. write    the node into the step's own rows; then the stacks move: the shift phase pushes the
            buffer top's row, the reduce phase pops two rows and pushes the node's (a node is
            read later only if its step reduced).

It calls the cells' own forward() (spinn/model/cells.py) and autograd differentiates it, so a new
cell works here at once; the fused encoder (thin_stack_forward.py / thin_stack_backward.py) is the
same computation over the same rows (spinn/model/addressing.py), with its backward written out.

Shapes: N sentences, L words, T steps, R memory rows, D hidden, Dt tracker; a memory row is [h | c].
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from spinn.model.addressing import BUFFER_SLOT, WORD_BASE, DeviceStacks, Layout, device_real_steps
from spinn.model.cells import Reduce, Tracker
from spinn.model.config import TransitionSource
from spinn.model.policy import sample_actions
from spinn.trees.transitions import PAD_TRANSITION, Transition


class EncoderOutput(NamedTuple):
    """What either encoder returns for N sentences."""

    roots: Tensor  # (N, D) root h of each sentence
    states: Tensor | None  # (T, N, Dt) the tracker's h after each step; None without a tracker (pi-nt)
    transitions: Tensor  # (N, T) the actions that ran, PAD_TRANSITION after each sentence's end
    legal: Tensor  # (T, N, 2) SHIFT and REDUCE legal before each step
    real: Tensor  # (T, N) bool: the step is one of the sentence's own 2n - 1


def encode(
    words: Tensor,
    lengths: Tensor,
    layout: Layout,
    cells: tuple[Reduce, Tracker | None],
    source: TransitionSource,
    gold: Tensor | None = None,
    uniforms: Tensor | None = None,
) -> EncoderOutput:
    """words (N*L, 2D) = [h | c] of every word slot; gold (N, T) the parser's transitions (source gold);
    uniforms (N, T) one draw per sentence and own step (source sampled)."""
    composition, tracker = cells
    n, d = layout.sentences, words.shape[1] // 2
    nodes = words.new_zeros(layout.rows - layout.node_base, 2 * d)  # (T*N, 2D)
    memory = torch.cat([words.new_zeros(WORD_BASE, 2 * d), words, nodes])  # (R, 2D), addressing.Layout's rows
    stacks = DeviceStacks(lengths, layout)
    real = device_real_steps(lengths, layout.steps)  # (T, N)
    h = c = words.new_zeros(n, tracker.d_tracker) if tracker is not None else None  # (N, Dt)
    states, taken, legal = [], [], []
    for step in range(layout.steps):
        reads = stacks.reads()  # (N, 3) rows: [buffer top, stack second, stack top]
        buffer, second, top = memory[reads].unbind(1)  # (N, 2D) each: gather
        if tracker is not None:
            h, c = tracker(torch.cat([buffer[:, :d], top[:, :d], second[:, :d]], 1), h, c)  # (N, Dt) each
            states.append(h)
        legal.append(stacks.legal())  # (N, 2)
        action = choose(source, step, tracker, h, legal[-1], real[step], gold, uniforms)  # (N,)
        node = compose(composition, second, top, h, d)  # (N, 2D)
        node_rows = stacks.node_rows(step)  # (N,)
        memory = memory.index_copy(0, node_rows, node)  # write
        shift, reduce = action == Transition.SHIFT, action == Transition.REDUCE  # (N,) each; neither: padding
        stacks.move(shift, reduce, reads[:, BUFFER_SLOT], node_rows)  # shift phase, reduce phase
        taken.append(action)
    roots = memory[stacks.roots(), :d]  # (N, D)
    tracked = torch.stack(states) if tracker is not None else None  # (T, N, Dt)
    return EncoderOutput(roots, tracked, torch.stack(taken, 1), torch.stack(legal), real)


def compose(composition: Reduce, left: Tensor, right: Tensor, tracking: Tensor | None, d: int) -> Tensor:
    """The TreeLSTM over stack second (left child) and stack top (right child), rows (N, 2D) -> node (N, 2D).

    Every sentence composes every step (fixed shapes); the node is read later only if the step reduced."""
    h_children = torch.cat([left[:, :d], right[:, :d]], 1)  # (N, 2D)
    c_children = torch.cat([left[:, d:], right[:, d:]], 1)  # (N, 2D)
    h, c = composition(h_children, c_children, tracking if composition.d_tracker else None)  # (N, D) each
    return torch.cat([h, c], 1)


def choose(
    source: TransitionSource,
    step: int,
    tracker: Tracker | None,
    h: Tensor | None,
    legal: Tensor,
    real: Tensor,
    gold: Tensor | None,
    uniforms: Tensor | None,
) -> Tensor:
    """(N,) this step's Transition.SHIFT or Transition.REDUCE per sentence (PAD_TRANSITION once it ended).

    Not differentiated: REINFORCE learns the policy from the transition logits of the states."""
    if source is TransitionSource.GOLD:
        return gold[:, step]
    scores = tracker.transition(h.detach()).masked_fill(~legal, float("-inf"))  # (N, 2): illegal never chosen
    action = scores.argmax(1) if source is TransitionSource.GREEDY else sample_actions(scores, uniforms[:, step])
    return torch.where(real, action, PAD_TRANSITION)  # (N,)
