"""What every encoder loop is given and what it returns, whichever loop runs (spec, fused, CPU inference).

A run is the memory layout of a batch, the sentences' lengths, which steps are
real, and where the transitions come from: the parser's (`Gold`, with the plan
of their addresses worked out on the host), or the tracker's own (`Chooser`:
its best legal action, or one sampled from uniform draws). Each loop returns an
`EncoderOutput`; none writes its results into what it was given.

Shapes: N sentences, T steps, D hidden, Dt tracker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from spinn.model.addressing import Layout, StepPlan, device_real_steps
from spinn.model.policy import sample_actions
from spinn.trees.transitions import PAD_TRANSITION


@dataclass(frozen=True)
class Gold:
    """The parser's transitions and the plan of their addresses."""

    transitions: Tensor  # (N, T) right-padded with PAD_TRANSITION
    plan: StepPlan


@dataclass(frozen=True)
class Chooser:
    """How a model picks its own transitions: the transition head, and uniform draws when it samples (rl)."""

    weight: Tensor  # (2, Dt) detached: REINFORCE learns the policy from the states' logits, not through here
    bias: Tensor  # (2,)
    uniforms: Tensor | None  # (N, T): sentence n's draw for its own step t, or None: the best legal action

    def choose(self, h: Tensor, legal: Tensor, step: int, rows: Tensor | None = None) -> Tensor:
        """(A,) SHIFT or REDUCE for the tracker states h (A, Dt) with legal actions (A, 2), illegal ones never
        chosen; rows (A,): which sentences these are (None: all N), for their draws."""
        scores = torch.addmm(self.bias, h, self.weight.t()).masked_fill(~legal, float("-inf"))  # (A, 2)
        if self.uniforms is None:
            return scores.argmax(1)
        draws = self.uniforms[:, step]  # (N,)
        return sample_actions(scores, draws if rows is None else draws.index_select(0, rows))


@dataclass(frozen=True)
class Run:
    """One encoding's fixed facts: the layout, the lengths, the real steps, and gold or a chooser."""

    layout: Layout
    lengths: Tensor  # (N,)
    real: Tensor  # (T, N) bool: the step is one of the sentence's own 2n - 1
    gold: Gold | None = None
    chooser: Chooser | None = None

    @classmethod
    def of_gold(cls, layout: Layout, lengths: Tensor, gold: Gold) -> Run:
        return cls(layout, lengths, gold.plan.real, gold=gold)

    @classmethod
    def choosing(cls, layout: Layout, lengths: Tensor, chooser: Chooser) -> Run:
        return cls(layout, lengths, device_real_steps(lengths, layout.steps), chooser=chooser)

    def padded(self, action: Tensor, step: int) -> Tensor:
        """(N,) the chosen actions, PAD_TRANSITION where the step is past the sentence's end."""
        return torch.where(self.real[step], action, PAD_TRANSITION)


class EncoderOutput(NamedTuple):
    """What every encoder loop returns for N sentences."""

    roots: Tensor  # (N, D) root h of each sentence
    states: Tensor | None  # (T, N, Dt) the tracker's h after each step; None without a tracker (pi-nt)
    transitions: Tensor  # (N, T) the actions that ran, PAD_TRANSITION after each sentence's end
    legal: Tensor  # (T, N, 2) SHIFT and REDUCE legal before each step
    real: Tensor  # (T, N) bool: the step is one of the sentence's own 2n - 1
