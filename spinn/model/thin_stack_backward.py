"""The thin stack's backward loop: gradients walk the steps in reverse along the same read addresses.

Per step in reverse: each cell turns the gradients of its outputs into the
gradients of its gates with its own local derivatives (spinn/model/cells.py,
computed for all steps at once after the forward loop), two GEMMs take them back
to the h the loop gathered, the cell's children's c get theirs directly, and one
scatter-add moves the gathered rows' gradients (both planes) into a gradient
memory. A node that was not a REDUCE was never read, so it gets no gradient. The
weight gradients are one GEMM per input block over all steps, handed back to
each cell by input name. Compact (thin_stack_forward.py), the composition's
gradients are the step's k REDUCEs', added into the tracker's h gradient of
their sentences, and the scatter-adds are two: the tracker's read rows (h), and
the nodes' children (both planes).

Shapes: N sentences, T steps, R memory rows, D hidden, Dt tracker, M composed nodes, k a step's; memories are
(2, R, D): [h plane; c plane].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from spinn.model.addressing import (
    C_PLANE,
    CHILD_READS,
    H_PLANE,
    PLANES,
    READ_SLOTS,
    SLOT_NAMES,
    WORD_BASE,
    ChildRows,
)
from spinn.model.cells import Reduce, Tracker, step_rows

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
        self.loop, self.weights, self.compact = loop, loop.weights, loop.compact
        n, dt, steps = loop.n, loop.dt, loop.t_steps
        self.memory = torch.zeros_like(loop.memory)  # (2, R, D)
        if grad_roots is not None:
            self.memory[H_PLANE].index_add_(0, loop.roots, grad_roots)
        nodes = self.memory[:, loop.run.layout.node_base :].unsqueeze(2)  # (2, M, 1, D)
        self.node_h, self.node_c = (step_rows(plane, loop.reduce_tape.rows, steps) for plane in nodes)  # (k, 1, D)
        self.reduce = loop.reduce.backward_buffers(loop.reduce_tape, loop.children_c_rows)
        if self.compact is None:
            self._scatter_all_reads(loop)
        else:
            self._scatter_reads_and_children(loop)
        self.grad_states = None
        if loop.tracker is not None:
            self.tracker = loop.tracker.backward_buffers(loop.tracker_tape, loop.cells[:steps].view(-1, 1, dt))
            self.grad_states = grad_states.unbind(0) if grad_states is not None else None
            # What reaches the tracker's h from beside the composition: the loss (transition logits) and the next
            # step's tracker through its h input; and its c, from the next step's tracker through its c input.
            last = self.grad_states[-1] if self.grad_states is not None else None
            self.dh_recurrent = last.clone() if last is not None else loop.memory.new_zeros(n, dt)  # (N, Dt)
            self.dc_recurrent = loop.memory.new_zeros(n, 1, dt)
            self.dh = loop.memory.new_empty(n, 1, dt) if self.compact is None else self.dh_recurrent.view(n, 1, dt)
            self.dh_flat = self.dh.view(n, dt)  # the gradient reaching the tracker's h at the current step

    def _scatter_all_reads(self, loop: _Loop) -> None:
        """Every sentence's three read rows, both planes, get one step's gradients in one scatter-add."""
        n, d, steps = loop.n, loop.d, loop.t_steps
        rows = loop.memory.shape[1]
        reads = loop.reads.view(steps, READ_SLOTS * n)  # (T, 3N)
        self.reads = torch.cat([reads, reads + rows], 1).unbind(0)  # (6N,) each: the rows of both planes
        self.flat_memory = self.memory.view(PLANES * rows, d)  # (2R, D)
        self.row_grads = like_rows = self.memory.new_zeros(PLANES, READ_SLOTS * n, d)  # one step's gathered rows
        self.flat_rows = like_rows.view(PLANES * READ_SLOTS * n, d)  # (6N, D)
        self.reads_h = like_rows[H_PLANE].view(n, READ_SLOTS * d)  # (N, 3D) [buffer | second | top]
        second = CHILD_READS[0] * d
        self.children_h = [self.reads_h[:, second : second + len(CHILD_READS) * d]] * steps  # (N, 2D) strided
        slots_c = like_rows[C_PLANE].view(n, READ_SLOTS, d)  # (N, 3, D): the buffer's stays zero
        self.children_c = [slots_c[:, CHILD_READS[0] : CHILD_READS[-1] + 1]] * steps  # (N, 2, D) [left, right]

    def _scatter_reads_and_children(self, loop: _Loop) -> None:
        """Compact: the tracker's read rows get their h gradients, and the step's nodes' children both planes'."""
        n, d, counts = loop.n, loop.d, loop.compact.counts
        if loop.tracker is not None:
            self.reads = loop.reads.view(loop.t_steps, READ_SLOTS * n).unbind(0)  # (3N,) each
            self.memory_h = self.memory[H_PLANE]  # (R, D)
            self.reads_h = loop.memory.new_empty(n, READ_SLOTS * d)  # (N, 3D) one step's tracker inputs
            self.flat_rows = self.reads_h.view(READ_SLOTS * n, d)  # (3N, D)
        children = ChildRows.of(loop.memory, counts, d)  # laid out as the forward gathered them
        self.child_grads, self.children_h, self.children_c = children.both, children.h, children.c

    def step(self, step: int) -> None:
        """One step in reverse: the composition's gate gradients, then the tracker's, then the gathered rows'."""
        composed = self.compact is None or self.compact.counts[step] > 0
        reduce = self.reduce.gates(step, self.node_h[step], self.node_c[step]) if composed else None  # (k, 5D)
        if self.loop.tracker is not None:
            self._tracker_step(step, reduce)
        if composed:
            self._children(step, reduce)
        if self.compact is None:
            self.flat_memory.index_add_(0, self.reads[step], self.flat_rows)
            return
        if self.loop.tracker is not None:
            self.memory_h.index_add_(0, self.reads[step], self.flat_rows)
        if composed:
            self.memory.index_add_(1, self.loop.child_reads[step], self.child_grads[step])

    def _tracker_step(self, step: int, reduce: Tensor | None) -> None:
        """The tracker's gate gradients, from what its h got from the step's composition and from beside it, and
        the gradients of its read rows' h."""
        weights = self.weights
        if self.compact is None:
            torch.addmm(self.dh_recurrent, reduce, weights.reduce_tracking, out=self.dh_flat)
        elif reduce is not None:  # dh is dh_recurrent: the composing sentences' share added in place
            self.dh_recurrent.index_add_(0, self.loop.reducers[step], reduce @ weights.reduce_tracking)
        tracker = self.tracker.gates(step, self.dh, self.dc_recurrent)  # (N, 4Dt)
        torch.mm(tracker, weights.tracker_reads, out=self.reads_h)
        if step > 0:  # the state before step 0 is no parameter
            self.tracker.children(step, out=self.dc_recurrent)
            self._recurrent(step, tracker)

    def _children(self, step: int, reduce: Tensor) -> None:
        """The composition's children's gradients: their h through its GEMM (added to what the tracker's read
        gave the same rows, when they are one buffer), their c directly."""
        children_h = self.children_h[step]
        if self.compact is None and self.loop.tracker is not None:
            children_h.addmm_(reduce, self.weights.reduce_children)
        else:
            torch.mm(reduce, self.weights.reduce_children, out=children_h)  # (the buffer's h stays zero)
        self.reduce.children(step, out=self.children_c[step])

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
        over all rows per input block)."""
        loop, d = self.loop, self.loop.d
        reduce = self.reduce.grads  # (M, 5D)
        groups = [(Reduce.CHILDREN, reduce.t() @ loop.children_h_rows)]
        if loop.tracker is not None:
            tracking = loop.tracking_rows if self.compact is not None else loop.states[1:].view(-1, loop.dt)  # (M, Dt)
            groups.append(((Reduce.TRACKING,), reduce.t() @ tracking))
        words = self.memory[:, WORD_BASE : loop.run.layout.node_base].transpose(0, 1).reshape(-1, PLANES * d)
        reduce_grads = (loop.reduce.weight_grad(groups), reduce.sum(0))
        if loop.tracker is None:
            return words, *reduce_grads, None, None
        rows = loop.t_steps * loop.n
        reads_h = loop.reads_h.view(rows, READ_SLOTS * d)  # (TN, 3D) the h the tracker read
        tracker = self.tracker.grads  # (TN, 4Dt)
        recurrent = tracker.t() @ loop.states[: loop.t_steps].reshape(rows, loop.dt)  # (4Dt, Dt)
        weight = loop.tracker.weight_grad([(SLOT_NAMES, tracker.t() @ reads_h), ((Tracker.RECURRENT,), recurrent)])
        return words, *reduce_grads, weight, tracker.sum(0)
