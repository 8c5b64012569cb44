"""MLflow, behind one door: runs, metrics, artifacts and the model registry.

The store is MLflow's default local sqlite file (`sqlite:///mlflow.db` in the
working directory) unless MLFLOW_TRACKING_URI says otherwise, so `mlflow ui`
run in the project shows every run. A registered version is an MLflow 3
logged model (spinn/tracking/register.py `log_model`) whose artifacts are the
plain checkpoint, vocabulary and config; versions registered by 0.1.0 point at
the run's `model/` folder with the same files. Either way loading a model
never unpickles anything (`spinn.model.checkpoint` reads it with weights_only).

Processes share the store through one file lock (`store_lock`: beside a
sqlite store, else in SPINN_LOCK_DIR). A process opens the store under it
once, so that two runs meeting a fresh store do not both create and migrate
its tables (MLflow 3.17's SqlAlchemyStore does that unlocked, and two at once
break the store for good); registration holds it around read-compare-set.

A fresh sqlite store is built on a temporary file and moved into place only
when its tables are complete, so a run killed while MLflow migrates (20 s
under load) leaves no half-made store behind. One such store left by an
earlier release (its schema short of MLflow's head, and nothing in it) is
rebuilt the same way, under the lock; a store holding runs is never touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from spinn.ground.errors import MLFLOW_TIMEOUT_VARIABLE, SpinnError
from spinn.ground.io import OWNER_ONLY, atomic_path, tidy_folder

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
MODEL_ARTIFACT_DIR = "model"
ARTIFACTS_PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
CHECKPOINT_NAME = "checkpoint.pt"
MODEL_URI_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")
MAX_PARAM_LENGTH = 500  # MLflow refuses longer param values
DATASET_DIGEST_CHARS = 16
"""The start of a data file's SHA-256 that names it among a run's inputs (MLflow keeps at most 36 characters)."""
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
"""The experiment tag MLflow 3's UI files experiments by (in its JS bundle; mlflow's Python has no constant)."""
RUNNING, KILLED = "RUNNING", "KILLED"
"""MLflow run statuses (mlflow.entities.RunStatus names)."""
MODEL_TRAINING_KIND = "custom_model_development"
"""The kind the UI calls "Machine learning": runs and models first, not traces and GenAI evaluation."""

SQLITE_PREFIX = "sqlite:///"
LOCK_DIR_VARIABLE = "SPINN_LOCK_DIR"
"""Where the lock of a store that is not a local sqlite file lives (default: the temp folder). Point it at a
folder every process using the store sees, or registrations on different machines are not serialized."""
LOCK_SUFFIX = ".lock"
STORE_LOCK_TIMEOUT_S = 300
"""Opening or migrating a store and registering a model take seconds; this long means something is stuck."""
REQUEST_LIMITS = {MLFLOW_TIMEOUT_VARIABLE: "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}
"""MLflow's own variables, unless the user set them: 10 s a request and two retries (backoff 2 s, 4 s), so a
silent server is one error line within a minute (MLflow's 120 s and 7 doubling retries took minutes)."""

T = TypeVar("T")
_opened: set[str] = set()
"""Stores this process has opened (created and migrated if needed) under the store lock."""


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI)


def request_limits() -> None:
    """REQUEST_LIMITS for MLflow's requests to a tracking server, unless the user set them."""
    for variable, value in REQUEST_LIMITS.items():
        os.environ.setdefault(variable, value)


def _mlflow(*, write: bool = False):
    """Import MLflow pointed at our store (imported lazily: it takes seconds), opened once per process.

    `write`: refuse first, in one line, a store this process cannot write to. MLflow's per-download progress
    bar is off unless the user turned it on: fetching a model's three files drew bars into every log."""
    os.environ.setdefault(ARTIFACTS_PROGRESS_BAR, "false")
    request_limits()
    import mlflow

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    if write:
        check_writable()
    if uri not in _opened:
        _open_store(mlflow, uri)
        _opened.add(uri)
    return mlflow


