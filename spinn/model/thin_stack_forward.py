"""The thin stack: every node vector of a batch in one memory, and the fused encoder's forward loop over it.

Bowman et al. (2016) keep the stacks of a batch as one array of node vectors
written once per node, plus back-pointers; the backward pass walks the steps in
reverse, moving gradients along the same pointers. Here the whole encoding is
one autograd Function with both loops written out (the backward one in
spinn/model/thin_stack_backward.py), so that each transition step is a handful
of large kernels and nothing reads a value back to the host. The readable
encoder it must equal, step for step, is spinn/model/spec.py.

Forward, per step: one gather of the rows every sentence reads (buffer top,
stack second, stack top, as [h | c]), the tracker's two GEMMs and its fused
LSTM cell, the composition's GEMMs and its fused TreeLSTM cell, written
straight into the step's node rows. Every sentence computes every step, so all
shapes are fixed by (N, L, T) and the step can be captured in a CUDA graph; a
node that was not a REDUCE is never read, and gets no gradient.

Addresses come from the batch's StepPlan (gold transitions, worked out on the
host) or, when the model chooses its own transitions, from DeviceStacks, one
step at a time on the device (spinn/model/addressing.py).

Shapes: N sentences, L words, T steps, R memory rows, D hidden, Dt tracker,
K = 3 read slots; a memory row is [h | c] (2D).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from spinn.model.addressing import READ_SLOTS, WORD_BASE, ZERO_ROW, DeviceStacks, Layout, StepPlan
from spinn.model.cells import CHILD_SLOTS, REDUCE_GATES, TRACKER_GATES, TRACKER_READ_ORDER
from spinn.model.policy import sample_actions
from spinn.model.thin_stack_backward import backward
from spinn.trees.transitions import PAD_TRANSITION


@dataclass
class Chooser:
    """How a model picks its own transitions: the transition head, and uniform draws when it samples (rl)."""

    weight: Tensor  # (2, Dt)
    bias: Tensor  # (2,)
    uniforms: Tensor | None  # (N, T): sentence n's draw for its own step t, or None: the best legal action
    taken: Tensor | None = None  # (T, N) filled by the forward loop: the actions that ran
    legal: Tensor | None = None  # (T, N, 2) filled by the forward loop


@dataclass
class Run:
    """One encoding's fixed facts: the layout, the addresses (a plan, or a chooser), the real steps."""

    layout: Layout
    lengths: Tensor  # (N,)
    real: Tensor  # (T, N) bool
    plan: StepPlan | None = None
    chooser: Chooser | None = None
    roots: Tensor | None = field(default=None, init=False)  # (N,) set by the forward loop


def encode(
    words: Tensor,
    tracker: tuple[Tensor, Tensor] | None,
    reduce: tuple[Tensor, Tensor],
    run: Run,
) -> tuple[Tensor, Tensor | None]:
    """Root h of every sentence (N, D), and the tracker's h at every step (T, N, Dt) or None (pi-nt).

    words (N*L, 2D) = [h | c] of every word slot; tracker = (gates.weight, gates.bias)
    with columns [buffer, top, second, h]; reduce = (compose.weight, compose.bias)
    with columns [left, right, tracker].
    """
    tracker_weight, tracker_bias = tracker if tracker is not None else (None, None)
    roots, states = _Encode.apply(words, tracker_weight, tracker_bias, *reduce, run)
    return roots, (states if tracker is not None else None)


