"""The label-pairs flow on a real Prefect server, with shards on a real two-worker Dask cluster.

Files arrive in an inbox between runs: a run labels only the new ones, a file
that fails is recorded and retried on the next run (one refused for too many
rejected rows only once it or the threshold changes), and each labelled file
leaves its predictions, an index entry, a Prefect artifact row and an MLflow run.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow.parquet as pq
import pytest

from flows.label_pairs import DONE, FAILED, REFUSED, LabelRequest, read_index, write_index
from spinn.data.schema import LABELS
from spinn.data.sentence_pairs import read_input_pairs
from spinn.ground import cores
from spinn.ground.io import file_digest
from spinn.labeling import shard_plan
from spinn.labeling.track import LABELING_EXPERIMENT
from tests.helpers import (
    assert_the_thread_rule_ran,
    file_runs,
    run_table,
    smoke_pairs,
    stanza_dir,
    thread_decisions,
    thread_rule_env,
    write_rows,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SHARD_SIZE = 20
MEETING_S = 30.0
"""How long a file labelled side by side waits for the other to begin: Prefect's client retries a start that its
SQLite server refused as locked (503) after about 2 s; only a run that labels one file at a time waits it out."""


@pytest.fixture(scope="module")
def dask_address(smoke_model) -> Iterator[str]:
    """One two-worker cluster for the module's runs that do not test the flow's own cluster: each run pays no
    cluster start, later runs none of the workers' model loading. Its workers fetch registered models from the
    smoke model's store, as a real cluster's workers are set up to (each test's store is a copy of it)."""
    from distributed import LocalCluster

    from flows.label_pairs import LOOPBACK

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host=LOOPBACK,
        dashboard_address=None,
        env={"MLFLOW_TRACKING_URI": smoke_model.tracking_uri},
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture
def request_for(smoke_model, smoke_store, tmp_path, prefect_api):
    """Labelling runs go to a copy of the smoke model's store; tmp_path is the working folder, so the labelling
    experiment's artifacts go to its ./mlruns, not into the checkout."""
    (tmp_path / "inbox").mkdir()

    def make(
        dask_workers: int = 2,
        model: str | None = None,
        outbox: str = "labelled",
        files_at_once: int | str = "auto",
        dask_address: str | None = None,
        **overrides,
    ) -> LabelRequest:
        settings = {
            "shard_size": SHARD_SIZE,
            "device": "cpu",
            "parsing": {"stanza_dir": stanza_dir(), "device": "cpu"},
            **overrides,
        }
        return LabelRequest(
            inbox=tmp_path / "inbox",
            outbox=tmp_path / outbox,
            model=model or smoke_model.registered,
            settings=settings,
            dask_workers=dask_workers,
            files_at_once=files_at_once,
            dask_address=dask_address,
            settle_seconds=0,
        )

    return make


@pytest.mark.stanza
def test_each_inbox_file_is_labelled_once_on_a_dask_cluster(
    smoke_model, request_for, dask_address, tmp_path, monkeypatch
):
    from flows.label_pairs import label_pairs

    for variable, value in thread_rule_env(tmp_path / "threads.jsonl").items():
        monkeypatch.setenv(variable, value)  # the workers inherit it
    rows = smoke_pairs(smoke_model, 50)
    write_rows(tmp_path / "inbox" / "first.csv", rows[:45])
    write_rows(tmp_path / "inbox" / "second.jsonl", rows[45:])
    request = request_for()

    entries = label_pairs(request)
    assert {name: entry["status"] for name, entry in entries.items()} == {"first.csv": DONE, "second.jsonl": DONE}
    assert entries["first.csv"]["shards"] == 3 and entries["first.csv"]["model"] == "models:/label-test/1"
    labelled = pq.read_table(tmp_path / "labelled" / "first.csv.labels.parquet").to_pylist()
    assert [row["pair_id"] for row in labelled] == [row["id"] for row in rows[:45]]
    assert read_index(tmp_path / "labelled").keys() == {"first.csv", "second.jsonl"}

    write_rows(tmp_path / "inbox" / "third.parquet", rows[:5])
    # which files are new is the index's business, not the cluster's: the module's cluster spares a start
    assert list(label_pairs(request_for(dask_address=dask_address))) == ["third.parquet"]
    assert label_pairs(request) == {}
    decisions = thread_decisions(tmp_path / "threads.jsonl", "label")  # the workers' model threads, by the rule
    assert decisions and all(decision["omp_num_threads"] == cores.share(2) for decision in decisions)
    for decision in decisions:
        assert_the_thread_rule_ran(decision)


@pytest.mark.stanza
def test_a_failed_file_is_reported_and_retried_on_the_next_run(smoke_model, request_for, dask_address, tmp_path):
    import mlflow

    from flows.label_pairs import label_pairs

    rows = smoke_pairs(smoke_model, 6)
    bad = tmp_path / "inbox" / "bad.jsonl"
    bad.write_text("".join(json.dumps({"text": row["premise"]}) + "\n" for row in rows), encoding="utf-8")
    write_rows(tmp_path / "inbox" / "good.jsonl", rows)
    request = request_for(dask_workers=1, dask_address=dask_address)

    state = label_pairs(request, return_state=True)
    assert state.is_failed() and state.message == "1 of 2 files failed (retried on the next run): bad.jsonl"
    entries = state.result(raise_on_failure=False).entries
    assert entries["good.jsonl"]["status"] == DONE
    assert entries["bad.jsonl"]["status"] == FAILED and "no premise column" in entries["bad.jsonl"]["error"]
    failed = run_table(state)["bad.jsonl"]
    assert failed["status"] == FAILED and failed["error"] == entries["bad.jsonl"]["error"] and failed["rows"] is None

    write_rows(bad, rows)  # the sender fixes the file
    retried = label_pairs(request)
    assert list(retried) == ["bad.jsonl"] and retried["bad.jsonl"]["status"] == DONE
    runs = [
        run
        for run in mlflow.search_runs(experiment_names=[LABELING_EXPERIMENT], output_format="list")
        if run.data.params["input_path"].startswith(str(tmp_path))
    ]
    assert sorted(run.data.params["input"] for run in runs) == ["bad.jsonl", "good.jsonl"]
    assert all(run.data.metrics["labelled"] == len(rows) for run in runs)


def test_a_file_refused_for_too_many_rejects_alerts_once_until_it_or_the_threshold_changes(
    smoke_model, request_for, dask_address, tmp_path
):
    """Too many rejected rows is a property of the file's content: the run that first sees it fails; later runs
    list it as still refused and complete without labelling it again, until the file or max_rejected changes."""
    import mlflow

    from flows.label_pairs import label_pairs

    rows = smoke_pairs(smoke_model, 4)
    mostly_empty = [rows[0], *({**row, "hypothesis": ""} for row in rows[1:])]  # 3 of 4 rejected, over 10%
    path = write_rows(tmp_path / "inbox" / "mostly_empty.jsonl", mostly_empty)
    request = request_for(parser="model", dask_address=dask_address)
    rejects = tmp_path / "labelled" / "mostly_empty.jsonl.labels.rejects.jsonl"

    def labelling_runs() -> int:
        runs = mlflow.search_runs(experiment_names=[LABELING_EXPERIMENT], output_format="list")
        return sum(run.data.params["input_path"] == str(path) for run in runs)

    first = label_pairs(request, return_state=True)
    assert first.is_failed() and first.message.endswith("(until the file or max_rejected changes): mostly_empty.jsonl")
    entry = read_index(request.outbox)["mostly_empty.jsonl"]
    assert (entry["status"], entry["sha256"], entry["max_rejected"]) == (REFUSED, file_digest(path, "sha256"), 0.1)
    assert entry["error"].startswith("TooManyRejected: 3 of 4 rows rejected")
    assert run_table(first)["mostly_empty.jsonl"]["status"] == REFUSED
    published = (rejects.read_bytes(), rejects.stat().st_mtime_ns)

    again = label_pairs(request, return_state=True)
    assert again.is_completed() and again.result() == {}
    row = run_table(again)["mostly_empty.jsonl"]
    assert row["status"] == REFUSED and row["error"].startswith(f"still refused since {entry['started_at']} (")
    assert f"change the file or raise max_rejected above 0.1): {entry['error']}" in row["error"]
    assert file_runs(again) == {} and labelling_runs() == 1
    assert (rejects.read_bytes(), rejects.stat().st_mtime_ns) == published

    write_rows(path, mostly_empty[:3])  # the sender edits it: new content, refused anew
    edited = label_pairs(request, return_state=True)
    assert edited.is_failed() and read_index(request.outbox)["mostly_empty.jsonl"]["sha256"] == file_digest(
        path, "sha256"
    )
    assert labelling_runs() == 2

    raised = label_pairs(request_for(parser="model", dask_address=dask_address, max_rejected=0.9))
    assert raised["mostly_empty.jsonl"]["status"] == DONE and raised["mostly_empty.jsonl"]["labelled"] == 1


def test_the_run_artifact_lists_every_file_with_the_figures_its_mlflow_run_logs(
    smoke_model, request_for, dask_address, tmp_path
):
    """The table shows what the file's MLflow run logged, rounded for reading: shares as percentages."""
    import mlflow

    from flows.label_pairs import label_pairs

    write_rows(tmp_path / "inbox" / "pairs.csv", smoke_pairs(smoke_model, 4))
    state = label_pairs(request_for(parser="model", dask_workers=1, dask_address=dask_address), return_state=True)
    output = str(tmp_path / "labelled" / "pairs.csv.labels.parquet")
    row = run_table(state)["pairs.csv"]
    [run] = mlflow.search_runs(
        experiment_names=[LABELING_EXPERIMENT], filter_string=f"params.output = '{output}'", output_format="list"
    )
    metrics = run.data.metrics
    shares = {label: metrics[f"predicted_share_{label}"] for label in LABELS}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert {label: row[label] for label in LABELS} == {label: f"{share:.1%}" for label, share in shares.items()}
    assert row["drift"] == round(metrics["drift"], 3) and row["OOV tokens"] == f"{metrics['oov_share']:.1%}"
    assert row["mean top probability"] == round(metrics["mean_top_probability"], 3)
    assert row["tokens per sentence"] == round(metrics["mean_sentence_tokens"], 1)
    assert row["MLflow run"].endswith(f"/runs/{run.info.run_id}?workflowType=machine_learning")
    assert (row["status"], row["rows"], row["labelled"], row["rejected"]) == (DONE, 4, 4, 0)
    assert (row["parser"], row["output"], row["error"]) == ("model", output, None)
    labelled = sorted(path.name for path in (tmp_path / "labelled").iterdir())
    assert labelled == [  # the shards went once the output was published: no pairs.csv.labels.parquet.parts
        "index.json",
        "pairs.csv.labels.parquet",
        "pairs.csv.labels.rejects.jsonl",
        "pairs.csv.labels.run.json",
    ]


def test_the_parser_reported_is_the_one_the_labeller_resolved(
    smoke_model, rl_checkpoint, request_for, dask_address, tmp_path
):
    """parser `auto` with an rl model labels on the model's own trees: every record must say `model`."""
    import mlflow

    from flows.label_pairs import label_pairs

    write_rows(tmp_path / "inbox" / "pairs.csv", smoke_pairs(smoke_model, 4))
    state = label_pairs(
        request_for(model=str(rl_checkpoint), parser="auto", dask_workers=1, dask_address=dask_address),
        return_state=True,
    )
    entries = state.result()

    rows = pq.read_table(tmp_path / "labelled" / "pairs.csv.labels.parquet").to_pylist()
    assert {row["parser"] for row in rows} == {"model"}
    assert entries["pairs.csv"]["parser"] == "model"
    assert read_index(tmp_path / "labelled")["pairs.csv"]["parser"] == "model"
    runs = mlflow.search_runs(
        experiment_names=[LABELING_EXPERIMENT],
        filter_string=f"params.output = '{entries['pairs.csv']['output']}'",
        output_format="list",
    )
    assert [run.data.params["parser"] for run in runs] == ["model"]
    assert run_table(state)["pairs.csv"]["parser"] == "model"


def test_inbox_files_are_labelled_side_by_side_as_they_are_one_at_a_time(
    smoke_model, rl_checkpoint, request_for, dask_address, tmp_path
):
    """Side by side, each good file's labelling waits, once it has begun, for the other's to
    begin too (one at a time, the first would wait in vain and fail), so Prefect's own records show the two
    subflows running at once; only the flow's thread writes the index, a bad file beside them still fails
    alone, each MLflow run holds its own file, and the labels are those of a run that takes one file at a
    time."""
    import flows.label_pairs as label_flow

    rows = smoke_pairs(smoke_model, 8)
    write_rows(tmp_path / "inbox" / "first.csv", rows[:5])
    write_rows(tmp_path / "inbox" / "second.jsonl", rows[5:])
    (tmp_path / "inbox" / "bad.jsonl").write_text(json.dumps({"text": rows[0]["premise"]}) + "\n", encoding="utf-8")
    good = ("first.csv", "second.jsonl")
    meeting = threading.Barrier(len(good), timeout=MEETING_S)

    began = set()

    def read_once_both_began(path, *args, **kwargs):
        """The first step of labelling a file is counting its rows to spread them (the plan reads it again).
        Patched in spinn.labeling.shard_plan, not in the flow's module: Dask pickles label_file's function by
        value with that module's globals, and a barrier cannot be pickled."""
        if path.name in good and path.name not in began:
            began.add(path.name)
            meeting.wait()
        return read_input_pairs(path, *args, **kwargs)

    def run(outbox: str, files_at_once: int):
        request = request_for(
            model=str(rl_checkpoint),
            parser="auto",
            outbox=outbox,
            files_at_once=files_at_once,
            dask_address=dask_address,
        )
        return label_good_and_bad(request, good)

    index_writers = []

    def write_index_noting_the_thread(outbox, index):
        index_writers.append(threading.current_thread())
        write_index(outbox, index)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shard_plan, "read_input_pairs", read_once_both_began)
        patch.setattr(label_flow, "write_index", write_index_noting_the_thread)
        side_by_side, labels = run("together", files_at_once=3)
    assert index_writers == [threading.current_thread()] * 3  # the flow's own thread, once as each file ends
    one_at_a_time, sequential_labels = run("one-by-one", files_at_once=1)

    assert overlapping(file_spans(side_by_side, good)) and not overlapping(file_spans(one_at_a_time, good))
    assert labels == sequential_labels
    assert [row["pair_id"] for name in good for row in labels[name]] == [row["id"] for row in rows]
    assert labelled_per_run(tmp_path / "together") == {"first.csv": 5, "second.jsonl": 3}


