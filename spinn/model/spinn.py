"""SPINN (Bowman et al. 2016): the model, from word ids to class logits, and its loss.

A sentence is encoded by running shift/reduce transitions over its words.
SHIFT moves the next word onto the stack; REDUCE pops the two top phrases and
composes them with a TreeLSTM cell; the root left on the stack is the sentence
vector. The variants, chosen by `SPINNConfig.variant`:

- `pi-nt`: no tracker, the gold transitions drive the stacks.
- `pi`: a tracker LSTM reads [buffer top, stack top, stack second] at every
  step and its state feeds every composition.
- `spinn`: the tracker also predicts SHIFT/REDUCE. Training supervises it with
  the gold transitions (loss weight alpha); at inference it can run on its own
  predictions, illegal actions masked, so no parser is needed.
- `rl`: the tracker's prediction is a policy: training samples the trees and
  learns them from the NLI reward with REINFORCE (spinn/model/policy.py), with
  optional supervision; evaluation takes the best legal action. No parses needed.
- `cbow`: no tree at all, the mean of the projected word vectors with the same
  classifier; the sanity baseline every tree model must beat.

Fully batched: premise and hypothesis of B pairs are one batch of N = 2B
sentences, every word slot of the (N, L) batch is embedded (batch norm counts
only the real ones), and the encoder (spinn/model/spec.py, fused in thin_stack_forward.py) runs all
sentences through T = 2L - 1 steps at once, each sentence's own 2n - 1 steps
first: its step s sits in column s of the transitions. With gold transitions
the addresses come from the batch's StepPlan, worked out on the host; nothing
in the forward or backward pass reads a value back from the device.

Shapes: B pairs, N = 2B sentences, L words (padded), T = 2L - 1 steps,
D hidden, Dt tracker, E embedding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spinn.ground.errors import SpinnError
from spinn.model import spec, thin_stack_forward, thin_stack_infer
from spinn.model.addressing import Layout, StepPlan
from spinn.model.batch import Batch
from spinn.model.cells import Classifier, Reduce, Tracker, WordEmbedding
from spinn.model.config import N_ACTIONS, EncoderLoop, SPINNConfig, TransitionSource
from spinn.model.encoder_run import Chooser, EncoderOutput, Gold, Run
from spinn.model.policy import (
    MovingAverageBaseline,
    PolicyTerms,
    ValueBaseline,
    chance_reward,
    draw_uniforms,
    reinforce,
)
from spinn.model.precision import check_int8
from spinn.trees.transitions import PAD_TRANSITION


class Encoding(NamedTuple):
    """What the encoder returns for N sentences, in input order."""

    vectors: Tensor  # (N, D) root h of each sentence
    transition_logits: Tensor | None  # (N, T, 2) illegal actions -inf, padding steps 0; spinn only
    transitions: Tensor  # (N, T) the transitions that ran (gold or predicted), PAD_TRANSITION after the end


class SPINNOutput(NamedTuple):
    """What the model returns for B pairs; training adds the transition loss when present."""

    logits: Tensor  # (B, n_classes)
    premise: Tensor  # (B, D)
    hypothesis: Tensor  # (B, D)
    transition_logits: Tensor | None  # (2B, T, 2) premises then hypotheses
    transitions: Tensor  # (2B, T)
    baseline: Tensor | None = None  # (B,) rl while training: the baseline each pair's reward is compared with


class Loss(NamedTuple):
    total: Tensor
    classification: Tensor
    transition: Tensor | None
    policy: PolicyTerms | None = None


# ----------------------------------------------------------------------------- encoder


class Encoder(nn.Module):
    """The composition and tracker cells, run over all sentences and steps by the loop the caller names:
    the spec (spinn/model/spec.py), the fused thin stack that equals it, or the CPU inference loop."""

    def __init__(self, config: SPINNConfig):
        super().__init__()
        self.config = config
        d_tracking = config.d_tracker if config.has_tracker else 0
        self.reduce = Reduce(config.d_hidden, d_tracking)
        self.tracker = (
            Tracker(config.d_hidden, config.d_tracker, config.predicts_transitions) if config.has_tracker else None
        )
        self.int8: thin_stack_infer.Gemms | None = None
        """The cells' int8 GEMMs once `quantize_int8` packed them (the CPU inference loop only)."""

    @property
    def cells(self) -> tuple[Reduce, Tracker | None]:
        return self.reduce, self.tracker

    def quantize_int8(self) -> None:
        """Pack the composition's weights for int8 dynamic GEMMs (the tracker stays fp32: its argmax is the tree)."""
        check_int8(config=self.config)
        self.int8 = thin_stack_infer.Gemms.of(self.cells, int8=True)

    def forward(self, words: Tensor, run: Run, loop: EncoderLoop) -> EncoderOutput:
        """Roots, tracker states and the transitions that ran; words (N*L, 2D)."""
        if self.int8 is not None and loop is not EncoderLoop.CPU_INFERENCE:
            raise SpinnError(f"an int8 model runs only for inference on the CPU, not in the {loop.value} loop")
        if loop is EncoderLoop.SPEC:
            return spec.encode(words, self.cells, run)
        if loop in (EncoderLoop.FUSED, EncoderLoop.FUSED_COMPACT):
            return thin_stack_forward.encode(words, self.cells, run, compact=loop is EncoderLoop.FUSED_COMPACT)
        return thin_stack_infer.encode(words, self.int8 or thin_stack_infer.Gemms.of(self.cells), self.cells, run)

    def run(self, layout: Layout, lengths: Tensor, gold: Gold | None, uniforms: Tensor | None) -> Run:
        """The run of a batch: on the parser's transitions, or choosing its own (greedy, or sampled from uniforms)."""
        if gold is not None:
            return Run.of_gold(layout, lengths, gold)
        head = self.tracker.transition
        return Run.choosing(layout, lengths, Chooser(head.weight.detach(), head.bias.detach(), uniforms))

    def transition_logits(self, states: Tensor, legal: Tensor, real: Tensor) -> Tensor:
        """(N, T, 2) scores of the tracker's states (T, N, Dt): illegal actions -inf, padding steps 0."""
        scores = self.tracker.transition(states).masked_fill(~legal, float("-inf"))  # (T, N, 2)
        return torch.where(real[..., None], scores, 0.0).transpose(0, 1)  # (N, T, 2)


