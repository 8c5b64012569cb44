"""Without gradients on the CPU the encoder computes only the rows that need it (spinn/model/thin_stack_infer.py):
the tracker for the sentences still inside their own steps, the composition for the sentences that REDUCE.

It must give the numbers of the full loop, which composes every row at every step: the same transitions,
and the same logits and transition logits (of the real steps) in float64, for every tree variant and every
transition source it can run, on real SNLI dev pairs of mixed lengths.
"""

from __future__ import annotations

import pytest
import torch

from spinn.errors import SpinnError
from spinn.model import thin_stack_infer
from spinn.model.batch import Batch
from spinn.model.config import SPINNConfig, TransitionSource
from spinn.model.policy import draw_uniforms
from spinn.model.spinn import SPINN, SPINNOutput, random_vectors
from tests.test_spec import CASES, TINY, TOLERANCE
from tests.test_spec import dev as dev  # the same real dev batch, built the same way

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(model: SPINN, batch: Batch, source: TransitionSource, *, grad: bool) -> SPINNOutput:
    """One forward in eval mode; with gradients enabled the full loop runs, without them the reduce-only one."""
    uniforms = None
    if source is TransitionSource.SAMPLED:
        generator = torch.Generator().manual_seed(1)
        uniforms = draw_uniforms(batch.tokens.shape[0], batch.transitions.shape[1], batch.tokens.device, generator)
    with torch.set_grad_enabled(grad):
        return model(batch, source=source, uniforms=uniforms)


@pytest.mark.parametrize(("variant", "source"), CASES, ids=[f"{v}-{s.value}" for v, s in CASES])
def test_computing_only_the_rows_read_gives_the_numbers_of_computing_every_row(dev, variant, source):
    batch, vocab_size = dev
    torch.manual_seed(0)
    model = SPINN(SPINNConfig(variant=variant, **TINY), random_vectors(vocab_size, TINY["d_embed"])).double().eval()
    words = model.embedding.project.weight
    assert not thin_stack_infer.applies(words)
    with torch.no_grad():
        assert thin_stack_infer.applies(words)
    full, reduce_only = run(model, batch, source, grad=True), run(model, batch, source, grad=False)
    assert torch.equal(reduce_only.transitions, full.transitions)
    torch.testing.assert_close(reduce_only.logits, full.logits, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(reduce_only.premise, full.premise, rtol=TOLERANCE, atol=TOLERANCE)
    if full.transition_logits is None:
        assert reduce_only.transition_logits is None
    else:
        torch.testing.assert_close(
            reduce_only.transition_logits, full.transition_logits, rtol=TOLERANCE, atol=TOLERANCE
        )


def test_int8_labels_stay_close_to_fp32_and_the_trees_stay_the_tracker_s(dev):
    """--int8 quantizes the composition's GEMMs: the logits move a little, never far, and the tracker (fp32)
    builds the same trees as long as the compositions it reads barely move."""
    batch, vocab_size = dev
    torch.manual_seed(0)
    config = SPINNConfig(variant="spinn", d_embed=8, d_hidden=64, d_tracker=16, mlp_layers=1, mlp_dim=64)
    model = SPINN(config, random_vectors(vocab_size, config.d_embed)).eval()
    with torch.no_grad():
        fp32 = model(batch, source=TransitionSource.GREEDY)
        model.quantize_int8()
        int8 = model(batch, source=TransitionSource.GREEDY)
    assert not torch.equal(int8.logits, fp32.logits)
    torch.testing.assert_close(int8.logits, fp32.logits, rtol=0.0, atol=0.05 * float(fp32.logits.abs().max()))
    assert (int8.transitions == fp32.transitions).float().mean() > 0.99


def test_an_int8_model_refuses_training(dev):
    batch, vocab_size = dev
    model = SPINN(SPINNConfig(variant="spinn", **TINY), random_vectors(vocab_size, TINY["d_embed"]))
    model.quantize_int8()
    with pytest.raises(SpinnError, match="int8 model runs only for inference on the CPU"):
        model(batch, source=TransitionSource.GOLD)
