"""Shared fixtures: the real SNLI files in ../shared, and a quiet, offline environment.

Telemetry is switched off and every tool home points inside a temporary folder
before any test imports Prefect, MLflow, DVC or Stanza, so the default test
command needs no environment of its own.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

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


@dataclass(frozen=True)
class SmokeModel:
    """A small spinn model trained on the smoke corpus, registered in its own MLflow store."""

    checkpoint: Path
    prepared: Path
    archive: Path
    tracking_uri: str
    registered: str


@pytest.fixture(scope="session")
def smoke_model(tmp_path_factory) -> SmokeModel:
    """Train once per session: the labelling tests need a real model whose vocabulary fits SNLI-style text."""
    from spinn.data.prepare import PrepareSettings, prepare
    from spinn.data.smoke import write_smoke_corpus
    from spinn.data.vocab import vocab_stage
    from spinn.training.config import TrainConfig
    from spinn.training.train import train

    root = tmp_path_factory.mktemp("smoke-model")
    archive = write_smoke_corpus(root / "snli_1.0.zip")
    prepared = root / "prepared"
    for split in ("train", "dev", "test"):
        prepare(archive, prepared, PrepareSettings(workers=1), member=f"snli_1.0_{split}.jsonl")
    vocab_stage(prepared / "train.parquet")
    tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
    config = TrainConfig.build(
        {
            "model": {"variant": "spinn", "d_hidden": 16, "d_tracker": 8, "mlp_dim": 16},
            "batch_size": 32,
            "max_steps": 40,
            "eval_every": 20,
            "log_every": 10,
            "checkpoint_every": 20,
            "device": "cpu",
            "threads": 1,
            "experiment": "label-test",
            "registered_model": "label-test",
        }
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
        patch.chdir(root)  # a new experiment's artifacts go to ./mlruns: keep them out of the checkout
        result = train(
            prepared / "train.parquet",
            prepared / "dev.parquet",
            config,
            output_dir=root / "models",
            embeddings_dir=root / "embeddings",
            progress=False,
        )
    return SmokeModel(result.best_checkpoint, prepared, archive, tracking_uri, "models:/label-test@champion")
