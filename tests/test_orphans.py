"""A stage process ends with the process that started it, and its lock lives where its
orchestrator does not delete it.

An orchestrator (`dvc repro`, a Prefect worker, a CI job) that is killed with SIGKILL leaves its stage running
as an orphan, which goes on writing into the outputs the next run writes. Every command arms the same watch
at its start (spinn.ground.children.stop_when_orphaned), and so does every Prefect flow (a worker's flow run process
calls the flow, not a command); here each command and each flow is checked to arm it, and a real training
run, and a real train-spinn flow run as a worker starts it, whose parent is SIGKILLed are checked to stop,
end their MLflow run and let go of their lock. The real `dvc repro` case is in tests/test_dvc.py.
"""

from __future__ import annotations

import importlib
import inspect
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from spinn.cli import COMMANDS, main
from spinn.ground import children
from tests.helpers import (
    SMALL_SMOKE_CORPUS,
    SPINN_COMMAND,
    TINY_MODEL,
    copy_store,
    descendants,
    kill_if_running,
    run_statuses,
    running,
    tiny_train_arguments,
    wait_for,
)

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


FLOW_MODULES = sorted(path.stem for path in (Path(__file__).parents[1] / "flows").glob("*.py"))


def every_flow() -> dict[str, object]:
    """Every Prefect flow that flows/ defines, by name: a flow added later is checked too."""
    from prefect import Flow

    found = {}
    for module in map(importlib.import_module, (f"flows.{name}" for name in FLOW_MODULES)):
        for value in vars(module).values():
            if isinstance(value, Flow) and value.fn.__module__ == module.__name__:
                found[value.name] = value
    return found


class Armed(Exception):
    """What the watch raises here: the flow's function went no further."""


@pytest.mark.parametrize("name", sorted(every_flow()))
def test_every_flow_arms_the_orphan_watch_before_any_work(name, monkeypatch, tmp_path):
    """A worker runs a flow run as `python -m prefect.engine`, which calls the flow's function and never goes
    through the commands' shared entry: each flow arms the watch first (a subflow in a thread, or a flow
    inside spinn-pipeline, finds it armed or not its to arm: stop_when_orphaned says)."""

    def arm() -> None:
        raise Armed

    monkeypatch.chdir(tmp_path)  # a flow that went on would write its data/ here
    monkeypatch.setattr(children, "stop_when_orphaned", arm)
    flow = every_flow()[name]
    required = [p.name for p in inspect.signature(flow.fn).parameters.values() if p.default is p.empty]
    with pytest.raises(Armed):
        flow.fn(**dict.fromkeys(required))


def test_the_flows_are_found():
    assert set(every_flow()) == {"train-spinn", "prepare-corpus", "evaluate-spinn", "label-pairs", "label-file"}


WATCHED = """
import time
from spinn.ground import children
children.stop_when_orphaned()
print("armed", flush=True)
try:
    time.sleep(120)
except children.Hangup:
    print("stopped", children.orphaned(), flush=True)
"""
"""A command in miniature: it arms the watch, then waits to be stopped."""
STARTER = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(120)"
"""An orchestrator in miniature (`dvc repro`, a worker): it starts its stage, then is SIGKILLed."""
WATCHED_STOP_S = 20
"""The parent poll (0.5 s) and a Python start, on two busy cores."""


def go_betweens(kind: str, levels: int) -> list[str]:
    """The watched command under `levels` go-betweens that stay: shells (`; exit $?` keeps any shell from exec'ing
    its last command, as dash never does: `dvc repro` runs its stages with `/bin/sh -c` where $SHELL is unset)
    or `timeout`."""
    command = [sys.executable, "-c", WATCHED]
    for _ in range(levels):
        line = shlex.join(command)
        command = ["timeout", "600", *command] if kind == "timeout" else [kind, "-c", f"{line}; exit $?"]
    return command


@pytest.mark.parametrize(
    "stage",
    [["direct", 0], ["sh", 1], ["sh", 2], ["bash", 1], ["timeout", 1]],
    ids=["parent", "sh", "sh-in-sh", "bash", "timeout"],
)
def test_a_command_outlives_no_starter_whatever_stands_between(stage, tmp_path):
    """Kill the starter of a command run directly or through go-betweens that stay: the command stops, naming
    the process it outlived; while the starter lives, it runs on."""
    command = go_betweens(*stage)
    output = tmp_path / "out.log"
    with output.open("w") as log:
        starter = subprocess.Popen([sys.executable, "-c", STARTER, *command], stdout=log)
    below = []
    try:
        wait_for(lambda: "armed" in output.read_text(), WATCHED_STOP_S, "the watched command to arm")
        below = descendants(starter.pid)  # the go-betweens and the command, to end if the test fails
        time.sleep(3 * children.PARENT_POLL_S)
        assert output.read_text().split() == ["armed"], "it stopped while its starter ran"
        starter.kill()
        starter.wait()
        wait_for(lambda: "stopped" in output.read_text(), WATCHED_STOP_S, "the orphaned command to stop")
    finally:
        kill_if_running([starter.pid, *below])
    assert output.read_text().split() == ["armed", "stopped", str(starter.pid)]


