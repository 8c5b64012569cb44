"""Issue 32, class 1: a stage process ends with the process that started it, and its lock lives where its
orchestrator does not delete it.

An orchestrator (`dvc repro`, a Prefect worker, a CI job) that is killed with SIGKILL leaves its stage running
as an orphan, which goes on writing into the outputs the next run writes. Every command arms the same watch
at its start (spinn.children.stop_when_orphaned); here each command is checked to arm it, and a real
training run whose parent is SIGKILLed is checked to stop, end its MLflow run and let go of its lock. The
real `dvc repro` case is in tests/test_dvc.py.
"""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest
from click.testing import CliRunner

from spinn import children
from spinn.cli import COMMANDS, main
from tests.conftest import copy_store
from tests.helpers import SPINN, kill_if_running, run_statuses, running, tiny_train_arguments, wait_for

ORPHAN_END_S = 60
"""How long an orphaned stage may take to notice and stop: the parent poll, then a training step under load."""
START_S = 180
"""How long a tiny training run may take to write its first checkpoint on two busy cores."""
ENDED = ("FAILED", "KILLED", "FINISHED")
ENDLESS = ("max_steps=100000", "max_epochs=100000", "eval_every=100000")
"""A training run that goes on until it is stopped."""


@pytest.mark.parametrize("command", [*COMMANDS, "spinn-pipeline"])
def test_every_command_arms_the_orphan_watch_before_any_work(command, monkeypatch):
    from flows.main import main as pipeline

    armed = []
    monkeypatch.setattr(children, "stop_when_orphaned", lambda: armed.append(True))
    arguments, entry = (["--help"], pipeline) if command == "spinn-pipeline" else ([command, "--help"], main)
    result = CliRunner().invoke(entry, arguments)
    assert result.exit_code == 0, result.output
    assert armed == [True]


@pytest.mark.slow  # two real training processes and a shell, about 30 s on two busy cores
def test_a_training_run_whose_parent_is_killed_stops_ends_its_mlflow_run_and_lets_go(
    smoke_model, migrated_store, tmp_path
):
    """The parent is a shell, as under `dvc repro`; it is SIGKILLed after the first checkpoint."""
    uri = copy_store(migrated_store, tmp_path / "mlflow.db")
    output = tmp_path / "models"
    arguments = tiny_train_arguments(smoke_model.prepared, output, *ENDLESS, "checkpoint_every=2")
    line = f"{shlex.join([str(SPINN), *arguments])} >{tmp_path / 'out.log'} 2>{tmp_path / 'err.log'} & echo $!; wait"
    environment = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    parent = subprocess.Popen(["bash", "-c", line], cwd=tmp_path, env=environment, stdout=subprocess.PIPE, text=True)
    stage = int(parent.stdout.readline())
    try:
        wait_for(lambda: (output / "last.pt").exists(), START_S, "the first checkpoint")
        parent.kill()
        parent.wait()
        wait_for(lambda: not running(stage), ORPHAN_END_S, f"the orphaned stage {stage} to end")
    finally:
        kill_if_running([stage])
    assert "Traceback" not in (tmp_path / "err.log").read_text()
    assert [status for status in run_statuses(uri) if status not in ENDED] == []
    again = subprocess.run(
        [str(SPINN), *tiny_train_arguments(smoke_model.prepared, output, "max_steps=4"), "--overwrite"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=START_S,
    )
    assert again.returncode == 0, again.stderr
    assert run_statuses(uri).count("FINISHED") == 1 and "RUNNING" not in run_statuses(uri)