def _open_store(mlflow, uri: str) -> None:
    """Create or migrate the store's tables under the store lock: MLflow does it on first use, unlocked.

    Both stores MLflow builds on one database (tracking and registry) are
    built here, and cached by MLflow for the rest of the process."""
    database = _sqlite_file(uri)
    with store_lock(required=database is None or _needs_building(database)):
        if database is not None and _needs_building(database):
            _build_sqlite_store(mlflow, database)
        _create_tables(mlflow, uri)


def _create_tables(mlflow, uri: str) -> None:
    """Open both stores MLflow builds on one database, which creates or migrates their tables."""
    client = mlflow.MlflowClient(uri)
    client.search_experiments(max_results=1)
    client.search_registered_models(max_results=1)


def _build_sqlite_store(mlflow, database: Path) -> None:
    """Create the store's tables on a temporary file beside `database`, then move it into place: killed at
    any point, the store is either absent or complete. Temporaries of killed builds go first."""
    tidy_folder(database.parent)
    with atomic_path(database) as temporary:
        _create_tables(mlflow, SQLITE_PREFIX + str(temporary.resolve()))


def _needs_building(database: Path) -> bool:
    """Whether a sqlite store is absent, or half made: its schema short of MLflow's head with no run and no
    registered model in it (what a killed first run of an earlier release left). A store with content, or
    a file that is no sqlite database, is left to MLflow and its own messages."""
    if not database.exists():
        return True
    try:
        with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "alembic_version" in tables:
                if db.execute("SELECT version_num FROM alembic_version").fetchall() == [(_schema_head(),)]:
                    return False
            return not any(db.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchall() for table in _CONTENT & tables)
    except sqlite3.Error:
        return False


_CONTENT = frozenset({"runs", "registered_models"})
"""The tables whose rows are work someone did: a store holding any is never rebuilt."""


@cache
def _schema_head() -> str:
    """The schema revision MLflow's migrations end at (a private helper: MLflow has no public one)."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def _sqlite_file(uri: str) -> Path | None:
    """`sqlite:///mlflow.db` -> mlflow.db, `sqlite:////abs/x.db` -> /abs/x.db; None for other stores."""
    if not uri.startswith(SQLITE_PREFIX):
        return None
    return Path(uri.removeprefix(SQLITE_PREFIX).split("?", 1)[0])


def store_lock_path(uri: str) -> Path:
    """`mlflow.db.lock` beside a sqlite store; for any other store a file named by its URI in SPINN_LOCK_DIR."""
    database = _sqlite_file(uri)
    if database is not None:
        return database.with_name(database.name + LOCK_SUFFIX)
    folder = Path(os.environ.get(LOCK_DIR_VARIABLE) or tempfile.gettempdir())
    return folder / f"spinn-mlflow-{hashlib.sha256(uri.encode()).hexdigest()[:16]}{LOCK_SUFFIX}"


@cache
def _lock_of(path: Path):
    """One FileLock per lock file and process: it counts nested holds, so a holder may take it again."""
    from filelock import FileLock

    return FileLock(path, timeout=STORE_LOCK_TIMEOUT_S, mode=OWNER_ONLY)  # private, as every spinn lock


@contextmanager
def store_lock(*, required: bool = True) -> Iterator[None]:
    """Hold the store's file lock for the block (re-entrant). Not `required`: a store that is there
    already may be read without it when its lock cannot be created (a read-only folder)."""
    path = store_lock_path(tracking_uri())
    lock = _lock_of(path)
    held = _acquire(lock, path, required)
    try:
        yield
    finally:
        if held:
            lock.release()


def _acquire(lock, path: Path, required: bool) -> bool:
    from filelock import Timeout

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except Timeout:
        waited = f"another process has held the MLflow store's lock for {STORE_LOCK_TIMEOUT_S} s"
        raise SpinnError(f"{path}: {waited}") from None
    except OSError as error:
        if required:
            raise SpinnError(f"{path}: cannot create the MLflow store's lock ({error.strerror})") from None
        return False
    return True


def check_writable() -> None:
    """Refuse, in one line, a sqlite store this process may not write: MLflow would fail at its first
    write, logging and chaining a page of tracebacks. sqlite writes its journal beside the file, so the
    folder must be writable too."""
    database = _sqlite_file(tracking_uri())
    if database is None:
        return
    for path in (database, database.parent):
        if path.exists() and not os.access(path, os.W_OK):
            raise SpinnError(
                f"{database}: the MLflow store is read-only here ({path} is not writable); "
                "make it writable or point MLFLOW_TRACKING_URI at another store"
            )


@contextmanager
def run(experiment: str, run_name: str | None = None, run_id: str | None = None) -> Iterator[str]:
    """Start (or, with run_id, continue) a run; yields its id.

    MLflow's own context manager ends the run FINISHED, or FAILED when the
    block raises anything, KeyboardInterrupt included.
    """
    mlflow = _mlflow(write=True)
    if run_id is None:
        _use_experiment(mlflow, experiment)
    with mlflow.start_run(run_id=run_id, run_name=None if run_id else run_name) as active:
        yield active.info.run_id


def _use_experiment(mlflow, name: str) -> None:
    """Make `name` the active experiment, filed as model training in MLflow 3's UI.

    An experiment without a kind may be shown with GenAI apps; one that
    earlier releases created untyped gets the kind too, one a person chose
    is kept.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND})
        except MlflowException as error:  # another process created it meanwhile
            if error.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
    elif EXPERIMENT_KIND_TAG not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
    mlflow.set_experiment(name)