@pytest.mark.slow  # two real training processes and a shell, about 30 s on two busy cores
def test_a_training_run_whose_parent_is_killed_stops_ends_its_mlflow_run_and_lets_go(
    smoke_model, migrated_store, tmp_path, monkeypatch
):
    """The parent is a shell, as under `dvc repro`; it is SIGKILLed after the first checkpoint."""
    uri = copy_store(migrated_store, tmp_path / "mlflow.db")
    output = tmp_path / "models"
    arguments = tiny_train_arguments(smoke_model.prepared, output, *ENDLESS, "checkpoint_every=2")
    command = shlex.join([str(SPINN_COMMAND), *arguments])
    line = f"{command} >{tmp_path / 'out.log'} 2>{tmp_path / 'err.log'} & echo $!; wait"
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
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # the rerun only has to find the folder free: in process, no second torch import
    again = CliRunner().invoke(
        main, [*tiny_train_arguments(smoke_model.prepared, output, "max_steps=4"), "--overwrite"]
    )
    assert again.exit_code == 0, (again.output, again.exception)
    assert run_statuses(uri).count("FINISHED") == 1 and "RUNNING" not in run_statuses(uri)


FLOW_SETTINGS = {
    "model": {"variant": "spinn", **TINY_MODEL},
    "batch_size": 32,
    "max_steps": 100000,
    "max_epochs": 100000,
    "eval_every": 100000,
    "checkpoint_every": 2,
    "device": "cpu",
    "threads": 1,
}
"""A train-spinn run that goes on until it is stopped, checkpointing every two steps."""


@pytest.mark.slow  # a flow run process (Prefect, prepare, training) and a shell, about 40 s on two busy cores
def test_a_flow_run_whose_worker_is_killed_stops_ends_its_runs_and_lets_go(prefect_api, migrated_store, tmp_path):
    """What a process worker does, without the worker: the flow run is created on the server and run by
    `python -m prefect.engine` (PREFECT__FLOW_RUN_ID, PREFECT__FLOW_ENTRYPOINT) under a shell, which is
    SIGKILLed once training has written its first checkpoint."""
    from prefect.client.orchestration import get_client

    from flows.flow_requests import CorpusRequest, TrainRequest
    from flows.train_spinn import train_spinn
    from spinn.data.smoke import write_smoke_corpus
    from spinn.ground.io import file_digest, lock_output_folder

    archive = write_smoke_corpus(tmp_path / "source" / "snli_1.0.zip", sizes=SMALL_SMOKE_CORPUS)
    download = {"file": str(archive), "checksum": f"sha256:{file_digest(archive)}"}
    parameters = {
        "corpus": CorpusRequest(params=None, data_dir=tmp_path / "data", download=download, prepare={"workers": 1}),
        "training": TrainRequest(params=None, settings=FLOW_SETTINGS, register_model=False),
    }
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run(train_spinn, parameters=parameters)
    uri = copy_store(migrated_store, tmp_path / "mlflow.db")
    entrypoint = f"{Path(__file__).parents[1] / 'flows' / 'train_spinn.py'}:train_spinn"
    environment = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PREFECT_API_URL": prefect_api}
    environment.update(PREFECT__FLOW_RUN_ID=str(flow_run.id), PREFECT__FLOW_ENTRYPOINT=entrypoint)
    engine = shlex.join([sys.executable, "-m", "prefect.engine"])
    line = f"{engine} >{tmp_path / 'out.log'} 2>{tmp_path / 'err.log'} & echo $!; wait"
    worker = subprocess.Popen(["bash", "-c", line], cwd=tmp_path, env=environment, stdout=subprocess.PIPE, text=True)
    flow_process = int(worker.stdout.readline())
    try:
        wait_for(lambda: any((tmp_path / "data" / "runs").glob("*/last.pt")), START_S, "the first checkpoint")
        worker.kill()
        worker.wait()
        wait_for(lambda: not running(flow_process), ORPHAN_END_S, f"the orphaned flow run {flow_process} to end")
    finally:
        kill_if_running([flow_process])
    assert [status for status in run_statuses(uri) if status not in ENDED] == []
    with get_client(sync_client=True) as client:
        assert not client.read_flow_run(flow_run.id).state.is_running()
    (folder,) = (path for path in (tmp_path / "data" / "runs").iterdir() if path.is_dir())
    assert "Hangup" in (tmp_path / "err.log").read_text()  # what stopped it: the watch, not the grace kill
    with lock_output_folder(folder):  # free: the flow run let go of it
        pass
