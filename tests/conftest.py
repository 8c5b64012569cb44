"""Shared fixtures: the real SNLI files in ../shared, and a quiet, offline environment.

Telemetry is switched off and every tool home points inside a temporary folder
before any test imports Prefect, MLflow, DVC or Stanza, so the default test
command needs no environment of its own.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

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