def log_params(params: dict[str, Any]) -> None:
    _mlflow().log_params({key: str(value)[:MAX_PARAM_LENGTH] for key, value in params.items()})


def set_tags(tags: dict[str, str]) -> None:
    _mlflow().set_tags(tags)


def log_dataset(path: Path, name: str, digest: str, context: str) -> None:
    """Record a data file as one of the run's dataset inputs (name, digest, source), without reading it."""
    import warnings

    mlflow = _mlflow()
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    with warnings.catch_warnings():  # MLflow 3.17 registers its local-file source twice and says so
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(str(Path(path).resolve()))
    mlflow.log_input(MetaDataset(source, name=name, digest=digest[:DATASET_DIGEST_CHARS]), context=context)


def log_metrics(metrics: dict[str, float], step: int) -> None:
    _mlflow().log_metrics({key: float(value) for key, value in metrics.items()}, step=step)


def _client(*, write: bool = False):
    return _mlflow(write=write).MlflowClient()


def _unless_missing(lookup: Callable[[], T]) -> T | None:
    """`lookup()`, or None when MLflow answers that the thing looked up does not exist.

    Any other error (a locked, unreachable or damaged store) raises: read as
    "absent", it would let a worse model take the champion alias.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode

    try:
        return lookup()
    except MlflowException as error:
        if error.error_code != ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
            raise
        return None


def run_exists(run_id: str) -> bool:
    """Whether `run_id` is in this store (a checkpoint may come from another machine's store)."""
    return run_tags(run_id) is not None


def run_tags(run_id: str) -> dict[str, str] | None:
    """The run's tags, or None when this store does not hold the run."""
    found = _unless_missing(lambda: _client().get_run(run_id))
    return None if found is None else dict(found.data.tags)


def log_run_metrics(run_id: str, metrics: dict[str, float], step: int = 0) -> bool:
    """Add metrics to a finished run (e.g. test scores to the training run); False when it is not here."""
    if not run_exists(run_id):
        return False
    client = _client(write=True)
    for key, value in metrics.items():
        client.log_metric(run_id, key, float(value), step=step)
    return True


def log_run_artifacts(run_id: str, paths: list[Path], artifact_dir: str) -> bool:
    """Add files to a run's artifacts (e.g. test scores to the training run); False when it is not here."""
    if not run_exists(run_id):
        return False
    client = _client(write=True)
    for path in paths:
        client.log_artifact(run_id, str(path), artifact_path=artifact_dir)
    return True


def versions_from_run(run_id: str) -> list[tuple[str, str, dict[str, str]]]:
    """(name, version, tags) of every registered version made from `run_id`, whatever the model's name."""
    found = _client().search_model_versions(filter_string=f"run_id = '{run_id}'")
    return [(version.name, str(version.version), dict(version.tags)) for version in found]


def tag_version(name: str, version: str, tags: dict[str, str]) -> None:
    client = _client(write=True)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)