def label_good_and_bad(request: LabelRequest, good: tuple[str, ...]) -> tuple[Any, dict[str, list[dict]]]:
    """Run label-pairs on an inbox of the `good` files and bad.jsonl: the run fails for bad.jsonl alone, and the
    good files are labelled; returns its state and each good file's output rows."""
    from flows.label_pairs import label_pairs

    state = label_pairs(request, return_state=True)
    assert state.is_failed() and state.message == "1 of 3 files failed (retried on the next run): bad.jsonl"
    entries = state.result(raise_on_failure=False).entries
    assert list(entries) == ["bad.jsonl", *good] and "no premise column" in entries["bad.jsonl"]["error"]
    assert {name: entries[name]["status"] for name in good} == dict.fromkeys(good, DONE), entries
    assert {name: read_index(request.outbox)[name]["status"] for name in good} == dict.fromkeys(good, DONE)
    return state, {name: pq.read_table(request.outbox / f"{name}.labels.parquet").to_pylist() for name in good}


def labelled_per_run(outbox) -> dict[str, float]:
    """Input name -> `labelled` of each MLflow labelling run whose output is in `outbox`."""
    import mlflow

    runs = mlflow.search_runs(experiment_names=[LABELING_EXPERIMENT], output_format="list")
    return {
        run.data.params["input"]: run.data.metrics["labelled"]
        for run in runs
        if run.data.params["output"].startswith(str(outbox))
    }


def file_spans(state, names: tuple[str, ...]) -> list[tuple]:
    """(start, end) of each named file's label-file subflow run under this label-pairs run, from Prefect."""
    runs = file_runs(state)
    return [(runs[f"label-{name}"].start_time, runs[f"label-{name}"].end_time) for name in names]


def overlapping(spans: list[tuple]) -> bool:
    """Some instant lies inside every span: the last start comes before the first end."""
    return max(start for start, _ in spans) < min(end for _, end in spans)
