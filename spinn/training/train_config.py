"""Training configuration: one typed object, read from params.yaml, flow parameters and command-line options.

params.yaml keeps one section per stage (DVC's convention); a training run
reads `train` (with its nested `model`) and `embeddings`, the vectors the
embeddings stage aligned. Anything left unset falls back to the paper's
setting for the chosen variant, so `variant: spinn` alone reproduces Bowman
et al. (2016)'s optimiser, dropout, tracker size and classifier depth.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from spinn.data.embeddings import EmbeddingSettings
from spinn.ground.memory import gib, usable_memory
from spinn.ground.settings import (
    AUTO,
    Conflict,
    Device,
    Layer,
    Settings,
    ThreadCount,
    count_or_auto,
    deep_merge,
    flatten,
    params_layer,
)
from spinn.model.config import DEFAULT_VARIANT, VARIANTS, SPINNConfig
from spinn.model.presets import PRESETS
from spinn.training.train_step import Schedule

REFERENCE_BATCH_SIZE = 32
"""The paper's batch size, at which its learning rates and decay interval were tuned."""
GPU_BATCH_SIZE = 256
"""batch_size auto on a GPU: large enough to keep it busy. With the square-root rule and a warmup it came
within one point of the paper's 32 at an equal epoch budget (scripts/large_batch_recipe.py; README)."""
FROM_VARIANT = {"default_from": "the paper's value for the variant"}
"""Marks fields whose default depends on model.variant (the CLI's help says so)."""


EVALS_PER_EPOCH = 4
"""eval_every auto: at least this many dev evaluations per epoch, so a small corpus still gets a dev curve,
best-model selection and early stopping."""
MAX_AUTO_EVAL_EVERY = 1_000
"""eval_every auto on a large corpus: the paper-scale interval (SNLI at batch 32 has 17,193 steps an epoch)."""


TRAINING_BYTES_PER_WEIGHT = 16
"""fp32 weight, gradient and the optimizer's two moments."""
MODEL_MEMORY_SHARE = 2
"""The training state may take at most 1/MODEL_MEMORY_SHARE of the memory: the rest is for batches."""
SIZE_FIELDS = ("d_hidden", "mlp_dim", "d_tracker", "d_embed", "mlp_layers")
"""The model's sizes, in the order a refusal blames the first one the user set."""
RUN_LENGTH = frozenset({"max_epochs", "max_steps", "patience", "eval_every", "checkpoint_every", "log_every"})
"""Settings that say how long a run goes on and when it looks at itself: a resumed run may change them."""
RUN_PLACE = frozenset({"device", "threads", "processes", "graphs", "experiment", "registered_model", "alias"})
"""Settings that say where a run computes and where it is recorded, not what it learns."""
NOT_IDENTITY = RUN_LENGTH | RUN_PLACE
"""The one declaration of what a run's identity leaves out: its folder's digest and the check that a resumed
run still learns the same both read `TrainConfig.identity()`."""


RL_ONLY = ("reward", "baseline", "baseline_decay", "policy_weight", "entropy_weight")
VARIANT_PARAMS: dict[str, frozenset[str]] = {
    **{f"model.{name}": frozenset({"rl"}) for name in RL_ONLY},
    "model.transition_loss_weight": frozenset({"spinn", "rl"}),
    "model.d_tracker": frozenset({"pi", "spinn", "rl"}),
}
"""Model settings that only some variants use: MLflow params leave them out of other variants' runs, where a
value would suggest it mattered."""


BatchSize = count_or_auto("pairs")
StepCount = count_or_auto("steps")