def end_abandoned_run(run_id: str) -> bool:
    """Mark a run whose process died KILLED if the store still has it RUNNING; True when it did.

    The caller knows the process is gone (it holds the lock that process held);
    a run not in this store (another MLFLOW_TRACKING_URI) is left alone."""
    client = _client(write=True)
    found = _unless_missing(lambda: client.get_run(run_id))
    if found is None or found.info.status != RUNNING:
        return False
    client.set_terminated(run_id, status=KILLED)
    return True


def tag_run(run_id: str, tags: dict[str, str]) -> None:
    client = _client(write=True)
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
    return {
        "run_id": run_id,
        "experiment_id": run.info.experiment_id,
        "run_name": run.info.run_name,
        "status": run.info.status,
        "artifact_uri": run.info.artifact_uri,
        "metrics": dict(run.data.metrics),
        "tracking_uri": tracking_uri(),
    }


def log_artifact(path: Path, artifact_dir: str | None = None) -> None:
    _mlflow().log_artifact(str(path), artifact_path=artifact_dir)


def git_commit(directory: Path = Path(".")) -> str:
    """The commit the code ran from ('unknown' outside git), for the run's tags."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() or "unknown"


def register(name: str, run_id: str, tags: dict[str, str], description: str = "", model_id: str | None = None) -> str:
    """Register the run's logged model `model_id` (else, as release 0.1.0 did, the run's `model/`
    folder) as a new version of `name`, with `tags`; returns the version.

    The registered model is created when missing; one created meanwhile by a process outside the store
    lock (the MLflow UI, another tool) is taken as it is."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

    client = _client(write=True)
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        try:
            client.create_registered_model(name)
        except MlflowException as error:
            if error.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
    source = f"models:/{model_id}" if model_id else f"{client.get_run(run_id).info.artifact_uri}/{MODEL_ARTIFACT_DIR}"
    version = client.create_model_version(
        name, source, run_id=run_id, description=description, tags=tags, model_id=model_id
    )
    if model_id:
        _list_version_on_model(client, model_id, name, str(version.version))
    return str(version.version)


def _list_version_on_model(client, model_id: str, name: str, version: str) -> None:
    """Record the version on the logged model, as mlflow.register_model does: the UI's logged-model page reads
    this tag for "Model versions" (without it the page says "Not registered")."""
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    listed = json.loads(client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
    listed.append({"name": name, "version": version})
    client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(listed)})


def versions_of_run(name: str, run_id: str) -> list[tuple[str, dict[str, str]]]:
    """(version, tags) of every version of `name` registered from `run_id`."""
    client = _client()
    if not client.search_registered_models(filter_string=f"name = '{name}'"):
        return []
    found = client.search_model_versions(filter_string=f"name = '{name}' and run_id = '{run_id}'")
    return [(str(version.version), dict(version.tags)) for version in found]


def _alias_target(name: str, alias: str):
    """The model version behind `name@alias`, or None when the model or the alias does not exist.

    The alias is looked up in the registered model's alias table, not with
    get_model_version_by_alias: MLflow 3.17 answers a missing alias with
    INVALID_PARAMETER_VALUE, the code of any bad request, not with not-found.
    """
    client = _client()
    model = _unless_missing(lambda: client.get_registered_model(name))
    version = None if model is None else model.aliases.get(alias)
    return None if version is None else client.get_model_version(name, str(version))


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
    _client(write=True).set_registered_model_alias(name, alias, version)


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
