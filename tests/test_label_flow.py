"""The label-pairs flow on a real Prefect server, with shards on a real two-worker Dask cluster.

Files arrive in an inbox between runs: a run labels only the new ones, a file
that fails is recorded and retried on the next run, and each labelled file
leaves its predictions, an index entry, a Prefect artifact row and an MLflow run.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from flows.label_pairs import DONE, FAILED, LabelRequest, read_index
from spinn.data.schema import LABELS
from spinn.labeling.track import LABELING_EXPERIMENT
from tests.test_label import smoke_pairs, stanza_dir, write_rows

pytestmark = pytest.mark.slow

SHARD_SIZE = 20


@pytest.fixture
def request_for(smoke_model, smoke_store, tmp_path, prefect_api):
    """Labelling runs go to a copy of the smoke model's store; tmp_path is the working folder, so the labelling
    experiment's artifacts go to its ./mlruns, not into the checkout."""
    (tmp_path / "inbox").mkdir()

    def make(dask_workers: int = 2, model: str | None = None, **overrides) -> LabelRequest:
        settings = {
            "shard_size": SHARD_SIZE,
            "device": "cpu",
            "parsing": {"stanza_dir": stanza_dir(), "device": "cpu"},
            **overrides,
        }
        return LabelRequest(
            inbox=tmp_path / "inbox",
            outbox=tmp_path / "labelled",
            model=model or smoke_model.registered,
            settings=settings,
            dask_workers=dask_workers,
        )

    return make


@pytest.mark.stanza
def test_each_inbox_file_is_labelled_once_on_a_dask_cluster(smoke_model, request_for, tmp_path):
    from flows.label_pairs import label_pairs

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
    assert list(label_pairs(request)) == ["third.parquet"]
    assert label_pairs(request) == {}


@pytest.mark.stanza
def test_a_failed_file_is_reported_and_retried_on_the_next_run(smoke_model, request_for, tmp_path):
    import mlflow

    from flows.label_pairs import label_pairs

    rows = smoke_pairs(smoke_model, 6)
    bad = tmp_path / "inbox" / "bad.jsonl"
    bad.write_text("".join(json.dumps({"text": row["premise"]}) + "\n" for row in rows), encoding="utf-8")
    write_rows(tmp_path / "inbox" / "good.jsonl", rows)
    request = request_for(dask_workers=1)

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


def run_table(state) -> dict[str, dict]:
    """File name -> its row in the labelling-run table artifact that this flow run created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["spinn-labeling-run"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id]),
            )
        )
    assert [artifact.type for artifact in artifacts] == ["table"]
    return {row["file"]: row for row in json.loads(artifacts[0].data)}


def test_the_run_artifact_lists_every_file_with_the_figures_its_mlflow_run_logs(smoke_model, request_for, tmp_path):
    """The table shows what the file's MLflow run logged, rounded for reading: shares as percentages."""
    import mlflow

    from flows.label_pairs import label_pairs

    write_rows(tmp_path / "inbox" / "pairs.csv", smoke_pairs(smoke_model, 4))
    state = label_pairs(request_for(parser="model", dask_workers=1), return_state=True)
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


def test_the_parser_reported_is_the_one_the_labeller_resolved(smoke_model, rl_checkpoint, request_for, tmp_path):
    """parser `auto` with an rl model labels on the model's own trees: every record must say `model`."""
    import mlflow

    from flows.label_pairs import label_pairs

    write_rows(tmp_path / "inbox" / "pairs.csv", smoke_pairs(smoke_model, 4))
    state = label_pairs(request_for(model=str(rl_checkpoint), parser="auto", dask_workers=1), return_state=True)
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
