"""MLflow 3 logged models: the pyfunc model a run logs, its signature, and reading a version's files back.

Part of the tracking package, MLflow's one door; store.py opens the store and holds the lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spinn.ground.errors import SpinnError, unanswered
from spinn.tracking.store import CHECKPOINT_NAME, _client, _mlflow, _unless_missing, tracking_uri

LOGGED_MODEL_ARTIFACTS_DIR = "artifacts"
"""Where a pyfunc model keeps the files it was logged with (MLflow's layout: <model>/artifacts/<file>)."""
VALIDATE_KEYWORD = "validate_serving_input"
"""`Model.log`'s keyword for whether it checks that the input example serves."""


def _checkpoint_in(folder: Path) -> Path:
    """The checkpoint of a downloaded model: a logged model keeps it under artifacts/, a folder registered
    before logged models (release 0.1.0) at its top."""
    logged = folder / LOGGED_MODEL_ARTIFACTS_DIR / CHECKPOINT_NAME
    return logged if logged.is_file() else folder / CHECKPOINT_NAME


@dataclass(frozen=True)
class ColumnSpec:
    """One column of a model's signature: name, MLflow type name ('string', 'double'), whether always set."""

    name: str
    type: str
    required: bool = True


@dataclass(frozen=True)
class PythonModelSpec:
    """What a models-from-code pyfunc model is logged with; plain data, so callers need no MLflow."""

    name: str
    code: Path
    """The models-from-code file (it calls mlflow.models.set_model): MLflow copies and runs it, never pickles."""
    artifacts: dict[str, Path]
    inputs: list[ColumnSpec]
    outputs: list[ColumnSpec]
    input_example: list[dict[str, Any]]
    requirements: list[str]
    model_config: dict[str, Any]
    tags: dict[str, str]
    validate_example: bool
    """Whether MLflow checks, while logging, that the input example serves (it loads the model and predicts
    it): a cheap offline proof for a model that labels without a parser; for one that needs parses it would
    load Stanza in the middle of training (offline a "could not download" warning, online a download of
    Stanza's models), so such a model keeps its example unchecked."""


class _PyfuncFlavor:
    """mlflow.pyfunc as the flavor `Model.log` saves with, taking VALIDATE_KEYWORD. Model.log reads that
    keyword and hands all its keywords on to the flavor's save_model, which pyfunc's refuses (MLflow 3.17:
    `TypeError: save_model() got unexpected keyword arguments`), and pyfunc.log_model has no such keyword."""

    @staticmethod
    def save_model(**kwargs: Any) -> Any:
        import mlflow.pyfunc

        kwargs.pop(VALIDATE_KEYWORD)
        return mlflow.pyfunc.save_model(**kwargs)


def log_python_model(run_id: str, spec: PythonModelSpec, metrics: dict[str, float], step: int) -> str:
    """Log `spec` as an MLflow 3 logged model of `run_id` (its "Logged models"), with `metrics`, measured at
    `step`, linked to it; returns its model id. Works with or without `run_id` active (training, or re-logging
    later).

    The input example is always logged (MLflow's UI shows it); it is checked to serve only when
    `spec.validate_example`, and a failed check is MLflow's warning: the model is logged all the same.
    `Model.log` with the pyfunc flavor is what pyfunc.log_model calls, plus that one keyword."""
    import pandas as pd

    mlflow = _mlflow(write=True)
    from mlflow.entities import LoggedModelOutput
    from mlflow.models import Model

    client = mlflow.MlflowClient()
    experiment_id = client.get_run(run_id).info.experiment_id
    model = mlflow.initialize_logged_model(
        name=spec.name, source_run_id=run_id, tags=spec.tags, experiment_id=experiment_id
    )
    Model.log(
        artifact_path=None,
        flavor=_PyfuncFlavor,
        name=spec.name,
        python_model=str(spec.code),
        artifacts={key: str(path) for key, path in spec.artifacts.items()},
        model_config=spec.model_config,
        signature=_signature(spec.inputs, spec.outputs),
        input_example=pd.DataFrame(spec.input_example),
        pip_requirements=spec.requirements,
        model_id=model.model_id,
        **{VALIDATE_KEYWORD: spec.validate_example},
    )
    active = mlflow.active_run()
    if active is None or active.info.run_id != run_id:  # an active run_id got the link from log_model
        client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
    for key, value in metrics.items():
        _link_metric(client, run_id, model.model_id, key, float(value), step)
    return model.model_id


def _link_metric(client, run_id: str, model_id: str, key: str, value: float, step: int) -> None:
    """Link a metric to the model as the run's point at `step`: the very point the run logged there (its
    timestamp too, so MLflow keeps one point and the run's curve gets no second one), else a new one."""
    from mlflow.utils.time import get_current_time_millis

    logged = [point for point in client.get_metric_history(run_id, key) if (point.step, point.value) == (step, value)]
    timestamp = logged[0].timestamp if logged else get_current_time_millis()
    client.log_metric(run_id, key, value, timestamp=timestamp, step=step, model_id=model_id)


def _signature(inputs: list[ColumnSpec], outputs: list[ColumnSpec]):
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    def schema(columns: list[ColumnSpec]) -> Schema:
        return Schema([ColSpec(column.type, column.name, required=column.required) for column in columns])

    return ModelSignature(inputs=schema(inputs), outputs=schema(outputs))


def logged_model_of_run(run_id: str, tag: str, value: str) -> str | None:
    """The id of the newest complete logged model of `run_id` whose `tag` is `value`, or None (one whose
    logging was cut short stays PENDING and is passed over)."""
    from mlflow.entities import LoggedModelStatus

    client = _client()
    experiment_id = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models(
        experiment_ids=[experiment_id],
        filter_string=f"source_run_id = '{run_id}' AND tags.`{tag}` = '{value}'",
        order_by=[{"field_name": "creation_time", "ascending": False}],
    )
    return next((model.model_id for model in found if model.status == LoggedModelStatus.READY), None)


@dataclass(frozen=True)
class VersionInfo:
    """A registered version as re-registering needs it."""

    name: str
    version: str
    source: str
    run_id: str | None
    tags: dict[str, str]
    description: str
    aliases: list[str]

    @property
    def is_logged_model(self) -> bool:
        """Registered from a logged model (source `models:/m-...`), not from a folder of files."""
        return self.source.startswith("models:/")


def version_info(name: str, version: str) -> VersionInfo:
    client = _client()
    found = _unless_missing(lambda: client.get_model_version(name, version))
    if found is None:
        raise SpinnError(f"models:/{name}/{version}: no such version in {tracking_uri()}")
    aliases = [alias for alias, target in client.get_registered_model(name).aliases.items() if str(target) == version]
    return VersionInfo(
        name,
        str(found.version),
        found.source,
        found.run_id or None,
        dict(found.tags),
        found.description or "",
        sorted(aliases),
    )


def download_model(uri: str, destination: Path) -> Path:
    """A registered or logged model's files, downloaded into `destination`; returns their folder."""
    mlflow = _mlflow()
    try:
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(destination)))
    except Exception as error:  # MlflowException, OSError: report the URI and the store
        silent = unanswered(error)
        if silent is not None:
            raise SpinnError(f"{uri}: {silent}") from None
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SpinnError(f"{uri}: cannot fetch the model from {tracking_uri()} ({reason})") from None


def download_checkpoint(uri: str, destination: Path) -> Path:
    """Fetch a registered or logged model folder (`models:/spinn@champion`) and return its checkpoint."""
    local = download_model(uri, destination)
    checkpoint = _checkpoint_in(local) if local.is_dir() else local
    if not checkpoint.is_file():
        raise SpinnError(f"{uri}: no {CHECKPOINT_NAME} in the model folder")
    return checkpoint
