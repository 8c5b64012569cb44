"""Shared fixtures: the real SNLI files in ../shared, a quiet offline environment, the tiers, and what is built once.

Telemetry is switched off and every tool home points inside a temporary folder
before any test imports Prefect, MLflow, DVC or Stanza, so the default test
command needs no environment of its own.

Tiers: every test gets one of `unit`, `integration` or `e2e` (by its file, or by
the fixtures it uses), and `stanza` where it runs Stanza, so that
`scripts/test -m "not e2e and not stanza"` is the local loop.

Built once, copied per test: the smoke corpus, its prepared splits, vocabulary,
aligned embeddings, a migrated MLflow store and a small trained model are built
once per test run (one xdist worker builds, the others wait on a file lock and
reuse it); a test that needs a store gets a copy of the migrated sqlite file, so
no test pays MLflow's migration.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

import spinn  # noqa: F401  (before any test loads torch: OpenMP's wait as every spinn process has it)
from tests.httpserver import LocalServer

_TOOL_HOME = Path(tempfile.mkdtemp(prefix="spinn-tests-"))
for _name, _value in {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_HOME": str(_TOOL_HOME / "prefect"),
    "XDG_CONFIG_HOME": str(_TOOL_HOME / "config"),
}.items():
    os.environ.setdefault(_name, _value)

SHARED = Path(__file__).resolve().parents[2] / "shared"
SNLI_DIR = SHARED / "data" / "snli"
STANZA_DIR = SHARED / "stanza" / "stanza_resources"
os.environ.setdefault("STANZA_RESOURCES_DIR", str(STANZA_DIR))
PREFECT_STARTUP_TIMEOUT_S = 120


def _shared_file(name: str) -> Path:
    path = SNLI_DIR / name
    if not path.exists():
        pytest.skip(f"real SNLI file {path} is absent (../shared is not beside this checkout)")
    return path


@pytest.fixture(scope="session")
def snli_dev() -> Path:
    return _shared_file("snli_1.0_dev.jsonl.gz")


@pytest.fixture(scope="session")
def snli_test() -> Path:
    return _shared_file("snli_1.0_test.jsonl.gz")


@pytest.fixture(scope="session")
def snli_train_sample() -> Path:
    return _shared_file("snli_1.0_train_first1024.jsonl.gz")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep any proxy settings in the environment away from the loopback test servers."""
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def server() -> Iterator[LocalServer]:
    """A file server on 127.0.0.1 that the test fills, cuts and inspects (tests/httpserver.py)."""
    with LocalServer() as running:
        yield running


@pytest.fixture(scope="session", autouse=True)
def torch_threads_by_the_rule() -> None:
    """This test process's torch threads by the rule every spinn process follows (spinn/ground/cores.py): its share of
    the cores, which the xdist workers split, within the cores other work leaves free."""
    from spinn.ground import cores

    workers = int(os.environ.get(XDIST_WORKERS, "1"))
    cores.use_threads(cores.AUTO, sharing=workers, where="tests")


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and on a shared CPU two threads wait on each other."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """One real Prefect server (SQLite, 127.0.0.1) for the whole session; yields its API URL.

    Starting it takes 10-20 s on two cores, so every flow test shares it.
    """
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=PREFECT_STARTUP_TIMEOUT_S):
        yield PREFECT_API_URL.value()


# ----------------------------------------------------------------------------- tiers

UNIT, INTEGRATION, E2E, STANZA = "unit", "integration", "e2e", "stanza"
E2E_FILES = frozenset({"test_repo.py", "test_flows.py", "test_dvc.py", "test_label_flow.py", "test_rl_pipeline.py"})
"""Front doors end to end: README's commands, the Prefect flows and deployments, DVC, the CLI pipeline."""
INTEGRATION_FILES = frozenset(
    {"test_train.py", "test_tracking.py", "test_cli.py", "test_errors.py", "test_distributed.py", "test_download.py"}
)
"""Stages and stores for real: training with MLflow, the CLI in subprocesses, torchrun, loopback downloads."""
INTEGRATION_FIXTURES = frozenset(
    {"smoke_model", "smoke_store", "mlflow_store", "prefect_api", "server"}
    | {"snli_dev", "snli_test", "snli_train_sample"}
)
"""A unit test that uses any of these reaches a real store, server, file set or trained model."""
STANZA_FILES = frozenset({"test_parse.py", "test_parse_stage.py"})


def tier(item: pytest.Item) -> str:
    """The one tier of a test: an explicit marker, else its file, else the fixtures it uses."""
    file = item.path.name
    if item.get_closest_marker(E2E) or file in E2E_FILES:
        return E2E
    if item.get_closest_marker(INTEGRATION) or file in INTEGRATION_FILES:
        return INTEGRATION
    if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
        return INTEGRATION
    return UNIT


def file_rank(item: pytest.Item) -> int:
    """The long files first: e2e, then integration, then the rest (xdist hands out files in this order)."""
    file = item.path.name
    return 0 if file in E2E_FILES else 1 if file in INTEGRATION_FILES else 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each test its tier, and start the longest files first so that no worker is left with a long tail.
    The sort is stable and by file, so a file's tests stay together and in their order."""
    for item in items:
        item.add_marker(tier(item))
        if item.path.name in STANZA_FILES:
            item.add_marker(STANZA)
    items.sort(key=file_rank)


# ----------------------------------------------------------------------------- built once per test run