# ----------------------------------------------------------------------------- model


class SPINN(nn.Module):
    """Word embedding -> encoder (premises and hypotheses as one batch) -> classifier."""

    def __init__(self, config: SPINNConfig, vectors: Tensor):
        super().__init__()
        self.config = config
        self.embedding = WordEmbedding(config, vectors)
        self.encoder = Encoder(config) if config.uses_trees else None
        self.classifier = Classifier(config)
        self.baseline = _make_baseline(config)

    def forward(
        self,
        batch: Batch,
        *,
        source: TransitionSource,
        uniforms: Tensor | None = None,
        loop: EncoderLoop | None = None,
    ) -> SPINNOutput:
        """Logits for the batch, on the transitions of `source` (one the variant can run: config.sources), run
        by `loop` (default: the model's own, config.loop).

        sampled: rl draws its trees from `uniforms` (N, T) when given (tests), else fresh draws.
        """
        sampled = source is TransitionSource.SAMPLED
        if sampled and uniforms is None:
            uniforms = draw_uniforms(batch.tokens.shape[0], batch.transitions.shape[1], batch.tokens.device)
        encoding = self.encode(batch.tokens, batch.lengths, source, batch.plan, batch.transitions, uniforms, loop=loop)
        premise, hypothesis = encoding.vectors.split(batch.pairs)  # (B, D) each
        logits = self.classifier(premise, hypothesis)  # (B, n_classes)
        baseline = self.baseline(self._pair_features(batch)) if sampled else None  # (B,)
        return SPINNOutput(logits, premise, hypothesis, encoding.transition_logits, encoding.transitions, baseline)

    def _check_trees(self, source: TransitionSource, plan: StepPlan | None) -> None:
        """Gold transitions need a parse of every sentence (a plan); tokens-only data has none."""
        if source is TransitionSource.GOLD and self.config.uses_trees and plan is None:
            raise SpinnError(
                "some sentences have no tree (tokens-only data): only a model that builds its own "
                "trees can read them (rl, or spinn on greedy transitions)"
            )

    def quantize_int8(self) -> None:
        """int8 dynamic quantization of the composition for the CPU inference loop (weights per output channel,
        activations per call), for labelling; not undone. The tracker, which builds the trees, and the
        classifier, whose argmax is the label, stay fp32. A spec model is refused: its loop has no int8 GEMMs."""
        if self.encoder is not None:
            self.encoder.quantize_int8()

    def observe_rewards(self, rewards: Tensor) -> None:
        """rl: let a moving-average baseline see this batch's rewards (after the loss used the old value)."""
        if self.baseline is not None:
            self.baseline.observe(rewards)

    def _pair_features(self, batch: Batch) -> Tensor:
        """[p; h; p * h] of mean frozen word vectors per sentence: what a value baseline may see -> (B, 3E)."""
        real = torch.arange(batch.tokens.shape[1], device=batch.tokens.device) < batch.lengths[:, None]  # (N, L)
        vectors = self.embedding.vectors(batch.tokens) * real[..., None]  # (N, L, E)
        means = vectors.sum(1) / batch.lengths[:, None].to(vectors.dtype)  # (N, E)
        premise, hypothesis = means.split(batch.pairs)  # (B, E) each
        return torch.cat([premise, hypothesis, premise * hypothesis], 1)  # (B, 3E)

    def encode(
        self,
        tokens: Tensor,
        lengths: Tensor,
        source: TransitionSource,
        plan: StepPlan | None = None,
        transitions: Tensor | None = None,
        uniforms: Tensor | None = None,
        *,
        loop: EncoderLoop | None = None,
    ) -> Encoding:
        """Sentence vectors of N sentences: tokens (N, L), lengths (N,); source gold runs the plan of the
        transitions (N, T) it was made from; greedy and sampled the model's own choices (sampled: from
        uniforms (N, T)). `loop`: the encoder loop (default: the model's own, config.loop)."""
        if source not in self.config.sources:
            runs = ", ".join(item.value for item in self.config.sources)
            raise SpinnError(f"a {self.config.variant} model cannot run on {source.value} transitions, only {runs}")
        if uniforms is not None and source is not TransitionSource.SAMPLED:
            raise SpinnError(f"uniform draws are for sampled transitions; this run is {source.value}")
        self._check_trees(source, plan)
        n, width = tokens.shape
        real_words = torch.arange(width, device=tokens.device) < lengths[:, None]  # (N, L)
        words = self.embedding(tokens.reshape(-1), real_words.reshape(-1)).to(self.state_dtype)  # (N*L, 2D)
        gold = source is TransitionSource.GOLD
        if self.encoder is None:
            return self._bag_of_words(words.view(n, width, -1), real_words, lengths, tokens, transitions)
        layout = Layout(n, width, plan.reads.shape[0] if gold else 2 * width - 1)
        run = self.encoder.run(layout, lengths, Gold(transitions, plan) if gold else None, uniforms)
        output = self.encoder(words, run, loop or self.config.loop)
        logits = None
        if self.config.predicts_transitions:
            logits = self.encoder.transition_logits(output.states, output.legal, output.real)
        return Encoding(output.roots, logits, output.transitions)

    def _bag_of_words(
        self, words: Tensor, real: Tensor, lengths: Tensor, tokens: Tensor, transitions: Tensor | None
    ) -> Encoding:
        """cbow: the mean of each sentence's projected word vectors (their h half); words (N, L, 2D)."""
        h = words[:, :, : self.config.d_hidden] * real[..., None]  # (N, L, D)
        vectors = h.sum(1) / lengths[:, None].to(h.dtype)  # (N, D)
        taken = transitions if transitions is not None else tokens.new_full((tokens.shape[0], 0), PAD_TRANSITION)
        return Encoding(vectors, None, taken)

    @property
    def state_dtype(self) -> torch.dtype:
        """The dtype of h and c: the parameters' (fp32 even when autocast runs the matmuls in bf16)."""
        return self.embedding.project.weight.dtype


