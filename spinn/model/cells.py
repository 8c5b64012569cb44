"""The learned cells: TreeLSTM composition, the tracker LSTM, word embedding and the classifier MLP.

Composition and tracker are one kind of cell, a gated cell over named input blocks:

    gates = b + W [x_1 | x_2 | ...]              the input blocks, named, are W's column blocks
    c = tanh(a)σ(i) + Σ_k σ(f_k) c_k             a candidate, an input gate, a forget gate per child
    h = σ(o) tanh(c)                             an output gate

The TreeLSTM composition has two children (the left and right phrases' c); the tracker is an
LSTM, a gated cell whose one child is its own previous c. Each cell owns its arithmetic, here
and nowhere else: `step` (which writes into caller-given buffers when a loop hands it some),
and `local_derivatives`, the elementwise derivatives the fused backward multiplies gradients by.
The encoder loops (spec.py, thin_stack_forward.py / thin_stack_backward.py, thin_stack_infer.py)
own the addressing: they gather the inputs, ask a cell for the weight blocks of the inputs they
gathered by name, call the cell and scatter its outputs; none of them names a gate.

Shapes: R rows, D the cell's width (h and c), G = (k + 3) D its gates for k children.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from spinn.ground.errors import SpinnError
from spinn.model.config import N_ACTIONS, SPINNConfig

GATES_BESIDE_FORGETS = 3
"""The candidate, the input gate and the output gate; each child adds a forget gate."""
KERNEL_ON_CPU = False
"""Whether the cell's kernel also runs on CPU tensors: only the tests set it, with Triton's interpreter on."""


class GateViews(NamedTuple):
    """A gated cell's gates by role, views of the pre-activations (candidate) and of their sigmoid (the rest)."""

    candidate: Tensor  # (..., D) pre-activation: tanh makes it the candidate
    input: Tensor  # (..., D)
    forgets: Tensor  # (..., k, D) one per child
    output: Tensor  # (..., D)


class StepOut(NamedTuple):
    """Where one step of a gated cell writes: its record for the backward and its outputs (views cut once)."""

    sig: Tensor | None  # (R, G) sigmoid of the pre-activations
    views: GateViews | None
    forgets: Sequence[Tensor] | None  # the forget gates one by one, (R, D) each
    tanh_candidate: Tensor | None  # (R, D)
    tanh_c: Tensor | None  # (R, D)
    h: Tensor | None  # (R, D)
    c: Tensor | None  # (R, D)


FRESH = StepOut(None, None, None, None, None, None, None)
"""No buffers: a step that makes new tensors (under autograd, or where shapes vary)."""


class LocalDerivatives(NamedTuple):
    """The cell's derivatives at every row a fused encoding kept (M, ...), elementwise in the cell's width.

    With dc = grad_c + grad_h * h_from_c (the gradient reaching c), the pre-activations' gradient
    is [c_from_gates * dc | h_from_output * grad_h] in gate order, and the children's c get
    dc * c_from_children."""

    c_from_gates: Tensor  # (M, k + 2, D) d c / d [candidate, input, forgets]
    h_from_output: Tensor  # (M, 1, D) d h / d output
    h_from_c: Tensor  # (M, 1, D) d h / d c
    c_from_children: Tensor  # (M, k, D) d c / d c_k


