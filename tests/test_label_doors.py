"""`spinn label` and the inbox flow are two doors to one orchestration: the same file meets the same checks.

The edge cases: an output that is a folder, an output the run reads, a file with nothing labelled, a rerun
of a published output; and a resumable state damaged after a kill. Each runs through the command (`spinn
label`, in process) and through the label-pairs flow (a real Prefect server, one two-worker Dask cluster for
the module), each in a folder of its own, and must end the same way: the same one-line error, or the same
counts with the output untouched and no new MLflow run when the rerun had nothing to do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pyarrow.parquet as pq
import pytest

from spinn.labeling.shard_plan import parts_folder
from tests.helpers import damage_shard, smoke_pairs, stop_before_the_merge, write_rows

INPUT_NAME = "pairs.csv"
OUTPUT_NAME = f"{INPUT_NAME}.labels.parquet"
"""Where the flow writes the input's labels (flows.label_pairs.output_name); the command is given the same."""
ROWS = 3
ROOT = "<root>"


class Outcome(NamedTuple):
    """How a door ended, with the door's own folder written as <root>: an error's one line, or the counts."""

    error: str | None
    counts: tuple[int, int, int] | None = None
    """rows, labelled, rejected."""
    output_rewritten: bool | None = None
    mlflow_runs: int | None = None
    """Labelling runs logged for this door's output, all runs of the case together."""


CASES = {
    "output_is_a_folder": Outcome(f"{ROOT}/labelled/{OUTPUT_NAME}: names a folder"),
    "output_is_read": Outcome(
        f"{ROOT}/labelled/{OUTPUT_NAME}: is the input; writing it would destroy what the command reads"
    ),
    "nothing_labelled": Outcome(
        f"no row labelled: {ROWS} of {ROWS} rejected ({ROWS} empty_sentence); "
        f"the reasons are in {ROOT}/labelled/{INPUT_NAME}.labels.rejects.jsonl"
    ),
    "published_rerun": Outcome(None, (ROWS, ROWS, 0), output_rewritten=False, mlflow_runs=1),
}


@pytest.fixture(scope="module")
def dask_address() -> Iterator[str]:
    from distributed import LocalCluster

    from flows.label_pairs import LOOPBACK

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host=LOOPBACK, dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


def prepare(case: str, root: Path, smoke_model) -> tuple[Path, Path, dict]:
    """The case's input in root/inbox, the output path, and the label settings (as the flow's request takes them)."""
    rows = smoke_pairs(smoke_model, ROWS)
    if case == "nothing_labelled":
        rows = [{**row, "premise": ""} for row in rows]
    for folder in ("inbox", "labelled"):
        (root / folder).mkdir(parents=True)
    source = write_rows(root / "inbox" / INPUT_NAME, rows)
    output = root / "labelled" / OUTPUT_NAME
    if case == "output_is_a_folder":
        output.mkdir()
    settings = {"parser": "model", "device": "cpu", "parsing": {"cache_path": str(root / "parses.sqlite")}}
    if case == "output_is_read":
        settings["parsing"]["cache_path"] = str(output)
    return source, output, settings


def through_the_command(case: str, root: Path, smoke_model) -> Outcome:
    from click.testing import CliRunner

    from spinn.cli import main

    source, output, settings = prepare(case, root, smoke_model)
    arguments = ["label", str(source), "--model", str(smoke_model.checkpoint), "--output", str(output)]
    arguments += ["--parser", "model", "--device", "cpu", "--parse-cache", settings["parsing"]["cache_path"]]
    arguments += ["--track"]
    runs = 2 if case == "published_rerun" else 1
    before = None
    for run in range(runs):
        result = CliRunner().invoke(main, arguments)
        if result.exit_code != 0:
            assert result.exit_code == 1 and result.stderr.startswith("error: "), (result.output, result.exception)
            return Outcome(_rooted(result.stderr.strip().removeprefix("error: "), root))
        if run == 0:
            before = _identity(output)
    counts = counts_of(output)
    return Outcome(None, counts, _identity(output) != before, _labelling_runs(root))


def through_the_flow(case: str, root: Path, smoke_model, address: str) -> Outcome:
    from flows.label_pairs import LabelRequest, label_pairs, write_index

    _, output, settings = prepare(case, root, smoke_model)
    request = LabelRequest(
        inbox=root / "inbox",
        outbox=root / "labelled",
        model=str(smoke_model.checkpoint),
        settings=settings,
        dask_address=address,
        settle_seconds=0,
    )
    runs = 2 if case == "published_rerun" else 1
    before = None
    for run in range(runs):
        state = label_pairs(request, return_state=True)
        result = state.result(raise_on_failure=False)
        entries = getattr(result, "entries", result)
        entry = entries[INPUT_NAME]
        if entry["status"] != "done":
            return Outcome(_rooted(entry["error"].split(": ", 1)[1], root))
        if run == 0:
            before = _identity(output)
            write_index(request.outbox, {})  # the index forgets the file: the next run finds it new
    return Outcome(None, counts_of(output), _identity(output) != before, _labelling_runs(root))


