"""The fused thin stack equals the readable spec encoder (spinn/model/spec.py) in float64.

For every tree variant and every transition source it can run, in training mode,
on real SNLI dev pairs and on a seeded synthetic batch (random lengths and trees,
so the check never needs ../shared): the same logits, transition logits and
transitions, the same gradient of every parameter, and the same batch-norm
statistics after the step. The spec is autograd over the cells' steps; the fused
path has a hand-written backward over the cells' local derivatives, so this is
what ties that backward to the algorithm (tests/test_cells.py edits a cell and
checks that every loop follows).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spinn.ground.errors import SpinnError
from spinn.model.batch import Batch
from spinn.model.checkpoint import load_checkpoint
from spinn.model.config import EncoderLoop, TransitionSource
from spinn.model.loading import load_model
from spinn.model.spinn import SPINN, SPINNOutput, spinn_loss
from tests.helpers import CASES, TOLERANCE, dev_batch, synthetic_batch, tiny_model, uniforms_for

RELEASE = Path(__file__).parent / "fixtures" / "release-0.1.0"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["dev", "synthetic"])
def batch(request) -> tuple[Batch, int]:
    """Real dev pairs of mixed lengths (skipped without ../shared), and a seeded synthetic batch."""
    if request.param == "dev":
        return dev_batch(request.getfixturevalue("snli_dev"))
    return synthetic_batch()


def twins(variant: str, vocab_size: int) -> tuple[SPINN, SPINN]:
    """A fused model and a spec model (encoder: spec) with the same float64 weights, in training mode."""
    fused = tiny_model(variant, vocab_size)
    spec = tiny_model(variant, vocab_size, encoder="spec")
    spec.load_state_dict(fused.state_dict())
    return fused.train(), spec.train()


def run(model: SPINN, batch: Batch, source: TransitionSource, loop: EncoderLoop | None = None) -> SPINNOutput:
    """One forward and backward (on the model's own loop unless one is named); the loss of the training step
    (rl: with REINFORCE)."""
    output = model(batch, source=source, uniforms=uniforms_for(batch, source), loop=loop)
    spinn_loss(output, batch, model.config).total.backward()
    return output


FUSED_CASES = [(*case, EncoderLoop.FUSED) for case in CASES] + [
    (*case, EncoderLoop.FUSED_COMPACT) for case in CASES if case[1] is TransitionSource.GOLD
]
"""Every case on the fixed-shape fused loop, and the gold ones on the compact loop too (CPU training's)."""


@pytest.mark.parametrize(
    ("variant", "source", "loop"), FUSED_CASES, ids=[f"{v}-{s.value}-{loop.value}" for v, s, loop in FUSED_CASES]
)
def test_fused_encoder_equals_the_spec(batch, variant, source, loop):
    batch, vocab_size = batch
    fused, spec = twins(variant, vocab_size)
    expected, found = run(spec, batch, source), run(fused, batch, source, loop)
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


def test_the_spec_runs_under_inference(batch):
    """No autograd (evaluation, labelling): the spec gives the fused loop's and the CPU inference loop's
    predictions too."""
    batch, vocab_size = batch
    model = tiny_model("spinn", vocab_size).eval()
    with torch.no_grad():
        expected, *found = (
            model(batch, source=TransitionSource.GREEDY, loop=loop)
            for loop in (EncoderLoop.SPEC, EncoderLoop.FUSED, EncoderLoop.CPU_INFERENCE)
        )
    for output in found:
        assert torch.equal(output.transitions, expected.transitions)
        torch.testing.assert_close(output.logits, expected.logits, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize(("variant", "source"), [("pi", TransitionSource.GREEDY), ("spinn", TransitionSource.SAMPLED)])
def test_a_source_the_variant_cannot_run_is_refused(variant, source):
    batch, vocab_size = synthetic_batch()
    model, _ = twins(variant, vocab_size)
    with pytest.raises(SpinnError, match=f"cannot run on {source.value} transitions"):
        model(batch, source=source)


def test_the_compact_loop_refuses_transitions_it_has_no_plan_for():
    """It composes the REDUCEs of a plan made on the host: the model's own choices have none."""
    batch, vocab_size = synthetic_batch()
    model, _ = twins("spinn", vocab_size)
    with pytest.raises(SpinnError, match="fused_compact loop runs gold transitions on a CPU, not chosen"):
        model(batch, source=TransitionSource.GREEDY, loop=EncoderLoop.FUSED_COMPACT)


def test_draws_without_sampling_are_refused():
    """The fused chooser samples whenever it has draws: a greedy run must not be handed any."""
    batch, vocab_size = synthetic_batch()
    model, _ = twins("rl", vocab_size)
    with pytest.raises(SpinnError, match="uniform draws are for sampled transitions"):
        model(batch, source=TransitionSource.GREEDY, uniforms=torch.rand(batch.transitions.shape))


def test_a_checkpoint_from_before_the_choice_loads_as_fused():
    assert "encoder" not in load_checkpoint(RELEASE / "checkpoint.pt").model_config
    assert load_model(RELEASE / "checkpoint.pt", torch.device("cpu")).model.config.encoder == "fused"
