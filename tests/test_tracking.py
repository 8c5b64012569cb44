"""spinn.tracking.store against a real MLflow sqlite store in a temporary folder.

A store that cannot be read must never look like an empty one: "no champion"
lets any new model take the alias, so only MLflow's not-found answers may read
as "absent" and every other error has to reach the caller.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
import torch

from spinn.tracking import store as tracking

pytestmark = pytest.mark.integration

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
"""Where MLflow 3's UI reads an experiment's type (its React bundle; the Python package has no constant for it)."""
MODEL_TRAINING_KIND = "custom_model_development"
"""The type the UI shows as "Machine learning", with runs, not traces, first."""
MODEL = "tracking-test"
ALIAS = "champion"
ABSENT_RUN_ID = "0" * 32
SQLITE_HEADER_BYTES = 100
"""The sqlite file header; overwriting it turns every later query into "file is not a database"."""


@pytest.fixture
def store(mlflow_store) -> Path:
    """An empty store (a copy of the migrated one); the working folder is tmp_path so no ./mlruns lands in the
    checkout."""
    return mlflow_store


@pytest.fixture
def fresh_store(tmp_path, monkeypatch) -> Path:
    """Where a store will be created, with no file there yet: the tests of creating one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path / "mlflow.db"


def logged_run() -> str:
    with tracking.run("tracking-test", run_name="logged") as run_id:
        tracking.log_metrics({"dev_accuracy": 0.5}, step=0)
    return run_id


def corrupt(database: Path) -> None:
    """Damage the store the way a bad disk or a half-copied file would, while MLflow has it open."""
    with database.open("r+b") as handle:
        handle.write(b"\xff" * SQLITE_HEADER_BYTES)


def test_no_alias_reads_as_no_champion(store):
    assert tracking.alias_version(MODEL, ALIAS) is None  # the model is not registered at all
    tracking.register(MODEL, logged_run(), tags={"dev_accuracy": "0.5"})
    assert tracking.alias_version(MODEL, ALIAS) is None  # registered, but the alias is not set
    assert tracking.alias_metric(MODEL, ALIAS, "dev_accuracy") is None


def test_an_alias_gives_its_version_and_metric(store):
    version = tracking.register(MODEL, logged_run(), tags={"dev_accuracy": "0.5"})
    tracking.set_alias(MODEL, ALIAS, version)
    assert tracking.alias_version(MODEL, ALIAS) == version
    assert tracking.alias_metric(MODEL, ALIAS, "dev_accuracy") == 0.5


def test_run_exists_only_for_runs_in_this_store(store):
    assert tracking.run_exists(logged_run())
    assert not tracking.run_exists(ABSENT_RUN_ID)


def test_an_unreadable_store_raises_instead_of_reading_as_no_champion(store):
    from mlflow.exceptions import MlflowException

    tracking.register(MODEL, logged_run(), tags={"dev_accuracy": "0.5"})
    corrupt(store)
    with pytest.raises(MlflowException, match="not a database"):
        tracking.alias_version(MODEL, ALIAS)
    with pytest.raises(MlflowException, match="not a database"):
        tracking.alias_metric(MODEL, ALIAS, "dev_accuracy")


def test_an_unreadable_store_raises_instead_of_reading_as_no_run(store):
    from mlflow.exceptions import MlflowException

    run_id = logged_run()
    corrupt(store)
    with pytest.raises(MlflowException, match="not a database"):
        tracking.run_exists(run_id)


def run_status(run_id: str) -> str:
    import mlflow

    return mlflow.MlflowClient().get_run(run_id).info.status


def test_a_clean_block_leaves_its_run_finished(store):
    import mlflow

    with tracking.run("tracking-test", run_name="clean") as run_id:
        tracking.log_params({"ok": True})
    assert run_status(run_id) == "FINISHED" and mlflow.active_run() is None


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_block_that_raises_leaves_its_run_failed(store, error):
    import mlflow

    with pytest.raises(error), tracking.run("tracking-test", run_name="raises") as run_id:
        raise error("stopped")
    assert run_status(run_id) == "FAILED" and mlflow.active_run() is None


def test_a_continued_run_is_finished_again(store):
    run_id = logged_run()
    with tracking.run("tracking-test", run_id=run_id) as continued:
        tracking.log_metrics({"dev_accuracy": 0.6}, step=1)
    assert continued == run_id and run_status(run_id) == "FINISHED"


def experiment_kind(name: str) -> str | None:
    import mlflow

    return mlflow.MlflowClient().get_experiment_by_name(name).tags.get(EXPERIMENT_KIND_TAG)