XDIST_WORKER = "PYTEST_XDIST_WORKER"
"""Set by pytest-xdist in each worker (gw0, gw1, ...); absent in a plain pytest process."""
XDIST_WORKERS = "PYTEST_XDIST_WORKER_COUNT"
"""Set by pytest-xdist in each worker: how many workers share the cores."""


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this run sees (the run's base temp), or this process's own without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if XDIST_WORKER in os.environ else base


def built_once(folder: Path, build: Callable[[Path], None]) -> Path:
    """`build(folder)` run by the first worker to get here; the others wait on the lock and reuse the folder."""
    done = folder / ".built"
    with FileLock(f"{folder}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            build(folder)
            done.touch()
    return folder


MIGRATED_STORE = "migrated-mlflow.db"
"""An MLflow sqlite store with every table made and migrated, and nothing in it: tests copy it."""


def migrate_store(database: Path) -> None:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{database}")
    client.search_experiments(max_results=1)
    client.search_registered_models(max_results=1)


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory) -> Path:
    """The migrated, empty store, made once per test run (migration takes seconds; a copy, milliseconds)."""
    folder = built_once(shared_folder(tmp_path_factory) / "migrated-store", _build_migrated_store)
    return folder / MIGRATED_STORE


def _build_migrated_store(folder: Path) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # the default experiment's artifact folder: here, never in the checkout
        migrate_store(folder / MIGRATED_STORE)


def copy_store(migrated: Path, database: Path) -> str:
    """A fresh-but-migrated store at `database`; its tracking URI."""
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated, database)
    return f"sqlite:///{database}"


@pytest.fixture
def mlflow_store(migrated_store, tmp_path, monkeypatch) -> Path:
    """tmp_path/mlflow.db, a copy of the migrated store, as MLFLOW_TRACKING_URI; tmp_path is the working folder
    (a new experiment's artifacts go to ./mlruns, out of the checkout)."""
    database = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", copy_store(migrated_store, database))
    monkeypatch.chdir(tmp_path)
    return database


@dataclass(frozen=True)
class SmokeModel:
    """A small spinn model trained on the smoke corpus, registered in its own MLflow store.

    The folder holds the archive, prepared/ (splits and vocabulary), embeddings/ (aligned vectors), models/
    and mlflow.db. It is shared by every test of the run: a test that writes to the store copies it first."""

    checkpoint: Path
    prepared: Path
    archive: Path
    tracking_uri: str
    registered: str


SMOKE_REGISTERED = "label-test"
SMOKE_TRAINING = {
    "model": {"variant": "spinn", "d_hidden": 16, "d_tracker": 8, "mlp_dim": 16},
    "batch_size": 32,
    "max_steps": 40,
    "eval_every": 20,
    "log_every": 10,
    "checkpoint_every": 20,
    "device": "cpu",
    "threads": 1,
    "experiment": SMOKE_REGISTERED,
    "registered_model": SMOKE_REGISTERED,
}


@pytest.fixture(scope="session")
def smoke_model(tmp_path_factory, migrated_store) -> SmokeModel:
    """Train once per test run: the labelling tests need a real model whose vocabulary fits SNLI-style text."""
    root = built_once(shared_folder(tmp_path_factory) / "smoke-model", lambda root: _build_smoke(root, migrated_store))
    return SmokeModel(
        checkpoint=root / "models" / "best.pt",
        prepared=root / "prepared",
        archive=root / "snli_1.0.zip",
        tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
        registered=f"models:/{SMOKE_REGISTERED}@champion",
    )


def _build_smoke(root: Path, migrated_store: Path) -> None:
    from spinn.data.prepare import PrepareSettings, prepare
    from spinn.data.smoke import write_smoke_corpus
    from spinn.data.vocab import vocab_stage
    from spinn.training.train import train
    from spinn.training.train_config import TrainConfig

    archive = write_smoke_corpus(root / "snli_1.0.zip")
    prepared = root / "prepared"
    for split in ("train", "dev", "test"):
        prepare(archive, prepared, PrepareSettings(workers=1), member=f"snli_1.0_{split}.jsonl")
    vocab_stage(prepared / "train.parquet")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", copy_store(migrated_store, root / "mlflow.db"))
        patch.chdir(root)  # a new experiment's artifacts go to ./mlruns: keep them out of the checkout
        result = train(
            prepared / "train.parquet",
            prepared / "dev.parquet",
            TrainConfig.build(SMOKE_TRAINING),
            output_dir=root / "models",
            embeddings_dir=root / "embeddings",
            progress=False,
        )
    assert result.best_checkpoint == root / "models" / "best.pt", result.best_checkpoint


@pytest.fixture
def smoke_store(smoke_model, tmp_path, monkeypatch) -> str:
    """A copy of the smoke model's store (its registered model included) as MLFLOW_TRACKING_URI, for a test
    that logs or registers: the shared store stays as built. tmp_path is the working folder."""
    uri = copy_store(Path(smoke_model.tracking_uri.removeprefix("sqlite:///")), tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    return uri


@pytest.fixture(scope="module")
def rl_checkpoint(smoke_model, tmp_path_factory, migrated_store) -> Path:
    """A tiny rl model trained a few steps on the smoke splits: it labels on the trees it builds itself."""
    from spinn.training.train import train
    from spinn.training.train_config import TrainConfig

    root = tmp_path_factory.mktemp("rl-model")
    config = TrainConfig.build(
        {
            "model": {"variant": "rl", "d_hidden": 16, "d_tracker": 8, "mlp_dim": 16},
            "batch_size": 32,
            "max_steps": 6,
            "eval_every": 6,
            "log_every": 3,
            "device": "cpu",
            "threads": 1,
            "experiment": "rl-model",
        }
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", copy_store(migrated_store, root / "mlflow.db"))
        patch.chdir(root)
        result = train(
            smoke_model.prepared / "train.parquet",
            smoke_model.prepared / "dev.parquet",
            config,
            output_dir=root / "models",
            embeddings_dir=root / "embeddings",
            register=False,
            progress=False,
        )
    return result.best_checkpoint
