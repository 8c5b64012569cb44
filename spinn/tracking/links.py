"""Links into the MLflow UI and the facts of registered versions: what labelling runs show and link to.

Part of the tracking package, MLflow's one door; store.py opens the store and holds the lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from spinn.tracking.store import _client, _mlflow, _unless_missing, _use_experiment, run, set_tags, tracking_uri

UI_ADDRESS = "http://127.0.0.1:5000"
"""Where README's `mlflow ui` command serves the store."""
MACHINE_LEARNING_VIEW = "workflowType=machine_learning"
"""The query that opens MLflow 3.17's experiment page on its runs and models (the model-training view), not on
the GenAI "Traces" page it opens by default (found in the UI's bundle; the browser remembers the choice)."""
LOGGED_MODEL_PREFIX = "m-"
"""How MLflow 3 starts a logged model's id."""
NOTE_TAG = "mlflow.note.content"
"""The run tag MLflow's UI shows, as Markdown, as the run's description."""
PREDICTED_SHARE = "predicted_share_"
"""Metric name prefix of a label's share of a model's predictions, in training (`dev_`) and labelling runs."""


def share_metrics(shares: dict[str, float], prefix: str = "") -> dict[str, float]:
    """`{"neutral": 0.3}` -> `{"<prefix>predicted_share_neutral": 0.3}`: one name in training and labelling runs,
    so the runs table lines them up."""
    return {f"{prefix}{PREDICTED_SHARE}{name}": share for name, share in shares.items()}


def ui_url(experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI's page of an experiment, or of one of its runs, in the model-training view."""
    return f"{UI_ADDRESS}/{ui_page(experiment_id, run_id)}"


def ui_page(experiment_id: str, run_id: str | None = None) -> str:
    """`ui_url` relative to the UI (a Markdown link in a run's description, wherever the UI is served)."""
    page = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{page}?{MACHINE_LEARNING_VIEW}"


def ui_hint(experiment_id: str, run_id: str | None = None) -> str:
    """How to see a run: the command that serves this store at UI_ADDRESS, and the page to open there."""
    return (
        f"see it: .venv/bin/mlflow ui --backend-store-uri {tracking_uri()} --host 127.0.0.1 --port 5000, "
        f"then open {ui_url(experiment_id, run_id)}"
    )


def version_page(name: str, version: str) -> str:
    """A registered model version's page, relative to the UI (a Markdown link in a run's description)."""
    return f"#/models/{name}/versions/{version}?{MACHINE_LEARNING_VIEW}"


@contextmanager
def run_started_at(experiment: str, run_name: str, started_at: float) -> Iterator[str]:
    """A new run that began at `started_at` (seconds since the epoch), ended as `run` ends it: work logged
    once it is done then shows its own duration in the UI, not the seconds the logging took. The source, user
    and git tags are the ones MLflow's own start_run would give it."""
    mlflow = _mlflow(write=True)
    from mlflow.tracking.context.registry import resolve_tags

    _use_experiment(mlflow, experiment)
    client = mlflow.MlflowClient()
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    start_time = round(started_at * 1000)
    created = client.create_run(experiment_id, start_time=start_time, tags=resolve_tags(), run_name=run_name)
    with run(experiment, run_id=created.info.run_id) as run_id:
        yield run_id


def describe_run(markdown: str) -> None:
    """The active run's description, shown on its page in the UI (links clickable)."""
    set_tags({NOTE_TAG: markdown})


def model_version_facts(uri: str) -> dict[str, str] | None:
    """Name, version, the run that logged it (and its experiment) and its logged model id, for a
    `models:/<name>/<version>` URI; None for any other reference (a checkpoint file, a run's folder)."""
    name, _, version = uri.removeprefix("models:/").partition("/")
    if not uri.startswith("models:/") or not version.isdigit():
        return None
    client = _client()
    found = client.get_model_version(name, version)
    facts = {"name": name, "version": version, "source": found.source}
    if found.run_id:
        facts["run_id"] = found.run_id
        run = _unless_missing(lambda: client.get_run(found.run_id))
        if run is not None:
            facts["experiment_id"] = run.info.experiment_id
    model_id = getattr(found, "model_id", None) or _logged_model_id(found.source)
    if model_id:
        facts["model_id"] = model_id
    return facts


def _logged_model_id(source: str | None) -> str | None:
    """`models:/m-1a2b...` -> `m-1a2b...`: the logged model a version was registered from (MLflow 3.17's sqlite
    registry keeps no model_id of its own); None for a version made from a run's folder."""
    found = (source or "").removeprefix("models:/")
    return found if source and source != found and "/" not in found and found.startswith(LOGGED_MODEL_PREFIX) else None


def log_model_input(run_id: str, model_id: str) -> None:
    """Record an MLflow 3 logged model as an input of a run (the run used it, it did not make it). Through the
    client: MLflow 3.17's fluent log_inputs takes models on Databricks only."""
    from mlflow.entities import LoggedModelInput

    _client(write=True).log_inputs(run_id, models=[LoggedModelInput(model_id)])
