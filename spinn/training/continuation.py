"""Which MLflow run a resumed training run writes into: its own, unless it finished.

A run killed mid-way (its MLflow run still RUNNING, or FAILED, or marked
KILLED) goes on in its own MLflow run: that is what resume is for. A run that
FINISHED is a record: its status, metrics and end time say what it did, and a
registered version may point at it. Resumed with a larger budget (README's
`--set max_steps=12 --resume`), or with its model still to register, it goes
on in a new MLflow run of the same experiment that names it (the
`spinn.resumed_from` tag, its name in the new run's name and description) and
logs the steps after its last, so the two histories line up; the finished run
is never written to. With nothing left to do, no MLflow run is opened at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from spinn.training.state import TrainState

RESUMED_FROM_TAG = "spinn.resumed_from"
"""The tag of a run that continues a finished one: the finished run's id."""
DESCRIPTION_TAG = "mlflow.note.content"
"""The tag MLflow's UI shows as a run's description (mlflow.utils.mlflow_tags.MLFLOW_RUN_NOTE)."""
FINISHED = "FINISHED"
CONTINUED_AT = " continued at step "
"""Joins a finished run's name and the step its continuation starts after."""


@dataclass(frozen=True)
class FinishedRun:
    """The finished MLflow run that a resumed run continues."""

    run_id: str
    name: str
    step: int


def finished_run(state: TrainState, tracking) -> FinishedRun | None:
    """The FINISHED MLflow run `state` (a resumed last.pt's) names; None for a new run or one that did not
    finish. The store holds the run (spinn.training.folders.check_run_of_folder checked)."""
    if state.run_id is None:
        return None
    summary = tracking.run_summary(state.run_id)
    if summary["status"] != FINISHED:
        return None
    return FinishedRun(state.run_id, summary["run_name"], state.step)


def continuation_name(finished: FinishedRun) -> str:
    """`spinn-16d smoke train 2026-11-26T21:40 3f2a continued at step 4`: the first run's name (not a chain)."""
    return f"{finished.name.split(CONTINUED_AT)[0]}{CONTINUED_AT}{finished.step}"


def continuation_tags(finished: FinishedRun | None) -> dict[str, str]:
    """What a new run records of the finished run it continues (nothing for a run that continues none)."""
    if finished is None:
        return {}
    return {
        RESUMED_FROM_TAG: finished.run_id,
        DESCRIPTION_TAG: (
            f"Continues MLflow run {finished.run_id} ({finished.name}), which finished at step {finished.step}: "
            f"this run's steps go on from step {finished.step + 1}, with the same model, optimizer and data order."
        ),
    }


def lineage(run_id: str, tracking) -> list[str]:
    """`run_id` and the finished runs it continues, oldest first (a run missing from the store ends it)."""
    chain = [run_id]
    while (tags := tracking.run_tags(chain[0])) is not None and tags.get(RESUMED_FROM_TAG) not in (None, *chain):
        chain.insert(0, tags[RESUMED_FROM_TAG])
    return chain


def history(run_id: str, keys: list[str], tracking) -> dict[str, dict[int, float]]:
    """`{key: {step: value}}` over the run and the runs it continues: the whole training's curves."""
    merged: dict[str, dict[int, float]] = {key: {} for key in keys}
    for link in lineage(run_id, tracking):
        for key, points in tracking.metric_history(link, keys).items():
            merged[key].update(points)
    return merged
