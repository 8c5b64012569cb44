"""SPINN (Bowman et al. 2016): the whole forward pass in one file.

A sentence is encoded by running shift/reduce transitions over its words.
SHIFT moves the next word onto the stack; REDUCE pops the two top phrases and
composes them with a TreeLSTM cell; the root left on the stack is the sentence
vector. Three variants, chosen by `SPINNConfig.variant`:

- `pi-nt`: no tracker, the gold transitions drive the stacks.
- `pi`: a tracker LSTM reads [buffer top, stack top, stack second] at every
  step and its state feeds every composition.
- `spinn`: the tracker also predicts SHIFT/REDUCE. Training supervises it with
  the gold transitions (loss weight alpha); at inference it can run on its own
  predictions, illegal actions masked, so no parser is needed.
- `rl`: the tracker's prediction is a policy: training samples the trees and
  learns them from the NLI reward with REINFORCE (spinn/policy.py), with
  optional supervision; evaluation takes the best legal action. No parses needed.
- `cbow`: no tree at all, the mean of the projected word vectors with the same
  classifier; the sanity baseline every tree model must beat.

Fully batched: premise and hypothesis of B pairs are one batch of N = 2B
sentences; the only Python loop is over transition steps. All node vectors
(words, then compositions) live in one `ThinStack` memory that is written
once per node and never moved; a stack is a row of back-pointers into it, so
SHIFT and REDUCE move integers, not vectors. Transitions are left-padded with
a no-op, so every sentence's root is on top of its stack after the last step.
With `compose="needed"` each step composes only the rows that REDUCE and runs
the tracker only on rows that have started; `compose="all"` computes every row
at every step and discards the unused results (kept to measure the difference).

Shapes: B pairs, N = 2B sentences, L words (padded), T = 2L - 1 steps,
D hidden, Dt tracker, E embedding, A rows started at a step, R rows reducing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from spinn.batching import PAD_TRANSITION, Batch
from spinn.errors import SpinnError
from spinn.policy import (
    BASELINES,
    REWARDS,
    MovingAverageBaseline,
    PolicyTerms,
    ValueBaseline,
    chance_reward,
    draw_uniforms,
    reinforce,
    sample_actions,
)
from spinn.schema import LABELS
from spinn.transitions import Transition

TREE_VARIANTS = ("pi-nt", "pi", "spinn", "rl")
BASELINE = "cbow"
VARIANTS = (*TREE_VARIANTS, BASELINE)
COMPOSE_STRATEGIES = ("needed", "all")
N_ACTIONS = len(Transition)
SHIFT = int(Transition.SHIFT)
REDUCE = int(Transition.REDUCE)
REDUCE_GATES = 5  # a, i, f_left, f_right, o
TRACKER_GATES = 4  # g, i, f, o
EMPTY_COLUMNS = 2  # stack columns that point at the zero row, so top/second of a short stack read zeros
ZERO_ROW = 0  # the memory row every empty buffer or stack slot points at
ZERO_ROWS = 1


@dataclass(frozen=True)
class SPINNConfig:
    """Every hyperparameter of the model; checkpoints store `to_dict()`."""

    variant: str = "spinn"
    d_embed: int = 300
    d_hidden: int = 300
    d_tracker: int = 64
    mlp_layers: int = 1
    mlp_dim: int = 1024
    embed_dropout: float = 0.0
    mlp_dropout: float = 0.0
    use_batch_norm: bool = False
    transition_loss_weight: float = 3.9
    n_classes: int = len(LABELS)
    compose: str = "needed"
    reward: str = "log_likelihood"  # rl: log p(gold label), or "correct" (1/0)
    baseline: str = "moving_average"  # rl: or "value", a learned baseline on bag-of-words features
    baseline_decay: float = 0.99  # rl: moving-average decay
    policy_weight: float = 1.0  # rl: weight of the REINFORCE term
    entropy_weight: float = 0.01  # rl: bonus for exploring (subtracted from the loss)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise SpinnError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.compose not in COMPOSE_STRATEGIES:
            raise SpinnError(f"compose must be one of {COMPOSE_STRATEGIES}, got {self.compose!r}")
        for name in ("d_embed", "d_hidden", "n_classes"):
            if getattr(self, name) < 1:
                raise SpinnError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.has_tracker and self.d_tracker < 1:
            raise SpinnError(f"variant {self.variant} needs d_tracker >= 1, got {self.d_tracker}")
        if self.mlp_layers < 0 or (self.mlp_layers and self.mlp_dim < 1):
            raise SpinnError(f"bad classifier shape: {self.mlp_layers} layers of {self.mlp_dim}")
        for name in ("embed_dropout", "mlp_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise SpinnError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.reward not in REWARDS or self.baseline not in BASELINES:
            raise SpinnError(f"reward must be one of {REWARDS} and baseline one of {BASELINES}, "
                             f"got {self.reward!r}, {self.baseline!r}")
        if not 0.0 <= self.baseline_decay < 1.0:
            raise SpinnError(f"baseline_decay must be in [0, 1), got {self.baseline_decay}")

    @property
    def has_tracker(self) -> bool:
        return self.variant in ("pi", "spinn", "rl")

    @property
    def uses_trees(self) -> bool:
        return self.variant in TREE_VARIANTS

    @property
    def predicts_transitions(self) -> bool:
        return self.variant in ("spinn", "rl")

    @property
    def samples_transitions(self) -> bool:
        """rl: training samples its own trees (no gold transitions needed)."""
        return self.variant == "rl"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SPINNConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpinnError(f"unknown SPINN config fields {unknown}")
        return cls(**data)


# Bowman et al. 2016, appendix hyperparameter table (300D models). Dropout here is
# the drop probability (the paper lists keep rates). Learning rate and L2 belong to training.
PRESETS: dict[str, SPINNConfig] = {
    "spinn-pi-nt-300d": SPINNConfig(variant="pi-nt", d_embed=300, d_hidden=300, d_tracker=0, mlp_layers=2,
                                    mlp_dim=1024, embed_dropout=0.17, mlp_dropout=0.06, use_batch_norm=True),
    "spinn-pi-300d": SPINNConfig(variant="pi", d_embed=300, d_hidden=300, d_tracker=61, mlp_layers=2,
                                 mlp_dim=1024, embed_dropout=0.08, mlp_dropout=0.07, use_batch_norm=True),
    "spinn-300d": SPINNConfig(variant="spinn", d_embed=300, d_hidden=300, d_tracker=79, mlp_layers=1,
                              mlp_dim=1024, embed_dropout=0.14, mlp_dropout=0.06, use_batch_norm=True,
                              transition_loss_weight=3.9),
    "tiny": SPINNConfig(variant="spinn", d_embed=8, d_hidden=6, d_tracker=5, mlp_layers=1, mlp_dim=10),
    # The spinn-300d shape, learning its trees from the reward alone (no transition supervision).
    "rl-300d": SPINNConfig(variant="rl", d_embed=300, d_hidden=300, d_tracker=79, mlp_layers=1, mlp_dim=1024,
                           embed_dropout=0.14, mlp_dropout=0.06, use_batch_norm=True, transition_loss_weight=0.0),
}


class Encoding(NamedTuple):
    """What the encoder returns for N sentences, in input order."""

    vectors: Tensor  # (N, D) root h of each sentence
    transition_logits: Tensor | None  # (N, T, 2) illegal actions -inf, padding steps 0; spinn only
    transitions: Tensor  # (N, T) the transitions that ran (gold or predicted), PAD_TRANSITION before the start


class SPINNOutput(NamedTuple):
    """What the model returns for B pairs; training adds the transition loss when present."""

    logits: Tensor  # (B, n_classes)
    premise: Tensor  # (B, D)
    hypothesis: Tensor  # (B, D)
    transition_logits: Tensor | None  # (2B, T, 2) premises then hypotheses
    transitions: Tensor  # (2B, T)
    baseline: Tensor | None = None  # (B,) rl while training: the baseline each pair's reward is compared with


class Loss(NamedTuple):
    total: Tensor
    classification: Tensor
    transition: Tensor | None
    policy: PolicyTerms | None = None


# ----------------------------------------------------------------------------- cells


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


class WordEmbedding(nn.Module):
    """Frozen word vectors projected to (h, c) of size 2D, then batch norm and dropout."""

    def __init__(self, config: SPINNConfig, vectors: Tensor):
        super().__init__()
        if vectors.dim() != 2 or vectors.shape[1] != config.d_embed:
            raise SpinnError(f"embedding matrix has shape {tuple(vectors.shape)}, expected (vocab, {config.d_embed})")
        self.vectors = nn.Embedding.from_pretrained(vectors, freeze=True)
        self.project = nn.Linear(config.d_embed, 2 * config.d_hidden)
        self.norm = nn.BatchNorm1d(2 * config.d_hidden) if config.use_batch_norm else nn.Identity()
        self.dropout = nn.Dropout(config.embed_dropout)

    def forward(self, token_ids: Tensor) -> Tensor:
        """token_ids (W,) of real words only, so batch norm never sees padding -> (W, 2D) = [h | c]."""
        return self.dropout(self.norm(self.project(self.vectors(token_ids))))  # (W, 2D)


class Classifier(nn.Module):
    """MLP over [p; h; p - h; p * h] -> class logits."""

    def __init__(self, config: SPINNConfig):
        super().__init__()
        width = 4 * config.d_hidden
        layers: list[nn.Module] = [nn.BatchNorm1d(width)] if config.use_batch_norm else []
        layers.append(nn.Dropout(config.mlp_dropout))
        for _ in range(config.mlp_layers):
            layers += [nn.Linear(width, config.mlp_dim), nn.ReLU()]
            layers += [nn.BatchNorm1d(config.mlp_dim)] if config.use_batch_norm else []
            layers.append(nn.Dropout(config.mlp_dropout))
            width = config.mlp_dim
        layers.append(nn.Linear(width, config.n_classes))
        self.mlp = nn.Sequential(*layers)

    def forward(self, premise: Tensor, hypothesis: Tensor) -> Tensor:
        features = torch.cat([premise, hypothesis, premise - hypothesis, premise * hypothesis], 1)  # (B, 4D)
        return self.mlp(features)  # (B, n_classes)


# ----------------------------------------------------------------------------- thin stack memory


class _Memory:
    """Node vectors of one encoding, (rows, D) for h and for c, each row written exactly once.

    Reads and writes go through the autograd functions below, which keep the
    gradient in one buffer of the same shape (the thin-stack backward of Bowman
    et al.): a read adds its gradient at its rows; a write, whose backward runs
    only after every later read (they depend on its token), takes the gradient
    of its rows and clears them. Without this, autograd would copy the whole
    memory for every in-place write. Each read and write passes along a
    zero-size `token` so autograd sees that order. Partial `autograd.grad` calls
    that skip the word projection and then backpropagate again are not supported.
    """

    def __init__(self, rows: int, zero_rows: int, width: int, like: Tensor):
        self.shape = (rows, width)
        self.h = like.new_empty(self.shape)
        self.c = like.new_empty(self.shape)
        self.h[:zero_rows].zero_()
        self.c[:zero_rows].zero_()
        self.used = zero_rows
        self.grad_h: Tensor | None = None
        self.grad_c: Tensor | None = None
        self.token = like.new_empty(0)

    def append(self, h: Tensor, c: Tensor) -> int:
        """Write a block of rows after the last one; returns its first row."""
        start = self.used
        if torch.is_grad_enabled() and (h.requires_grad or c.requires_grad or self.token.requires_grad):
            self.token = _Write.apply(self.token, self, start, h, c)
        else:  # inference: the same copy without autograd's per-call cost (a third of the time at D=50)
            self.store(start, h, c)
        self.used += h.shape[0]
        return start

    def store(self, start: int, h: Tensor, c: Tensor) -> None:
        self.h[start:start + h.shape[0]].copy_(h.detach())
        self.c[start:start + c.shape[0]].copy_(c.detach())

    def read_h(self, rows: Tensor) -> Tensor:
        if self.token.requires_grad:
            return _Read.apply(self.token, self, rows, False)
        return self.h.index_select(0, rows)

    def read(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        if self.token.requires_grad:
            return _Read.apply(self.token, self, rows, True)
        return self.h.index_select(0, rows), self.c.index_select(0, rows)

    def release(self) -> None:
        """Free the values once the forward pass is done; backward needs only the gradient buffers.

        Dropping the token matters most: it is the output of the last _Write, whose
        autograd node holds this memory, so keeping it would close a reference cycle
        through C++ autograd nodes that Python's collector cannot break, and every
        training step's graph would leak.
        """
        self.h = self.c = None
        self.token = None

    def accumulate(self, rows: Tensor, grad_h: Tensor, grad_c: Tensor | None) -> None:
        if self.grad_h is None:
            self.grad_h = grad_h.new_zeros(self.shape)
        self.grad_h.index_add_(0, rows, grad_h)
        if grad_c is not None:
            if self.grad_c is None:
                self.grad_c = grad_c.new_zeros(self.shape)
            self.grad_c.index_add_(0, rows, grad_c)

    def take(self, start: int, count: int) -> tuple[Tensor | None, Tensor | None]:
        """The gradient of rows start..start+count, cleared for the next backward pass."""
        return _take_block(self.grad_h, start, count), _take_block(self.grad_c, start, count)

    def forget_gradients(self) -> None:
        self.grad_h = self.grad_c = None


def _take_block(grad: Tensor | None, start: int, count: int) -> Tensor | None:
    if grad is None:
        return None
    block = grad[start:start + count]
    taken = block.clone()
    block.zero_()
    return taken


class _Write(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token: Tensor, memory: _Memory, start: int, h: Tensor, c: Tensor) -> Tensor:
        memory.store(start, h, c)
        ctx.memory, ctx.start, ctx.count, ctx.dtypes = memory, start, h.shape[0], (h.dtype, c.dtype)
        ctx.first = not token.requires_grad
        return token.new_empty(0)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_token: Tensor):
        grad_h, grad_c = ctx.memory.take(ctx.start, ctx.count)
        if ctx.first:  # the last memory node of this backward pass: start the next one clean
            ctx.memory.forget_gradients()
        grad_h = None if grad_h is None else grad_h.to(ctx.dtypes[0])
        grad_c = None if grad_c is None else grad_c.to(ctx.dtypes[1])
        return grad_token, None, None, grad_h, grad_c


class _Read(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token: Tensor, memory: _Memory, rows: Tensor, with_c: bool):
        ctx.memory, ctx.rows, ctx.with_c = memory, rows, with_c
        h = memory.h.index_select(0, rows)
        return (h, memory.c.index_select(0, rows)) if with_c else h

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_h: Tensor, grad_c: Tensor | None = None):
        ctx.memory.accumulate(ctx.rows, grad_h, grad_c if ctx.with_c else None)
        return grad_h.new_zeros(0), None, None, None


class ThinStack:
    """Stacks and buffers of N sentences as tensors: one memory plus per-row cursors.

    Memory rows: row 0 is zeros (what an empty buffer or stack slot reads), then
    every real word in row order (sentence r's word j at word_start[r] + j), then
    composed nodes appended block by block. `pointers` (N, L + 3) holds each
    stack as addresses: two columns at the zero row, the stack items, and one
    scratch column that no-op rows write to.
    """

    def __init__(self, words: Tensor, lengths: Tensor, width: int, nodes: int):
        n = lengths.shape[0]
        d = words.shape[1] // 2
        self.memory = _Memory(ZERO_ROWS + words.shape[0] + nodes, ZERO_ROWS, d, like=words)
        self.memory.append(*words.split(d, 1))  # (W, D) h and c, rows ZERO_ROWS..
        self.lengths = lengths  # (N,)
        self.word_start = ZERO_ROWS + torch.cumsum(lengths, 0) - lengths  # (N,)
        self.pointers = lengths.new_full((n, width + EMPTY_COLUMNS + 1), ZERO_ROW)  # (N, L + 3)
        self.scratch = width + EMPTY_COLUMNS
        self.buffer = torch.zeros_like(lengths)  # (N,) next word to shift
        self.depth = torch.zeros_like(lengths)  # (N,) items on the stack
        self._locate()

    def _locate(self) -> None:
        """Addresses of the buffer top and the two stack tops after the last step."""
        self.buffer_top = torch.where(self.buffer < self.lengths, self.word_start + self.buffer, ZERO_ROW)  # (N,)
        columns = torch.stack([self.depth, self.depth + 1], 1)  # (N, 2)
        self.children = self.pointers.gather(1, columns)  # (N, 2) = [second, top] = [left, right] of a REDUCE
        self.tracked = torch.stack([self.buffer_top, self.children[:, 1], self.children[:, 0]], 1)  # (N, 3)

    def legal(self, rows: int) -> Tensor:
        """(rows, 2) which actions the first `rows` stacks allow, columns in Transition order."""
        allowed = {Transition.SHIFT: self.buffer[:rows] < self.lengths[:rows],
                   Transition.REDUCE: self.depth[:rows] >= 2}
        return torch.stack([allowed[action] for action in Transition], 1)  # (A, 2)

    def apply(self, transition: Tensor, nodes: Tensor | None) -> None:
        """Move the cursors: SHIFT pushes the buffer top, REDUCE replaces two items by `nodes` (N,)."""
        shift = transition == SHIFT  # (N,)
        reduce = transition == REDUCE  # (N,)
        pushed = self.buffer_top if nodes is None else torch.where(shift, self.buffer_top, nodes)  # (N,)
        column = torch.where(shift, self.depth + EMPTY_COLUMNS,
                             torch.where(reduce, self.depth, self.scratch))  # (N,)
        self.pointers.scatter_(1, column[:, None], pushed[:, None])
        self.depth = self.depth + shift.long() - reduce.long()
        self.buffer = self.buffer + shift.long()
        self._locate()


# ----------------------------------------------------------------------------- encoder


class Encoder(nn.Module):
    """Runs the transitions of N sentences, one Python iteration per step, all rows at once."""

    def __init__(self, config: SPINNConfig):
        super().__init__()
        self.config = config
        d_tracking = config.d_tracker if config.has_tracker else 0
        self.reduce = Reduce(config.d_hidden, d_tracking)
        self.tracker = Tracker(config.d_hidden, config.d_tracker, config.predicts_transitions) \
            if config.has_tracker else None

    def forward(self, words: Tensor, lengths: Tensor, transitions: Tensor | None,
                uniforms: Tensor | None = None) -> Encoding:
        """Encode sentences sorted by length, longest first, so the rows started at a step are a prefix.

        words (W, 2D) the real words in row order, lengths (N,), transitions
        (T, N) gold and left-padded, or None to run on the tracker's own
        predictions (a sentence of n words then gets the last 2n - 1 steps, as
        the gold left-padding would give it): the best legal action, or with
        uniforms (N, T), one draw per row and own step, a sampled one (rl).
        """
        n, longest = lengths.shape[0], int(lengths[0])
        steps = 2 * longest - 1 if transitions is None else transitions.shape[0]
        if steps < 2 * longest - 1:
            raise SpinnError(f"{steps} transition steps cannot encode a sentence of {longest} words")
        first_step = steps - (2 * lengths - 1)  # (N,) ascending
        started_at = torch.searchsorted(first_step, torch.arange(steps, device=lengths.device), right=True)  # (T,)
        every_row = self.config.compose == "all"
        nodes = steps * n if every_row else int(lengths.sum()) - n
        stack = ThinStack(words, lengths, width=longest, nodes=nodes)
        state: tuple[Tensor, Tensor] | None = None
        logits: list[Tensor] = []
        taken: list[Tensor] = []
        for step, started in enumerate(started_at.tolist()):  # rows 0..started-1 have begun by this step
            if self.tracker is not None:
                waiting = (first_step > step)[:, None] if every_row else None  # (N, 1)
                state = self._track(stack, state, started, waiting)  # (A, Dt) each; (N, Dt) if every_row
            if self.config.predicts_transitions:
                logits.append(self._predict(stack, state[0], started))  # (A, 2)
            if transitions is not None:
                transition = transitions[step]  # (N,)
            elif uniforms is not None:
                transition = _sample(logits[-1], uniforms, first_step, step, n)  # (N,)
            else:
                transition = _choose(logits[-1], n)  # (N,)
            addresses = self._reduce(stack, transition, state)  # (N,) or None
            stack.apply(transition, addresses)
            taken.append(transition)
        roots = stack.memory.read_h(stack.children[:, 1])  # (N, D)
        stack.memory.release()
        transition_logits = _scatter_logits(logits, steps, n) if logits else None  # (N, T, 2)
        return Encoding(roots, transition_logits, torch.stack(taken, 1))

    def _track(self, stack: ThinStack, state: tuple[Tensor, Tensor] | None, started: int,
               waiting: Tensor | None) -> tuple[Tensor, Tensor]:
        """One tracker step for the started rows; with `waiting` (compose="all") for every row,
        keeping the state of rows that have not started (zero) unchanged."""
        rows = started if waiting is None else waiting.shape[0]
        reads = stack.memory.read_h(stack.tracked[:rows].reshape(-1)).view(rows, -1)  # (A, 3D)
        h, c = self._grow(state, rows, reads)  # (A, Dt) each
        new_h, new_c = self.tracker(reads, h, c)  # (A, Dt) each
        if waiting is None:
            return new_h, new_c
        return torch.where(waiting, h, new_h), torch.where(waiting, c, new_c)  # (N, Dt) each

    def _grow(self, state: tuple[Tensor, Tensor] | None, rows: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """The tracker state padded with zero rows for the sentences that start at this step."""
        if state is None:
            zeros = like.new_zeros(rows, self.config.d_tracker, dtype=self.tracker.gates.weight.dtype)
            return zeros, zeros
        h, c = state
        if h.shape[0] < rows:
            h, c = F.pad(h, (0, 0, 0, rows - h.shape[0])), F.pad(c, (0, 0, 0, rows - c.shape[0]))
        return h, c

    def _predict(self, stack: ThinStack, h: Tensor, started: int) -> Tensor:
        """(A, 2) transition logits of the started rows, illegal actions at -inf."""
        scores = self.tracker.transition(h[:started]).to(h.dtype)  # (A, 2)
        return scores.masked_fill(~stack.legal(started), float("-inf"))  # (A, 2)

    def _reduce(self, stack: ThinStack, transition: Tensor, state: tuple[Tensor, Tensor] | None) -> Tensor | None:
        """Compose the REDUCE rows (every row with compose="all") and append them to memory.

        Returns each row's new node address (N,), meaningful on REDUCE rows, or
        None when no row reduces at this step (nothing is computed then).
        """
        tracking = None if state is None else state[0]  # (A, Dt)
        if self.config.compose == "all":
            pairs = stack.children.reshape(-1)  # (2N,)
        else:
            reducing = transition == REDUCE  # (N,)
            rows = reducing.nonzero().squeeze(1)  # (R,)
            if rows.numel() == 0:
                return None
            pairs = stack.children.index_select(0, rows).reshape(-1)  # (2R,)
            tracking = None if tracking is None else tracking.index_select(0, rows)  # (R, Dt)
        h_pairs, c_pairs = stack.memory.read(pairs)  # (2R, D) each: left, right, left, right, ...
        count = h_pairs.shape[0] // 2
        h, c = self.reduce(h_pairs.view(count, -1), c_pairs.view(count, -1), tracking)  # (R, D) each
        start = stack.memory.append(h, c)
        if self.config.compose == "all":
            return start + torch.arange(count, device=h.device)  # (N,)
        return start - 1 + reducing.cumsum(0)  # (N,) the k-th reducing row was written at start + k


def _choose(logits: Tensor, n: int) -> Tensor:
    """Greedy legal action for the started rows, PAD_TRANSITION for the others -> (N,)."""
    return F.pad(logits.argmax(1), (0, n - logits.shape[0]), value=PAD_TRANSITION)


def _sample(logits: Tensor, uniforms: Tensor, first_step: Tensor, step: int, n: int) -> Tensor:
    """Sampled legal action for the started rows, each with the draw of its own step -> (N,)."""
    started = logits.shape[0]
    own_step = step - first_step[:started]  # (A,)
    draws = uniforms[:started].gather(1, own_step[:, None]).squeeze(1)  # (A,)
    return F.pad(sample_actions(logits, draws), (0, n - started), value=PAD_TRANSITION)


def _scatter_logits(logits: list[Tensor], steps: int, n: int) -> Tensor:
    """Per-step (A_t, 2) logits -> (N, T, 2), zeros where a row had not started."""
    flat = torch.cat(logits)  # (sum A_t, 2)
    positions = torch.cat([torch.arange(part.shape[0], device=flat.device) + step * n
                           for step, part in enumerate(logits)])
    full = flat.new_zeros(steps * n, N_ACTIONS).index_copy(0, positions, flat)  # (T*N, 2)
    return full.view(steps, n, N_ACTIONS).transpose(0, 1)  # (N, T, 2)


# ----------------------------------------------------------------------------- model


class SPINN(nn.Module):
    """Word embedding -> encoder (premises and hypotheses as one batch) -> classifier."""

    def __init__(self, config: SPINNConfig, vectors: Tensor):
        super().__init__()
        self.config = config
        self.embedding = WordEmbedding(config, vectors)
        self.encoder = Encoder(config) if config.uses_trees else None
        self.classifier = Classifier(config)
        self.baseline = _make_baseline(config)

    def forward(self, batch: Batch, *, predict_transitions: bool = False,
                uniforms: Tensor | None = None) -> SPINNOutput:
        """Logits for the batch.

        predict_transitions: spinn and rl ignore the gold transitions and take
        their best legal action. An rl model in training mode samples its trees
        instead, from `uniforms` (N, T) when given (tests), else fresh draws.
        """
        if predict_transitions and not self.config.predicts_transitions:
            raise SpinnError(f"variant {self.config.variant} cannot predict transitions; use 'spinn' or 'rl'")
        sample = self.config.samples_transitions and self.training
        if sample and uniforms is None:
            uniforms = draw_uniforms(batch.tokens.shape[0], batch.transitions.shape[1], batch.tokens.device)
        gold = None if predict_transitions or sample else batch.transitions
        if gold is not None and self.config.uses_trees and not bool((gold != PAD_TRANSITION).any(1).all()):
            raise SpinnError("some sentences have no tree (tokens-only data): only a model that builds its own "
                             "trees can read them (rl, or spinn on predicted transitions)")
        encoding = self.encode(batch.tokens, batch.lengths, gold, uniforms if sample else None)
        premise, hypothesis = encoding.vectors.split(batch.pairs)  # (B, D) each
        logits = self.classifier(premise, hypothesis)  # (B, n_classes)
        baseline = self.baseline(self._pair_features(batch)) if sample else None  # (B,)
        return SPINNOutput(logits, premise, hypothesis, encoding.transition_logits, encoding.transitions, baseline)

    def observe_rewards(self, rewards: Tensor) -> None:
        """rl: let a moving-average baseline see this batch's rewards (after the loss used the old value)."""
        if self.baseline is not None:
            self.baseline.observe(rewards)

    def _pair_features(self, batch: Batch) -> Tensor:
        """[p; h; p * h] of mean frozen word vectors per sentence: what a value baseline may see -> (B, 3E)."""
        real = torch.arange(batch.tokens.shape[1], device=batch.tokens.device) < batch.lengths[:, None]  # (N, L)
        vectors = self.embedding.vectors(batch.tokens) * real[..., None]  # (N, L, E)
        means = vectors.sum(1) / batch.lengths[:, None].to(vectors.dtype)  # (N, E)
        premise, hypothesis = means.split(batch.pairs)  # (B, E) each
        return torch.cat([premise, hypothesis, premise * hypothesis], 1)  # (B, 3E)

    def encode(self, tokens: Tensor, lengths: Tensor, transitions: Tensor | None,
               uniforms: Tensor | None = None) -> Encoding:
        """Sentence vectors of N sentences: tokens (N, L), lengths (N,), transitions (N, T) or None,
        uniforms (N, T) to sample the trees (rl) when transitions is None."""
        if self.encoder is None:
            return self._bag_of_words(tokens, lengths, transitions)
        order = torch.argsort(lengths, descending=True, stable=True)  # (N,)
        tokens, lengths = tokens.index_select(0, order), lengths.index_select(0, order)
        real = torch.arange(tokens.shape[1], device=tokens.device) < lengths[:, None]  # (N, L)
        words = self.embedding(tokens[real]).to(self.state_dtype)  # (W, 2D)
        gold = None if transitions is None else transitions.index_select(0, order).t()  # (T, N)
        draws = None if uniforms is None else uniforms.index_select(0, order)  # (N, T)
        encoding = self.encoder(words, lengths, gold, draws)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.shape[0], device=order.device)  # (N,)
        logits = encoding.transition_logits
        return Encoding(encoding.vectors.index_select(0, inverse),
                        None if logits is None else logits.index_select(0, inverse),
                        encoding.transitions.index_select(0, inverse))

    def _bag_of_words(self, tokens: Tensor, lengths: Tensor, transitions: Tensor | None) -> Encoding:
        """cbow: the mean of each sentence's projected word vectors (their h half)."""
        real = torch.arange(tokens.shape[1], device=tokens.device) < lengths[:, None]  # (N, L)
        words = self.embedding(tokens[real])[:, : self.config.d_hidden]  # (W, D)
        sentence = torch.repeat_interleave(torch.arange(lengths.shape[0], device=tokens.device), lengths)  # (W,)
        sums = words.new_zeros(lengths.shape[0], self.config.d_hidden).index_add(0, sentence, words)  # (N, D)
        vectors = sums / lengths[:, None].to(sums.dtype)  # (N, D)
        taken = transitions if transitions is not None else tokens.new_full((tokens.shape[0], 0), PAD_TRANSITION)
        return Encoding(vectors, None, taken)

    @property
    def state_dtype(self) -> torch.dtype:
        """The dtype of h and c: the parameters' (fp32 even when autocast runs the matmuls in bf16)."""
        return self.embedding.project.weight.dtype

    def compile_cells(self, **options: Any) -> None:
        """torch.compile the elementwise TreeLSTM/LSTM cells (fuses their ~10 kernels each)."""
        if self.encoder is None:
            return
        self.encoder.reduce.cell = torch.compile(tree_lstm, dynamic=True, **options)
        if self.encoder.tracker is not None:
            self.encoder.tracker.cell = torch.compile(lstm, dynamic=True, **options)


