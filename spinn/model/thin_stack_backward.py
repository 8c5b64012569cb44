"""The thin stack's backward loop: gradients walk the steps in reverse along the same read addresses.

Per step in reverse: each cell turns the gradients of its outputs into the
gradients of its gates with its own local derivatives (spinn/model/cells.py,
computed for all steps at once after the forward loop), two GEMMs take them back
to the inputs the loop gathered, and one scatter-add moves the gathered rows'
gradients into a gradient memory. A node that was not a REDUCE was never read,
so it gets no gradient. The weight gradients are one GEMM per input block over
all steps, handed back to each cell by input name.

Shapes: N sentences, T steps, R memory rows, D hidden, Dt tracker; a memory row is [h | c] (2D).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from spinn.model.addressing import CHILD_READS, READ_SLOTS, SLOT_NAMES, WORD_BASE
from spinn.model.cells import Reduce, Tracker

if TYPE_CHECKING:
    from spinn.model.thin_stack_forward import _Loop


def backward(loop: _Loop, grad_roots: Tensor | None, grad_states: Tensor | None) -> tuple:
    """Gradients of the words, the composition's weight and bias, and the tracker's (None without one)."""
    grads = _Gradients(loop, grad_roots, grad_states)
    for step in reversed(range(loop.t_steps)):
        grads.step(step)
    return grads.inputs()


class _Gradients:
    """The backward loop's state: the gradient memory, the recurrent gradients, each cell's gate gradients."""

    def __init__(self, loop: _Loop, grad_roots: Tensor | None, grad_states: Tensor | None):
        self.loop, self.weights = loop, loop.weights
        n, d, dt, steps = loop.n, loop.d, loop.dt, loop.t_steps
        like = loop.memory
        self.memory = torch.zeros_like(like)  # (R, 2D)
        if grad_roots is not None:
            self.memory[:, :d].index_add_(0, loop.roots, grad_roots)
        nodes = self.memory[loop.run.layout.node_base :].view(steps, n, 2, 1, d)  # (T, N, 2, 1, D)
        self.node_h, self.node_c = nodes[:, :, 0].unbind(0), nodes[:, :, 1].unbind(0)  # (N, 1, D) each
        self.reduce = loop.reduce.backward_buffers(loop.reduce_tape, loop.children_c)
        self.reads = loop.reads.view(steps, READ_SLOTS * n).unbind(0)
        self.row_grads = like.new_zeros(READ_SLOTS * n, 2 * d)  # (3N, 2D) gradients of one step's gathered rows
        flat = self.row_grads.view(n, READ_SLOTS * 2 * d)
        self.all_slots, self.children_h = flat, flat[:, 2 * d :]  # (N, 6D), (N, 4D)
        slots_c = self.row_grads.view(n, READ_SLOTS, 2, d)[:, :, 1]  # (N, 3, D)
        self.children_c = slots_c[:, CHILD_READS[0] : CHILD_READS[-1] + 1]  # (N, 2, D) [left, right]
        self.grad_states = None
        if loop.tracker is not None:
            self.tracker = loop.tracker.backward_buffers(loop.tracker_tape, loop.cells[:steps].unsqueeze(2))
            self.dh = like.new_empty(n, 1, dt)  # the gradient reaching the tracker's h at the current step
            self.dh_flat = self.dh.view(n, dt)
            self.dh_recurrent = like.new_zeros(n, dt)  # from the next step's tracker, through its h input
            self.dc_recurrent = like.new_zeros(n, 1, dt)  # from the next step's tracker, through its c input
            self.grad_states = grad_states.unbind(0) if grad_states is not None else None

    def step(self, step: int) -> None:
        """One step in reverse: the composition's gate gradients, then the tracker's, then the gathered rows'."""
        weights = self.weights
        reduce = self.reduce.gates(step, self.node_h[step], self.node_c[step])  # (N, 5D)
        if self.loop.tracker is None:
            torch.mm(reduce, weights.reduce_children, out=self.children_h)  # the buffer slot stays zero
        else:
            torch.addmm(self.dh_recurrent, reduce, weights.reduce_tracking, out=self.dh_flat)
            if self.grad_states is not None:
                self.dh_flat.add_(self.grad_states[step])
            tracker = self.tracker.gates(step, self.dh, self.dc_recurrent)  # (N, 4Dt)
            self.tracker.children(step, out=self.dc_recurrent)
            torch.mm(tracker, weights.tracker_reads, out=self.all_slots)
            torch.mm(tracker, weights.tracker_recurrent, out=self.dh_recurrent)
            self.children_h.addmm_(reduce, weights.reduce_children)
        self.reduce.children(step, out=self.children_c)  # after the GEMMs, which wrote zeros on the c columns
        self.memory.index_add_(0, self.reads[step], self.row_grads)

    def inputs(self) -> tuple:
        """Gradients of the words, the composition's weight and bias, the tracker's weight and bias (one GEMM
        over all steps per input block)."""
        loop, d = self.loop, self.loop.d
        rows = loop.t_steps * loop.n
        gathered = loop.gathered.view(rows, READ_SLOTS * 2 * d)  # (TN, 6D)
        reduce = self.reduce.grads.view(rows, -1)  # (TN, 5D)
        groups = [(Reduce.CHILDREN, _h_columns(reduce.t() @ gathered[:, 2 * d :], len(CHILD_READS), d))]
        if loop.tracker is not None:
            groups.append(((Reduce.TRACKING,), reduce.t() @ loop.states[1:].reshape(rows, loop.dt)))
        words = self.memory[WORD_BASE : loop.run.layout.node_base]
        reduce_grads = (loop.reduce.weight_grad(groups), reduce.sum(0))
        if loop.tracker is None:
            return words, *reduce_grads, None, None
        tracker = self.tracker.grads.view(rows, -1)  # (TN, 4Dt)
        reads = _h_columns(tracker.t() @ gathered, READ_SLOTS, d)  # (4Dt, 3D)
        recurrent = tracker.t() @ loop.states[: loop.t_steps].reshape(rows, loop.dt)  # (4Dt, Dt)
        weight = loop.tracker.weight_grad([(SLOT_NAMES, reads), ((Tracker.RECURRENT,), recurrent)])
        return words, *reduce_grads, weight, tracker.sum(0)


def _h_columns(grad: Tensor, slots: int, d: int) -> Tensor:
    """(G, slots*2D) gradients over [h | c] rows -> (G, slots*D) over the h halves (the weights' real columns)."""
    return grad.view(grad.shape[0], slots, 2, d)[:, :, 0].reshape(grad.shape[0], slots * d)
