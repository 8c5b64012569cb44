"""Shared fixtures: the real SNLI files in ../shared, a quiet offline environment, the tiers, and what is built once.

Telemetry is switched off and every tool home points inside a temporary folder
before any test imports Prefect, MLflow, DVC or Stanza, so the default test
command needs no environment of its own.

Tiers: a test file marks its tier (`pytestmark = pytest.mark.e2e` or `integration`;
`stanza` where it runs Stanza, `slow` where it takes long), a test may mark its own;
an unmarked test that uses a real store, server, SNLI file or trained model is
`integration`, any other `unit`. `scripts/test -m "not e2e and not integration and not stanza and not slow"`
is the local loop.

Built once, copied per test: the smoke corpus, its prepared splits, vocabulary,
aligned embeddings, a migrated MLflow store and a small trained model are built
once per test run (one xdist worker builds, the others wait on a file lock and
reuse it); a test that needs a store gets a copy of the migrated sqlite file, so
no test pays MLflow's migration.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

import spinn  # noqa: F401  (before any test loads torch: OpenMP's wait as every spinn process has it)
from tests.helpers import (
    FREE_CORES_SEEN,
    PREPARED_DEV_PAIRS,
    SMOKE_REGISTERED,
    SMOKE_TRAINING,
    STANZA_DIR,
    TINY_MODEL,
    copy_store,
    snli_file,
)
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

os.environ.setdefault("STANZA_RESOURCES_DIR", str(STANZA_DIR))


def _triton_interprets_without_a_gpu() -> None:
    """Triton decides when it loads whether it runs kernels in its interpreter, on the CPU: the cells' GPU
    kernels are tested so (tests/test_cell_kernel.py). Nothing else loads Triton on a CPU, and nothing runs the
    kernels there unless a test sets spinn.model.cells.KERNEL_ON_CPU, so the processes tests start may inherit
    it. Not on a machine with a GPU, whose tests run the kernels compiled."""
    import torch  # after spinn (above)

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_triton_interprets_without_a_gpu()
PREFECT_STARTUP_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def snli_dev() -> Path:
    return snli_file("snli_1.0_dev.jsonl.gz")


@pytest.fixture(scope="session")
def snli_test() -> Path:
    return snli_file("snli_1.0_test.jsonl.gz")


@pytest.fixture(scope="session")
def snli_train_sample() -> Path:
    return snli_file("snli_1.0_train_first1024.jsonl.gz")


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


@pytest.fixture
def one_reading_of_free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both sides of an exact comparison decide `auto` threads from one stubbed reading of the free cores: with
    another thread count, float32 sums round in another order (probabilities 3e-8 apart, labels equal; a
    calibration temperature fitted on a flat optimum moves in its last digits)."""
    from spinn.ground import cores

    monkeypatch.setenv(cores.FREE_CORES_VARIABLE, str(FREE_CORES_SEEN))


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

UNIT, INTEGRATION, E2E, SLOW = "unit", "integration", "e2e", "slow"
INTEGRATION_FIXTURES = frozenset(
    {"smoke_model", "smoke_store", "mlflow_store", "prefect_api", "server"}
    | {"snli_dev", "snli_test", "snli_train_sample"}
)
"""A test that uses any of these reaches a real store, server, file set or trained model."""


def tier(item: pytest.Item) -> str:
    """The one tier of a test: its own marker (or its file's pytestmark), else the fixtures it uses, else unit."""
    if item.get_closest_marker(E2E):
        return E2E
    if item.get_closest_marker(INTEGRATION) or INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
        return INTEGRATION
    return UNIT


def rank(item: pytest.Item) -> int:
    """How early the test's file starts: a file marked e2e, then one marked integration or holding a slow test,
    then the rest (a long test started last would leave one worker running it alone)."""
    if item.get_closest_marker(E2E):
        return 0
    return 1 if item.get_closest_marker(INTEGRATION) or item.get_closest_marker(SLOW) else 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each test its tier, and start the longest files first (xdist hands out files in this order, so no
    worker is left with a long tail). The sort is stable and by file, so a file's tests stay together and in
    their order."""
    file_rank: dict[Path, int] = {}
    for item in items:
        file_rank[item.path] = min(rank(item), file_rank.get(item.path, rank(item)))
        item.add_marker(tier(item))
    items.sort(key=lambda item: file_rank[item.path])


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


@pytest.fixture(scope="session")
def rl_checkpoint(smoke_model, tmp_path_factory, migrated_store) -> Path:
    """A tiny rl model trained a few steps on the smoke splits: it labels on the trees it builds itself. Built
    once per test run, as the smoke model is; the tests only read it."""
    root = built_once(
        shared_folder(tmp_path_factory) / "rl-model", lambda root: _build_rl(root, smoke_model, migrated_store)
    )
    return root / "models" / "best.pt"


def _build_rl(root: Path, smoke_model: SmokeModel, migrated_store: Path) -> None:
    from spinn.training.train import train
    from spinn.training.train_config import TrainConfig

    config = TrainConfig.build(
        {
            "model": {"variant": "rl", **TINY_MODEL},
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
    assert result.best_checkpoint == root / "models" / "best.pt", result.best_checkpoint


# ----------------------------------------------------------------------------- real SNLI pairs prepared for training


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, snli_train_sample, snli_dev) -> Path:
    """train: the 1,024 real training pairs; dev: the first PREPARED_DEV_PAIRS real dev pairs; vocab beside them.
    Built once per test run; the tests only read it."""
    return built_once(
        shared_folder(tmp_path_factory) / "snli-prepared", lambda folder: _prepare(folder, snli_train_sample, snli_dev)
    )


def _prepare(folder: Path, snli_train_sample: Path, snli_dev: Path) -> None:
    from spinn.data.prepare import prepare
    from spinn.data.vocab import vocab_stage

    prepare(snli_train_sample, folder, split="train")
    with gzip.open(snli_dev, "rt", encoding="utf-8") as stream:
        lines = [next(stream) for _ in range(PREPARED_DEV_PAIRS)]
    (folder / "source").mkdir()
    (folder / "source" / "dev.jsonl").write_text("".join(lines), encoding="utf-8")
    prepare(folder / "source" / "dev.jsonl", folder)
    vocab_stage(folder / "train.parquet")


@pytest.fixture(scope="session")
def aligned(tmp_path_factory, prepared) -> Path:
    """The prepared vocabulary's GloVe vectors (a data/embeddings folder), aligned once per test run."""
    from spinn.data.embeddings import embeddings_stage

    return built_once(
        shared_folder(tmp_path_factory) / "snli-embeddings",
        lambda folder: embeddings_stage(prepared / "vocab.json", cache_dir=folder, progress=False),
    )


@pytest.fixture
def fresh_workdir(tmp_path, monkeypatch, aligned) -> Path:
    """A project folder (the working folder) with no MLflow store yet, and a copy of the aligned vectors in
    data/embeddings, where train looks by default."""
    from spinn.data.embeddings import DEFAULT_CACHE_DIR

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    shutil.copytree(aligned, tmp_path / DEFAULT_CACHE_DIR)
    return tmp_path


@pytest.fixture
def workdir(fresh_workdir, migrated_store) -> Path:
    """The project folder with its own copy of the migrated MLflow store: no test here pays the migration."""
    copy_store(migrated_store, fresh_workdir / "mlflow.db")
    return fresh_workdir