def _make_baseline(config: SPINNConfig) -> nn.Module | None:
    if not config.samples_transitions:
        return None
    if config.baseline == "value":
        return ValueBaseline(3 * config.d_embed, config.d_tracker)
    return MovingAverageBaseline(config.baseline_decay, chance_reward(config.reward, config.n_classes))


def spinn_loss(output: SPINNOutput, batch: Batch, config: SPINNConfig) -> Loss:
    """Cross-entropy on labels, plus alpha x cross-entropy of the tracker's transitions (spinn);
    for a sampled rl batch, plus the REINFORCE surrogate, the entropy bonus and the value loss."""
    if batch.labels is None:
        raise SpinnError("the batch has no labels to compute a loss against")
    classification = F.cross_entropy(output.logits, batch.labels)
    if output.baseline is not None:
        return _rl_loss(output, batch, config, classification)
    if output.transition_logits is None:
        return Loss(classification, classification, None)
    transition = F.cross_entropy(output.transition_logits.reshape(-1, N_ACTIONS), batch.transitions.reshape(-1),
                                 ignore_index=PAD_TRANSITION)
    return Loss(classification + config.transition_loss_weight * transition, classification, transition)


def _rl_loss(output: SPINNOutput, batch: Batch, config: SPINNConfig, classification: Tensor) -> Loss:
    terms = reinforce(output.transition_logits, output.transitions, output.logits, batch.labels, output.baseline,
                      config.reward, config.baseline == "value")
    total = classification + config.policy_weight * terms.loss - config.entropy_weight * terms.entropy
    if terms.value_loss is not None:
        total = total + terms.value_loss
    supervised = None
    if config.transition_loss_weight > 0:
        # The gold action at each step, on the sampled path's states (the paths part once a sample differs).
        supervised = F.cross_entropy(output.transition_logits.reshape(-1, N_ACTIONS), batch.transitions.reshape(-1),
                                     ignore_index=PAD_TRANSITION)
        total = total + config.transition_loss_weight * supervised
    return Loss(total, classification, supervised, terms)


def transition_counts(output: SPINNOutput, batch: Batch) -> tuple[int, int]:
    """(real steps, steps where the tracker's best legal action is the gold one).

    On a predicted-transitions run the best legal action is the one that ran,
    so the same count scores both modes. Counts, not a ratio, so callers can
    sum them over batches.
    """
    if output.transition_logits is None:
        raise SpinnError("this output has no transition predictions")
    real = batch.transitions != PAD_TRANSITION  # (N, T)
    correct = (output.transition_logits.argmax(-1) == batch.transitions) & real  # (N, T)
    return int(real.sum()), int(correct.sum())


def transition_accuracy(output: SPINNOutput, batch: Batch) -> float:
    """Share of real (non-padding) steps where the tracker's best legal action is the gold one."""
    steps, correct = transition_counts(output, batch)
    return correct / steps


def random_vectors(vocab_size: int, d_embed: int, seed: int = 0) -> Tensor:
    """Random word vectors (benchmarks, tests): N(0, 1/E) like a normalized pretrained table."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(vocab_size, d_embed, generator=generator) / d_embed ** 0.5
