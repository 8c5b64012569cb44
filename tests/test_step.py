"""The training step: sync-free, few ops, the same numbers as a plain step (inference: tests/test_inference.py).

Everything here runs on a CPU; the CUDA graph capture itself needs a GPU and is
exercised by scripts/gpu_check.sh there. The op counts are the CPU-measurable
proxy for GPU speed: every aten op is a kernel launch on a GPU, every host read
a stall (spinn/opcount.py).
"""

from __future__ import annotations

import pytest
import torch

from spinn.bench import load_examples, take_batches
from spinn.inference.infer_step import InferStep
from spinn.model.batch import WIDTH_STEP, Batch, make_batch
from spinn.model.config import EncoderLoop, SPINNConfig, TransitionSource
from spinn.model.spinn import SPINN, random_vectors, spinn_loss
from spinn.opcount import counting
from spinn.training.loader import prefetch
from spinn.training.train_step import (
    Schedule,
    StepOptions,
    TrainStep,
    make_optimizer,
    set_rate,
    training_loop,
)
from tests.helpers import synthetic_batch

MAX_OPS_PER_TRANSITION_STEP = 50
"""The issue's bar for a training step (forward, backward, optimizer), counted on the CPU."""

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def snli_batches(snli_dev):
    """Five real 256-pair batches of SNLI dev trees, length-bucketed as training makes them."""
    examples, vocab_size = load_examples(snli_dev, None, 0, labelled=True)
    return take_batches(examples, 256, 5, 0), vocab_size


def trainer(variant: str, vocab_size: int, d: int = 24, encoder: str = "fused", **options) -> TrainStep:
    torch.manual_seed(0)
    config = SPINNConfig(
        variant=variant, encoder=encoder, d_embed=d, d_hidden=d, d_tracker=8, use_batch_norm=True, mlp_dim=32
    )
    model = SPINN(config, random_vectors(vocab_size, d, 0))
    schedule = Schedule(base=1e-3, decay=0.75, decay_steps=10)
    optimizer = make_optimizer(model, schedule, 1e-5, torch.device("cpu"))
    return TrainStep(model, optimizer, schedule, StepOptions(clip_norm=5.0, **options))


STEP_LOOPS = [(variant, EncoderLoop.FUSED) for variant in ("pi", "spinn", "rl", "pi-nt")] + [
    (variant, EncoderLoop.FUSED_COMPACT) for variant in ("pi", "spinn", "pi-nt")
]
"""The GPU's loop for every variant, and the CPU's for those that train on gold transitions."""


@pytest.mark.parametrize(("variant", "loop"), STEP_LOOPS, ids=[f"{v}-{loop.value}" for v, loop in STEP_LOOPS])
def test_a_training_step_never_reads_the_device_and_launches_few_ops(snli_batches, variant, loop):
    """Forward, loss, backward, clipping, RMSprop and the metric sums: no host sync; PI and SPINN within
    the issue's 50 aten ops per transition step (the encoder's work is the same at any width)."""
    batches, vocab_size = snli_batches
    step = trainer(variant, vocab_size, loop=loop)
    step(batches[0], 0)  # lazy state (optimizer buffers) is made once
    with counting() as count:
        for index, batch in enumerate(batches[1:3], start=1):
            step(batch, index)
    transition_steps = sum(batch.transitions.shape[1] for batch in batches[1:3])
    assert count.syncs == 0, count.sync_ops()
    if variant in ("pi", "spinn"):
        assert count.total / transition_steps <= MAX_OPS_PER_TRANSITION_STEP, count.ops.most_common(10)


@pytest.mark.parametrize(
    ("variant", "encoder", "device", "expected"),
    [
        ("pi", "fused", "cpu", EncoderLoop.FUSED_COMPACT),
        ("spinn", "fused", "cpu", EncoderLoop.FUSED_COMPACT),
        ("rl", "fused", "cpu", EncoderLoop.FUSED),
        ("pi", "fused", "cuda", EncoderLoop.FUSED),
        ("pi", "spec", "cpu", EncoderLoop.SPEC),
    ],
)
def test_training_composes_only_the_reduces_on_a_cpu(variant, encoder, device, expected):
    """Gold transitions on a CPU train on the compact loop; sampled trees (rl) and a GPU's fixed shapes on the
    fused one; a spec model on its spec. The step runs what the rule chose."""
    config = SPINNConfig(variant=variant, encoder=encoder)
    assert training_loop(config, torch.device(device)) is expected
    if device == "cpu":
        assert trainer(variant, 20, encoder=encoder).loop is expected


def test_the_step_is_a_plain_rmsprop_step(snli_dev):
    """Foreach kernels and a tensor learning rate compute what torch's default RMSprop computes."""
    examples, vocab_size = load_examples(snli_dev, 40, 0, labelled=True)
    batch = make_batch(examples[:16])
    step = trainer("spinn", vocab_size, d=12)
    plain = SPINN(step.model.config, step.model.embedding.vectors.weight.clone())
    plain.load_state_dict(step.model.state_dict())
    optimizer = torch.optim.RMSprop([p for p in plain.parameters() if p.requires_grad], lr=1e-3, weight_decay=1e-5)
    step(batch, 0)
    plain.train()
    optimizer.zero_grad()
    spinn_loss(plain(batch, source=TransitionSource.GOLD, loop=step.loop), batch, plain.config).total.backward()
    torch.nn.utils.clip_grad_norm_(plain.parameters(), 5.0)
    optimizer.step()
    for (name, mine), theirs in zip(step.model.state_dict().items(), plain.state_dict().values(), strict=True):
        assert torch.allclose(mine.float(), theirs.float(), atol=1e-6), name


