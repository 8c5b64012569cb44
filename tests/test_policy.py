"""RL-SPINN's policy: sampled trees are always legal, batching does not change them, and the gradient is REINFORCE's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spinn.data.example import Example
from spinn.model.batch import make_batch, own_steps
from spinn.model.config import SPINNConfig, TransitionSource
from spinn.model.policy import free_reduce_share, reinforce, sample_actions
from spinn.model.spinn import SPINN, random_vectors, spinn_loss
from spinn.trees.transitions import (
    PAD_TRANSITION,
    REDUCE,
    SHIFT,
    check_transitions,
    left_branching,
    right_branching,
)
from tests.helpers import TINY

VOCAB = 30
NO_NORM = {"use_batch_norm": False, "embed_dropout": 0.0, "mlp_dropout": 0.0}
"""Batch norm in training mode makes each row's policy depend on its batch; without it the sampler alone decides."""

SAMPLED = TransitionSource.SAMPLED


def rl_model(seed: int, **settings) -> SPINN:
    torch.manual_seed(seed)
    config = rl_config(transition_loss_weight=0.0, **settings)
    return SPINN(config, random_vectors(VOCAB, config.d_embed, seed)).double().train()


def rl_config(**settings) -> SPINNConfig:
    """The tiny model as rl, batch norm off."""
    return SPINNConfig(**{**TINY, "variant": "rl", "use_batch_norm": False, **settings})


def example(rng: np.random.Generator, premise: int, hypothesis: int) -> Example:
    """A pair of the given lengths; its transitions are a placeholder the sampling model never reads."""

    def words(n: int) -> tuple[int, ...]:
        return tuple(int(w) for w in rng.integers(2, VOCAB, n))

    return Example(
        words(premise),
        tuple(right_branching(premise)),
        words(hypothesis),
        tuple(right_branching(hypothesis)),
        int(rng.integers(0, 3)),
    )


def sentence_actions(taken: torch.Tensor, lengths: list[int]) -> list[list[int]]:
    """Each sentence's own 2n - 1 actions from the (N, T) actions that ran (own steps first, then padding)."""
    return [own_steps(taken, row, n) for row, n in enumerate(lengths)]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    lengths=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=5),
    scale=st.floats(0.1, 50.0),
)
def test_sampled_and_greedy_trees_are_always_legal(seed, lengths, scale):
    """Random policies, sharpened or flattened by `scale`, never take an illegal action."""
    model = rl_model(seed)
    with torch.no_grad():
        model.encoder.tracker.transition.weight.mul_(scale)
        model.encoder.tracker.transition.bias.uniform_(-scale, scale)
    rng = np.random.default_rng(seed)
    batch = make_batch([example(rng, p, h) for p, h in lengths])
    sentence_lengths = batch.lengths.tolist()
    for training, source in ((True, TransitionSource.SAMPLED), (False, TransitionSource.GREEDY)):
        model.train(training)
        with torch.no_grad():
            output = model(batch, source=source)
        for actions, n in zip(sentence_actions(output.transitions, sentence_lengths), sentence_lengths, strict=True):
            check_transitions(actions, n)


def test_the_batched_sampler_equals_one_sentence_pair_at_a_time():
    rng = np.random.default_rng(3)
    examples = [example(rng, int(rng.integers(1, 15)), int(rng.integers(1, 15))) for _ in range(9)]
    model = rl_model(5, **NO_NORM)
    batch = make_batch(examples)
    draws = torch.rand(
        batch.tokens.shape[0],
        batch.transitions.shape[1],
        generator=torch.Generator().manual_seed(1),
        dtype=torch.float64,
    )
    with torch.no_grad():
        together = sentence_actions(model(batch, source=SAMPLED, uniforms=draws).transitions, batch.lengths.tolist())
        pairs = len(examples)
        for index, pair in enumerate(examples):
            alone = make_batch([pair])
            own = draws[[index, pairs + index], : alone.transitions.shape[1]]  # each row's draws by its own steps
            actions = sentence_actions(model(alone, source=SAMPLED, uniforms=own).transitions, alone.lengths.tolist())
            assert actions == [together[index], together[pairs + index]]
    assert len({tuple(a) for a in together}) > 1  # the sample is not one fixed tree


def test_illegal_actions_have_probability_zero_at_any_draw():
    logits = torch.tensor([[0.3, float("-inf")], [float("-inf"), -2.0], [5.0, -5.0]])
    for draw in (0.0, 0.5, 1.0 - 1e-7):
        actions = sample_actions(logits, torch.full((3,), draw)).tolist()
        assert actions[0] == SHIFT and actions[1] == REDUCE