class GatedCell(nn.Module):
    """c = tanh(a)σ(i) + Σ_k σ(f_k) c_k, h = σ(o) tanh(c), over named input blocks (module docstring).

    Subclasses name their inputs (in the weight's column order) and their linear layer; a
    subclass that changes the arithmetic overrides `step` and `local_derivatives` together
    (tests/test_cells.py checks the second against autograd of the first)."""

    def __init__(self, inputs: Mapping[str, int], width: int, children: int):
        super().__init__()
        self.inputs = dict(inputs)  # name -> width, in the weight's column order
        self.width, self.n_children = width, children

    @property
    def linear(self) -> nn.Linear:
        raise NotImplementedError

    @property
    def gate_width(self) -> int:
        return (self.n_children + GATES_BESIDE_FORGETS) * self.width

    # ------------------------------------------------------------------ weights by name

    def weight(self, *names: str) -> Tensor:
        """(G, sum of widths): the weight's columns that read these inputs, in this order (a view where
        they lie in that order)."""
        columns = self._columns()
        spans = [columns[name] for name in names]
        weight = self.linear.weight
        if all(first[1] == second[0] for first, second in zip(spans, spans[1:], strict=False)):
            return weight[:, spans[0][0] : spans[-1][1]]
        return torch.cat([weight[:, start:stop] for start, stop in spans], 1)

    def weight_grad(self, groups: Sequence[tuple[Sequence[str], Tensor]]) -> Tensor:
        """(G, in) the weight's gradient in its column order, from gradients of (names, (G, sum of widths))
        blocks that together name every input once."""
        blocks = {}
        for names, grad in groups:
            blocks.update(zip(names, grad.split([self.inputs[name] for name in names], 1), strict=True))
        if blocks.keys() != self.inputs.keys():
            raise SpinnError(f"gradients for inputs {sorted(blocks)}, the cell reads {list(self.inputs)}")
        return torch.cat([blocks[name] for name in self.inputs], 1)

    @property
    def bias(self) -> Tensor:
        return self.linear.bias

    def _columns(self) -> dict[str, tuple[int, int]]:
        spans, start = {}, 0
        for name, width in self.inputs.items():
            spans[name] = (start, start + width)
            start += width
        return spans

    # ------------------------------------------------------------------ arithmetic

    def forward(self, inputs: Mapping[str, Tensor], c_children: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """inputs: (R, width) per input name; c_children: the children's c, (R, D) each -> h, c (R, D).
        Gates are cast to the cell state's dtype, so bf16 matmuls keep an fp32 cell."""
        gates = self.linear(torch.cat([inputs[name] for name in self.inputs], 1))  # (R, G)
        return self.step(gates.to(c_children[0].dtype), c_children)

    def step(self, gates: Tensor, c_children: Sequence[Tensor], out: StepOut = FRESH) -> tuple[Tensor, Tensor]:
        """The cell on pre-activations: gates (R, G), the children's c (R, D) each -> h, c (R, D).

        `out`: buffers to write into (the fused loop's, so a step allocates nothing and can be
        captured in a CUDA graph); FRESH makes new tensors, which autograd can differentiate. Into buffers
        on a GPU, one Triton kernel does the step (spinn/model/cell_kernel.py) where it can."""
        if out.h is not None and (gates.is_cuda or KERNEL_ON_CPU):
            from spinn.model.cell_kernel import fused_step  # imports Triton: only where the kernel may run

            if fused_step(gates, c_children, out, self.width):
                return out.h, out.c
        sig = torch.sigmoid(gates, out=out.sig)  # (R, G)
        views = out.views or self.gate_views(gates, sig)
        forgets = out.forgets or views.forgets.unbind(-2)  # (R, D) each
        tanh_candidate = torch.tanh(views.candidate, out=out.tanh_candidate)  # (R, D)
        c = torch.mul(forgets[0], c_children[0], out=out.c)  # (R, D)
        for forget, child in zip(forgets[1:], c_children[1:], strict=True):
            c.addcmul_(forget, child)
        c.addcmul_(tanh_candidate, views.input)
        tanh_c = torch.tanh(c, out=out.tanh_c)  # (R, D)
        return torch.mul(views.output, tanh_c, out=out.h), c

    def gate_views(self, gates: Tensor, sig: Tensor) -> GateViews:
        """The gates by role, over any leading shape: gates and sig (..., G)."""
        d, k = self.width, self.n_children
        blocks = sig.unflatten(-1, (k + GATES_BESIDE_FORGETS, d))  # (..., k + 3, D)
        return GateViews(gates[..., :d], blocks[..., 1, :], blocks[..., 2 : 2 + k, :], blocks[..., -1, :])

    def local_derivatives(self, tape: GateTape, c_children: Tensor) -> LocalDerivatives:
        """The step's derivatives at every row the tape kept (M, ...) at once, from the tape the forward loop
        wrote and the children's c it read, (M, k, D): a few kernels, each writing its result once."""
        d, k = self.width, self.n_children
        sig = tape.sig.unflatten(-1, (k + GATES_BESIDE_FORGETS, d))[:, 1:]  # (M, k + 2, D) input, forgets, output
        d_sig = torch.addcmul(sig, sig, sig, value=-1)  # σ' = σ - σ²
        (input_, _, output), (d_input, d_forgets, d_output) = (x.split([1, k, 1], 1) for x in (sig, d_sig))
        tanh_candidate, tanh_c = tape.tanh_candidate.unsqueeze(1), tape.tanh_c.unsqueeze(1)  # (M, 1, D) each
        c_from_gates = tape.sig.new_empty(tape.sig.shape[0], k + 2, d)  # [candidate, input, forgets]
        to_candidate, to_input, to_forgets = c_from_gates.split([1, 1, k], 1)
        torch.addcmul(input_, input_, tanh_candidate.square(), value=-1, out=to_candidate)  # σ(i)(1 - tanh²(a))
        torch.mul(tanh_candidate, d_input, out=to_input)
        torch.mul(c_children, d_forgets, out=to_forgets)
        h_from_c = torch.addcmul(output, output, tanh_c.square(), value=-1)  # σ(o)(1 - tanh²(c))
        return LocalDerivatives(c_from_gates, tanh_c * d_output, h_from_c, sig[:, 1 : 1 + k])

    # ------------------------------------------------------------------ the fused loops' buffers

    def tape(self, like: Tensor, rows: Sequence[int], h: Sequence[Tensor], c: Sequence[Tensor]) -> GateTape:
        """Buffers for the fused forward over len(h) steps; rows: how many rows each step computes, one
        entry per step kept (to be differentiated), or a single entry whose buffers every step reuses;
        h, c: where each step's outputs go, (rows, D) each."""
        return GateTape(self, like, rows, h, c)

    def backward_buffers(self, tape: GateTape, c_children: Tensor) -> GateBackward:
        """What the fused backward needs of this cell for one encoding (c_children: (M, k, D), as the tape's rows)."""
        return GateBackward(self.local_derivatives(tape, c_children), tape.pre, tape.rows)


def per_step(tensor: Tensor, steps: int) -> list[Tensor]:
    """Per-step views of a (T', ...) buffer: T' = steps gives one per step, T' = 1 the same view each step."""
    return list(tensor.unbind(0)) if tensor.shape[0] == steps else [tensor[0]] * steps


def step_rows(tensor: Tensor, rows: Sequence[int], steps: int) -> list[Tensor]:
    """Per-step views of an (M, ...) buffer of rows kept step after step (rows[t] at step t), or, with one entry
    in rows, the same view at each of the steps."""
    if len(rows) == 1:
        return [tensor] * steps
    return list(tensor.split(rows[0] if len(set(rows)) == 1 else list(rows)))  # one op either way


class GateTape:
    """A gated cell's record of every step of one fused encoding, in (M, ...) buffers of the rows each step
    computed, each step's views cut once (a view is an op too): the loop writes a step's pre-activations into
    `gates[t]` (rows[t], G) and calls `cell.step(gates[t], c_children, out[t])`."""

    def __init__(self, cell: GatedCell, like: Tensor, rows: Sequence[int], h: Sequence[Tensor], c: Sequence[Tensor]):
        steps, kept = len(h), sum(rows)
        self.rows = list(rows)
        self.pre = like.new_empty(kept, cell.gate_width)  # (M, G)
        self.sig = like.new_empty(kept, cell.gate_width)  # (M, G)
        self.tanh_candidate = like.new_empty(kept, cell.width)  # (M, D)
        self.tanh_c = like.new_empty(kept, cell.width)  # (M, D)
        views = cell.gate_views(self.pre, self.sig)
        gates = (self.sig, views.candidate, views.input, views.forgets, views.output)
        sig, candidate, input_, forgets, output, tanh_candidate, tanh_c = (
            step_rows(tensor, rows, steps) for tensor in (*gates, self.tanh_candidate, self.tanh_c)
        )
        by_child = [step_rows(tensor, rows, steps) for tensor in views.forgets.unbind(1)]
        self.gates = step_rows(self.pre, rows, steps)
        self.out = [
            StepOut(
                sig[t],
                GateViews(candidate[t], input_[t], forgets[t], output[t]),
                [child[t] for child in by_child],
                tanh_candidate[t],
                tanh_c[t],
                h[t],
                c[t],
            )
            for t in range(steps)
        ]


class GateBackward:
    """The fused backward's view of a gated cell: its local derivatives per step, and the gradient of its
    pre-activations at every row the tape kept, (M, G), which the loop multiplies back into inputs and weights."""

    def __init__(self, local: LocalDerivatives, like: Tensor, rows: Sequence[int]):
        kept, k_plus_2, d = local.c_from_gates.shape
        steps = len(rows)
        self.c_from_gates, self.h_from_output, self.h_from_c, self.c_from_children = (
            step_rows(tensor, rows, steps) for tensor in local
        )
        self.grads = like.new_empty(kept, (k_plus_2 + 1) * d)  # (M, G)
        blocks = self.grads.view(kept, k_plus_2 + 1, d)
        self.to_c_part = step_rows(blocks[:, :k_plus_2], rows, steps)
        self.output_part = step_rows(blocks[:, k_plus_2:], rows, steps)
        self.flat = step_rows(self.grads, rows, steps)  # (rows[t], G) each
        dc = like.new_empty(max(rows), 1, d)  # the gradient reaching c at the current step
        self.dc = [dc] * steps if len(set(rows)) == 1 else [dc[:count] for count in rows]

    def gates(self, step: int, grad_h: Tensor, grad_c: Tensor) -> Tensor:
        """grad_h, grad_c (rows, 1, D): the step's output gradients -> its pre-activations' gradient (rows, G).
        On a GPU one Triton kernel does it where it can (spinn/model/cell_kernel.py)."""
        dc = self.dc[step]
        if grad_h.is_cuda or KERNEL_ON_CPU:
            from spinn.model.cell_kernel import fused_gate_gradients  # imports Triton: only where it may run

            local = (self.h_from_c[step], self.c_from_gates[step], self.h_from_output[step])
            if fused_gate_gradients(grad_h, grad_c, local, dc, self.to_c_part[step], self.output_part[step]):
                return self.flat[step]
        torch.addcmul(grad_c, grad_h, self.h_from_c[step], out=dc)
        torch.mul(self.c_from_gates[step], dc, out=self.to_c_part[step])
        torch.mul(self.h_from_output[step], grad_h, out=self.output_part[step])
        return self.flat[step]

    def children(self, step: int, out: Tensor) -> None:
        """The children's c gradient (rows, k, D) of the step `gates` last ran, written into out (which may be
        the buffer grad_c was read from)."""
        torch.mul(self.c_from_children[step], self.dc[step], out=out)


class Reduce(GatedCell):
    """Composition: the TreeLSTM over the left and right children (stack second and stack top), reading the
    tracker's state too where there is one; the three input weights are column blocks of `compose`."""

    CHILDREN = ("left", "right")
    TRACKING = "tracking"

    def __init__(self, d_hidden: int, d_tracker: int):
        inputs = {name: d_hidden for name in self.CHILDREN} | ({self.TRACKING: d_tracker} if d_tracker else {})
        super().__init__(inputs, d_hidden, len(self.CHILDREN))
        self.d_hidden, self.d_tracker = d_hidden, d_tracker
        self.compose = nn.Linear(sum(inputs.values()), self.gate_width)

    @property
    def linear(self) -> nn.Linear:
        return self.compose


class Tracker(GatedCell):
    """LSTM over the buffer top, stack top and stack second (their h) and its own h; its one child is its
    previous c. Optionally predicts the next transition."""

    READS = ("buffer", "top", "second")
    RECURRENT = "h"

    def __init__(self, d_hidden: int, d_tracker: int, predict: bool):
        inputs = {name: d_hidden for name in self.READS} | {self.RECURRENT: d_tracker}
        super().__init__(inputs, d_tracker, 1)
        self.d_tracker = d_tracker
        self.gates = nn.Linear(sum(inputs.values()), self.gate_width)  # input and recurrent, fused
        self.transition = nn.Linear(d_tracker, N_ACTIONS) if predict else None

    @property
    def linear(self) -> nn.Linear:
        return self.gates


class MaskedBatchNorm1d(nn.BatchNorm1d):
    """Batch norm whose training statistics count only the rows a mask marks real, over every rank.

    Batches keep every word slot of every sentence (N*L rows, a fixed shape), so
    padding slots must not move the statistics: with a mask this is exactly
    nn.BatchNorm1d over the real rows (the same parameters and buffers, so
    checkpoints move freely between the two), without any data-dependent shape.
    Under torch.distributed the sums are added over all ranks (differentiably),
    so N ranks normalize with the statistics of the global batch, as one process
    would, on CPU (gloo) and GPU (nccl) alike.
    """

    def forward(self, x: Tensor, real: Tensor | None = None) -> Tensor:
        synced = _world() > 1
        if not self.training or (real is None and not synced):
            return super().forward(x)
        weight = (real.to(x.dtype) if real is not None else x.new_ones(x.shape[0]))[:, None]  # (R, 1)
        count = _global_sum(weight.sum())
        mean = _global_sum((x * weight).sum(0)) / count  # (C,)
        centered = x - mean  # (R, C)
        variance = _global_sum((centered * centered * weight).sum(0)) / count  # (C,) biased, as batch norm does
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(variance * count / (count - 1).clamp(min=1), self.momentum)  # unbiased
        return centered * torch.rsqrt(variance + self.eps) * self.weight + self.bias


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _global_sum(tensor: Tensor) -> Tensor:
    """The sum over ranks, with gradients flowing back to every rank's share (identity in one process)."""
    if _world() == 1:
        return tensor
    return _GlobalSum.apply(tensor)


class _GlobalSum(torch.autograd.Function):
    """all_reduce(SUM) whose gradient is the all_reduce(SUM) of the ranks' gradients: what
    torch.distributed.nn.functional.all_reduce computes, without the FutureWarning it prints on every rank
    (its suggested replacement has no backward)."""

    @staticmethod
    def forward(ctx, tensor: Tensor) -> Tensor:
        total = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return _GlobalSum.apply(grad)


class WordEmbedding(nn.Module):
    """Frozen word vectors projected to (h, c) of size 2D, then batch norm and dropout."""

    def __init__(self, config: SPINNConfig, vectors: Tensor):
        super().__init__()
        if vectors.dim() != 2 or vectors.shape[1] != config.d_embed:
            raise SpinnError(f"embedding matrix has shape {tuple(vectors.shape)}, expected (vocab, {config.d_embed})")
        self.vectors = nn.Embedding.from_pretrained(vectors, freeze=True)
        self.project = nn.Linear(config.d_embed, 2 * config.d_hidden)
        self.norm = MaskedBatchNorm1d(2 * config.d_hidden) if config.use_batch_norm else None
        self.dropout = nn.Dropout(config.embed_dropout)

    def forward(self, token_ids: Tensor, real: Tensor | None = None) -> Tensor:
        """token_ids (W,) -> (W, 2D) = [h | c]; `real` (W,) marks the words batch norm may learn from."""
        vectors = self.vectors(token_ids)  # (W, E)
        if self.norm is not None and not self.norm.training:
            return self.dropout(F.linear(vectors, *self._folded()))  # (W, 2D)
        projected = self.project(vectors)  # (W, 2D)
        if self.norm is not None:
            projected = self.norm(projected, real)
        return self.dropout(projected)

    def _folded(self) -> tuple[Tensor, Tensor]:
        """The projection with evaluation's batch norm folded in: (2D, E) weight and (2D,) bias. Batch norm on
        running statistics is an affine map per column, so one GEMM does both, with no (W, 2D) pass over every
        word slot."""
        norm = self.norm
        scale = norm.weight * torch.rsqrt(norm.running_var + norm.eps)  # (2D,)
        return self.project.weight * scale[:, None], (self.project.bias - norm.running_mean) * scale + norm.bias


class Classifier(nn.Module):
    """MLP over [p; h; p - h; p * h] -> class logits."""

    def __init__(self, config: SPINNConfig):
        super().__init__()
        width = 4 * config.d_hidden
        layers: list[nn.Module] = [MaskedBatchNorm1d(width)] if config.use_batch_norm else []
        layers.append(nn.Dropout(config.mlp_dropout))
        for _ in range(config.mlp_layers):
            layers += [nn.Linear(width, config.mlp_dim), nn.ReLU()]
            layers += [MaskedBatchNorm1d(config.mlp_dim)] if config.use_batch_norm else []
            layers.append(nn.Dropout(config.mlp_dropout))
            width = config.mlp_dim
        layers.append(nn.Linear(width, config.n_classes))
        self.mlp = nn.Sequential(*layers)

    def forward(self, premise: Tensor, hypothesis: Tensor) -> Tensor:
        features = torch.cat([premise, hypothesis, premise - hypothesis, premise * hypothesis], 1)  # (B, 4D)
        return self.mlp(features)  # (B, n_classes)