def _make_baseline(config: SPINNConfig) -> nn.Module | None:
    if not config.samples_transitions:
        return None
    if config.baseline == "value":
        return ValueBaseline(3 * config.d_embed, config.d_tracker)
    return MovingAverageBaseline(config.baseline_decay, chance_reward(config.reward, config.n_classes))


def spinn_loss(output: SPINNOutput, batch: Batch, config: SPINNConfig) -> Loss:
    """Cross-entropy on labels, plus alpha x cross-entropy of the tracker's transitions (spinn);
    for a sampled rl batch, plus the REINFORCE surrogate, the entropy bonus and the value loss.

    A rank's share of a distributed batch weights its per-pair means and its per-step means by
    batch.loss_scale, so the ranks' averaged gradients are the global batch's (the terms reported
    stay the rank's own means)."""
    if batch.labels is None:
        raise SpinnError("the batch has no labels to compute a loss against")
    per_pair, per_step = (1.0, 1.0) if batch.loss_scale is None else batch.loss_scale.unbind(0)
    classification = F.cross_entropy(output.logits, batch.labels)
    if output.baseline is not None:
        return _rl_loss(output, batch, config, classification, per_pair, per_step)
    if output.transition_logits is None:
        return Loss(per_pair * classification, classification, None)
    transition = F.cross_entropy(
        output.transition_logits.reshape(-1, N_ACTIONS), batch.transitions.reshape(-1), ignore_index=PAD_TRANSITION
    )
    total = per_pair * classification + per_step * config.transition_loss_weight * transition
    return Loss(total, classification, transition)


