"""The gated cell's Triton kernels (spinn/model/cell_kernel.py), run by Triton's interpreter on the CPU.

On a GPU the fused loops' cell steps, forward and backward, run as one kernel
each; here the same kernels run in Triton's interpreter, in float64 and
float32, inside the real fused loop (forward, the hand-written backward, and
the inference loop whose tracker updates c in place), against the same loop
on torch ops. A kernel that fails turns itself off with one warning. Small
batches: the interpreter runs every program of a launch in Python.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

import spinn.model.cells as cells
from spinn.model.config import EncoderLoop, TransitionSource
from spinn.model.spinn import SPINN, SPINNOutput, spinn_loss
from tests.helpers import synthetic_batch, tiny_model, uniforms_for

pytest.importorskip("triton", reason="Triton installs on Linux x86_64 only (pyproject's dev extra)")

KERNEL_CASES = [
    ("pi-nt", TransitionSource.GOLD, torch.float64),  # the composition alone (two children)
    ("spinn", TransitionSource.GREEDY, torch.float64),  # the tracker too (one child), on its own transitions
    ("rl", TransitionSource.SAMPLED, torch.float64),
    ("pi", TransitionSource.GOLD, torch.float32),
]
FLOAT64_TOLERANCE = 1e-12
FLOAT32_TOLERANCE = 1e-5


@pytest.fixture
def kernel(monkeypatch):
    """The cell kernel module (its kernel in Triton's interpreter), which the cells now call on CPU tensors,
    recording whether each step ran it."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a GPU is here: tests/conftest.py left Triton compiling, and the GPU check runs the kernels")
    monkeypatch.setattr(cells, "KERNEL_ON_CPU", True)
    from spinn.model import cell_kernel as module

    done, backward = [], []
    step, gradients = module.fused_step, module.fused_gate_gradients
    monkeypatch.setattr(module, "fused_step", lambda *args: done.append(step(*args)) or done[-1])
    monkeypatch.setattr(module, "fused_gate_gradients", lambda *args: backward.append(gradients(*args)) or backward[-1])
    module.done, module.backward = done, backward
    return module


def run(model: SPINN, source: TransitionSource, batch) -> SPINNOutput:
    output = model(batch, source=source, uniforms=uniforms_for(batch, source), loop=EncoderLoop.FUSED)
    spinn_loss(output, batch, model.config).total.backward()
    return output


@pytest.mark.parametrize(("variant", "source", "dtype"), KERNEL_CASES, ids=lambda case: str(case))
def test_the_kernel_trains_as_the_torch_ops_do(kernel, variant, source, dtype):
    batch, vocab_size = synthetic_batch(pairs=3, longest=5)
    with_kernel, with_ops = (tiny_model(variant, vocab_size).to(dtype).train() for _ in range(2))
    found = run(with_kernel, source, batch)
    steps, backward_steps = len(kernel.done), len(kernel.backward)
    assert steps and all(kernel.done), "every step of the loop ran the kernel"
    assert backward_steps and all(kernel.backward), "and every step of its backward"
    with kernel.disabled():
        expected = run(with_ops, source, batch)
    assert len(kernel.done) == 2 * steps and not any(kernel.done[steps:]), "disabled: the torch ops ran"
    assert not any(kernel.backward[backward_steps:])
    tolerance = FLOAT64_TOLERANCE if dtype is torch.float64 else FLOAT32_TOLERANCE
    assert torch.equal(found.transitions, expected.transitions)
    torch.testing.assert_close(found.logits, expected.logits, rtol=tolerance, atol=tolerance)
    for (name, mine), theirs in zip(with_kernel.named_parameters(), with_ops.parameters(), strict=True):
        if theirs.grad is not None:
            torch.testing.assert_close(mine.grad, theirs.grad, rtol=tolerance, atol=tolerance, msg=name)


def test_the_kernel_infers_as_the_torch_ops_do_with_the_trackers_c_updated_in_place(kernel):
    """Without gradients the loop keeps one tracker c, which the step reads and overwrites."""
    batch, vocab_size = synthetic_batch(pairs=3, longest=5, seed=1)
    model = tiny_model("spinn", vocab_size).eval()
    with torch.no_grad():
        found = model(batch, source=TransitionSource.GREEDY, loop=EncoderLoop.FUSED)
        steps = len(kernel.done)
        with kernel.disabled():
            expected = model(batch, source=TransitionSource.GREEDY, loop=EncoderLoop.FUSED)
    assert steps and all(kernel.done[:steps]) and not any(kernel.done[steps:])
    assert torch.equal(found.transitions, expected.transitions)
    torch.testing.assert_close(found.logits, expected.logits, rtol=FLOAT64_TOLERANCE, atol=FLOAT64_TOLERANCE)


def test_a_kernel_that_fails_is_turned_off_with_one_warning_and_the_ops_run(kernel, monkeypatch, caplog):
    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("no compiler here")

            return launch

    monkeypatch.setattr(kernel, "_gated_step", Broken())
    monkeypatch.setitem(kernel._state, "enabled", True)
    batch, vocab_size = synthetic_batch(pairs=3, longest=5)
    broken, sound = (tiny_model("pi", vocab_size).train() for _ in range(2))
    with caplog.at_level(logging.WARNING, logger=kernel.__name__):
        found = run(broken, TransitionSource.GOLD, batch)
    assert kernel.done[0] is False and not any(kernel.done) and not kernel._state["enabled"]
    assert [record.getMessage().count("no compiler here") for record in caplog.records] == [1]
    with kernel.disabled():
        expected = run(sound, TransitionSource.GOLD, batch)
    torch.testing.assert_close(found.logits, expected.logits, rtol=0, atol=0)


def test_the_environment_can_turn_the_kernel_off_for_a_run(kernel, monkeypatch):
    monkeypatch.setenv(kernel.OFF_VARIABLE, kernel.OFF)
    batch, vocab_size = synthetic_batch(pairs=3, longest=5)
    run(tiny_model("pi", vocab_size).train(), TransitionSource.GOLD, batch)
    assert kernel.done and not any(kernel.done) and kernel.backward and not any(kernel.backward)
