"""The learned cells: TreeLSTM composition, the tracker LSTM, word embedding and the classifier MLP."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from spinn.errors import SpinnError
from spinn.model.addressing import BUFFER_SLOT, SECOND_SLOT, TOP_SLOT
from spinn.model.config import N_ACTIONS, SPINNConfig

REDUCE_GATES = 5  # a, i, f_left, f_right, o
TRACKER_GATES = 4  # g, i, f, o
CHILD_SLOTS = 2
"""The composition's inputs: left child (stack second) and right child (stack top), then the tracker."""
TRACKER_READ_ORDER = [BUFFER_SLOT, TOP_SLOT, SECOND_SLOT]
"""The tracker weight's column blocks, as read slots: [buffer top, stack top, stack second]."""


def tree_lstm(gates: Tensor, c_children: Tensor) -> tuple[Tensor, Tensor]:
    """TreeLSTM update: c = tanh(a)σ(i) + σ(f1)c1 + σ(f2)c2, h = σ(o)tanh(c).

    gates (R, 5D) in the order [a, i, f1, f2, o]; c_children (R, 2D) = [c_left | c_right].
    Gates are cast to the cell state's dtype so bf16 matmuls keep an fp32 cell.
    """
    d = c_children.shape[1] // 2
    a, ifo = gates.to(c_children.dtype).split([d, 4 * d], 1)  # (R, D), (R, 4D)
    i, f, o = torch.sigmoid(ifo).split([d, 2 * d, d], 1)  # (R, D), (R, 2D), (R, D)
    c = torch.tanh(a) * i + (f * c_children).view(-1, 2, d).sum(1)  # (R, D)
    h = o * torch.tanh(c)  # (R, D)
    return h, c


def lstm(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """LSTM update; gates (A, 4Dt) in the order [g, i, f, o], c (A, Dt) kept in its own dtype."""
    d = c.shape[1]
    g, ifo = gates.to(c.dtype).split([d, 3 * d], 1)  # (A, Dt), (A, 3Dt)
    i, f, o = torch.sigmoid(ifo).chunk(3, 1)  # (A, Dt) each
    c = torch.tanh(g) * i + f * c  # (A, Dt)
    h = o * torch.tanh(c)  # (A, Dt)
    return h, c


class Reduce(nn.Module):
    """Composition: lstm_in = W_l h_left + W_r h_right (+ W_t h_tracker), as ONE matmul over the
    concatenated inputs (the three weights are column blocks of `compose.weight`)."""

    def __init__(self, d_hidden: int, d_tracker: int):
        super().__init__()
        self.d_hidden, self.d_tracker = d_hidden, d_tracker
        self.compose = nn.Linear(2 * d_hidden + d_tracker, REDUCE_GATES * d_hidden)
        self.cell = tree_lstm

    def forward(self, h_children: Tensor, c_children: Tensor, tracking: Tensor | None) -> tuple[Tensor, Tensor]:
        """h_children, c_children (R, 2D) = [left | right]; tracking (R, Dt) or None."""
        inputs = h_children if tracking is None else torch.cat([h_children, tracking], 1)  # (R, 2D + Dt)
        return self.cell(self.compose(inputs), c_children)  # (R, D), (R, D)


class Tracker(nn.Module):
    """LSTM over [buffer top, stack top, stack second] h-parts; optionally predicts the next transition."""

    def __init__(self, d_hidden: int, d_tracker: int, predict: bool):
        super().__init__()
        self.d_tracker = d_tracker
        self.gates = nn.Linear(3 * d_hidden + d_tracker, TRACKER_GATES * d_tracker)  # input and recurrent, fused
        self.transition = nn.Linear(d_tracker, N_ACTIONS) if predict else None
        self.cell = lstm

    def forward(self, reads: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        """reads (A, 3D) = [buffer top | stack top | stack second]; h, c (A, Dt)."""
        return self.cell(self.gates(torch.cat([reads, h], 1)), c)  # (A, Dt), (A, Dt)


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
        running statistics is an affine map per column, so one GEMM does both, and the (W, 2D) pass that
        normalized every word slot (about 4% of CPU labelling) is gone."""
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
