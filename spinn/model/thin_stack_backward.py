"""The thin stack's backward loop: gradients walk the steps in reverse along the same read addresses.

Per step in reverse: the cells' gate gradients from local derivatives computed
for all steps at once after the forward loop (spinn/model/thin_stack_forward.py
keeps them on its tape), two GEMMs back to the inputs, and one scatter-add of
the gathered rows' gradients into a gradient memory. A node that was not a
REDUCE was never read, so it gets no gradient. The weight gradients are one
GEMM each over all steps.

Shapes: N sentences, T steps, R memory rows, D hidden, Dt tracker; a memory row is [h | c] (2D).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from spinn.model.addressing import READ_SLOTS, WORD_BASE
from spinn.model.cells import CHILD_SLOTS, REDUCE_GATES, TRACKER_GATES, TRACKER_READ_ORDER

if TYPE_CHECKING:
    from spinn.model.thin_stack_forward import _Loop


def backward(loop: _Loop, grad_roots: Tensor | None, grad_states: Tensor | None) -> tuple:
    grads = _Gradients(loop, grad_roots)
    local = _local_derivatives(loop)
    grad_states = grad_states.unbind(0) if grad_states is not None and loop.w.tracked else None
    reduce_in, tracker_in = loop.w.reduce_in, loop.w.tracker_in
    for step in reversed(range(loop.t_steps)):
        grads.compose(step, local, reduce_in, loop.w.reduce_track)
        if loop.w.tracked:
            grads.track(step, local, tracker_in, loop.w.tracker_rec, grad_states)
            grads.children_from_reduce(step, local, reduce_in)
        else:
            grads.children_only(step, local, reduce_in)
        grads.memory.index_add_(0, grads.reads[step], grads.row_grads)
    return grads.inputs()


def _local_derivatives(loop: _Loop) -> dict[str, list[Tensor]]:
    """What the backward multiplies gradients by, for all steps at once (a few large kernels), as
    per-step views."""
    sig = loop.reduce_sig  # (T, N, 5, D)
    d_sig = sig * (1 - sig)
    children_c = loop.gathered.view(loop.t_steps, loop.n, READ_SLOTS, 2, loop.d)[:, :, 1:, 1]  # (T, N, 2, D)
    tanh_a, tanh_c = loop.reduce_tanh_a, loop.reduce_tanh_c
    reduce = torch.stack(
        [
            sig[:, :, 1] * (1 - tanh_a * tanh_a),  # a
            tanh_a * d_sig[:, :, 1],  # i
            children_c[:, :, 0] * d_sig[:, :, 2],  # f_left
            children_c[:, :, 1] * d_sig[:, :, 3],  # f_right
            tanh_c * d_sig[:, :, 4],  # o
        ],
        2,
    )  # (T, N, 5, D)
    local = {
        "reduce_first4": reduce[:, :, :4].unbind(0),  # (N, 4, D) each: [a, i, f_left, f_right], times dc
        "reduce_o": reduce[:, :, 4:].unbind(0),  # (N, 1, D) each, times dh
        "reduce_c": (sig[:, :, 4] * (1 - tanh_c * tanh_c)).unsqueeze(2).unbind(0),  # (N, 1, D): dc from dh
    }
    if loop.w.tracked:
        local.update(_tracker_derivatives(loop))
    return local


def _tracker_derivatives(loop: _Loop) -> dict[str, list[Tensor]]:
    sig, tanh_g, tanh_c = loop.tracker_sig, loop.tracker_tanh_g, loop.tracker_tanh_c  # (T, N, 4, Dt), ...
    d_sig = sig * (1 - sig)
    c_before = loop.cells[: loop.t_steps]  # (T, N, Dt)
    tracker = torch.stack(
        [
            sig[:, :, 1] * (1 - tanh_g * tanh_g),  # g
            tanh_g * d_sig[:, :, 1],  # i
            c_before * d_sig[:, :, 2],  # f
            tanh_c * d_sig[:, :, 3],  # o
        ],
        2,
    )  # (T, N, 4, Dt)
    return {
        "tracker_first3": tracker[:, :, :3].unbind(0),  # (N, 3, Dt) each: [g, i, f], times dc
        "tracker_o": tracker[:, :, 3:].unbind(0),  # (N, 1, Dt) each, times dh
        "tracker_c": (sig[:, :, 3] * (1 - tanh_c * tanh_c)).unsqueeze(2).unbind(0),  # (N, 1, Dt)
        "forget": sig[:, :, 2].unsqueeze(2).unbind(0),  # (N, 1, Dt): dc_before = dc * f
    }


class _Gradients:
    """The backward loop's state: the gradient memory, the recurrent gradients, the per-step gate gradients."""

    def __init__(self, loop: _Loop, grad_roots: Tensor | None):
        self.loop = loop
        n, d, dt, steps = loop.n, loop.d, loop.dt, loop.t_steps
        like = loop.memory
        self.memory = torch.zeros_like(like)  # (R, 2D)
        if grad_roots is not None:
            self.memory[:, :d].index_add_(0, loop.run.roots, grad_roots)
        nodes = self.memory[loop.run.layout.node_base :].view(steps, n, 2, 1, d)  # (T, N, 2, 1, D)
        self.node_h, self.node_c = nodes[:, :, 0].unbind(0), nodes[:, :, 1].unbind(0)  # (N, 1, D) each
        self.reduce_gates = like.new_empty(steps, n, REDUCE_GATES, d)  # (T, N, 5, D)
        self.r_flat = self.reduce_gates.view(steps, n, REDUCE_GATES * d).unbind(0)
        self.r_first4 = self.reduce_gates[:, :, :4].unbind(0)
        self.r_o = self.reduce_gates[:, :, 4:].unbind(0)
        self.dc = like.new_empty(n, 1, d)
        self.dc_flat = self.dc.view(n, d)
        self.reads = loop.reads.view(steps, READ_SLOTS * n).unbind(0)
        self.row_grads = like.new_zeros(READ_SLOTS * n, 2 * d)  # (3N, 2D) gradients of one step's gathered rows
        flat = self.row_grads.view(n, READ_SLOTS * 2 * d)
        self.all_slots, self.child_slots = flat, flat[:, 2 * d :]  # (N, 6D), (N, 4D)
        slots = self.row_grads.view(n, READ_SLOTS, 2, d)
        self.left_c, self.right_c = slots[:, 1, 1], slots[:, 2, 1]  # (N, D) each
        if loop.w.tracked:
            self.tracker_gates = like.new_empty(steps, n, TRACKER_GATES, dt)
            self.t_flat = self.tracker_gates.view(steps, n, TRACKER_GATES * dt).unbind(0)
            self.t_first3 = self.tracker_gates[:, :, :3].unbind(0)
            self.t_o = self.tracker_gates[:, :, 3:].unbind(0)
            self.dh = like.new_empty(n, 1, dt)
            self.dh_flat = self.dh.view(n, dt)
            self.dh_rec = like.new_zeros(n, dt)  # from the next step's tracker, through its h input
            self.dc_rec = like.new_zeros(n, 1, dt)  # from the next step's cell, through its c input
            self.dct = like.new_empty(n, 1, dt)

    def compose(self, step: int, local: dict[str, list[Tensor]], reduce_in: Tensor, reduce_track) -> None:
        """Gate gradients of the step's composition, from its node's h and c gradients."""
        gh, gc = self.node_h[step], self.node_c[step]  # (N, 1, D)
        torch.addcmul(gc, gh, local["reduce_c"][step], out=self.dc)
        torch.mul(local["reduce_first4"][step], self.dc, out=self.r_first4[step])
        torch.mul(local["reduce_o"][step], gh, out=self.r_o[step])

    def track(self, step, local, tracker_in, tracker_rec, grad_states: list[Tensor] | None) -> None:
        """Gate gradients of the step's tracker, and what flows to the step before it."""
        torch.addmm(self.dh_rec, self.r_flat[step], self.loop.w.reduce_track, out=self.dh_flat)
        if grad_states is not None:
            self.dh_flat.add_(grad_states[step])
        torch.addcmul(self.dc_rec, self.dh, local["tracker_c"][step], out=self.dct)
        torch.mul(local["tracker_first3"][step], self.dct, out=self.t_first3[step])
        torch.mul(local["tracker_o"][step], self.dh, out=self.t_o[step])
        torch.mm(self.t_flat[step], tracker_in, out=self.all_slots)
        torch.mm(self.t_flat[step], tracker_rec, out=self.dh_rec)
        torch.mul(self.dct, local["forget"][step], out=self.dc_rec)

    def children_from_reduce(self, step: int, local: dict[str, Tensor], reduce_in: Tensor) -> None:
        """Add the composition's input gradients to the children's slots (after the tracker wrote all slots)."""
        self.child_slots.addmm_(self.r_flat[step], reduce_in)
        self._children_c(step)

    def children_only(self, step: int, local: dict[str, Tensor], reduce_in: Tensor) -> None:
        """No tracker: the composition alone reads the children (the buffer slot stays zero)."""
        torch.mm(self.r_flat[step], reduce_in, out=self.child_slots)
        self._children_c(step)

    def _children_c(self, step: int) -> None:
        self.left_c.addcmul_(self.dc_flat, self.loop.r_f1[step])
        self.right_c.addcmul_(self.dc_flat, self.loop.r_f2[step])

    def inputs(self) -> tuple:
        """Gradients of words, tracker weight and bias, reduce weight and bias (one GEMM over all steps each)."""
        loop, d = self.loop, self.loop.d
        rows = loop.t_steps * loop.n
        gathered = loop.gathered.view(rows, READ_SLOTS * 2 * d)  # (TN, 6D)
        reduce = self.reduce_gates.view(rows, REDUCE_GATES * d)  # (TN, 5D)
        child_weight = _h_columns(reduce.t() @ gathered[:, 2 * d :], CHILD_SLOTS, d)  # (5D, 2D) [left, right]
        blocks = [child_weight]
        if loop.w.tracked:
            states = loop.states.view(loop.t_steps + 1, loop.n, loop.dt)
            blocks.append(reduce.t() @ states[1:].reshape(rows, loop.dt))  # (5D, Dt)
        words = self.memory[WORD_BASE : loop.run.layout.node_base]
        reduce_grads = (torch.cat(blocks, 1), reduce.sum(0))
        if not loop.w.tracked:
            return words, None, None, *reduce_grads
        tracker = self.tracker_gates.view(rows, TRACKER_GATES * loop.dt)  # (TN, 4Dt)
        slots = _h_columns(tracker.t() @ gathered, READ_SLOTS, d).view(-1, READ_SLOTS, d)[:, TRACKER_READ_ORDER]
        recurrent = tracker.t() @ loop.states[: loop.t_steps].reshape(rows, loop.dt)  # (4Dt, Dt)
        tracker_weight = torch.cat([slots.reshape(-1, READ_SLOTS * d), recurrent], 1)
        return words, tracker_weight, tracker.sum(0), *reduce_grads


def _h_columns(grad: Tensor, slots: int, d: int) -> Tensor:
    """(G, slots*2D) gradients over [h | c] rows -> (G, slots*D) over the h halves (the weights' real columns)."""
    return grad.view(grad.shape[0], slots, 2, d)[:, :, 0].reshape(grad.shape[0], slots * d)
