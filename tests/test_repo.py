"""The repository's promises to a new user: CI runs exactly README's test command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkout import copy_checkout

ROOT = Path(__file__).resolve().parents[1]
SMOKE_TIMEOUT_S = 600
CHANCE = 1 / 3


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Run the tests", 1)[1]
    command = re.search(r"```bash\n(.+?)\n```", section, re.DOTALL).group(1).strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert command in ci_lines


def test_ci_installs_what_readme_installs():
    """scripts/install runs README's install line verbatim, and CI installs through it."""
    install = readme_block("## Install", "pip install")
    assert install in (ROOT / "scripts" / "install").read_text(encoding="utf-8").splitlines()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert "scripts/install" in ci_lines


def test_readme_starts_with_the_two_commands():
    """The first command block sets up and runs the main job, then sets up and runs the tests."""
    first = re.search(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(encoding="utf-8"), re.DOTALL)
    assert first.group(1).split("\n") == ["scripts/run", "scripts/test"]
    for name in ("run", "test"):
        script = ROOT / "scripts" / name
        assert os.access(script, os.X_OK), f"{script} is not executable"
        assert "scripts/install" in script.read_text(encoding="utf-8").splitlines(), f"{script} does not set up .venv"


def readme_block(heading: str, marker: str) -> str:
    """The first ```bash block under `heading` whose command contains `marker`."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split(heading, 1)[1]
    for block in re.findall(r"```bash\n(.+?)\n```", section, re.DOTALL):
        if marker in block:
            return block.strip()
    raise AssertionError(f"no command with {marker!r} under {heading!r} in README.md")


@pytest.mark.slow
def test_readme_smoke_command_runs_the_whole_pipeline_as_written(tmp_path):
    """README's main job in smoke mode, verbatim, in a fresh checkout: Prefect's temporary server, local MLflow."""
    command = readme_block("## Main job", "--smoke")
    checkout = copy_checkout(tmp_path / "checkout")
    (checkout / ".venv").symlink_to(Path(sys.executable).parents[1])
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PREFECT_API", "MLFLOW_TRACKING", "SPINN_DOWNLOAD"))
    }
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    done = subprocess.run(
        command, shell=True, cwd=checkout, env=env, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    assert "Starting temporary server on http://127.0.0.1" in done.stdout + done.stderr
    assert re.search(r"MLflow run [0-9a-f]{32} .* in sqlite:///mlflow.db", done.stdout)
    metrics = json.loads((checkout / "data" / "smoke" / "metrics" / "test.json").read_text())
    assert metrics["accuracy"] > CHANCE
    assert (checkout / "mlflow.db").is_file() and (checkout / "data" / "smoke" / "models" / "best.pt").is_file()
    assert "registered as models:/spinn-smoke/1 (now @champion)" in done.stdout
