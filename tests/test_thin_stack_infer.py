"""Without gradients on the CPU the encoder can compute only the rows that need it (spinn/model/thin_stack_infer.py):
the tracker for the sentences still inside their own steps, the composition for the sentences that REDUCE.

It must give the numbers of the fused loop, which composes every row at every step: the same transitions,
and the same logits and transition logits (of the real steps) in float64, for every tree variant and every
transition source it can run, on real SNLI dev pairs of mixed lengths and on a seeded synthetic batch.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from spinn.cli import main
from spinn.ground.errors import SpinnError
from spinn.inference.infer_step import InferStep
from spinn.model.batch import Batch
from spinn.model.checkpoint import save_checkpoint
from spinn.model.config import EncoderLoop, SPINNConfig, TransitionSource
from spinn.model.spinn import SPINN, SPINNOutput, random_vectors
from tests.helpers import (
    CASE_IDS,
    CASES,
    TINY,
    TOLERANCE,
    dev_batch,
    synthetic_batch,
    tiny_model,
    uniforms_for,
    untrained_checkpoint,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["dev", "synthetic"])
def batch(request) -> tuple[Batch, int]:
    if request.param == "dev":
        return dev_batch(request.getfixturevalue("snli_dev"))
    return synthetic_batch()


def run(model: SPINN, batch: Batch, source: TransitionSource, loop: EncoderLoop) -> SPINNOutput:
    """One forward in eval mode without gradients, by the named loop."""
    with torch.no_grad():
        return model(batch, source=source, uniforms=uniforms_for(batch, source), loop=loop)


@pytest.mark.parametrize(("variant", "source"), CASES, ids=CASE_IDS)
def test_computing_only_the_rows_read_gives_the_numbers_of_computing_every_row(batch, variant, source):
    batch, vocab_size = batch
    model = tiny_model(variant, vocab_size).eval()
    full, reduce_only = (run(model, batch, source, loop) for loop in (EncoderLoop.FUSED, EncoderLoop.CPU_INFERENCE))
    assert torch.equal(reduce_only.transitions, full.transitions)
    torch.testing.assert_close(reduce_only.logits, full.logits, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(reduce_only.premise, full.premise, rtol=TOLERANCE, atol=TOLERANCE)
    if full.transition_logits is None:
        assert reduce_only.transition_logits is None
    else:
        torch.testing.assert_close(
            reduce_only.transition_logits, full.transition_logits, rtol=TOLERANCE, atol=TOLERANCE
        )


@pytest.mark.parametrize(
    ("device", "amp", "loop"), [("cpu", False, EncoderLoop.CPU_INFERENCE), ("cpu", True, EncoderLoop.FUSED)]
)
def test_inference_names_its_loop_from_the_device_and_autocast(device, amp, loop):
    """On a CPU without autocast inference computes only the rows read; under CPU autocast (no bf16 path
    there) the fused loop, which keeps the cell state fp32, runs instead; a spec model runs its spec."""
    batch, vocab_size = synthetic_batch()
    model = tiny_model("spinn", vocab_size)
    assert InferStep(model, TransitionSource.GREEDY, amp=amp).loop is loop
    spec = tiny_model("spinn", vocab_size, encoder="spec")
    assert InferStep(spec, TransitionSource.GREEDY, amp=amp).loop is EncoderLoop.SPEC


def test_int8_labels_stay_close_to_fp32_and_the_trees_stay_the_tracker_s(batch):
    """--int8 quantizes the composition's GEMMs: the logits move a little, never far, and the tracker (fp32)
    builds the same trees as long as the compositions it reads barely move."""
    batch, vocab_size = batch
    torch.manual_seed(0)
    config = SPINNConfig(variant="spinn", d_embed=8, d_hidden=64, d_tracker=16, mlp_layers=1, mlp_dim=64)
    model = SPINN(config, random_vectors(vocab_size, config.d_embed)).eval()
    fp32 = run(model, batch, TransitionSource.GREEDY, EncoderLoop.CPU_INFERENCE)
    model.quantize_int8()
    int8 = run(model, batch, TransitionSource.GREEDY, EncoderLoop.CPU_INFERENCE)
    assert not torch.equal(int8.logits, fp32.logits)
    torch.testing.assert_close(int8.logits, fp32.logits, rtol=0.0, atol=0.05 * float(fp32.logits.abs().max()))
    assert (int8.transitions == fp32.transitions).float().mean() > 0.99


@pytest.mark.parametrize("loop", [EncoderLoop.FUSED, EncoderLoop.SPEC])
def test_an_int8_model_runs_in_no_other_loop(loop):
    batch, vocab_size = synthetic_batch()
    model = SPINN(SPINNConfig(variant="spinn", **TINY), random_vectors(vocab_size, TINY["d_embed"]))
    model.quantize_int8()
    with pytest.raises(SpinnError, match="int8 model runs only for inference on the CPU"):
        model(batch, source=TransitionSource.GOLD, loop=loop)


def test_int8_on_a_spec_model_is_refused_with_one_error_line(tmp_path: Path):
    """A spec model's loop has no int8 GEMMs: `spinn label --int8` says so instead of labelling in fp32."""
    config = SPINNConfig(variant="spinn", encoder="spec", **TINY)
    checkpoint = save_checkpoint(tmp_path / "model.pt", untrained_checkpoint(config))
    source = tmp_path / "pairs.csv"
    with source.open("w", newline="") as out:
        csv.writer(out).writerows([["premise", "hypothesis"], ["A dog runs.", "A cat sleeps."]])
    arguments = ["label", str(source), "--model", str(checkpoint), "--output", str(tmp_path / "out.parquet")]
    result = CliRunner().invoke(main, [*arguments, "--parser", "model", "--device", "cpu", "--no-progress", "--int8"])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: int8 runs in the fused encoder's CPU inference loop; this model's encoder is spec"]
    assert not (tmp_path / "out.parquet").exists()
