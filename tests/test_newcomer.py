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


SNLI_TRAIN_PAIRS = 550_152


def test_default_eval_every_evaluates_a_small_run_several_times() -> None:
    """1,024 pairs at batch 32 are 32 steps an epoch: the shipped default must evaluate dev at least four
    times an epoch (the old 1000 never evaluated inside the 320 steps of ten epochs)."""
    from spinn.settings import DEFAULT_PARAMS
    from spinn.training.config import TrainConfig

    config = TrainConfig.from_params(ROOT / DEFAULT_PARAMS).resolved("cpu", 1_024)
    steps_per_epoch = 1_024 // config.batch_size
    assert steps_per_epoch // config.eval_every >= 4


@pytest.mark.parametrize(("pairs", "expected"), [(1, 1), (1_024, 8), (SNLI_TRAIN_PAIRS, 1_000)])
def test_auto_eval_every_follows_the_data(pairs: int, expected: int) -> None:
    from spinn.training.config import TrainConfig

    assert TrainConfig().resolved("cpu", pairs).eval_every == expected


def test_an_explicit_eval_every_is_kept() -> None:
    from spinn.training.config import TrainConfig

    assert TrainConfig(eval_every=7).resolved("cpu", SNLI_TRAIN_PAIRS).eval_every == 7


def test_train_help_says_eval_every_follows_the_data() -> None:
    from click.testing import CliRunner

    from spinn.cli import main

    text = " ".join(CliRunner().invoke(main, ["train", "--help"], terminal_width=200).output.split())
    assert "auto: min(1000, steps per epoch // 4)" in text