def test_policy_gradient_matches_a_hand_computed_reinforce_estimate():
    """For the transition head's bias, d(-mean_b A_b log pi_b)/d bias = -(1/B) sum A_b sum_t (e_{a_t} - p_t)."""
    rng = np.random.default_rng(11)
    examples = [example(rng, p, h) for p, h in ((3, 4), (5, 2), (4, 4))]
    model = rl_model(2, **NO_NORM)
    batch = make_batch(examples)
    output = model(batch, source=SAMPLED)
    baseline = torch.tensor([-1.0, -1.2, -0.9], dtype=torch.float64)
    terms = reinforce(
        output.transition_logits,
        output.transitions,
        output.logits,
        batch.labels,
        baseline,
        "log_likelihood",
        learned_baseline=False,
    )
    bias = model.encoder.tracker.transition.bias
    (gradient,) = torch.autograd.grad(terms.loss, [bias])

    logits = output.transition_logits.detach().numpy()  # (2B, T, 2)
    taken = output.transitions.numpy()  # (2B, T)
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    rewards = -torch.nn.functional.cross_entropy(output.logits.detach(), batch.labels, reduction="none").numpy()
    advantage = rewards - baseline.numpy()
    pairs = len(examples)
    expected = np.zeros(2)
    for row in range(2 * pairs):
        for step in np.nonzero(taken[row] != PAD_TRANSITION)[0]:
            expected -= advantage[row % pairs] / pairs * (np.eye(2)[taken[row, step]] - probabilities[row, step])
    assert np.allclose(gradient.numpy(), expected, atol=1e-10)
    assert np.abs(expected).sum() > 1e-6  # some steps were real choices


def test_rl_loss_adds_entropy_value_and_supervision_terms():
    rng = np.random.default_rng(4)
    batch = make_batch([example(rng, 4, 3), example(rng, 2, 5)])
    for baseline, supervised in (("moving_average", 0.0), ("value", 0.5)):
        torch.manual_seed(0)
        config = rl_config(baseline=baseline, transition_loss_weight=supervised)
        model = SPINN(config, random_vectors(VOCAB, config.d_embed, 0)).double().train()
        loss = spinn_loss(model(batch, source=SAMPLED), batch, config)
        assert (loss.policy.value_loss is not None) == (baseline == "value")
        assert (loss.transition is not None) == (supervised > 0)
        assert 0.0 <= float(loss.policy.reduce_fraction) <= 1.0 and float(loss.policy.entropy.detach()) >= 0.0
        loss.total.backward()
        assert model.encoder.tracker.transition.weight.grad.abs().sum() > 0


def test_transition_supervision_of_sampled_trees_stays_finite():
    """rl with transition_loss_weight > 0 scores the gold action on the sampled path's states. Once a sample has
    parted from the parse, the gold action may be illegal there (no word left to shift, one item to reduce):
    such a step teaches nothing, and its -inf score must not make the loss infinite (the training loop stops
    on a loss that is not finite, so every such run died at its first log)."""
    rng = np.random.default_rng(5)
    batch = make_batch([example(rng, 9, 7), example(rng, 8, 10), example(rng, 12, 6)])
    torch.manual_seed(0)
    config = rl_config(transition_loss_weight=1.0)
    model = SPINN(config, random_vectors(VOCAB, config.d_embed, 0)).double().train()
    illegal_gold = 0
    for seed in range(4):
        torch.manual_seed(seed)
        output = model(batch, source=SAMPLED)
        gold = batch.transitions.clamp(max=REDUCE)[..., None]  # (N, T, 1)
        illegal_gold += int((output.transition_logits.gather(-1, gold) == float("-inf")).sum())
        loss = spinn_loss(output, batch, model.config)
        assert torch.isfinite(loss.transition) and torch.isfinite(loss.total), seed
        loss.total.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert illegal_gold > 0, "no sample parted from the parse: the case is not exercised"


def test_moving_average_starts_at_chance_and_follows_rewards():
    model = rl_model(0)
    assert float(model.baseline.average) == pytest.approx(np.log(1 / 3))
    model.observe_rewards(torch.tensor([0.0, 0.0]))
    assert float(model.baseline.average) == pytest.approx(0.99 * np.log(1 / 3))
    assert "baseline.average" in model.state_dict()  # checkpointed, so a resumed run continues it


@pytest.mark.parametrize(("shape", "share"), [(left_branching, 1.0), (right_branching, 0.0)])
def test_reduce_share_counts_only_free_choices(shape, share):
    """Left-branching trees reduce at every free step, right-branching ones never do."""
    actions = shape(6)
    logits, stack, buffer = [], 0, 6
    for action in actions:
        logits.append([0.0 if buffer else float("-inf"), 0.0 if stack >= 2 else float("-inf")])
        stack, buffer = (stack + 1, buffer - 1) if action == SHIFT else (stack - 1, buffer)
    share_seen = free_reduce_share(torch.tensor([logits]), torch.tensor([actions]))
    assert float(share_seen) == share
