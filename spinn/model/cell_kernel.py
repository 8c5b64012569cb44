"""A gated cell's step in one Triton kernel: the fused loops' path on a GPU.

`GatedCell.step` (spinn/model/cells.py) writes a step into a fused loop's
buffers with seven to eight elementwise torch ops (sigmoid, tanh, the c update,
tanh, the output), each a kernel of its own. On a GPU a training step is bound
by its number of kernels, not its arithmetic (README's GPU section), so
`fused_step` does the same arithmetic in one kernel, reading the
pre-activations and the children's c once and writing the step's record (the
sigmoids, tanh of the candidate and of c) and its h and c. `fused_gate_gradients`
does the same for the backward's step of a cell (the gradient reaching c, then
the pre-activations' gradient: three torch kernels).

Chosen at run time: cells.py imports this module (and with it Triton) only for
a step on CUDA tensors that writes into a loop's buffers, never under autograd.
Without Triton, or once the kernel fails to build or launch (one warning, then
off for the process), the torch ops run as before; `disabled()` turns it off
for a block (the GPU check's side-by-side timing), and SPINN_CELL_KERNEL=off in
the environment for whole runs (a user's way out, should it misbehave on some
GPU). On a CPU it runs only in
the tests, under Triton's interpreter (TRITON_INTERPRET=1, set before Triton
loads), which checks its arithmetic against the torch ops.

tanh(x) is 2 sigmoid(2x) - 1 here (Triton's core language has no tanh): within
a few float32 units of torch's in absolute terms, not near zero in relative.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU install: the torch ops run
    triton = None

LOG = logging.getLogger(__name__)
OFF_VARIABLE, OFF = "SPINN_CELL_KERNEL", "off"
"""SPINN_CELL_KERNEL=off: the torch ops everywhere, read at every step (a run's environment decides)."""
MAX_BLOCK = 1024
"""Columns one program handles at most (a cell's width is its hidden size: 300 for the paper's models)."""
DTYPES = (torch.float32, torch.float64)
"""A fused loop's cell state: float32 (also under autocast, whose gates are cast to it) or float64 (tests)."""

_state = {"enabled": triton is not None}


@contextmanager
def disabled() -> Iterator[None]:
    """The torch ops instead of the kernel during the block."""
    before = _state["enabled"]
    _state["enabled"] = False
    try:
        yield
    finally:
        _state["enabled"] = before


def fused_step(gates: Tensor, c_children: Sequence[Tensor], out: Any, width: int) -> bool:
    """Write the step of a gated cell of `width` over `gates` (R, G) and its children's c, (R, D) each, into
    `out`'s buffers (a cells.StepOut) with the kernel; False, with nothing written, where it does not apply."""
    if not _on() or not _fits(gates, c_children, out):
        return False
    children = (*c_children, c_children[0])[:2]  # one child: the second is never read
    tensors = (gates, out.sig, out.tanh_candidate, out.tanh_c, out.h, out.c, *children)
    rows = (tensor.stride(0) for tensor in tensors)
    return _launched(_gated_step, gates.shape[0], width, *tensors, *rows, CHILDREN=len(c_children))


def fused_gate_gradients(
    grad_h: Tensor,
    grad_c: Tensor,
    local: tuple[Tensor, Tensor, Tensor],
    dc: Tensor,
    to_c: Tensor,
    to_output: Tensor,
) -> bool:
    """The backward's step of a gated cell, as `GateBackward.gates` computes it, in one kernel: with `local` the
    step's (h_from_c, c_from_gates, h_from_output), dc = grad_c + grad_h h_from_c, to_c = c_from_gates dc,
    to_output = h_from_output grad_h. Every tensor (R, blocks, D); False, with nothing written, where the
    kernel does not apply."""
    h_from_c, c_from_gates, h_from_output = local
    tensors = (grad_h, grad_c, h_from_c, c_from_gates, h_from_output, dc, to_c, to_output)
    if not _on() or not _all_fit(tensors, dims=3):
        return False
    count, blocks, width = c_from_gates.shape
    rows = (tensor.stride(0) for tensor in tensors)
    between_blocks = (c_from_gates.stride(1), to_c.stride(1))
    return _launched(_gate_gradients, count, width, *tensors, *rows, *between_blocks, BLOCKS=blocks)


def _on() -> bool:
    return _state["enabled"] and os.environ.get(OFF_VARIABLE) != OFF


def _launched(kernel: Any, rows: int, width: int, *arguments: Any, **constants: int) -> bool:
    """Launch `kernel` over the rows and the columns' blocks (its last arguments: width, then BLOCK); False, and
    the kernels off for the rest of the process, when Triton fails to build or launch it."""
    if rows == 0:
        return True
    block = min(MAX_BLOCK, 1 << (width - 1).bit_length())
    try:
        kernel[(rows, -(-width // block))](*arguments, width, BLOCK=block, **constants)
    except Exception as error:  # Triton raises many kinds (compilation, launch): each means "not here"
        _state["enabled"] = False
        LOG.warning("the gated cell's Triton kernel failed (%s); the cells run as torch ops from now on", error)
        return False
    return True


def _all_fit(tensors: Sequence[Tensor], dims: int) -> bool:
    """All of one float dtype, `dims` dimensions, unit stride along the last."""
    dtype = tensors[0].dtype
    return dtype in DTYPES and all(
        tensor.dtype == dtype and tensor.dim() == dims and tensor.stride(-1) == 1 for tensor in tensors
    )


def _fits(gates: Tensor, c_children: Sequence[Tensor], out: Any) -> bool:
    """Every buffer given, all of one float dtype, rows of unit column stride; one or two children."""
    if out.h is None or len(c_children) not in (1, 2):
        return False
    return _all_fit((gates, out.sig, out.tanh_candidate, out.tanh_c, out.h, out.c, *c_children), dims=2)


if triton is not None:

    @triton.jit
    def _tanh(x):
        return 2 * tl.sigmoid(2 * x) - 1

    @triton.jit
    def _gated_step(
        pre,
        sig,
        tanh_candidate,
        tanh_c,
        h,
        c,
        c_first,
        c_second,
        pre_row,
        sig_row,
        tanh_candidate_row,
        tanh_c_row,
        h_row,
        c_row,
        c_first_row,
        c_second_row,
        width,
        CHILDREN: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """One row, BLOCK columns: gates [candidate | input | forget per child | output], each `width` wide."""
        row = tl.program_id(0)
        columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = columns < width
        gates = pre + row * pre_row + columns
        sigmoids = sig + row * sig_row + columns
        candidate = tl.load(gates, mask=inside)
        tl.store(sigmoids, tl.sigmoid(candidate), mask=inside)  # unread, but torch.sigmoid writes it too
        input_gate = tl.sigmoid(tl.load(gates + width, mask=inside))
        tl.store(sigmoids + width, input_gate, mask=inside)
        forget = tl.sigmoid(tl.load(gates + 2 * width, mask=inside))
        tl.store(sigmoids + 2 * width, forget, mask=inside)
        cell = forget * tl.load(c_first + row * c_first_row + columns, mask=inside)
        if CHILDREN == 2:
            forget = tl.sigmoid(tl.load(gates + 3 * width, mask=inside))
            tl.store(sigmoids + 3 * width, forget, mask=inside)
            cell += forget * tl.load(c_second + row * c_second_row + columns, mask=inside)
        output_gate = tl.sigmoid(tl.load(gates + (2 + CHILDREN) * width, mask=inside))
        tl.store(sigmoids + (2 + CHILDREN) * width, output_gate, mask=inside)
        squashed = _tanh(candidate)
        tl.store(tanh_candidate + row * tanh_candidate_row + columns, squashed, mask=inside)
        cell += squashed * input_gate
        tl.store(c + row * c_row + columns, cell, mask=inside)  # after every read of c_first: they may alias
        squashed_cell = _tanh(cell)
        tl.store(tanh_c + row * tanh_c_row + columns, squashed_cell, mask=inside)
        tl.store(h + row * h_row + columns, output_gate * squashed_cell, mask=inside)

    @triton.jit
    def _gate_gradients(
        grad_h,
        grad_c,
        h_from_c,
        c_from_gates,
        h_from_output,
        dc,
        to_c,
        to_output,
        grad_h_row,
        grad_c_row,
        h_from_c_row,
        c_from_gates_row,
        h_from_output_row,
        dc_row,
        to_c_row,
        to_output_row,
        c_from_gates_block,
        to_c_block,
        width,
        BLOCKS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """One row, BLOCK columns: dc once, then each of the BLOCKS gate blocks that reach c, then the output's."""
        row = tl.program_id(0)
        columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = columns < width
        upstream_h = tl.load(grad_h + row * grad_h_row + columns, mask=inside)
        upstream_c = tl.load(grad_c + row * grad_c_row + columns, mask=inside)
        reaching_c = upstream_c + upstream_h * tl.load(h_from_c + row * h_from_c_row + columns, mask=inside)
        tl.store(dc + row * dc_row + columns, reaching_c, mask=inside)
        for block in tl.static_range(BLOCKS):
            local = tl.load(c_from_gates + row * c_from_gates_row + block * c_from_gates_block + columns, mask=inside)
            tl.store(to_c + row * to_c_row + block * to_c_block + columns, local * reaching_c, mask=inside)
        through_output = tl.load(h_from_output + row * h_from_output_row + columns, mask=inside) * upstream_h
        tl.store(to_output + row * to_output_row + columns, through_output, mask=inside)
