"""What README, CI and the scripts say of each other: the text checks, in one place.

The commands themselves run in test_repo.py (README's two commands and smoke
command), test_flows.py (the Prefect section) and test_dvc.py (the DVC section);
here only what can be read: CI runs README's test command, installs through
README's install line, and the test command uses every core it may.
"""

from __future__ import annotations

import os
import re

from tests.helpers import BASH_BLOCK, README, ROOT, readme_block

CI = ROOT / ".ci" / "run"
TEST_SCRIPT = ROOT / "scripts" / "test"


def ci_lines() -> list[str]:
    return [line.strip() for line in CI.read_text(encoding="utf-8").splitlines()]


def test_ci_runs_the_readme_test_command():
    section = README.read_text(encoding="utf-8").split("## Run the tests", 1)[1]
    command = re.search(BASH_BLOCK, section, re.DOTALL).group(1).strip()
    assert command in ci_lines()


def test_ci_installs_what_readme_installs():
    """scripts/install runs README's install line verbatim, and CI installs through it."""
    install = readme_block("## Install", "pip install")
    assert install in (ROOT / "scripts" / "install").read_text(encoding="utf-8").splitlines()
    assert "scripts/install" in ci_lines()


def test_readme_starts_with_the_two_commands():
    """The first command block sets up and runs the main job, then sets up and runs the tests."""
    first = re.search(BASH_BLOCK, README.read_text(encoding="utf-8"), re.DOTALL)
    assert first.group(1).split("\n") == ["scripts/run", "scripts/test"]
    for name in ("run", "test"):
        script = ROOT / "scripts" / name
        assert os.access(script, os.X_OK), f"{script} is not executable"
        assert "scripts/install" in script.read_text(encoding="utf-8").splitlines(), f"{script} does not set up .venv"


def test_the_test_command_runs_on_every_core_and_lets_arguments_override():
    """scripts/test starts one xdist worker per CPU this process may use, files whole per worker (module
    fixtures are built once) in collection order (conftest puts the long ones first), and passes its arguments
    after those defaults, so `-n 0` wins."""
    pytest_line = next(line for line in TEST_SCRIPT.read_text(encoding="utf-8").splitlines() if "-m pytest" in line)
    assert "sched_getaffinity" in TEST_SCRIPT.read_text(encoding="utf-8")
    assert re.search(r'-n "\$workers" --dist loadfile --no-loadscope-reorder "\$@"$', pytest_line), pytest_line


def test_ci_fails_when_no_test_is_collected():
    """pytest's exit 5 (nothing collected) passes through scripts/test and CI turns it into a failure."""
    text = CI.read_text(encoding="utf-8")
    assert '"$status" -eq 5' in text and "exit 1" in text.split('"$status" -eq 5', 1)[1].split("fi", 1)[0]
    assert "exec .venv/bin/python -m pytest" in TEST_SCRIPT.read_text(encoding="utf-8")
