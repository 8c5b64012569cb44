"""Issue 24, a newcomer's findings: each test fails on the code the newcomer tried."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUN_OUTPUTS = [
    "data/runs/a1b2/last.pt",
    "data/inbox/private.csv",
    "data/labelled/private.parquet",
    "data/parse_cache/parses.sqlite",
]


def _git(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=clone, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("path", [*RUN_OUTPUTS, ".venv"])
def test_git_ignores_what_runs_write(tmp_path: Path, path: str) -> None:
    """A `git add -A` after a run must not commit checkpoints, users' corpora or a symlinked `.venv`."""
    _git(tmp_path, "init", "-q")
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    target = tmp_path / path
    if path == ".venv":
        target.symlink_to(tmp_path / "elsewhere")
    else:
        target.parent.mkdir(parents=True)
        target.write_text("x")
    assert _git(tmp_path, "check-ignore", "-q", path).returncode == 0, f"git would commit {path}"


def test_git_keeps_the_metrics(tmp_path: Path) -> None:
    """data/metrics is the one data folder git holds (README)."""
    _git(tmp_path, "init", "-q")
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    (tmp_path / "data" / "metrics").mkdir(parents=True)
    (tmp_path / "data" / "metrics" / "test.json").write_text("{}")
    assert _git(tmp_path, "check-ignore", "-q", "data/metrics/test.json").returncode == 1
