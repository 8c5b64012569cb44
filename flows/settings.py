"""Typed, validated parameters of the flows (what the Prefect UI shows as the run form).

Each model checks what it can before any work starts, with messages that name
the setting: a training override is turned into the full TrainConfig here, so
a misspelt key or an unknown variant fails the run at submission, not an hour
into preparing data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spinn.config import TrainConfig, load_train_config, read_params_section
from spinn.download import CORPORA, Checksum, lookup_corpus
from spinn.errors import SpinnError

DEFAULT_PARAMS = Path("params.yaml")
DEFAULT_MODEL = "models:/spinn@champion"
VOCAB_SETTINGS = frozenset({"lowercase", "min_freq", "max_size"})


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class CorpusSettings(_Settings):
    """Which corpus, where it comes from, and where its prepared splits go."""

    corpus: Literal["snli", "multinli"] = "snli"
    url: str | None = Field(None, description="A mirror of the official archive (default: the official address).")
    file: Path | None = Field(None, description="A local copy of the archive instead of downloading.")
    checksum: str | None = Field(None, description="sha256:HEX of a mirror's archive (default: the published one).")
    data_dir: Path = Field(Path("data"), description="raw/, prepared/, embeddings/, models/ and metrics/ go here.")
    splits: dict[str, str] | None = Field(None, description="Split -> file in the archive (default: the corpus's).")
    max_reject_ratio: float = Field(0.01, ge=0, le=1)
    workers: int | None = Field(None, ge=1, description="Parsing processes (default: CPU count, at most 4).")

    @field_validator("checksum")
    @classmethod
    def _checksum_parses(cls, value: str | None) -> str | None:
        if value is not None:
            _user_error(Checksum.parse, value)
        return value

    @model_validator(mode="after")
    def _one_source(self) -> CorpusSettings:
        if self.url is not None and self.file is not None:
            raise ValueError("give url (a mirror) or file (a local copy), not both")
        missing = {"train", "dev", "test"} - set(self.split_files)
        if missing:
            raise ValueError(f"splits must name train, dev and test; missing {sorted(missing)}")
        return self

    @property
    def split_files(self) -> dict[str, str]:
        return self.splits or CORPORA[self.corpus].splits

    @property
    def archive(self) -> Path:
        return self.raw_dir / lookup_corpus(self.corpus).filename

    @property
    def raw_dir(self) -> Path:
        return self.data_dir / "raw"

    @property
    def prepared_dir(self) -> Path:
        return self.data_dir / "prepared"

    @property
    def vocab_path(self) -> Path:
        return self.prepared_dir / "vocab.json"

    @property
    def embeddings_dir(self) -> Path:
        return self.data_dir / "embeddings"

    def split_path(self, split: str) -> Path:
        return self.prepared_dir / f"{split}.parquet"


class TrainSettings(_Settings):
    """The params file's `train` and `embeddings` sections, plus overrides by dotted key."""

    config: Path | None = Field(DEFAULT_PARAMS, description="params.yaml; null: the paper's settings only.")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description='e.g. {"model.variant": "spinn", "max_steps": 2000}')
    resume: bool = Field(False, description="Continue from models/last.pt in the same MLflow run.")
    register_model: bool = Field(True, description="Register the model; move the alias when it beats the champion.")
    run_name: str | None = None

    @model_validator(mode="after")
    def _config_builds(self) -> TrainSettings:
        if self.config is not None and not Path(self.config).is_file():
            raise ValueError(f"config {self.config}: no such params file (run from the project folder, "
                             "or set config to null for the paper's settings)")
        self.vocab_settings()
        self.train_config()
        return self

    def vocab_settings(self) -> dict[str, Any]:
        """The params file's `vocab` section (lowercase, min_freq, max_size), as `spinn vocab --config` reads it."""
        settings = read_params_section(self.config, "vocab") if self.config is not None else {}
        unknown = sorted(set(settings) - VOCAB_SETTINGS)
        if unknown:
            raise ValueError(f"{self.config}: unknown vocab settings {unknown}; known: {sorted(VOCAB_SETTINGS)}")
        return settings

    def train_config(self) -> TrainConfig:
        overrides = [f"{key}={_yaml_value(value)}" for key, value in self.overrides.items()]
        return _user_error(load_train_config, self.config, overrides)


class EvaluateSettings(_Settings):
    """Which model to score on which prepared split."""

    model: str = Field(DEFAULT_MODEL, description="A checkpoint path or an MLflow model URI.")
    data: Path = Path("data/prepared/test.parquet")
    output: Path = Path("data/metrics/test.json")
    transitions: Literal["auto", "gold", "predicted"] = "auto"
    batch_size: int = Field(256, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"


def _yaml_value(value: Any) -> str:
    """Overrides travel as `key=value` text that the config reads as YAML; JSON is valid YAML."""
    import json

    return value if isinstance(value, str) else json.dumps(value)


def _user_error(function, *args):
    """Call a spinn check and re-raise its SpinnError as the ValueError pydantic reports."""
    try:
        return function(*args)
    except SpinnError as error:
        raise ValueError(str(error)) from None