def test_a_new_experiment_is_filed_as_model_training(store):
    logged_run()
    assert experiment_kind("tracking-test") == MODEL_TRAINING_KIND


def test_an_untyped_experiment_from_an_earlier_release_is_filed_as_model_training(store):
    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri())
    mlflow.MlflowClient().create_experiment("made-before")
    with tracking.run("made-before"):
        pass
    assert experiment_kind("made-before") == MODEL_TRAINING_KIND


def test_a_kind_someone_chose_is_kept(store):
    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri())
    mlflow.MlflowClient().create_experiment("chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    with tracking.run("chosen"):
        pass
    assert experiment_kind("chosen") == "genai_development"


def test_a_registered_model_created_meanwhile_is_taken_as_it_is(store, monkeypatch):
    """Another process (the MLflow UI, say) creates the model between our look-up and our creation."""
    import mlflow

    run_id = logged_run()
    tracking.register(MODEL, run_id, tags={})
    monkeypatch.setattr(mlflow.MlflowClient, "search_registered_models", lambda *_args, **_kwargs: [])
    assert tracking.register(MODEL, run_id, tags={}) == "2"


# ----------------------------------------------------------------------------- a model that is not finite

NOT_FINITE = {
    "nan-weight": ({"model_state": {"cell.weight": torch.tensor([0.1, float("nan")])}}, 0.5, "model_state.cell.weight"),
    "inf-weight": ({"model_state": {"cell.bias": torch.tensor([float("inf")])}}, 0.5, "model_state.cell.bias"),
    "nan-accuracy": ({"model_state": {"cell.weight": torch.tensor([0.1])}}, float("nan"), "dev accuracy nan"),
}


@pytest.mark.parametrize("case", NOT_FINITE)
def test_a_model_that_is_not_finite_is_never_registered(case, store, tmp_path):
    from spinn.ground.errors import SpinnError
    from spinn.tracking.register import register_model

    contents, accuracy, named = NOT_FINITE[case]
    checkpoint = tmp_path / "best.pt"
    torch.save(contents, checkpoint)
    run_id = logged_run()
    with pytest.raises(SpinnError, match=rf"^{checkpoint}: {re.escape(named)}.*not registered$"):
        register_model(run_id, checkpoint, accuracy, name=MODEL, alias=ALIAS)
    assert tracking.versions_from_run(run_id) == []


# ----------------------------------------------------------------------------- two processes, one store

RACE_TIMEOUT_S = 300
TRIALS = 6
START_MARGIN_S = 0.25
"""From telling the processes a trial's instant to that instant: both have read it by then."""
READY = "ready"
NEXT_INSTANT = """
import os, sys, time
def next_instant():
    \"\"\"Say this process is ready for the next trial, then sleep until the instant the test names.\"\"\"
    print("ready", flush=True)
    time.sleep(max(0.0, float(sys.stdin.readline()) - time.time()))
"""
REGISTER_AT = (
    NEXT_INSTANT
    + """
from spinn.tracking.register import register_model
run_id, checkpoint, accuracy = sys.argv[1], sys.argv[2], float(sys.argv[3])
for trial in range(int(os.environ["TRIALS"])):
    next_instant()
    register_model(run_id, checkpoint, accuracy, name=f"race-{trial}", alias="champion")
"""
)
OPEN_AT = (
    NEXT_INSTANT
    + """
from spinn.tracking import store as tracking
for trial in range(int(os.environ["TRIALS"])):
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{sys.argv[1]}/fresh-{trial}.db"
    next_instant()
    with tracking.run("race"):
        tracking.log_metrics({"dev_accuracy": 0.5}, step=1)
"""
)


def at_the_same_instants(script: str, argument_lists: list[list[str]], cwd: Path) -> None:
    """One process per argument list, each doing TRIALS trials, trial k of every process at the same clock
    time; all must succeed. A trial starts as soon as every process has finished the one before and said
    it is ready (no fixed waits for imports or for the slowest trial)."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, *arguments],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "TRIALS": str(TRIALS)},
        )
        for arguments in argument_lists
    ]
    printed: list[list[str]] = [[] for _ in processes]
    for _ in range(TRIALS):
        for process, lines in zip(processes, printed, strict=True):
            _wait_until_ready(process, lines)
        instant = time.time() + START_MARGIN_S
        for process in processes:
            process.stdin.write(f"{instant}\n")
            process.stdin.flush()
    for process, lines in zip(processes, printed, strict=True):
        output, _ = process.communicate(timeout=RACE_TIMEOUT_S)
        assert process.returncode == 0, "".join(lines) + output


def _wait_until_ready(process: subprocess.Popen, lines: list[str]) -> None:
    """Read what `process` prints until it says it is ready; a process that ends first fails the test."""
    for line in process.stdout:
        if line.strip() == READY:
            return
        lines.append(line)
    process.wait(timeout=RACE_TIMEOUT_S)
    raise AssertionError(f"exited {process.returncode} before its trial:\n{''.join(lines)}")


@pytest.mark.slow
def test_the_better_of_two_models_registered_at_the_same_instant_is_champion_every_time(store, tmp_path):
    """Odd trials race for a model nobody registered yet, even ones against a champion both beat."""
    from spinn.tracking.register import SELECTION_METRIC, register_model

    checkpoints = {}
    for accuracy in (0.30, 0.40, 0.50):
        checkpoints[accuracy] = tmp_path / f"model-{accuracy}.pt"
        torch.save({"model_state": {"weight": torch.tensor([accuracy])}}, checkpoints[accuracy])
    runs = {accuracy: logged_run() for accuracy in checkpoints}
    for trial in range(0, TRIALS, 2):
        register_model(runs[0.30], checkpoints[0.30], 0.30, name=f"race-{trial}", alias=ALIAS)
    racers = [[runs[accuracy], str(checkpoints[accuracy]), str(accuracy)] for accuracy in (0.40, 0.50)]
    at_the_same_instants(REGISTER_AT, racers, tmp_path)
    for trial in range(TRIALS):
        assert tracking.alias_metric(f"race-{trial}", ALIAS, SELECTION_METRIC) == 0.50, f"trial {trial}"


@pytest.mark.slow
def test_two_processes_opening_a_fresh_store_at_the_same_instant_both_work(tmp_path):
    at_the_same_instants(OPEN_AT, [[str(tmp_path)], [str(tmp_path)]], tmp_path)
    for trial in range(TRIALS):
        import mlflow

        client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/fresh-{trial}.db")
        runs = client.search_runs([client.get_experiment_by_name("race").experiment_id])
        assert [run.info.status for run in runs] == ["FINISHED", "FINISHED"], f"trial {trial}"


# ----------------------------------------------------------------------------- a killed first run

OPEN_WHEN_TOLD = """
import sys
import mlflow
from spinn.tracking import store as tracking
print("imported", flush=True)
with tracking.run("killed"):
    tracking.log_metrics({"dev_accuracy": 0.5}, step=1)
"""
KILL_POINTS = (
    ("imported", 0.2),
    ("Creating initial MLflow database tables", 0.0),
    ("Updating database tables", 0.0),
    ("Updating database tables", 1.0),
    ("Updating database tables", 2.5),
)
"""Where the first run is killed: a line it prints (MLflow logs the two steps of creating a store), then a pause.
Creating and migrating a fresh store takes seconds, so these land at its start, in its migrations and later
(one point each; every case costs a process start and a migration, about 12 s on two busy cores)."""
PROCESS_TIMEOUT_S = 120


def first_run_killed_at(line: str, seconds: float, folder: Path) -> None:
    """Start a first run on a fresh store in `folder`; SIGKILL it `seconds` after it printed `line`."""
    process = subprocess.Popen(
        [sys.executable, "-c", OPEN_WHEN_TOLD], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        for printed in process.stdout:
            if line in printed:
                time.sleep(seconds)
                break
    finally:
        process.kill()
        process.wait(timeout=PROCESS_TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.parametrize(("line", "seconds"), KILL_POINTS)
def test_a_first_run_killed_while_creating_the_store_never_breaks_it(line, seconds, fresh_store):
    store = fresh_store
    first_run_killed_at(line, seconds, store.parent)
    run_id = logged_run()  # the next run works on whatever the killed one left
    assert tracking.run_exists(run_id)
    assert not [path.name for path in store.parent.iterdir() if path.name.endswith(".tmp")]


def test_a_half_made_store_of_an_earlier_release_is_rebuilt(fresh_store):
    store = fresh_store
    """What a killed migration left: some tables, an old schema revision, no runs."""
    with closing(sqlite3.connect(store)) as db:
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        db.execute("INSERT INTO alembic_version VALUES ('451aebb31d03')")
        db.execute("CREATE TABLE assessments (id INTEGER)")
        db.commit()
    assert tracking.run_exists(logged_run())


def test_a_store_with_runs_is_never_rebuilt(store):
    run_id = logged_run()
    tracking._opened.clear()  # as a new process would open it
    with closing(sqlite3.connect(store)) as db:
        db.execute("UPDATE alembic_version SET version_num = 'an-older-one'")
        db.commit()
    assert not tracking._needs_building(store)
    with closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT run_uuid FROM runs").fetchall() == [(run_id,)]
