"""predict(): a model over examples, in length-sorted batches, read back once; the one inference loop.

Evaluation, labelling and `spinn trees` all call it, so a label, a score and
a drawn tree come from the same batches, the same step and the same CUDA
graphs. Batches are cut by length (bucket_batches, without shuffling) so
padding stays low; the outputs stay on the device until the last batch is
done, and come back in input order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy
import torch
from torch import Tensor

from spinn.data.example import Example
from spinn.errors import SpinnError
from spinn.inference.step import InferStep
from spinn.model.batch import WIDTH_STEP, bucket_batches, make_batch
from spinn.model.config import TransitionSource
from spinn.model.spinn import SPINN, transition_counts
from spinn.trees.transitions import PAD_TRANSITION, transition_count

Steps = tuple[int, ...]


@dataclass(frozen=True)
class Predictions:
    """What the model said about N pairs, in input order."""

    probabilities: numpy.ndarray  # (N, C) float32
    labels: numpy.ndarray  # (N,) int64, the most probable class
    premise_transitions: list[Steps]
    """The 2n-1 transitions each premise ran on (its parse for gold; the tracker's for greedy)."""
    hypothesis_transitions: list[Steps]
    transition_steps: int = 0
    """Real steps of the sentences that came with transitions (0: none did, or the model has no tracker)."""
    transition_agreement: int = 0
    """Of those, the steps where the tracker's best legal action is the given transition."""

    @property
    def transition_accuracy(self) -> float | None:
        return self.transition_agreement / self.transition_steps if self.transition_steps else None


@dataclass(frozen=True)
class _Ran:
    """One batch's outputs, still on the device."""

    indices: list[int]
    probabilities: Tensor  # (b, C)
    transitions: Tensor  # (2b, T) premises then hypotheses
    agreement: Tensor | None  # (2,) [real steps, agreeing steps]


def predict(
    model: SPINN,
    examples: Sequence[Example],
    device: torch.device,
    batch_size: int,
    source: TransitionSource,
    *,
    step: InferStep | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> Predictions:
    """Run `model` over `examples` on `source` transitions; the batch size and order change no number.

    step: a caller that predicts often (training's dev evaluation) passes its own, so its CUDA graphs
    are kept. on_batch: told the pair count of each batch as it is submitted (progress)."""
    if not examples:
        raise SpinnError("nothing to predict: no examples")
    step = step or InferStep(model, source)
    if step.source is not source:
        raise SpinnError(f"the inference step runs on {step.source.value} transitions, not {source.value}")
    was_training = model.training
    try:
        runs = [
            _run(step, examples, indices, device, on_batch)
            for indices in bucket_batches(examples, batch_size, shuffle=False)
        ]
    finally:
        model.train(was_training)  # the step ran it in eval mode (no dropout, batch norm's running statistics)
    return _read_back(runs, examples)


def _run(
    step: InferStep,
    examples: Sequence[Example],
    indices: list[int],
    device: torch.device,
    on_batch: Callable[[int], None] | None,
) -> _Ran:
    """One batch through the step; nothing is read back."""
    batch = make_batch([examples[i] for i in indices], width_step=WIDTH_STEP).to(device, non_blocking=True)
    output = step(batch)
    agreement = None if output.transition_logits is None else transition_counts(output, batch)  # (2,)
    if on_batch is not None:
        on_batch(len(indices))
    return _Ran(indices, torch.softmax(output.logits.float(), dim=1), output.transitions, agreement)


def _read_back(runs: list[_Ran], examples: Sequence[Example]) -> Predictions:
    """Every batch's outputs to the host in one copy each, put back in input order."""
    order = torch.tensor([index for ran in runs for index in ran.indices])  # (N,) input index of each sorted row
    width = max(ran.transitions.shape[1] for ran in runs)
    premises, hypotheses = zip(*(_padded(ran.transitions, width).split(len(ran.indices)) for ran in runs), strict=True)
    sorted_probabilities = torch.cat([ran.probabilities for ran in runs]).cpu()  # (N, C)
    probabilities = torch.empty_like(sorted_probabilities)
    probabilities[order] = sorted_probabilities
    ran_premises, ran_hypotheses = torch.cat(premises).tolist(), torch.cat(hypotheses).tolist()  # (N, T) each
    position = torch.empty_like(order)
    position[order] = torch.arange(len(order))  # (N,) sorted row of each input
    rows = position.tolist()
    agreements = [ran.agreement for ran in runs if ran.agreement is not None]
    steps, agreeing = torch.stack(agreements).sum(0).tolist() if agreements else (0, 0)
    return Predictions(
        probabilities.numpy(),
        probabilities.argmax(1).numpy(),
        [_own_steps(ran_premises[row], len(e.premise)) for row, e in zip(rows, examples, strict=True)],
        [_own_steps(ran_hypotheses[row], len(e.hypothesis)) for row, e in zip(rows, examples, strict=True)],
        int(steps),
        int(agreeing),
    )


def _own_steps(padded: list[int], n_tokens: int) -> Steps:
    """A sentence's 2n - 1 transitions out of its right-padded row, read back once as a list for all rows."""
    return tuple(padded[: transition_count(n_tokens)])


def _padded(transitions: Tensor, width: int) -> Tensor:
    """(n, T) transitions right-padded to (n, width) with the no-op, so batches of every width stack."""
    return torch.nn.functional.pad(transitions, (0, width - transitions.shape[1]), value=PAD_TRANSITION)
