"""The repository's promises to a new user, run: README's two commands and its smoke command, in fresh checkouts.

What README, CI and scripts say of each other is tests/test_docs.py's."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import TINY_MODEL_SETTINGS, copy_checkout, readme_block

pytestmark = pytest.mark.e2e

SMOKE_TIMEOUT_S = 600
REAL_PAIRS = 400
"""Real SNLI pairs per split in the fresh-clone test's zip: enough for every stage, quick on two cores."""
TWO_STEPS = ("max_steps=2", "eval_every=2", "log_every=1", "checkpoint_every=2")
"""The front doors check wiring: two steps reach every stage (evaluation, a checkpoint, registration).
What the smoke settings learn is test_smoke.py's test_the_smoke_settings_beat_chance."""
SMALL_RUN = (
    *TINY_MODEL_SETTINGS,
    *TWO_STEPS,
    "device=cpu",
    "threads=1",
)
NO_TESTS_COLLECTED = 5


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory) -> Path:
    """One fresh PREFECT_HOME for this file's pipeline runs: the first run makes and migrates Prefect's
    database, as on a fresh machine; the other reuses it (a fresh one costs about 5 CPU-s more)."""
    return tmp_path_factory.mktemp("prefect-home")


@pytest.mark.slow
def test_readme_smoke_command_runs_the_whole_pipeline_as_written(tmp_path, prefect_home):
    """README's main job in smoke mode as written (plus two-step settings), in a fresh checkout: Prefect's
    temporary server, local MLflow."""
    command = readme_block("## Main job", "--smoke") + "".join(f" --set {setting}" for setting in TWO_STEPS)
    checkout = copy_checkout(tmp_path / "checkout")
    (checkout / ".venv").symlink_to(Path(sys.executable).parents[1])
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PREFECT_API", "MLFLOW_TRACKING", "SPINN_DOWNLOAD"))
    }
    env["PREFECT_HOME"] = str(prefect_home)
    done = subprocess.run(
        command, shell=True, cwd=checkout, env=env, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    assert "Starting temporary server on http://127.0.0.1" in done.stdout + done.stderr
    assert re.search(r"MLflow run [0-9a-f]{32} .* in sqlite:///mlflow.db", done.stdout)
    metrics = json.loads((checkout / printed_path(done.stdout, r"\(metrics: (\S+)\)")).read_text())
    assert metrics["examples"] > 0 and 0.0 <= metrics["accuracy"] <= 1.0
    checkpoint = checkout / printed_path(done.stdout, r"model checkpoint (\S+)")
    assert (checkout / "mlflow.db").is_file() and checkpoint.is_file()
    assert checkpoint.parent.parent == checkout / "data" / "smoke" / "runs"
    assert "registered as models:/spinn-smoke/1 (now @champion)" in done.stdout


def printed_path(output: str, pattern: str) -> Path:
    """A path spinn-pipeline printed (relative to the checkout, or absolute)."""
    found = re.search(pattern, output)
    assert found, f"no {pattern!r} in:\n{output}"
    return Path(found.group(1))


def real_snli_zip(path: Path, sources: dict[str, Path], pairs: int) -> Path:
    """A zip laid out as the official snli_1.0.zip, holding the first `pairs` real pairs of each split."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for split, source in sources.items():
            with gzip.open(source, "rt", encoding="utf-8") as stream:
                lines = [line for _, line in zip(range(pairs), stream, strict=False)]
            archive.writestr(f"snli_1.0/snli_1.0_{split}.jsonl", "".join(lines))
    return path


@pytest.mark.slow
def test_readme_two_commands_run_in_a_fresh_clone_on_real_data(
    tmp_path, prefect_home, snli_train_sample, snli_dev, snli_test
):
    """README's first command (a small model set with --set) on a real-data zip given by SPINN_DOWNLOAD_FILE and
    SPINN_DOWNLOAD_CHECKSUM, offline; its second on one test file, and pytest's status comes back through it.
    .venv is this environment (scripts/install leaves a complete one alone)."""
    run_command, test_command = readme_block("## Two commands", "scripts/run").splitlines()
    checkout = copy_checkout(tmp_path / "clone")
    (checkout / ".venv").symlink_to(Path(sys.executable).parents[1])
    corpus = real_snli_zip(
        tmp_path / "snli_1.0.zip", {"train": snli_train_sample, "dev": snli_dev, "test": snli_test}, REAL_PAIRS
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_API", "MLFLOW_", "SPINN_"))}
    env.update(
        PREFECT_HOME=str(prefect_home),
        SPINN_DOWNLOAD_FILE=str(corpus),
        SPINN_DOWNLOAD_CHECKSUM=f"sha256:{hashlib.sha256(corpus.read_bytes()).hexdigest()}",
    )
    small = " ".join(f"--set {setting}" for setting in SMALL_RUN)
    done = subprocess.run(
        f"{run_command} {small}", shell=True, cwd=checkout, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{run_command}\n{done.stdout}\n{done.stderr}"
    metrics = json.loads((checkout / printed_path(done.stdout, r"\(metrics: (\S+)\)")).read_text())
    assert metrics["examples"] > 0.9 * REAL_PAIRS
    assert "registered as models:/spinn/1 (now @champion)" in done.stdout

    tests = subprocess.run(
        f"{test_command} -q tests/test_trees.py", shell=True, cwd=checkout, env=env, capture_output=True, text=True
    )
    assert tests.returncode == 0 and " passed" in tests.stdout, tests.stdout + tests.stderr
    # in one process, on a folder with no tests and no conftest: what this call checks is the status coming
    # back, and xdist's workers (8 s of CPU) and tests/conftest.py's imports (3 s) would only add time
    nothing = subprocess.run(f"{test_command} -n 0 -q scripts", shell=True, cwd=checkout, env=env)
    assert nothing.returncode == NO_TESTS_COLLECTED
