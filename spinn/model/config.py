"""The model's settings: one frozen config per model, stored in every checkpoint (the paper's presets: presets.py)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from spinn.data.schema import LABELS
from spinn.ground.settings import Conflict, Settings
from spinn.model.policy import Baseline, Reward
from spinn.trees.transitions import Transition

Variant = Literal["pi-nt", "pi", "spinn", "rl", "cbow"]
EncoderKind = Literal["fused", "spec"]
VARIANTS: tuple[str, ...] = get_args(Variant)
BASELINE = "cbow"
TREE_VARIANTS = tuple(variant for variant in VARIANTS if variant != BASELINE)
DEFAULT_VARIANT: Variant = "spinn"
"""The variant when none is named, for a model and a training run alike: params.yaml's, the one that labels
without a parser (README, "Which variant ships")."""
N_ACTIONS = len(Transition)


class TransitionSource(str, Enum):
    """Where an encoder's SHIFT/REDUCE decisions come from; callers say which, nothing infers it.

    A parser's trees (`gold`) need a plan built from the batch's transitions; `greedy` and
    `sampled` need a tracker that predicts transitions (spinn, rl): `greedy` takes its best
    legal action (evaluation, labelling without a parser), `sampled` draws from its policy
    (rl while training)."""

    GOLD = "gold"
    GREEDY = "greedy"
    SAMPLED = "sampled"


class EncoderLoop(str, Enum):
    """Which loop runs an encoding; each caller names one (SPINN.forward and SPINN.encode default to the
    model's own `encoder`, the loop it trains with).

    `spec` is the readable loop that autograd differentiates; `fused` the thin stack with its backward
    written out, every sentence at every step (fixed shapes: training, CUDA graphs); `fused_compact` the same
    loops composing only the REDUCEs of gold transitions, with a node row for each (CPU training: shapes vary
    by step); `cpu_inference` computes only the rows that are read, without gradients (CPU evaluation and
    labelling, int8)."""

    SPEC = "spec"
    FUSED = "fused"
    FUSED_COMPACT = "fused_compact"
    CPU_INFERENCE = "cpu_inference"


class SPINNConfig(Settings):
    """Every hyperparameter of the model; checkpoints store `to_dict()`."""

    variant: Variant = Field(DEFAULT_VARIANT, json_schema_extra={"cli": "--variant", "default_from": None})
    """cbow: bag of words; pi-nt: TreeLSTM over the parse; pi: plus a tracker; spinn: the tracker also
    predicts the transitions; rl: the tracker learns its own trees by REINFORCE."""
    encoder: EncoderKind = "fused"
    """fused: the thin stack with its hand-written backward (fast, spinn/model/thin_stack_forward.py);
    spec: the readable step loop that autograd differentiates (spinn/model/spec.py), tested equal to it.
    Checkpoints from before the choice load as fused."""
    d_embed: int = Field(300, ge=1)
    """Word vector size (taken from the vectors when training)."""
    d_hidden: int = Field(300, ge=1)
    """Size of every phrase vector (h and c each)."""
    d_tracker: int = Field(64, ge=0)
    """Tracker LSTM size (pi, spinn, rl)."""
    mlp_layers: int = Field(1, ge=0)
    """Hidden layers of the classifier MLP."""
    mlp_dim: int = Field(1024, ge=1)
    """Width of each classifier layer."""
    embed_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Drop probability on the projected word vectors."""
    mlp_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Drop probability in the classifier."""
    use_batch_norm: bool = False
    """Batch norm on the projected words and in the classifier, as the paper."""
    transition_loss_weight: float = Field(3.9, ge=0.0)
    """Weight of the tracker's transition loss (spinn; rl: optional supervision)."""
    n_classes: int = Field(len(LABELS), ge=1)
    """Output classes (entailment, neutral, contradiction)."""
    reward: Reward = "log_likelihood"
    """rl: log p(gold label), or correct (1/0)."""
    baseline: Baseline = "moving_average"
    """rl: a moving average of rewards, or value, a learned baseline on bag-of-words features."""
    baseline_decay: float = Field(0.99, ge=0.0, lt=1.0)
    """rl: moving-average decay."""
    policy_weight: float = 1.0
    """rl: weight of the REINFORCE term."""
    entropy_weight: float = 0.01
    """rl: bonus for exploring (subtracted from the loss)."""

    @model_validator(mode="before")
    @classmethod
    def _drop_retired_fields(cls, data: Any) -> Any:
        """Release 0.1 chose a compose strategy; the thin stack now always composes every row (its shapes
        stay fixed), so checkpoints that name one still load."""
        if isinstance(data, dict) and "compose" in data:
            data = {key: value for key, value in data.items() if key != "compose"}
        return data

    @model_validator(mode="after")
    def _tracker_has_a_size(self) -> SPINNConfig:
        if self.has_tracker and self.d_tracker < 1:
            raise Conflict(f"variant {self.variant} needs d_tracker >= 1, got {self.d_tracker}", "d_tracker", "variant")
        return self

    def parameter_estimate(self) -> int:
        """About how many weights the model trains (the frozen word vectors aside): the products of its sizes
        that dominate, for bounding what a machine can hold before anything is allocated."""
        d, t, m, classes = self.d_hidden, self.d_tracker, self.mlp_dim, self.n_classes
        projection = self.d_embed * 2 * d  # words to (h, c)
        compose = (2 * d + t) * 5 * d  # TreeLSTM gates from both children and the tracker
        tracker = (3 * d + t) * 4 * t  # LSTM gates from buffer top and two stack tops
        features = 4 * d  # [p; h; p - h; p * h]
        hidden = features * m + (self.mlp_layers - 1) * m * m + m * classes if self.mlp_layers else 0
        return projection + compose + tracker + (hidden or features * classes)

    @property
    def has_tracker(self) -> bool:
        return self.variant in ("pi", "spinn", "rl")

    @property
    def uses_trees(self) -> bool:
        return self.variant in TREE_VARIANTS

    @property
    def predicts_transitions(self) -> bool:
        return self.variant in ("spinn", "rl")

    @property
    def samples_transitions(self) -> bool:
        """rl: training samples its own trees (no gold transitions needed)."""
        return self.variant == "rl"

    @property
    def sources(self) -> tuple[TransitionSource, ...]:
        """The transition sources this variant can run: a parser's trees always; its own best or sampled
        actions only with a transition head (spinn: greedy; rl: greedy and sampled)."""
        if self.samples_transitions:
            return tuple(TransitionSource)
        if self.predicts_transitions:
            return (TransitionSource.GOLD, TransitionSource.GREEDY)
        return (TransitionSource.GOLD,)

    @property
    def loop(self) -> EncoderLoop:
        """The encoder loop this model trains with (fused, or spec)."""
        return EncoderLoop(self.encoder)

    @property
    def training_source(self) -> TransitionSource:
        """rl trains on the trees it samples; every other variant on the parser's."""
        return TransitionSource.SAMPLED if self.samples_transitions else TransitionSource.GOLD

    @property
    def evaluation_source(self) -> TransitionSource:
        """Dev evaluation while training: rl on its own best trees (it never needs a parse), others on gold."""
        return TransitionSource.GREEDY if self.samples_transitions else TransitionSource.GOLD

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SPINNConfig:
        """A checkpoint's stored config (every release's checkpoints hold the same fields)."""
        return cls.build(data, where="model config")
