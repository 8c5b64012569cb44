"""The fused thin stack equals the readable spec encoder (spinn/model/spec.py) in float64.

For every tree variant and every transition source it can run, on real SNLI dev
pairs, in training mode: the same logits, transition logits and transitions,
the same gradient of every parameter, and the same batch-norm statistics after
the step. The spec is autograd over cells.py's forward(); the fused path has a
hand-written backward, so this is what ties that backward to the algorithm.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spinn.data.pairs import corpus_vocabulary, encode_pairs, read_raw_pairs
from spinn.errors import SpinnError
from spinn.model.batch import Batch, make_batch
from spinn.model.checkpoint import load_checkpoint
from spinn.model.config import TREE_VARIANTS, SPINNConfig, TransitionSource
from spinn.model.loading import load_model
from spinn.model.policy import draw_uniforms
from spinn.model.spinn import SPINN, SPINNOutput, random_vectors, spinn_loss

PAIRS = 24
TOLERANCE = 1e-10
RELEASE = Path(__file__).parent / "fixtures" / "release-0.1.0"
TINY = {"d_embed": 8, "d_hidden": 6, "d_tracker": 5, "mlp_layers": 1, "mlp_dim": 10, "use_batch_norm": True}
CASES = [(variant, source) for variant in TREE_VARIANTS for source in SPINNConfig(variant=variant, **TINY).sources]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def dev(snli_dev: Path) -> tuple[Batch, int]:
    """A batch of real dev pairs of mixed lengths, and the size of their vocabulary."""
    pairs = read_raw_pairs(snli_dev)[:PAIRS]
    vocabulary = corpus_vocabulary(pairs)
    return make_batch(encode_pairs(pairs, vocabulary)), len(vocabulary)


def twins(variant: str, vocab_size: int) -> tuple[SPINN, SPINN]:
    """A fused model and a spec model with the same float64 weights, in training mode."""
    torch.manual_seed(0)
    fused = SPINN(SPINNConfig(variant=variant, **TINY), random_vectors(vocab_size, TINY["d_embed"])).double()
    spec = SPINN(fused.config.replace(encoder="spec"), random_vectors(vocab_size, TINY["d_embed"])).double()
    spec.load_state_dict(fused.state_dict())
    return fused.train(), spec.train()


def run(model: SPINN, batch: Batch, source: TransitionSource) -> SPINNOutput:
    """One forward and backward; the loss of the training step (rl sampled: with REINFORCE)."""
    uniforms = None
    if source is TransitionSource.SAMPLED:
        generator = torch.Generator().manual_seed(1)
        uniforms = draw_uniforms(batch.tokens.shape[0], batch.transitions.shape[1], batch.tokens.device, generator)
    output = model(batch, source=source, uniforms=uniforms)
    spinn_loss(output, batch, model.config).total.backward()
    return output


@pytest.mark.parametrize(("variant", "source"), CASES, ids=[f"{v}-{s.value}" for v, s in CASES])
def test_fused_encoder_equals_the_spec(dev, variant, source):
    batch, vocab_size = dev
    fused, spec = twins(variant, vocab_size)
    expected, found = run(spec, batch, source), run(fused, batch, source)
    assert torch.equal(found.transitions, expected.transitions)
    torch.testing.assert_close(found.logits, expected.logits, rtol=TOLERANCE, atol=TOLERANCE)
    if source is not TransitionSource.GOLD:
        assert not torch.equal(found.transitions, batch.transitions), "the model's own trees should differ from gold"
    if expected.transition_logits is None:
        assert found.transition_logits is None
    else:
        torch.testing.assert_close(found.transition_logits, expected.transition_logits, rtol=TOLERANCE, atol=TOLERANCE)
    for (name, mine), theirs in zip(fused.named_parameters(), spec.parameters(), strict=True):
        if theirs.grad is None:
            assert mine.grad is None, name
            continue
        assert theirs.grad.abs().sum() > 0 or name.startswith("baseline"), f"{name} got no gradient"
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=TOLERANCE, atol=TOLERANCE, msg=name)
    for (name, mine), theirs in zip(fused.named_buffers(), spec.buffers(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=TOLERANCE, atol=TOLERANCE, msg=name)


def mean_forget_tree_lstm(gates: torch.Tensor, c_children: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A different composition cell, same gate layout: one forget gate, the mean of f1 and f2, for both children."""
    d = c_children.shape[1] // 2
    a, i, f1, f2, o = gates.split(d, 1)  # (R, D) each
    forget = torch.sigmoid((f1 + f2) / 2)  # (R, D)
    c = torch.tanh(a) * torch.sigmoid(i) + forget * (c_children[:, :d] + c_children[:, d:])  # (R, D)
    return torch.sigmoid(o) * torch.tanh(c), c


def test_a_new_cell_runs_under_the_spec_with_no_other_change(dev):
    """Only cells.py changes (here: Reduce.cell); the spec composes with it and autograd trains it."""
    batch, vocab_size = dev
    fused, spec = twins("pi", vocab_size)
    spec.encoder.reduce.cell = mean_forget_tree_lstm
    output = run(spec, batch, TransitionSource.GOLD)
    assert not torch.allclose(output.logits, fused(batch, source=TransitionSource.GOLD).logits)
    weight = spec.encoder.reduce.compose.weight.grad
    assert torch.isfinite(weight).all() and weight.abs().sum() > 0


def test_the_spec_runs_under_inference(dev):
    """No autograd (evaluation, labelling): the spec gives the fused path's predictions too."""
    batch, vocab_size = dev
    fused, spec = (model.eval() for model in twins("spinn", vocab_size))
    with torch.no_grad():
        expected, found = (model(batch, source=TransitionSource.GREEDY) for model in (spec, fused))
    assert torch.equal(found.transitions, expected.transitions)
    torch.testing.assert_close(found.logits, expected.logits, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize(("variant", "source"), [("pi", TransitionSource.GREEDY), ("spinn", TransitionSource.SAMPLED)])
def test_a_source_the_variant_cannot_run_is_refused(dev, variant, source):
    batch, vocab_size = dev
    model, _ = twins(variant, vocab_size)
    with pytest.raises(SpinnError, match=f"cannot run on {source.value} transitions"):
        model(batch, source=source)


def test_draws_without_sampling_are_refused(dev):
    """The fused chooser samples whenever it has draws: a greedy run must not be handed any."""
    batch, vocab_size = dev
    model, _ = twins("rl", vocab_size)
    with pytest.raises(SpinnError, match="uniform draws are for sampled transitions"):
        model(batch, source=TransitionSource.GREEDY, uniforms=torch.rand(batch.transitions.shape))


def test_a_checkpoint_from_before_the_choice_loads_as_fused():
    assert "encoder" not in load_checkpoint(RELEASE / "checkpoint.pt").model_config
    assert load_model(RELEASE / "checkpoint.pt", torch.device("cpu")).model.config.encoder == "fused"