def real_or_synthetic(kind: str, request: pytest.FixtureRequest) -> tuple[Batch, int]:
    """32 real dev pairs (the snli_dev fixture: skipped without ../shared), or a seeded synthetic batch of 16."""
    if kind == "synthetic":
        return synthetic_batch(pairs=16)
    examples, vocab_size = load_examples(request.getfixturevalue("snli_dev"), 32, 0, labelled=True)
    return make_batch(examples), vocab_size


@pytest.mark.parametrize("kind", ["dev", "synthetic"])
@pytest.mark.parametrize("variant", ["spinn", "rl"])
def test_training_and_inference_steps_run_the_spec_encoder_as_the_fused_one(variant, kind, request):
    """encoder: spec trains (rl: on sampled trees) and infers to the fused encoder's numbers. Compared: one
    step's gradients and statistics (RMSprop turns float32 noise in a gradient that batch norm makes ~0,
    the projection's bias, into a full-size update, so weights after the step are not comparable)."""
    batch, vocab_size = real_or_synthetic(kind, request)
    steps = [trainer(variant, vocab_size, d=12, encoder=encoder) for encoder in ("fused", "spec")]
    for step in steps:
        torch.manual_seed(1)  # rl draws its trees' uniforms inside the step
        step(batch, 0)
    fused, spec = (step.model for step in steps)
    for (name, mine), theirs in zip(fused.named_parameters(), spec.parameters(), strict=True):
        assert (mine.grad is None) == (theirs.grad is None), name
        assert mine.grad is None or torch.allclose(mine.grad, theirs.grad, atol=1e-6), name
    for (name, mine), theirs in zip(fused.named_buffers(), spec.buffers(), strict=True):
        assert torch.allclose(mine.float(), theirs.float(), atol=1e-6), name
    spec.load_state_dict(fused.state_dict())
    found, expected = (InferStep(model, source=fused.config.evaluation_source)(batch) for model in (fused, spec))
    assert torch.equal(found.transitions, expected.transitions)
    assert torch.allclose(found.logits, expected.logits, atol=1e-5)


def test_the_step_takes_a_compiled_network():
    """torch.compile's module refuses len(), so the step must not ask a network for its truth value (the GPU
    check times the step with a compiled forward pass)."""
    step = trainer("pi", 20)
    compiled = torch.compile(step.model)
    with_compiled = TrainStep(step.model, step.optimizer, step.schedule, step.options, network=compiled)
    assert with_compiled.network is compiled


def test_metrics_are_summed_on_the_device_and_read_once(snli_dev):
    examples, vocab_size = load_examples(snli_dev, 64, 0, labelled=True)
    step = trainer("pi", vocab_size)
    batches = [make_batch(examples[i : i + 16]) for i in range(0, 48, 16)]
    for index, batch in enumerate(batches):
        step(batch, index)
    with counting() as count:
        sums = step.metrics.read()
    assert count.syncs == 1  # one .tolist() for every metric of every step
    assert sums["steps"] == 3 and sums["pairs"] == 48 and 0 <= sums["correct"] <= 48
    assert sums["loss"] > 0 and step.metrics.read()["steps"] == 0  # read starts a new window


def test_the_schedule_warms_up_then_decays():
    schedule = Schedule(base=1.0, decay=0.5, decay_steps=4, warmup_steps=2)
    assert [schedule.rate(step) for step in range(9)] == [0.5, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.25]


def test_a_capturable_optimizer_gets_its_rate_tensor_back():
    """An optimizer state from 0.1 holds a float rate; a captured graph needs the tensor it read."""
    step = trainer("pi", 20)
    group = step.optimizer.param_groups[0]
    set_rate(step.optimizer, 0.5)
    assert group["lr"] == 0.5  # on a CPU the rate is a number: a tensor would be read back every step
    group["capturable"], group["lr"] = True, 0.5  # as a CUDA optimizer after loading a 0.1 state
    set_rate(step.optimizer, 0.25)
    assert isinstance(group["lr"], torch.Tensor) and group["lr"].item() == 0.25
    kept = group["lr"]
    set_rate(step.optimizer, 0.125)
    assert group["lr"] is kept and kept.item() == 0.125  # in place: the tensor a captured graph reads


def test_a_capturable_optimizer_takes_its_rate_back_to_its_device():
    """A CUDA run's checkpoint is loaded on the CPU, so its rate comes back as a tensor on another device than
    the parameters (here the meta device stands for the CPU, the CPU for CUDA): set_rate moves it home."""
    step = trainer("pi", 20)
    group = step.optimizer.param_groups[0]
    group["capturable"], group["lr"] = True, torch.tensor(0.5, device="meta")
    set_rate(step.optimizer, 0.25)
    rate = group["lr"]
    assert rate.device == group["params"][0].device and rate.dtype == torch.float32 and rate.item() == 0.25


def test_the_loader_makes_the_same_batches_ahead_of_the_model(snli_dev):
    examples, _ = load_examples(snli_dev, 100, 0, labelled=True)
    order = [list(range(start, start + 10)) for start in range(0, 100, 10)]
    loaded = list(prefetch(examples, order, torch.device("cpu")))
    assert len(loaded) == 10
    for indices, batch in zip(order, loaded, strict=True):
        expected = make_batch([examples[i] for i in indices], width_step=WIDTH_STEP)
        assert torch.equal(batch.tokens, expected.tokens) and torch.equal(batch.plan.reads, expected.plan.reads)


def test_a_loader_failure_reaches_the_loop(snli_dev):
    examples, _ = load_examples(snli_dev, 10, 0, labelled=True)
    with pytest.raises(IndexError):
        list(prefetch(examples, [[0, 1], [99]], torch.device("cpu")))
