"""The thin stack's backward loop: gradients walk the steps in reverse along the same read addresses.

Per step in reverse: each cell turns the gradients of its outputs into the
gradients of its gates with its own local derivatives (spinn/model/cells.py,
computed for all steps at once after the forward loop), two GEMMs take them back
to the h the loop gathered, the cell's children's c get theirs directly, and one
scatter-add moves the gathered rows' gradients (both planes) into a gradient
memory. A node that was not a REDUCE was never read, so it gets no gradient. The
weight gradients are one GEMM per input block over all steps, handed back to
each cell by input name.

Shapes: N sentences, T steps, R memory rows, D hidden, Dt tracker; memories are (2, R, D): [h plane; c plane].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from spinn.model.addressing import C_PLANE, CHILD_READS, H_PLANE, PLANES, READ_SLOTS, SLOT_NAMES, WORD_BASE
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
        rows = loop.memory.shape[1]
        self.memory = torch.zeros_like(loop.memory)  # (2, R, D)
        if grad_roots is not None:
            self.memory[H_PLANE].index_add_(0, loop.roots, grad_roots)
        nodes = self.memory[:, loop.run.layout.node_base :].view(PLANES, steps, n, 1, d)  # (2, T, N, 1, D)
        self.node_h, self.node_c = nodes[H_PLANE].unbind(0), nodes[C_PLANE].unbind(0)  # (N, 1, D) each
        self.reduce = loop.reduce.backward_buffers(loop.reduce_tape, loop.children_c)
        reads = loop.reads.view(steps, READ_SLOTS * n)  # (T, 3N)
        self.reads = torch.cat([reads, reads + rows], 1).unbind(0)  # (6N,) each: the rows of both planes
        self.flat_memory = self.memory.view(PLANES * rows, d)  # (2R, D)
        self.row_grads = like_rows = self.memory.new_zeros(PLANES, READ_SLOTS * n, d)  # one step's gathered rows
        self.flat_rows = like_rows.view(PLANES * READ_SLOTS * n, d)  # (6N, D)
        self.reads_h = like_rows[H_PLANE].view(n, READ_SLOTS * d)  # (N, 3D) [buffer | second | top]
        second = CHILD_READS[0] * d
        self.children_h = self.reads_h[:, second : second + len(CHILD_READS) * d]  # (N, 2D) strided
        slots_c = like_rows[C_PLANE].view(n, READ_SLOTS, d)  # (N, 3, D): the buffer's stays zero
        self.children_c = slots_c[:, CHILD_READS[0] : CHILD_READS[-1] + 1]  # (N, 2, D) [left, right]
        self.grad_states = None
        if loop.tracker is not None:
            self.tracker = loop.tracker.backward_buffers(loop.tracker_tape, loop.cells[:steps].unsqueeze(2))
            self.dh = loop.memory.new_empty(n, 1, dt)  # the gradient reaching the tracker's h at the current step
            self.dh_flat = self.dh.view(n, dt)
            self.grad_states = grad_states.unbind(0) if grad_states is not None else None
            # What reaches the tracker's h from beside the composition: the loss (transition logits) and the next
            # step's tracker through its h input; and its c, from the next step's tracker through its c input.
            last = self.grad_states[-1] if self.grad_states is not None else None
            self.dh_recurrent = last.clone() if last is not None else loop.memory.new_zeros(n, dt)  # (N, Dt)
            self.dc_recurrent = loop.memory.new_zeros(n, 1, dt)

    def step(self, step: int) -> None:
        """One step in reverse: the composition's gate gradients, then the tracker's, then the gathered rows'."""
        weights = self.weights
        reduce = self.reduce.gates(step, self.node_h[step], self.node_c[step])  # (N, 5D)
        if self.loop.tracker is None:
            torch.mm(reduce, weights.reduce_children, out=self.children_h)  # the buffer's h stays zero
        else:
            torch.addmm(self.dh_recurrent, reduce, weights.reduce_tracking, out=self.dh_flat)
            tracker = self.tracker.gates(step, self.dh, self.dc_recurrent)  # (N, 4Dt)
            torch.mm(tracker, weights.tracker_reads, out=self.reads_h)
            if step > 0:  # the state before step 0 is no parameter
                self.tracker.children(step, out=self.dc_recurrent)
                self._recurrent(step, tracker)
            self.children_h.addmm_(reduce, weights.reduce_children)
        self.reduce.children(step, out=self.children_c)
        self.flat_memory.index_add_(0, self.reads[step], self.flat_rows)

    def _recurrent(self, step: int, tracker: Tensor) -> None:
        """The gradient reaching the previous step's tracker h beside its composition: through this step's h
        input, plus the loss's (the GEMM adds it, no kernel of its own)."""
        weight = self.weights.tracker_recurrent
        if self.grad_states is None:
            torch.mm(tracker, weight, out=self.dh_recurrent)
        else:
            torch.addmm(self.grad_states[step - 1], tracker, weight, out=self.dh_recurrent)

    def inputs(self) -> tuple:
        """Gradients of the words, the composition's weight and bias, the tracker's weight and bias (one GEMM
        over all steps per input block)."""
        loop, d = self.loop, self.loop.d
        rows = loop.t_steps * loop.n
        reads_h = loop.reads_h.view(rows, READ_SLOTS * d)  # (TN, 3D) the h the loop gathered
        second = CHILD_READS[0] * d
        reduce = self.reduce.grads.view(rows, -1)  # (TN, 5D)
        groups = [(Reduce.CHILDREN, reduce.t() @ reads_h[:, second : second + len(CHILD_READS) * d])]
        if loop.tracker is not None:
            groups.append(((Reduce.TRACKING,), reduce.t() @ loop.states[1:].reshape(rows, loop.dt)))
        words = self.memory[:, WORD_BASE : loop.run.layout.node_base].transpose(0, 1).reshape(-1, PLANES * d)
        reduce_grads = (loop.reduce.weight_grad(groups), reduce.sum(0))
        if loop.tracker is None:
            return words, *reduce_grads, None, None
        tracker = self.tracker.grads.view(rows, -1)  # (TN, 4Dt)
        recurrent = tracker.t() @ loop.states[: loop.t_steps].reshape(rows, loop.dt)  # (4Dt, Dt)
        weight = loop.tracker.weight_grad([(SLOT_NAMES, tracker.t() @ reads_h), ((Tracker.RECURRENT,), recurrent)])
        return words, *reduce_grads, weight, tracker.sum(0)
