"""RL-SPINN: the tracker's transition head as a parsing policy, trained with REINFORCE (Yogatama et al. 2016).

The `rl` variant samples SHIFT/REDUCE from the tracker's softmax while it
trains and takes the most likely legal action when it evaluates, so it can
learn trees from the NLI reward alone, without any parse data. Sampling stays
fully batched: every sentence owns a row of uniform draws, one per own step,
and at each step the started rows compare their draw with their REDUCE
probability. Illegal actions have probability exactly 0 (their logits are
-inf), so a sampled sequence is always a valid binary tree. Because a
sentence's draws are indexed by its own steps, encoding it alone with its row
of draws samples the same tree as encoding it inside any batch.

The policy gradient is the score-function estimate
    grad J = E[(R - b) grad log pi(tree)],
with reward R the log-likelihood of the gold label (or 1/0 for a correct
label), and a baseline b that does not depend on the sampled tree, so the
estimate stays unbiased: a moving average of past rewards, or a value network
on bag-of-words features of the pair.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spinn.ground.errors import SpinnError
from spinn.trees.transitions import PAD_TRANSITION, REDUCE, SHIFT

Reward = Literal["log_likelihood", "correct"]
Baseline = Literal["moving_average", "value"]
REWARDS: tuple[str, ...] = get_args(Reward)
LOG_FLOOR = -100.0
"""Where entropy clamps log-probabilities: masked actions have p = 0 and log p = -inf, whose gradient would be nan."""


class PolicyTerms(NamedTuple):
    """The REINFORCE pieces of one batch (all scalars except `rewards`)."""

    loss: Tensor  # policy-gradient surrogate: -mean((R - b) log pi)
    entropy: Tensor  # mean entropy of the policy over real steps
    value_loss: Tensor | None  # MSE of the learned baseline
    rewards: Tensor  # (B,) detached
    baseline: Tensor  # mean baseline used
    reduce_fraction: Tensor  # share of REDUCE among the steps where both actions were legal


def sample_actions(logits: Tensor, uniforms: Tensor) -> Tensor:
    """Sample from (A, 2) masked logits with one uniform draw per row -> (A,) SHIFT/REDUCE.

    REDUCE when u < p(REDUCE): with p(REDUCE) = 0 (illegal) it never happens,
    with p(REDUCE) = 1 (SHIFT illegal) always, since u is in [0, 1).
    """
    p_reduce = torch.softmax(logits.float(), dim=1)[:, REDUCE]  # (A,)
    return torch.where(uniforms < p_reduce, REDUCE, SHIFT)  # (A,)


def draw_uniforms(sentences: int, steps: int, device: torch.device, generator: torch.Generator | None = None) -> Tensor:
    """(N, T) draws in [0, 1): row = sentence in input order, column = the sentence's own step."""
    return torch.rand(sentences, steps, device=device, generator=generator)


def sequence_log_probs(transition_logits: Tensor, taken: Tensor) -> Tensor:
    """log pi of each sentence's whole action sequence: logits (N, T, 2), taken (N, T) -> (N,)."""
    real = taken != PAD_TRANSITION  # (N, T)
    log_p = torch.log_softmax(transition_logits.float(), dim=-1)  # (N, T, 2)
    chosen = log_p.gather(-1, taken.clamp(max=REDUCE).unsqueeze(-1)).squeeze(-1)  # (N, T)
    return torch.where(real, chosen, torch.zeros_like(chosen)).sum(1)  # (N,)


def policy_entropy(transition_logits: Tensor, taken: Tensor) -> Tensor:
    """Mean entropy of the action distribution over the real steps (forced steps count as 0)."""
    real = taken != PAD_TRANSITION  # (N, T)
    log_p = torch.log_softmax(transition_logits.float(), dim=-1).clamp(min=LOG_FLOOR)  # (N, T, 2)
    entropy = -(log_p.exp() * log_p).sum(-1)  # (N, T)
    return (entropy * real).sum() / real.sum().clamp(min=1)  # masked mean: no data-dependent shape


def free_reduce_share(transition_logits: Tensor, taken: Tensor) -> Tensor:
    """Share of REDUCE where the policy had a choice. Over all steps it is always (n-1)/(2n-1), since a
    whole tree takes n SHIFTs and n-1 REDUCEs; over free steps, high means left-leaning trees."""
    free = (taken != PAD_TRANSITION) & torch.isfinite(transition_logits).all(-1)  # (N, T)
    return ((taken == REDUCE) & free).sum() / free.sum().clamp(min=1)  # 0 when no step was free


def rewards_of(logits: Tensor, labels: Tensor, kind: str) -> Tensor:
    """(B,) detached reward per pair: log p(gold label), or 1 for a correct prediction and 0 otherwise."""
    if kind == "log_likelihood":
        return -F.cross_entropy(logits.detach().float(), labels, reduction="none")
    if kind == "correct":
        return (logits.detach().argmax(1) == labels).float()
    raise SpinnError(f"reward must be one of {REWARDS}, got {kind!r}")


def reinforce(
    transition_logits: Tensor,
    taken: Tensor,
    logits: Tensor,
    labels: Tensor,
    baseline: Tensor,
    reward: str,
    learned_baseline: bool,
) -> PolicyTerms:
    """The policy-gradient surrogate for B pairs whose 2B sentences (premises, then hypotheses) sampled `taken`.

    Both sentences of a pair share the pair's reward; the surrogate's gradient
    is -mean_b (R_b - b_b) grad [log pi(premise_b) + log pi(hypothesis_b)].
    """
    pairs = logits.shape[0]
    rewards = rewards_of(logits, labels, reward)  # (B,)
    per_sentence = sequence_log_probs(transition_logits, taken)  # (2B,)
    per_pair = per_sentence[:pairs] + per_sentence[pairs:]  # (B,)
    advantage = rewards - baseline.detach()  # (B,)
    loss = -(advantage * per_pair).mean()
    value_loss = F.mse_loss(baseline, rewards) if learned_baseline else None
    reduce_fraction = free_reduce_share(transition_logits, taken)
    return PolicyTerms(
        loss, policy_entropy(transition_logits, taken), value_loss, rewards, baseline.detach().mean(), reduce_fraction
    )


def chance_reward(reward: str, n_classes: int) -> float:
    """The expected reward of a uniform classifier: where a moving average starts, so the first
    batches are not pushed by an advantage that is all negative (log-likelihood) or all positive."""
    return math.log(1.0 / n_classes) if reward == "log_likelihood" else 1.0 / n_classes


class MovingAverageBaseline(nn.Module):
    """b = exponential moving average of past mean rewards (a buffer: checkpointed, resumed exactly)."""

    def __init__(self, decay: float, initial: float):
        super().__init__()
        self.decay = decay
        self.register_buffer("average", torch.tensor(initial))

    def forward(self, features: Tensor) -> Tensor:
        return self.average.expand(features.shape[0])  # (B,)

    @torch.no_grad()
    def observe(self, rewards: Tensor) -> None:
        self.average.mul_(self.decay).add_((1 - self.decay) * rewards.float().mean())


class ValueBaseline(nn.Module):
    """b(x) = a small MLP on bag-of-words features of the pair: it sees the words, never the sampled tree."""

    def __init__(self, d_features: int, d_hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d_features, d_hidden), nn.Tanh(), nn.Linear(d_hidden, 1))

    def forward(self, features: Tensor) -> Tensor:
        return self.mlp(features.detach()).squeeze(1)  # (B,)

    def observe(self, rewards: Tensor) -> None:
        """Learned by its own loss term, not from observation."""
