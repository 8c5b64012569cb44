"""The rewritten encoder computes the 0.1.0 encoder's function: same outputs, same gradients, same statistics.

tests/fixtures/encoder-0.1.0 holds what the 0.1.0 encoder (left-padded thin
stack, per-step autograd reads and writes) produced for each variant on 32 real
SNLI dev pairs, in float64: class logits, loss, transition logits, the
transitions that ran, every parameter's gradient and the batch-norm running
statistics. The same model state on the same batch must give the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spinn.data.example import Example
from spinn.model.batch import make_batch
from spinn.model.config import SPINNConfig
from spinn.model.spinn import SPINN, spinn_loss
from spinn.trees.transitions import PAD_TRANSITION

FIXTURES = Path(__file__).parent / "fixtures" / "encoder-0.1.0"
TOLERANCE = 1e-10  # float64: only the order of summation differs
POLICY_TOLERANCE = 1e-6  # rl: the REINFORCE terms are computed in float32 (spinn/model/policy.py)


def load(variant: str) -> dict:
    return torch.load(FIXTURES / f"{variant}.pt", weights_only=True)


def right_aligned(left: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """0.1.0's left-padded (N, T, ...) -> own steps first, zeros (or PAD) after, as the encoder lays them now."""
    fill = PAD_TRANSITION if left.dtype == torch.long else 0
    aligned = torch.full_like(left, fill)
    for row, count in enumerate((2 * lengths - 1).tolist()):
        aligned[row, :count] = left[row, left.shape[1] - count :]
    return aligned


def examples_of(record: dict) -> list[Example]:
    tokens, lengths, transitions, labels = (
        record[k] for k in ("tokens", "lengths", "transitions_left_padded", "labels")
    )
    own = right_aligned(transitions, lengths)
    pairs = tokens.shape[0] // 2
    sentences = [
        (tuple(tokens[row, : lengths[row]].tolist()), tuple(own[row, : 2 * lengths[row] - 1].tolist()))
        for row in range(tokens.shape[0])
    ]
    return [Example(*sentences[p], *sentences[pairs + p], int(labels[p])) for p in range(pairs)]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, tolerance: float = TOLERANCE) -> None:
    difference = (actual - expected).abs().max().item() if expected.numel() else 0.0
    assert difference <= tolerance, f"{what}: max difference {difference:.3g}"


@pytest.mark.parametrize("variant", ["pi-nt", "pi", "spinn", "rl"])
def test_outputs_gradients_and_statistics_match_release_0_1(variant):
    record = load(variant)
    config = SPINNConfig.from_dict(record["config"])
    model = SPINN(config, record["state"]["embedding.vectors.weight"]).double()
    model.load_state_dict(record["state"])
    model.train()
    batch = make_batch(examples_of(record))
    assert torch.equal(batch.tokens[:, : record["tokens"].shape[1]], record["tokens"])
    uniforms = record["uniforms_by_own_step"] if variant == "rl" else None
    output = model(batch, source=config.training_source, uniforms=uniforms)
    loss = spinn_loss(output, batch, config)
    assert_close(output.logits, record["logits"], "logits")
    tolerance = POLICY_TOLERANCE if variant == "rl" else TOLERANCE
    assert_close(loss.total, record["loss"], "loss", tolerance)
    lengths = record["lengths"]
    assert torch.equal(output.transitions, right_aligned(record["taken_left_padded"], lengths))
    if record["transition_logits_left_padded"] is not None:
        expected = right_aligned(record["transition_logits_left_padded"], lengths)
        assert torch.equal(output.transition_logits.isinf(), expected.isinf())
        finite = expected.isfinite()
        assert_close(output.transition_logits[finite], expected[finite], "transition logits")
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss.total, [p for _, p in named], allow_unused=True)
    for (name, _), grad in zip(named, grads, strict=True):
        expected = record["grads"].get(name)
        if expected is None:
            assert grad is None or grad.abs().max() == 0, f"{name} got a gradient 0.1.0 did not give it"
        else:
            assert_close(grad, expected, f"gradient of {name}", tolerance)
    state = model.state_dict()
    for name, value in record["running_after"].items():
        assert_close(state[name].double(), value.double(), name)
