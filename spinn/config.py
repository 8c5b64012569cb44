"""Training configuration: one typed object, read from params.yaml and command-line overrides.

params.yaml keeps one section per stage (DVC's convention); `spinn train`
reads `train` (with its nested `model`) and `embeddings`. Anything left
unset falls back to the paper's setting for the chosen variant, so
`variant: spinn` alone reproduces Bowman et al. (2016)'s optimiser, dropout,
tracker size and classifier depth.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from spinn.errors import SpinnError
from spinn.model import PRESETS, SPINNConfig

# Bowman et al. 2016, appendix table of tuned hyperparameters (300D models): initial
# learning rate and L2 strength per variant. `cbow` takes the paper's sequence
# baseline's values, the closest model it tuned.
PAPER_OPTIMIZATION: dict[str, tuple[float, float]] = {
    "cbow": (5e-3, 4e-6),
    "pi-nt": (3e-4, 3e-6),
    "pi": (7e-3, 2e-5),
    "spinn": (2e-3, 3e-5),
    "rl": (2e-3, 3e-5),  # not in the paper: spinn's, the model it extends
}
PAPER_MODELS: dict[str, str] = {"pi-nt": "spinn-pi-nt-300d", "pi": "spinn-pi-300d", "spinn": "spinn-300d",
                                "cbow": "spinn-pi-nt-300d", "rl": "rl-300d"}
OOV_POLICIES = ("random", "zeros")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run; logged to MLflow and stored in checkpoints."""

    model: SPINNConfig = field(default_factory=lambda: PRESETS["spinn-pi-300d"])
    embeddings: str = "glove-6b-50d"
    oov: str = "random"
    embeddings_seed: int = 1234
    """Seeds the random vectors of words without one; apart from `seed` so the embeddings stage owns it."""
    learning_rate: float = PAPER_OPTIMIZATION["pi"][0]
    weight_decay: float = PAPER_OPTIMIZATION["pi"][1]
    lr_decay: float = 0.75
    lr_decay_steps: int = 10_000
    clip_norm: float = 5.0
    batch_size: int = 32
    max_epochs: int = 10
    max_steps: int | None = None
    eval_every: int = 1_000
    log_every: int = 50
    patience: int = 10
    checkpoint_every: int = 1_000
    seed: int = 1234
    device: str = "auto"
    amp: bool = True
    threads: int | None = None
    experiment: str = "spinn"
    registered_model: str = "spinn"
    alias: str = "champion"

    def __post_init__(self) -> None:
        if self.oov not in OOV_POLICIES:
            raise SpinnError(f"train.oov must be one of {OOV_POLICIES}, got {self.oov!r}")
        if self.device not in DEVICES:
            raise SpinnError(f"train.device must be one of {DEVICES}, got {self.device!r}")
        for name in ("batch_size", "max_epochs", "eval_every", "log_every", "checkpoint_every", "lr_decay_steps"):
            if getattr(self, name) < 1:
                raise SpinnError(f"train.{name} must be at least 1, got {getattr(self, name)}")
        if self.learning_rate <= 0 or not 0 < self.lr_decay <= 1:
            raise SpinnError(f"need learning_rate > 0 and 0 < lr_decay <= 1, got {self.learning_rate}, {self.lr_decay}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        data = dict(data)
        model = SPINNConfig.from_dict(data.pop("model"))
        return cls(model=model, **data)

    def flat(self) -> dict[str, Any]:
        """`model.d_hidden`-style keys, for MLflow params."""
        flat = {f"model.{key}": value for key, value in self.model.to_dict().items()}
        flat.update({key: value for key, value in self.to_dict().items() if key != "model"})
        return flat


def load_train_config(path: Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """params.yaml's `train` and `embeddings` sections, then `key=value` overrides (dotted keys)."""
    train = read_params_section(path, "train") if path is not None else {}
    embeddings = read_params_section(path, "embeddings") if path is not None else {}
    for key, value in (("embeddings", embeddings.get("source")), ("oov", embeddings.get("oov")),
                       ("embeddings_seed", embeddings.get("seed"))):
        if value is not None:
            train.setdefault(key, value)
    for override in overrides or []:
        _apply_override(train, override)
    return build_train_config(train)


def build_train_config(train: dict[str, Any]) -> TrainConfig:
    """Fill what `train` leaves unset from the paper's settings for its variant."""
    train = dict(train)
    model_settings = dict(train.pop("model", None) or {})
    preset = model_settings.pop("preset", None)
    variant = model_settings.get("variant", "pi")
    if variant not in PAPER_OPTIMIZATION:
        raise SpinnError(f"train.model.variant must be one of {sorted(PAPER_OPTIMIZATION)}, got {variant!r}")
    preset_name = preset or PAPER_MODELS[variant]
    if preset_name not in PRESETS:
        raise SpinnError(f"train.model.preset must be one of {sorted(PRESETS)}, got {preset_name!r}")
    model = replace(PRESETS[preset_name], **_known(SPINNConfig, model_settings, "train.model"))
    learning_rate, weight_decay = PAPER_OPTIMIZATION[variant]
    train.setdefault("learning_rate", learning_rate)
    train.setdefault("weight_decay", weight_decay)
    return TrainConfig(model=model, **_known(TrainConfig, train, "train"))


def _known(cls: type, settings: dict[str, Any], section: str) -> dict[str, Any]:
    names = {f.name for f in fields(cls)} - {"model"}
    unknown = sorted(set(settings) - names)
    if unknown:
        raise SpinnError(f"unknown {section} settings {unknown}; known: {sorted(names)}")
    return settings


def read_params_section(path: Path, section: str) -> dict[str, Any]:
    """One stage's section of params.yaml (empty when absent), checked to be a mapping."""
    value = _read_params(path).get(section)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpinnError(f"{path}: section {section!r} must be a mapping, got {type(value).__name__}")
    return dict(value)


def _read_params(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise SpinnError(f"{path}: no such params file") from None
    except yaml.YAMLError as error:
        raise SpinnError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SpinnError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def parse_override(override: str) -> tuple[str, Any]:
    """`model.d_hidden=100` -> ("model.d_hidden", 100): the value read as YAML."""
    key, separator, text = override.partition("=")
    if not separator or not key.strip():
        raise SpinnError(f"override {override!r}: expected KEY=VALUE, e.g. model.d_hidden=100")
    return key.strip(), yaml.safe_load(text)


def _apply_override(train: dict[str, Any], override: str) -> None:
    """`model.d_hidden=100` sets train['model']['d_hidden'] = 100."""
    key, value = parse_override(override)
    *parents, leaf = key.split(".")
    target = train
    for parent in parents:
        target = target.setdefault(parent, {})
        if not isinstance(target, dict):
            raise SpinnError(f"override {override!r}: {parent} is not a section")
    target[leaf] = value