class TrainConfig(Settings):
    """Every setting of a training run; logged to MLflow and stored in checkpoints."""

    section: ClassVar[str] = "train"

    model: SPINNConfig = Field(default_factory=lambda: PRESETS[DEFAULT_VARIANT].model, json_schema_extra=FROM_VARIANT)
    """The model; fields left unset take the paper's preset for its variant."""
    embeddings: EmbeddingSettings = EmbeddingSettings()
    """The word vectors (params.yaml's `embeddings` section: the embeddings stage cached them)."""
    learning_rate: float = Field(PRESETS[DEFAULT_VARIANT].learning_rate, gt=0, json_schema_extra=FROM_VARIANT)
    """RMSprop's initial learning rate at the paper's batch of 32 (lr_scaling adapts it to batch_size)."""
    weight_decay: float = Field(PRESETS[DEFAULT_VARIANT].weight_decay, ge=0, json_schema_extra=FROM_VARIANT)
    """L2 strength."""
    lr_decay: float = Field(0.75, gt=0, le=1)
    """Learning-rate factor applied every lr_decay_steps."""
    lr_decay_steps: int = Field(10_000, ge=1)
    """Steps of 32 pairs between learning-rate decays (scaled to batch_size)."""
    clip_norm: float = Field(5.0, gt=0)
    """Gradient norm clipping."""
    batch_size: BatchSize = 32
    """Pairs per optimizer step; auto: 256 on a GPU (the large-batch recipe), the paper's 32 on a CPU."""
    lr_scaling: Literal["none", "sqrt", "linear"] = "sqrt"
    """How learning_rate, tuned for the paper's batch of 32, scales to another batch size (and the decay
    interval with it, so the schedule follows the pairs seen, not the steps)."""
    warmup_pairs: int = Field(0, ge=0)
    """Pairs over which the learning rate rises linearly from zero (0: no warmup)."""
    graphs: bool = True
    """On a GPU, capture each batch shape's training step in a CUDA graph and replay it."""
    processes: int = Field(1, ge=1)
    """Training processes on this node (torchrun; each on its own GPU, or gloo on the CPU); batch_size stays
    the global batch, shared among them."""
    max_epochs: int = Field(10, ge=1)
    """Stop after this many passes over the training split."""
    max_steps: int | None = Field(None, ge=1)
    """Stop after this many optimizer steps (none: only max_epochs)."""
    eval_every: StepCount = AUTO
    """Steps between dev evaluations (early stopping, best.pt); auto: min(1000, steps per epoch // 4), at
    least 1, so every epoch is evaluated at least four times."""
    log_every: int = Field(50, ge=1)
    """Steps between training-metric logs."""
    patience: int = Field(10, ge=1)
    """Dev evaluations without improvement before stopping early."""
    checkpoint_every: int = Field(1_000, ge=1)
    """Steps between writes of last.pt."""
    seed: int = 1234
    """Seeds initialization, batch order and dropout."""
    device: Device = "auto"
    """auto: the GPU when there is one."""
    amp: bool = True
    """bf16 autocast on GPU (cell state stays fp32)."""
    threads: ThreadCount = AUTO
    """torch intra-op threads on CPU; auto: the cores other work leaves free, within this process's share of the
    cores it may use (a torchrun rank's: OMP_NUM_THREADS), followed as they change (spinn/ground/cores.py)."""
    experiment: str = "spinn"
    """MLflow experiment."""
    registered_model: str = "spinn"
    """MLflow registered model name."""
    alias: str = "champion"
    """Registry alias moved to a new version that beats it on dev accuracy."""

    @field_validator("model")
    @classmethod
    def _model_fits_in_memory(cls, model: SPINNConfig) -> SPINNConfig:
        return check_trainable(model, SIZE_FIELDS)

    @model_validator(mode="before")
    @classmethod
    def _paper_defaults(cls, data: Any) -> Any:
        """Fill what is unset from the paper's settings for the chosen variant (and read old checkpoints)."""
        if not isinstance(data, dict):
            return data
        data = _migrate_flat_embeddings(dict(data))
        if "threads" in data and data["threads"] is None:  # before auto, none said it
            data["threads"] = AUTO
        model = data.get("model", {})
        if isinstance(model, SPINNConfig):
            model = model.model_dump()
        if not isinstance(model, dict):  # `--set model=3`: the model field's own validation names it
            return data
        variant = model.get("variant", DEFAULT_VARIANT)
        if variant in VARIANTS:  # else the model's own validation names the field
            preset = PRESETS[variant]
            data["model"] = deep_merge(preset.model.model_dump(), model)
            data.setdefault("learning_rate", preset.learning_rate)
            data.setdefault("weight_decay", preset.weight_decay)
        return data

    @classmethod
    def from_params(cls, path: Path | None, *overrides: dict[str, Any] | Layer) -> TrainConfig:
        """params.yaml's `train` section over its `embeddings` section (the vectors the embeddings stage
        aligned), then the overrides (nested dicts or layers, later ones win)."""
        if path is None:
            return cls.build(*overrides)
        vectors = params_layer(path, EmbeddingSettings.section, under="embeddings")
        return cls.build(vectors, params_layer(path, cls.section), *overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """A checkpoint's stored config; its threads said where it ran (RUN_PLACE), so they are not checked
        against this machine's cores."""
        return cls.build({key: value for key, value in data.items() if key != "threads"}, where="train config")

    def resolved(self, device: str, train_pairs: int) -> TrainConfig:
        """The config with its autos decided: `batch_size` for the device the run uses ("cuda" or "cpu"),
        then `eval_every` for the steps an epoch of `train_pairs` takes at that batch size."""
        config = self
        if config.batch_size == AUTO:
            config = config.replace(batch_size=GPU_BATCH_SIZE if device == "cuda" else REFERENCE_BATCH_SIZE)
        if config.eval_every == AUTO:
            config = config.replace(eval_every=auto_eval_every(train_pairs, config.batch_size))
        return config

    def schedule(self) -> Schedule:
        """The learning-rate schedule of this (resolved) batch size: the paper's, scaled to its batch."""
        ratio = self.batch_size / REFERENCE_BATCH_SIZE
        scale = {"none": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[self.lr_scaling]
        return Schedule(
            base=self.learning_rate * scale,
            decay=self.lr_decay,
            decay_steps=max(1, round(self.lr_decay_steps / ratio)),
            warmup_steps=-(-self.warmup_pairs // self.batch_size),
        )

    def identity(self) -> dict[str, Any]:
        """The settings that make the model what it is (NOT_IDENTITY aside): equal for two runs of one folder."""
        return {key: value for key, value in self.to_dict().items() if key not in NOT_IDENTITY}

    def same_run_as(self, saved: TrainConfig) -> bool:
        """This config asks for the run `saved` (a checkpoint's resolved config) was: same identity and length,
        a setting left auto here matching whatever the run decided. The embedding size is the vectors' (the
        `embeddings` settings, compared), whatever the preset said."""
        mine = self.replace(model=self.model.replace(d_embed=saved.model.d_embed)).to_dict()
        theirs = saved.to_dict()
        compared = set(self.identity()) | RUN_LENGTH
        return all(mine[key] in (AUTO, theirs.get(key)) for key in compared)

    def flat(self) -> dict[str, Any]:
        """`model.d_hidden`-style keys, for MLflow params: the settings this variant uses (VARIANT_PARAMS)."""
        variant = self.model.variant
        return {
            key: value
            for key, value in flatten(self.to_dict())
            if variant in VARIANT_PARAMS.get(key, frozenset({variant}))
        }


def check_trainable(model: SPINNConfig, sizes: tuple[str, ...]) -> SPINNConfig:
    """A model whose training state (weights, gradients, the optimizer's moments) would pass half this
    machine's memory is one line naming the size the user gave (the first of `sizes` set), not an allocator
    traceback: the one rule for `spinn train` and `spinn bench`."""
    needed = model.parameter_estimate() * TRAINING_BYTES_PER_WEIGHT
    if needed > usable_memory() // MODEL_MEMORY_SHARE:
        raise Conflict(
            f"a model this size needs about {gib(needed)} to train, more than 1/{MODEL_MEMORY_SHARE} of this "
            f"machine's memory ({gib(usable_memory())}); choose smaller sizes",
            *sizes,
        )
    return model


def auto_eval_every(train_pairs: int, batch_size: int) -> int:
    """Steps between dev evaluations when the config says auto: EVALS_PER_EPOCH per epoch, at most
    MAX_AUTO_EVAL_EVERY steps apart."""
    steps_per_epoch = -(-train_pairs // batch_size)
    return max(1, min(MAX_AUTO_EVAL_EVERY, steps_per_epoch // EVALS_PER_EPOCH))


def _migrate_flat_embeddings(data: dict[str, Any]) -> dict[str, Any]:
    """Release 0.1 stored the vectors as three flat train fields (embeddings, oov, embeddings_seed)."""
    if isinstance(data.get("embeddings"), str):
        data["embeddings"] = {"source": data["embeddings"]}
        if "oov" in data:
            data["embeddings"]["oov"] = data.pop("oov")
        if "embeddings_seed" in data:
            data["embeddings"]["seed"] = data.pop("embeddings_seed")
    return data
