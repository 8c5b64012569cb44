"""The flows' parameters: the stages' own settings models, every field optional, as typed forms.

A flow parameter never restates a setting. Each request names the params file
and carries the stages' `overrides()` models (spinn.ground.settings): the same fields,
types and help texts as the CLI's options and params.yaml's sections, every
one optional; what is left empty comes from the params file, else the stage's
default. Each request resolves its settings when it is made, so a misspelt
key, an unknown variant or a params file that does not build fails the run at
submission (Prefect's ParameterTypeError), not an hour into preparing data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spinn.data.download import CORPORA, DownloadSettings, for_chosen_corpus
from spinn.data.embeddings import EmbeddingSettings
from spinn.data.prepare import PrepareSettings
from spinn.data.vocab import VocabSettings
from spinn.evaluation.evaluate import EvaluateSettings
from spinn.ground.errors import SpinnError, redact
from spinn.ground.settings import DEFAULT_PARAMS, Layer, Settings
from spinn.training.train_config import TrainConfig

DEFAULT_MODEL = "models:/spinn@champion"
PARAMS_HELP = "params.yaml whose sections set what is left empty here (null: the defaults only)."

DownloadOverrides = DownloadSettings.overrides()
PrepareOverrides = PrepareSettings.overrides()
VocabOverrides = VocabSettings.overrides()
EmbeddingOverrides = EmbeddingSettings.overrides()
TrainOverrides = TrainConfig.overrides()
EvaluateOverrides = EvaluateSettings.overrides()


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


def _resolved(model: type[Settings], params: Path | None, overrides: BaseModel, field: str) -> Any:
    """The stage's settings from the params file and the overrides (the request's `field`, by which a bad
    value is named); problems as the ValueError pydantic reports, so Prefect refuses the run before it starts."""
    if params is not None and not Path(params).is_file():
        raise ValueError(f"params {params}: no such file (run from the project folder, or set params to null)")
    given = Layer(overrides.model_dump(exclude_none=True), lambda key: f"{field}.{key}")
    try:
        return model.from_params(params, given)
    except SpinnError as error:
        raise ValueError(str(error)) from None


class CorpusStages(NamedTuple):
    download: DownloadSettings
    prepare: PrepareSettings
    vocab: VocabSettings
    embeddings: EmbeddingSettings


class CorpusRequest(_Request):
    """Which corpus, how each data stage runs, and where the data goes."""

    params: Path | None = Field(DEFAULT_PARAMS, description=PARAMS_HELP)
    data_dir: Path = Field(
        Path("data"), description="raw/, prepared/, embeddings/ and runs/ (one folder per training run) go here."
    )
    download: DownloadOverrides = Field(default_factory=DownloadOverrides)  # type: ignore[valid-type]
    prepare: PrepareOverrides = Field(default_factory=PrepareOverrides)  # type: ignore[valid-type]
    vocab: VocabOverrides = Field(default_factory=VocabOverrides)  # type: ignore[valid-type]
    embeddings: EmbeddingOverrides = Field(default_factory=EmbeddingOverrides)  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _stages_resolve(self) -> CorpusRequest:
        self.stages()
        return self

    @model_validator(mode="after")
    def _no_credentials(self) -> CorpusRequest:
        """Flow parameters are stored in Prefect's database and shown in its UI: a URL's credentials come
        only from the worker's environment."""
        url = self.download.model_dump(exclude_none=True).get("url")
        if url is not None and redact(url) != url:
            raise ValueError(
                f"download url {redact(url)}: credentials in a flow parameter are stored in Prefect's database; "
                "set SPINN_DOWNLOAD_URL in the worker's environment instead"
            )
        return self

    def stages(self) -> CorpusStages:
        download = _resolved(DownloadSettings, self.params, self.download, "download")
        prepare = _resolved(PrepareSettings, self.params, self.prepare, "prepare")
        written = _resolved(DownloadSettings, self.params, DownloadOverrides(), "download")
        if download.corpus != written.corpus:  # the params file's archive and splits name the other corpus's files
            download = for_chosen_corpus(download, written, archive_given=self.download.archive is not None)
            if self.prepare.splits is None:
                prepare = prepare.replace(splits=CORPORA[download.corpus].splits)
        return CorpusStages(
            download,
            prepare,
            _resolved(VocabSettings, self.params, self.vocab, "vocab"),
            _resolved(EmbeddingSettings, self.params, self.embeddings, "embeddings"),
        )

    def split_files(self, stages: CorpusStages) -> dict[str, str]:
        return stages.prepare.splits or CORPORA[stages.download.corpus].splits

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


class TrainRequest(_Request):
    """How to train: the train settings (params.yaml's `train` under these), and what to do with the run."""

    params: Path | None = Field(DEFAULT_PARAMS, description=PARAMS_HELP)
    settings: TrainOverrides = Field(default_factory=TrainOverrides)  # type: ignore[valid-type]
    resume: bool = Field(
        False,
        description=(
            "Continue from last.pt in the run's folder (runs/): a killed run in its MLflow run, a finished one "
            "in a new MLflow run linked to it."
        ),
    )
    overwrite: bool = Field(
        False,
        description="Replace the run in its folder under runs/ (without it or resume, that folder is refused).",
    )
    register_model: bool = Field(True, description="Register the model; move the alias when it beats the champion.")
    run_name: str | None = Field(None, description="MLflow run name.")

    @model_validator(mode="after")
    def _config_resolves(self) -> TrainRequest:
        self.config()
        return self

    def config(self) -> TrainConfig:
        return _resolved(TrainConfig, self.params, self.settings, "settings")


class EvaluateRequest(_Request):
    """Which model to score on which prepared split, and how."""

    params: Path | None = Field(DEFAULT_PARAMS, description=PARAMS_HELP)
    model: str = Field(DEFAULT_MODEL, description="A checkpoint path or an MLflow model URI.")
    data: Path = Path("data/prepared/test.parquet")
    output: Path | None = Field(
        None, description="The metrics file (none: data/evaluations/<time>-<model>/metrics.json, never DVC's)."
    )
    settings: EvaluateOverrides = Field(default_factory=EvaluateOverrides)  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _settings_resolve(self) -> EvaluateRequest:
        self.evaluation()
        return self

    def evaluation(self) -> EvaluateSettings:
        return _resolved(EvaluateSettings, self.params, self.settings, "settings")
