"""MLflow, behind one door: runs, metrics, artifacts and the model registry.

The store is MLflow's default local sqlite file (`sqlite:///mlflow.db` in the
working directory) unless MLFLOW_TRACKING_URI says otherwise, so `mlflow ui`
run in the project shows every run. A registered model version points at the
run's `model/` artifact folder, which holds the plain checkpoint, the
vocabulary and the config: loading a model never unpickles anything
(`spinn.checkpoint` reads it with weights_only).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spinn.errors import SpinnError

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
MODEL_ARTIFACT_DIR = "model"
CHECKPOINT_NAME = "checkpoint.pt"
MODEL_URI_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")
MAX_PARAM_LENGTH = 500  # MLflow refuses longer param values


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI)


def _mlflow():
    """Import MLflow pointed at our store (imported lazily: it takes seconds)."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    return mlflow


@contextmanager
def run(experiment: str, run_name: str | None = None, run_id: str | None = None) -> Iterator[str]:
    """Start (or, with run_id, continue) a run; yields its id and ends it FAILED if the block raises."""
    mlflow = _mlflow()
    if run_id is None:
        mlflow.set_experiment(experiment)
    active = mlflow.start_run(run_id=run_id, run_name=None if run_id else run_name)
    try:
        yield active.info.run_id
    except BaseException:
        mlflow.end_run(status="FAILED")
        raise
    mlflow.end_run(status="FINISHED")


def log_params(params: dict[str, Any]) -> None:
    _mlflow().log_params({key: str(value)[:MAX_PARAM_LENGTH] for key, value in params.items()})


def set_tags(tags: dict[str, str]) -> None:
    _mlflow().set_tags(tags)


def log_metrics(metrics: dict[str, float], step: int) -> None:
    _mlflow().log_metrics({key: float(value) for key, value in metrics.items()}, step=step)


def _client():
    return _mlflow().MlflowClient()


def run_exists(run_id: str) -> bool:
    """Whether `run_id` is in this store (a checkpoint may come from another machine's store)."""
    try:
        _client().get_run(run_id)
    except Exception:  # MlflowException (RESOURCE_DOES_NOT_EXIST) or a store that cannot be read
        return False
    return True


def log_run_metrics(run_id: str, metrics: dict[str, float], step: int = 0) -> bool:
    """Add metrics to a finished run (e.g. test scores to the training run); False when it is not here."""
    if not run_exists(run_id):
        return False
    client = _client()
    for key, value in metrics.items():
        client.log_metric(run_id, key, float(value), step=step)
    return True


def tag_run(run_id: str, tags: dict[str, str]) -> None:
    client = _client()
    for key, value in tags.items():
        client.set_tag(run_id, key, value)


def metric_history(run_id: str, keys: list[str]) -> dict[str, dict[int, float]]:
    """`{key: {step: value}}`; where a resumed run logged a step twice, the later value wins."""
    client = _client()
    history: dict[str, dict[int, float]] = {}
    for key in keys:
        points = sorted(client.get_metric_history(run_id, key), key=lambda metric: metric.timestamp)
        history[key] = {point.step: point.value for point in points}
    return history


def run_summary(run_id: str) -> dict[str, Any]:
    """The run's experiment, name, status and latest metrics: what the Prefect artifacts show."""
    run = _client().get_run(run_id)
    return {"run_id": run_id, "experiment_id": run.info.experiment_id, "run_name": run.info.run_name,
            "status": run.info.status, "artifact_uri": run.info.artifact_uri, "metrics": dict(run.data.metrics),
            "tracking_uri": tracking_uri()}


def log_artifact(path: Path, artifact_dir: str | None = None) -> None:
    _mlflow().log_artifact(str(path), artifact_path=artifact_dir)


def log_model_files(files: list[Path]) -> None:
    """Put the checkpoint and its companions under the run's `model/` artifact folder."""
    for path in files:
        log_artifact(path, MODEL_ARTIFACT_DIR)


def git_commit(directory: Path = Path(".")) -> str:
    """The commit the code ran from ('unknown' outside git), for the run's tags."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True,
                                timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() or "unknown"


def register(name: str, run_id: str, tags: dict[str, str], description: str = "") -> str:
    """Register the run's `model/` folder as a new version of `name`, with `tags`; returns the version."""
    client = _client()
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        client.create_registered_model(name)
    run_info = client.get_run(run_id).info
    source = f"{run_info.artifact_uri}/{MODEL_ARTIFACT_DIR}"
    version = client.create_model_version(name, source, run_id=run_id, description=description, tags=tags)
    return str(version.version)


def versions_of_run(name: str, run_id: str) -> list[tuple[str, dict[str, str]]]:
    """(version, tags) of every version of `name` registered from `run_id`."""
    client = _client()
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        return []
    found = client.search_model_versions(filter_string=f"name = '{name}' and run_id = '{run_id}'")
    return [(str(version.version), dict(version.tags)) for version in found]


def _alias_target(name: str, alias: str):
    try:
        return _client().get_model_version_by_alias(name, alias)
    except Exception:  # MlflowException when either the model or the alias does not exist
        return None


def alias_version(name: str, alias: str) -> str | None:
    """The version behind `name@alias`, or None when the alias is not set yet."""
    target = _alias_target(name, alias)
    return None if target is None else str(target.version)


def alias_metric(name: str, alias: str, metric: str) -> float | None:
    """The metric recorded on the version behind `name@alias`, or None when the alias is not set yet."""
    target = _alias_target(name, alias)
    value = None if target is None else target.tags.get(metric)
    return None if value is None else float(value)


def set_alias(name: str, alias: str, version: str) -> None:
    _client().set_registered_model_alias(name, alias, version)


def resolve_model_uri(uri: str) -> str:
    """`models:/spinn@champion` -> `models:/spinn/3`, the version the alias points at now; other URIs as given.

    Outputs record the resolved name, because the alias moves when a better model is registered.
    """
    if not uri.startswith("models:/") or "@" not in uri:
        return uri
    name, _, alias = uri.removeprefix("models:/").partition("@")
    version = alias_version(name, alias)
    if version is None:
        raise SpinnError(f"{uri}: no version of {name!r} has the alias {alias!r} in {tracking_uri()}")
    return f"models:/{name}/{version}"


def is_model_uri(reference: str) -> bool:
    return reference.startswith(MODEL_URI_SCHEMES)


def download_checkpoint(uri: str, destination: Path) -> Path:
    """Fetch a registered or logged model folder (`models:/spinn@champion`) and return its checkpoint."""
    mlflow = _mlflow()
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(destination)))
    except Exception as error:  # MlflowException, OSError: report the URI and the store
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SpinnError(f"{uri}: cannot fetch the model from {tracking_uri()} ({reason})") from None
    checkpoint = local / CHECKPOINT_NAME if local.is_dir() else local
    if not checkpoint.is_file():
        raise SpinnError(f"{uri}: no {CHECKPOINT_NAME} in the model folder")
    return checkpoint
