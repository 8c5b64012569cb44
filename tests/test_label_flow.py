"""The label-pairs flow on a real Prefect server, with shards on a real two-worker Dask cluster.

Files arrive in an inbox between runs: a run labels only the new ones, a file
that fails is recorded and retried on the next run, and each labelled file
leaves its predictions, an index entry, a Prefect artifact row and an MLflow run.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from flows.label_pairs import (
    DONE,
    FAILED,
    LABELING_EXPERIMENT,
    LabelRequest,
    read_index,
)
from tests.test_label import smoke_pairs, stanza_dir, write_rows

pytestmark = pytest.mark.slow

SHARD_SIZE = 20


@pytest.fixture
def request_for(smoke_model, tmp_path, monkeypatch, prefect_api):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", smoke_model.tracking_uri)
    monkeypatch.chdir(tmp_path)  # the labelling experiment's artifacts go to ./mlruns, not into the checkout
    (tmp_path / "inbox").mkdir()

    def make(**overrides) -> LabelRequest:
        settings = {"inbox": tmp_path / "inbox", "outbox": tmp_path / "labelled", "model": smoke_model.registered,
                    "stanza_dir": stanza_dir(), "shard_size": SHARD_SIZE, "device": "cpu", "dask_workers": 2}
        return LabelRequest(**{**settings, **overrides})

    return make


def test_each_inbox_file_is_labelled_once_on_a_dask_cluster(smoke_model, request_for, tmp_path):
    from flows.label_pairs import label_pairs

    rows = smoke_pairs(smoke_model, 50)
    write_rows(tmp_path / "inbox" / "first.csv", rows[:45])
    write_rows(tmp_path / "inbox" / "second.jsonl", rows[45:])
    request = request_for()

    entries = label_pairs(request)
    assert {name: entry["status"] for name, entry in entries.items()} == {"first.csv": DONE, "second.jsonl": DONE}
    assert entries["first.csv"]["shards"] == 3 and entries["first.csv"]["model"] == "models:/label-test/1"
    labelled = pq.read_table(tmp_path / "labelled" / "first.labels.parquet").to_pylist()
    assert [row["pair_id"] for row in labelled] == [row["id"] for row in rows[:45]]
    assert read_index(tmp_path / "labelled").keys() == {"first.csv", "second.jsonl"}

    write_rows(tmp_path / "inbox" / "third.parquet", rows[:5])
    assert list(label_pairs(request)) == ["third.parquet"]
    assert label_pairs(request) == {}


def test_a_failed_file_is_reported_and_retried_on_the_next_run(smoke_model, request_for, tmp_path):
    import mlflow

    from flows.label_pairs import label_pairs

    rows = smoke_pairs(smoke_model, 6)
    bad = tmp_path / "inbox" / "bad.jsonl"
    bad.write_text("".join(json.dumps({"text": row["premise"]}) + "\n" for row in rows), encoding="utf-8")
    write_rows(tmp_path / "inbox" / "good.jsonl", rows)
    request = request_for(dask_workers=1)

    entries = label_pairs(request)
    assert entries["good.jsonl"]["status"] == DONE
    assert entries["bad.jsonl"]["status"] == FAILED and "no premise column" in entries["bad.jsonl"]["error"]

    write_rows(bad, rows)  # the sender fixes the file
    retried = label_pairs(request)
    assert list(retried) == ["bad.jsonl"] and retried["bad.jsonl"]["status"] == DONE
    runs = [run for run in mlflow.search_runs(experiment_names=[LABELING_EXPERIMENT], output_format="list")
            if run.data.params["input"].startswith(str(tmp_path))]
    assert sorted(run.data.params["input"].rsplit("/", 1)[1] for run in runs) == ["bad.jsonl", "good.jsonl"]
    assert all(run.data.metrics["labelled"] == len(rows) for run in runs)


def test_the_run_artifact_lists_every_file_with_its_counts(smoke_model, request_for, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.label_pairs import label_pairs

    write_rows(tmp_path / "inbox" / "pairs.csv", smoke_pairs(smoke_model, 4))
    state = label_pairs(request_for(parser="model", dask_workers=1), return_state=True)
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["spinn-labeling-run"])))
    mine = [a for a in artifacts if a.flow_run_id == state.state_details.flow_run_id]
    assert len(mine) == 1 and "| pairs.csv | done | 4 | 4 | 0 |" in mine[0].data