class _Encode(torch.autograd.Function):
    """Autocast stays outside: the cells run in the parameters' dtype (fp32), as the old cells kept their state."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, words, tracker_weight, tracker_bias, reduce_weight, reduce_bias, run: Run):
        weights = _Weights.of(tracker_weight, tracker_bias, reduce_weight, reduce_bias)
        loop = _Loop(run, weights, words, keep_steps=any(ctx.needs_input_grad[:5]))
        roots, states = loop.forward()
        ctx.loop = loop
        if not weights.tracked:
            ctx.mark_non_differentiable(states)
        return roots, states

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_roots, grad_states):
        return (*backward(ctx.loop, grad_roots, grad_states), None)


@dataclass(frozen=True)
class _Weights:
    """The cells' weights laid out for the loops, built once per encoding.

    The gathered rows hold [h | c] of the three read slots, (N, 6D); the input
    weights get zero rows for the c halves, so each cell's input is a single
    GEMM over the gathered rows as they lie, with no copies per step.
    """

    tracker_in: Tensor | None  # (4Dt, 6D)
    tracker_rec: Tensor | None  # (4Dt, Dt)
    tracker_bias: Tensor | None  # (4Dt,)
    reduce_in: Tensor  # (5D, 4D) over the two child slots
    reduce_track: Tensor | None  # (5D, Dt)
    reduce_bias: Tensor  # (5D,)

    @property
    def tracked(self) -> bool:
        return self.tracker_in is not None

    @classmethod
    def of(cls, tracker_weight, tracker_bias, reduce_weight, reduce_bias) -> _Weights:
        d = reduce_weight.shape[0] // REDUCE_GATES
        reduce_in = _with_zero_c(reduce_weight[:, : CHILD_SLOTS * d], CHILD_SLOTS, d)  # (5D, 4D)
        reduce_track = reduce_weight[:, CHILD_SLOTS * d :] if reduce_weight.shape[1] > CHILD_SLOTS * d else None
        if tracker_weight is None:
            return cls(None, None, None, reduce_in, reduce_track, reduce_bias)
        slots = tracker_weight[:, : READ_SLOTS * d].view(-1, READ_SLOTS, d)[:, TRACKER_READ_ORDER]  # (4Dt, 3, D)
        tracker_in = _with_zero_c(slots.reshape(-1, READ_SLOTS * d), READ_SLOTS, d)  # (4Dt, 6D)
        return cls(tracker_in, tracker_weight[:, READ_SLOTS * d :], tracker_bias, reduce_in, reduce_track, reduce_bias)


def _with_zero_c(weight: Tensor, slots: int, d: int) -> Tensor:
    """(G, slots*D) weights over h halves -> (G, slots*2D) over [h | c] rows, zeros on the c columns."""
    blocks = weight.view(weight.shape[0], slots, d)
    return torch.cat([blocks, torch.zeros_like(blocks)], 2).view(weight.shape[0], slots * 2 * d)


def _steps(tensor: Tensor, steps: int) -> list[Tensor]:
    """Per-step views of a (T', ...) buffer: T' = steps gives one per step, T' = 1 the same view each step."""
    return list(tensor.unbind(0)) if tensor.shape[0] == steps else [tensor[0]] * steps


class _Loop:
    """The forward and backward loops of one encoding, with the buffers they share (the tape)."""

    def __init__(self, run: Run, weights: _Weights, words: Tensor, keep_steps: bool):
        self.run, self.w, self.keep = run, weights, keep_steps
        layout = run.layout
        self.n, self.t_steps = layout.sentences, layout.steps
        self.d = words.shape[1] // 2
        self.dt = weights.tracker_rec.shape[1] if weights.tracked else 0
        self.memory = words.new_empty(layout.rows, 2 * self.d)  # (R, 2D)
        self.memory[ZERO_ROW].zero_()
        self.memory[WORD_BASE : layout.node_base].copy_(words)
        self._make_tape(words)

    # ------------------------------------------------------------------ buffers

    def _make_tape(self, like: Tensor) -> None:
        n, d, steps = self.n, self.d, self.t_steps
        depth = steps if self.keep else 1
        self.gathered = like.new_empty(depth, n, READ_SLOTS * 2 * d)  # (T', N, 6D)
        self.reduce_gates = like.new_empty(depth, n, REDUCE_GATES, d)  # (T', N, 5, D) pre-activations
        self.reduce_sig = like.new_empty(depth, n, REDUCE_GATES, d)  # sigmoid of all five
        self.reduce_tanh_a = like.new_empty(depth, n, d)
        self.reduce_tanh_c = like.new_empty(depth, n, d)
        nodes = self.memory[self.run.layout.node_base :].view(steps, n, 2, d)  # (T, N, 2, D)
        self.node_h, self.node_c = nodes[:, :, 0].unbind(0), nodes[:, :, 1].unbind(0)
        self.gathered_rows = _steps(self.gathered.view(depth, READ_SLOTS * n, 2 * d), steps)  # (3N, 2D) each
        self.children = _steps(self.gathered[:, :, 2 * d :], steps)  # (N, 4D) strided
        children_c = self.gathered.view(depth, n, READ_SLOTS, 2, d)[:, :, 1:, 1]  # (T', N, 2, D)
        self.left_c, self.right_c = _steps(children_c[:, :, 0], steps), _steps(children_c[:, :, 1], steps)
        self.gathered_flat = _steps(self.gathered, steps)
        r_gates = _steps(self.reduce_gates.view(depth, n, REDUCE_GATES * d), steps)
        self.r_gates, self.r_a = r_gates, _steps(self.reduce_gates[:, :, 0], steps)
        self.r_sig = _steps(self.reduce_sig.view(depth, n, REDUCE_GATES * d), steps)
        self.r_i, self.r_f1, self.r_f2, self.r_o = (_steps(self.reduce_sig[:, :, k], steps) for k in range(1, 5))
        self.r_tanh_a, self.r_tanh_c = _steps(self.reduce_tanh_a, steps), _steps(self.reduce_tanh_c, steps)
        if self.w.tracked:
            self._make_tracker_tape(like, depth)

    def _make_tracker_tape(self, like: Tensor, depth: int) -> None:
        n, dt, steps = self.n, self.dt, self.t_steps
        self.states = like.new_zeros(steps + 1, n, dt)  # (T+1, N, Dt): h before step 0, then after each step
        self.cells = like.new_zeros(depth + 1 if self.keep else 1, n, dt)  # c likewise (one deep at inference)
        self.tracker_gates = like.new_empty(depth, n, TRACKER_GATES, dt)
        self.tracker_sig = like.new_empty(depth, n, TRACKER_GATES, dt)
        self.tracker_tanh_g = like.new_empty(depth, n, dt)
        self.tracker_tanh_c = like.new_empty(depth, n, dt)
        self.h = self.states.unbind(0)
        self.c = self.cells.unbind(0) if self.keep else [self.cells[0]] * (steps + 1)
        self.t_gates = _steps(self.tracker_gates.view(depth, n, TRACKER_GATES * dt), steps)
        self.t_g = _steps(self.tracker_gates[:, :, 0], steps)
        self.t_sig = _steps(self.tracker_sig.view(depth, n, TRACKER_GATES * dt), steps)
        self.t_i, self.t_f, self.t_o = (_steps(self.tracker_sig[:, :, k], steps) for k in range(1, 4))
        self.t_tanh_g, self.t_tanh_c = _steps(self.tracker_tanh_g, steps), _steps(self.tracker_tanh_c, steps)

    # ------------------------------------------------------------------ forward

    def forward(self) -> tuple[Tensor, Tensor]:
        w = self.w
        reduce_in, tracker_in = w.reduce_in.t(), (w.tracker_in.t() if w.tracked else None)
        reduce_track = w.reduce_track.t() if w.reduce_track is not None else None
        tracker_rec = w.tracker_rec.t() if w.tracked else None
        reads = self._read_plan()
        for step in range(self.t_steps):
            torch.index_select(self.memory, 0, reads(step), out=self.gathered_rows[step])
            if w.tracked:
                self._track(step, tracker_in, tracker_rec)
                self._choose(step)
            self._compose(step, reduce_in, reduce_track)
        roots = self.run.plan.roots if self.run.plan is not None else self.stacks.roots()
        self.run.roots = roots
        h_roots = self.memory[:, : self.d].index_select(0, roots)  # (N, D)
        states = self.states[1:].clone() if w.tracked else h_roots.new_empty(0)  # (T, N, Dt)
        return h_roots, states

    def _read_plan(self) -> Callable[[int], Tensor]:
        """Step -> the (3N,) rows to gather: from the plan, or from the device stacks as the model chooses."""
        if self.run.plan is not None:
            self.reads = self.run.plan.reads
            per_step = self.reads.view(self.t_steps, READ_SLOTS * self.n).unbind(0)
            return per_step.__getitem__
        chooser = self.run.chooser
        self.stacks = DeviceStacks(self.run.lengths, self.run.layout)
        self.reads = torch.empty(self.t_steps, self.n, READ_SLOTS, dtype=torch.long, device=self.memory.device)
        chooser.taken = torch.empty(self.t_steps, self.n, dtype=torch.long, device=self.memory.device)
        chooser.legal = torch.empty(self.t_steps, self.n, 2, dtype=torch.bool, device=self.memory.device)
        self.reads[0] = self.stacks.reads()
        per_step = self.reads.view(self.t_steps, READ_SLOTS * self.n).unbind(0)
        return per_step.__getitem__

    def _track(self, step: int, tracker_in: Tensor, tracker_rec: Tensor) -> None:
        """Tracker LSTM over [buffer, second, top] h: two GEMMs into the tape, then the fused cell."""
        gates = torch.addmm(self.w.tracker_bias, self.gathered_flat[step], tracker_in, out=self.t_gates[step])
        gates.addmm_(self.h[step], tracker_rec)
        torch.sigmoid(gates, out=self.t_sig[step])
        torch.tanh(self.t_g[step], out=self.t_tanh_g[step])
        c = torch.mul(self.t_f[step], self.c[step], out=self.c[step + 1])
        c.addcmul_(self.t_tanh_g[step], self.t_i[step])
        torch.tanh(c, out=self.t_tanh_c[step])
        torch.mul(self.t_o[step], self.t_tanh_c[step], out=self.h[step + 1])

    def _compose(self, step: int, reduce_in: Tensor, reduce_track: Tensor | None) -> None:
        """TreeLSTM over the two children (and the tracker's h), written into the step's node rows."""
        gates = torch.addmm(self.w.reduce_bias, self.children[step], reduce_in, out=self.r_gates[step])
        if reduce_track is not None:
            gates.addmm_(self.h[step + 1], reduce_track)
        torch.sigmoid(gates, out=self.r_sig[step])
        torch.tanh(self.r_a[step], out=self.r_tanh_a[step])
        c = torch.mul(self.r_f1[step], self.left_c[step], out=self.node_c[step])
        c.addcmul_(self.r_f2[step], self.right_c[step])
        c.addcmul_(self.r_tanh_a[step], self.r_i[step])
        torch.tanh(c, out=self.r_tanh_c[step])
        torch.mul(self.r_o[step], self.r_tanh_c[step], out=self.node_h[step])

    def _choose(self, step: int) -> None:
        """With the model's own transitions: pick this step's actions, and work out the next step's reads."""
        chooser = self.run.chooser
        if chooser is None:
            return
        legal = self.stacks.legal()  # (N, 2)
        scores = torch.addmm(chooser.bias, self.h[step + 1], chooser.weight.t()).masked_fill(~legal, float("-inf"))
        action = scores.argmax(1) if chooser.uniforms is None else sample_actions(scores, chooser.uniforms[:, step])
        action = torch.where(self.run.real[step], action, PAD_TRANSITION)  # (N,)
        chooser.taken[step], chooser.legal[step] = action, legal
        self.stacks.apply(action, self.reads[step], step)
        if step + 1 < self.t_steps:
            self.reads[step + 1] = self.stacks.reads()