def _rl_loss(
    output: SPINNOutput, batch: Batch, config: SPINNConfig, classification: Tensor, per_pair, per_step
) -> Loss:
    terms = reinforce(
        output.transition_logits,
        output.transitions,
        output.logits,
        batch.labels,
        output.baseline,
        config.reward,
        config.baseline == "value",
    )
    pair_terms = classification + config.policy_weight * terms.loss
    if terms.value_loss is not None:
        pair_terms = pair_terms + terms.value_loss
    total = per_pair * pair_terms - per_step * config.entropy_weight * terms.entropy
    supervised = None
    if config.transition_loss_weight > 0:
        # The gold action at each step, on the sampled path's states (the paths part once a sample differs).
        gold = _legal_gold(output.transition_logits, batch.transitions)  # (N, T)
        supervised = F.cross_entropy(
            output.transition_logits.reshape(-1, N_ACTIONS), gold.reshape(-1), ignore_index=PAD_TRANSITION
        )
        total = total + per_step * config.transition_loss_weight * supervised
    return Loss(total, classification, supervised, terms)


def _legal_gold(transition_logits: Tensor, transitions: Tensor) -> Tensor:
    """(N, T) the gold transitions, PAD_TRANSITION where the sampled path has made the gold action illegal (its
    score is -inf there: a cross-entropy against it would be infinite, and it teaches nothing)."""
    real = transitions != PAD_TRANSITION  # (N, T)
    scores = transition_logits.gather(-1, transitions.clamp(max=N_ACTIONS - 1).unsqueeze(-1)).squeeze(-1)  # (N, T)
    return torch.where(real & scores.isfinite(), transitions, PAD_TRANSITION)


def transition_counts(transition_logits: Tensor, transitions: Tensor) -> Tensor:
    """(N, 2) per sentence: [real steps, steps where the tracker's best legal action is the given one], on the
    device. transition_logits (N, T, 2), transitions (N, T) padded with PAD_TRANSITION.

    On a predicted-transitions run the best legal action is the one that ran,
    so the same count scores both modes. Counts, not a ratio, so callers can
    weigh and sum them over sentences and batches and read them once.
    """
    real = transitions != PAD_TRANSITION  # (N, T)
    correct = (transition_logits.argmax(-1) == transitions) & real  # (N, T)
    return torch.stack([real.sum(1), correct.sum(1)], 1)  # (N, 2)


def random_vectors(vocab_size: int, d_embed: int, seed: int = 0) -> Tensor:
    """Random word vectors (benchmarks, tests): N(0, 1/E) like a normalized pretrained table."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(vocab_size, d_embed, generator=generator) / d_embed**0.5