def counts_of(output: Path) -> tuple[int, int, int]:
    """rows, labelled, rejected: from the published output and its rejects file."""
    import pyarrow.parquet as pq

    labelled = pq.read_metadata(output).num_rows
    rejects = output.with_name(output.name.removesuffix(".parquet") + ".rejects.jsonl")
    rejected = len([json.loads(line) for line in rejects.read_text(encoding="utf-8").splitlines()])
    return labelled + rejected, labelled, rejected


def _identity(path: Path) -> tuple[int, int]:
    status = path.stat()
    return status.st_ino, status.st_mtime_ns


def _rooted(message: str, root: Path) -> str:
    return message.replace(str(root), ROOT)


def _labelling_runs(root: Path) -> int:
    import mlflow

    from spinn.labeling.track import LABELING_EXPERIMENT

    runs = mlflow.search_runs(experiment_names=[LABELING_EXPERIMENT], output_format="list")
    return sum(1 for run in runs if run.data.params.get("output", "").startswith(str(root)))


@pytest.mark.parametrize("case", list(CASES))
def test_the_command_and_the_flow_end_a_case_the_same_way(
    case, smoke_model, smoke_store, prefect_api, dask_address, tmp_path
):
    command = through_the_command(case, tmp_path / "command", smoke_model)
    flow = through_the_flow(case, tmp_path / "flow", smoke_model, dask_address)
    expected = CASES[case]
    if expected.error is not None:  # the command adds its fix to the line; the flow records the error alone
        assert command.error.startswith(expected.error), command
        assert flow.error == expected.error, flow
    else:
        assert command == flow == expected, (command, flow)


FOUR_DAMAGES = ("labels truncated", "input deleted", "a row twice", "label rejects not JSON")
"""One damage per shard of a four-shard plan (shard 1 keeps its labels; its input is cut again)."""
DAMAGED_ROWS = 12


@pytest.mark.parametrize("door", ["command", "flow"])
def test_a_damaged_resumable_state_is_repaired_by_either_door(
    door, smoke_model, smoke_store, prefect_api, dask_address, tmp_path
):
    """A run killed before its merge leaves its shards; damaged, then resumed by the same door: each damaged
    file is named (a warning, the summary, the flow's index entry) and redone, never a traceback, and the
    output holds every row once."""
    rows = smoke_pairs(smoke_model, DAMAGED_ROWS)
    for folder in ("inbox", "labelled"):
        (tmp_path / folder).mkdir()
    source = write_rows(tmp_path / "inbox" / INPUT_NAME, rows)
    output = tmp_path / "labelled" / OUTPUT_NAME
    run = (
        _command_run(source, output, smoke_model)
        if door == "command"
        else _flow_run(tmp_path, smoke_model, dask_address)
    )
    with pytest.MonkeyPatch.context() as patch:
        stop_before_the_merge(patch)
        first = run()
    assert first[0] == "failed" and "stopped before the merge" in first[1]
    damaged = [damage_shard(parts_folder(output), damage, index) for index, damage in enumerate(FOUR_DAMAGES)]
    status, repaired = run()
    assert status == "done", repaired
    assert sorted(Path(line.split(": ")[0]).name for line in repaired) == sorted(damaged)
    labelled = pq.read_table(output).to_pylist()
    assert [row["pair_id"] for row in labelled] == [row["id"] for row in rows]
    assert not parts_folder(output).exists()


def _command_run(source: Path, output: Path, smoke_model):
    """`spinn label` as a function of no arguments: ("done", the summary's repaired lines) or ("failed", stderr)."""
    from click.testing import CliRunner

    from spinn.cli import main

    arguments = ["label", str(source), "--model", str(smoke_model.checkpoint), "--output", str(output)]
    arguments += ["--parser", "model", "--device", "cpu", "--shard-size", str(DAMAGED_ROWS // len(FOUR_DAMAGES))]

    def run() -> tuple[str, list[str]]:
        result = CliRunner().invoke(main, arguments)
        if result.exit_code != 0:
            return "failed", result.stderr
        assert _lines(result.stderr, "warning: ") == _lines(result.stdout, "repaired: "), result.output
        return "done", _lines(result.stdout, "repaired: ")

    return run


def _lines(text: str, prefix: str) -> list[str]:
    return [line.removeprefix(prefix) for line in text.splitlines() if line.startswith(prefix)]


def _flow_run(root: Path, smoke_model, address: str):
    """The label-pairs flow as a function of no arguments: ("done", the entry's repaired) or ("failed", error)."""
    from flows.label_pairs import LabelRequest, label_pairs

    request = LabelRequest(
        inbox=root / "inbox",
        outbox=root / "labelled",
        model=str(smoke_model.checkpoint),
        settings={"parser": "model", "device": "cpu", "shard_size": DAMAGED_ROWS // len(FOUR_DAMAGES)},
        dask_address=address,
        settle_seconds=0,
        track=False,
    )

    def run() -> tuple[str, list[str]]:
        result = label_pairs(request, return_state=True).result(raise_on_failure=False)
        entry = getattr(result, "entries", result)[INPUT_NAME]
        return (entry["status"], entry["repaired"]) if entry["status"] == "done" else ("failed", entry["error"])

    return run
