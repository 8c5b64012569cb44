"""Cells own their arithmetic (spinn/model/cells.py), the encoder loops only the addressing.

So a cell edited in one place reaches every loop: here a cell with softsign in
place of both tanh (the candidate's and the cell state's), written as a subclass
that overrides the step and its local derivatives and nothing else, runs in the
spec (autograd over its step), the fused loop (its step forward, its local
derivatives backward) and the CPU inference loop, and all three agree on its
numbers, which are not the unedited cell's. The derivative check below holds
every cell to autograd of its own step, offline, in milliseconds.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from spinn.ground.errors import SpinnError
from spinn.model.cells import FRESH, GatedCell, LocalDerivatives, Reduce, StepOut, Tracker
from spinn.model.config import EncoderLoop, TransitionSource
from spinn.model.spinn import SPINN, SPINNOutput, spinn_loss
from tests.helpers import CASE_IDS, CASES, TOLERANCE, synthetic_batch, tiny_model, uniforms_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Softsign(GatedCell):
    """c = softsign(a)σ(i) + Σ_k σ(f_k) c_k, h = σ(o) softsign(c): a cell edit, as a user would write one."""

    def step(self, gates: Tensor, c_children, out: StepOut = FRESH) -> tuple[Tensor, Tensor]:
        sig = torch.sigmoid(gates, out=out.sig)
        views = out.views or self.gate_views(gates, sig)
        forgets = out.forgets or views.forgets.unbind(-2)
        candidate = torch.div(views.candidate, views.candidate.abs().add_(1), out=out.tanh_candidate)
        c = torch.mul(forgets[0], c_children[0], out=out.c)
        for forget, child in zip(forgets[1:], c_children[1:], strict=True):
            c.addcmul_(forget, child)
        c.addcmul_(candidate, views.input)
        squashed = torch.div(c, c.abs().add_(1), out=out.tanh_c)
        return torch.mul(views.output, squashed, out=out.h), c

    def local_derivatives(self, tape, c_children: Tensor) -> LocalDerivatives:
        views = self.gate_views(tape.pre, tape.sig)
        d_views = self.gate_views(tape.pre, tape.sig * (1 - tape.sig))
        candidate, squashed = tape.tanh_candidate, tape.tanh_c  # softsign(a), softsign(c): 1 - |s| = 1 / (1 + |x|)
        to_candidate = views.input * (1 - candidate.abs()) ** 2
        c_from_gates = torch.cat(
            [torch.stack([to_candidate, candidate * d_views.input], 1), c_children * d_views.forgets], 1
        )
        h_from_output = (squashed * d_views.output).unsqueeze(1)
        h_from_c = (views.output * (1 - squashed.abs()) ** 2).unsqueeze(1)
        return LocalDerivatives(c_from_gates, h_from_output, h_from_c, views.forgets)


class SoftsignReduce(Softsign, Reduce):
    pass


class SoftsignTracker(Softsign, Tracker):
    pass


def softsign_cells(model: SPINN) -> SPINN:
    """The model with both gated cells edited, on the same weights."""
    encoder = model.encoder
    reduce = SoftsignReduce(encoder.reduce.d_hidden, encoder.reduce.d_tracker).to(torch.float64)
    reduce.load_state_dict(encoder.reduce.state_dict())
    encoder.reduce = reduce
    if encoder.tracker is not None:
        tracker = encoder.tracker
        edited = SoftsignTracker(reduce.d_hidden, tracker.d_tracker, tracker.transition is not None)
        edited.to(torch.float64).load_state_dict(tracker.state_dict())
        encoder.tracker = edited
    return model


def make_cell(kind: type) -> GatedCell:
    torch.manual_seed(0)
    if issubclass(kind, Reduce):
        return kind(4, 3).double()
    return kind(5, 4, predict=False).double()


CELLS = [Reduce, Tracker, SoftsignReduce, SoftsignTracker]


@pytest.mark.parametrize("kind", CELLS, ids=lambda kind: kind.__name__)
def test_local_derivatives_are_the_derivatives_of_the_step(kind):
    """The fused loop's record (its step writing into buffers) and its backward (the cell's local
    derivatives) against autograd of the same step making new tensors, over three steps of five rows."""
    cell = make_cell(kind)
    steps, rows, d, k = 3, 5, cell.width, cell.n_children
    generator = torch.Generator().manual_seed(1)
    gates = torch.randn(steps, rows, cell.gate_width, generator=generator, dtype=torch.float64) * 2
    children = torch.randn(steps, rows, k, d, generator=generator, dtype=torch.float64)
    grad_h, grad_c = (torch.randn(steps, rows, 1, d, generator=generator, dtype=torch.float64) for _ in range(2))
    gates.requires_grad_(True)
    children.requires_grad_(True)
    h, c = cell.step(gates, children.unbind(2))  # FRESH: autograd
    expected = torch.autograd.grad([h, c], [gates, children], [grad_h.squeeze(2), grad_c.squeeze(2)])

    outputs = torch.empty(2, steps, rows, d, dtype=torch.float64)
    tape = cell.tape(gates, [rows] * steps, outputs[0].unbind(0), outputs[1].unbind(0))
    with torch.no_grad():
        for step in range(steps):
            tape.gates[step].copy_(gates[step])
            cell.step(tape.gates[step], children[step].unbind(1), tape.out[step])
        torch.testing.assert_close(outputs[0], h, rtol=0, atol=1e-15)
        torch.testing.assert_close(outputs[1], c, rtol=0, atol=1e-15)
        backward = cell.backward_buffers(tape, children.flatten(0, 1))
        found_children = torch.empty_like(children)
        for step in range(steps):
            backward.gates(step, grad_h[step], grad_c[step])
            backward.children(step, found_children[step])
    torch.testing.assert_close(backward.grads.view(steps, rows, -1), expected[0], rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(found_children, expected[1], rtol=TOLERANCE, atol=TOLERANCE)


def test_the_edited_cell_computes_what_it_says():
    """Softsign's step on one row, against its two equations written with torch's own softsign."""
    cell = make_cell(SoftsignReduce)
    generator = torch.Generator().manual_seed(2)
    gates = torch.randn(1, cell.gate_width, generator=generator, dtype=torch.float64)
    left, right = torch.randn(2, 1, cell.width, generator=generator, dtype=torch.float64)
    a, i, f_left, f_right, o = gates.split(cell.width, 1)
    c = F.softsign(a) * torch.sigmoid(i) + torch.sigmoid(f_left) * left + torch.sigmoid(f_right) * right
    h, found_c = cell.step(gates, (left, right))
    torch.testing.assert_close(found_c, c, rtol=0, atol=1e-15)
    torch.testing.assert_close(h, torch.sigmoid(o) * F.softsign(c), rtol=0, atol=1e-15)


def train(model: SPINN, batch, source: TransitionSource, loop: EncoderLoop) -> SPINNOutput:
    output = model(batch, source=source, uniforms=uniforms_for(batch, source), loop=loop)
    spinn_loss(output, batch, model.config).total.backward()
    return output


@pytest.mark.parametrize(("variant", "source"), CASES, ids=CASE_IDS)
def test_an_edited_cell_reaches_every_encoder_loop(variant, source):
    """Spec and both fused loops (fixed shapes; compact, for gold transitions) agree on the edited cells' outputs
    and every gradient; the CPU inference loop on its predictions; and the edit changes the numbers (it really
    runs)."""
    batch, vocab_size = synthetic_batch()
    spec = softsign_cells(tiny_model(variant, vocab_size)).train()
    expected = train(spec, batch, source, EncoderLoop.SPEC)
    loops = [EncoderLoop.FUSED] + ([EncoderLoop.FUSED_COMPACT] if source is TransitionSource.GOLD else [])
    for loop in loops:
        fused = softsign_cells(tiny_model(variant, vocab_size)).train()
        found = train(fused, batch, source, loop)
        assert torch.equal(found.transitions, expected.transitions)
        torch.testing.assert_close(found.logits, expected.logits, rtol=TOLERANCE, atol=TOLERANCE)
        for (name, mine), theirs in zip(fused.named_parameters(), spec.parameters(), strict=True):
            assert (mine.grad is None) == (theirs.grad is None), name
            if theirs.grad is not None:
                torch.testing.assert_close(mine.grad, theirs.grad, rtol=TOLERANCE, atol=TOLERANCE, msg=f"{loop} {name}")
    unedited = tiny_model(variant, vocab_size).train()
    plain = unedited(batch, source=source, uniforms=uniforms_for(batch, source), loop=EncoderLoop.SPEC)
    assert (plain.logits - expected.logits).abs().max() > 1e-3

    inferred = source if source is not TransitionSource.SAMPLED else TransitionSource.GREEDY
    edited = softsign_cells(tiny_model(variant, vocab_size)).eval()
    with torch.no_grad():
        full, reduce_only = (
            edited(batch, source=inferred, loop=loop) for loop in (EncoderLoop.SPEC, EncoderLoop.CPU_INFERENCE)
        )
    assert torch.equal(reduce_only.transitions, full.transitions)
    torch.testing.assert_close(reduce_only.logits, full.logits, rtol=TOLERANCE, atol=TOLERANCE)


def test_cells_hand_out_their_weight_blocks_by_name():
    """A block is its columns of the one weight, in the order asked; gradients of blocks go back in the
    weight's own column order."""
    reduce, tracker = make_cell(Reduce), make_cell(Tracker)
    d = reduce.d_hidden
    torch.testing.assert_close(reduce.weight("right"), reduce.compose.weight[:, d : 2 * d], rtol=0, atol=0)
    torch.testing.assert_close(reduce.weight("left", "right", "tracking"), reduce.compose.weight, rtol=0, atol=0)
    blocks = tracker.gates.weight.split([5, 5, 5, 4], 1)  # buffer, top, second, h
    swapped = torch.cat([blocks[0], blocks[2], blocks[1]], 1)
    torch.testing.assert_close(tracker.weight("buffer", "second", "top"), swapped, rtol=0, atol=0)
    groups = [(("buffer", "second", "top"), swapped), (("h",), blocks[3])]
    torch.testing.assert_close(tracker.weight_grad(groups), tracker.gates.weight, rtol=0, atol=0)
    with pytest.raises(SpinnError, match="the cell reads"):
        tracker.weight_grad(groups[:1])
