"""The Prefect flows end to end against a real Prefect server, a real MLflow store and the smoke corpus.

One module fixture runs train-spinn once on the synthetic SNLI-format corpus
(spinn.data.smoke) with a small model; the tests then check what that run left
behind (Parquet, checkpoint, metrics JSON, the MLflow run, the registered
version, the Prefect artifacts) and what reruns do: everything cached, a
deleted output rebuilt, nothing registered twice.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from uuid import UUID

import pytest
from pydantic import ValidationError

from flows.flow_requests import CorpusRequest, EvaluateRequest, TrainRequest
from spinn.data.smoke import write_smoke_corpus
from spinn.evaluation.evaluate import report_path
from spinn.ground.io import file_digest
from spinn.ground.settings import nest
from spinn.tracking.register import version_description
from tests.helpers import (
    SMALL_SMOKE_CORPUS,
    TINY_MODEL,
    assert_the_thread_rule_ran,
    copy_checkout,
    copy_store,
    stanza_dir,
    thread_decisions,
    thread_rule_env,
    write_rows,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMALL_TRAINING = {
    "model.variant": "spinn",
    **{f"model.{key}": value for key, value in TINY_MODEL.items()},
    "batch_size": 32,
    "max_steps": 2,
    "eval_every": 2,
    "log_every": 1,
    "checkpoint_every": 2,
    "device": "cpu",
    "threads": 1,
    "experiment": "flow-test",
    "registered_model": "flow-test",
}
STAGE_TASKS = {"download", "prepare-train", "prepare-dev", "prepare-test", "vocab", "embeddings", "train", "evaluate"}
CACHED = "Cached"
VENV_BIN = Path(sys.executable).parent
CLI_TIMEOUT_S = 120
WORKER_TIMEOUT_S = 300
LATER_RUNS = ("evaluate-spinn/champion", "label-pairs/inbox")
"""README's runs after training: they score and label with the champion it registered."""


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_api, migrated_store) -> dict:
    """A data folder, an MLflow store and the smoke archive; the environment points MLflow there."""
    root = tmp_path_factory.mktemp("flow-project")
    # README's label run takes 12 of its test pairs
    archive = write_smoke_corpus(root / "source" / "snli_1.0.zip", sizes=SMALL_SMOKE_CORPUS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", copy_store(migrated_store, root / "mlflow.db"))
        patch.chdir(root)  # MLflow puts a new experiment's artifacts under ./mlruns: keep them out of the checkout
        yield {
            "root": root,
            "archive": archive,
            "corpus": CorpusRequest(
                params=None,
                data_dir=root / "data",
                download={"file": archive, "checksum": f"sha256:{file_digest(archive)}"},
                prepare={"workers": 1},
            ),
            "training": TrainRequest(params=None, settings=nest(SMALL_TRAINING.items())),
        }


@pytest.fixture(scope="module")
def first_run(project):
    from flows.train_spinn import train_spinn

    state = train_spinn(project["corpus"], project["training"], return_state=True)
    assert state.is_completed(), state.message
    return state


def with_subflows(flow_run_id: UUID) -> list[UUID]:
    """The flow run and its subflow runs (prepare-corpus runs as a subflow of train-spinn)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]))
        )
    return [flow_run_id, *(child.id for child in children)]


def stage_states(flow_run_id: UUID) -> dict[str, list[str]]:
    """Task run name -> its runs' state names in start order, over the flow run and its subflows."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=with_subflows(flow_run_id))))
    states: dict[str, list[str]] = {}
    for run in sorted(runs, key=lambda run: run.expected_start_time):
        states.setdefault(run.name, []).append(run.state.name)
    return states


def test_train_spinn_leaves_data_model_metrics_and_a_registered_version(project, first_run):
    import mlflow

    result = first_run.result()
    data = project["root"] / "data"
    for split in ("train", "dev", "test"):
        assert (data / "prepared" / f"{split}.parquet").is_file()
    run_folder = Path(result.checkpoint).parent
    assert run_folder.parent == data / "runs" and Path(result.checkpoint).name == "best.pt"
    assert Path(result.metrics_file) == run_folder / "metrics" / "test.json"
    metrics = json.loads(Path(result.metrics_file).read_text())
    assert metrics["examples"] > 0 and 0.0 <= metrics["accuracy"] <= 1.0
    assert result.test_metrics["accuracy"] == pytest.approx(metrics["accuracy"])

    client = mlflow.MlflowClient()
    run = client.get_run(result.run_id)
    assert {"best_dev_accuracy", "dev_accuracy", "train_loss", "test_accuracy"} <= set(run.data.metrics)
    assert run.data.tags["prefect.flow_run_id"] == str(first_run.state_details.flow_run_id)
    version = client.get_model_version_by_alias("flow-test", "champion")
    assert version.run_id == result.run_id and str(version.version) == result.registered["version"]
    assert float(version.tags["test_accuracy"]) == pytest.approx(metrics["accuracy"])
    assert version.description == version_description("spinn", result.best_dev_accuracy)  # as `spinn train` does
    assert run.data.tags.get("prefect.flow_run_url", "http").startswith("http")  # a real address, or none
    assert stage_states(first_run.state_details.flow_run_id).keys() >= STAGE_TASKS


def run_artifact(state, key: str, kind: str):
    """The one artifact under `key` that the flow run or its subflows made; it must be of type `kind`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key]),
                flow_run_id=ArtifactFilterFlowRunId(any_=with_subflows(state.state_details.flow_run_id)),
            )
        )
    assert [artifact.type for artifact in artifacts] == [kind]
    return artifacts[0]


def facts_table(state, key: str) -> dict:
    return {row["fact"]: row["value"] for row in json.loads(run_artifact(state, key, "table").data)}


def test_the_prefect_run_shows_the_mlflow_run_and_its_metrics(first_run):
    result = first_run.result()
    facts = facts_table(first_run, "spinn-training-run")
    assert facts["MLflow run"] == result.run_id
    assert facts["test accuracy"] == pytest.approx(result.test_metrics["accuracy"], abs=1e-4)
    assert facts["registered model"].startswith(f"models:/flow-test/{result.registered['version']} ")
    link = run_artifact(first_run, "spinn-training-run-link", "markdown").data
    assert f"/#/experiments/{result.experiment_id}/runs/{result.run_id}?workflowType=machine_learning)" in link


def test_the_prefect_run_shows_each_split_s_counts_and_the_vocabulary(project, first_run):
    import pyarrow.parquet as pq

    rows = json.loads(run_artifact(first_run, "spinn-prepared-corpus", "table").data)
    prepared = project["root"] / "data" / "prepared"
    assert [row["split"] for row in rows] == ["train", "dev", "test"]
    assert all(row["written"] == pq.read_metadata(prepared / f"{row['split']}.parquet").num_rows for row in rows)
    assert all(row["read"] == row["written"] + row["skipped (no consensus)"] + row["rejected"] for row in rows)
    vocabulary = facts_table(first_run, "spinn-prepared-vocabulary")
    assert vocabulary["vocabulary entries"] > 0 and 0.0 <= vocabulary["coverage"] <= 1.0


def test_rerun_skips_every_finished_stage_and_registers_nothing_new(project, first_run):
    import mlflow

    from flows.train_spinn import train_spinn

    state = train_spinn(project["corpus"], project["training"], return_state=True)
    states = stage_states(state.state_details.flow_run_id)
    assert {name: states[name] for name in STAGE_TASKS} == {name: [CACHED] for name in STAGE_TASKS}
    assert state.result().run_id == first_run.result().run_id
    assert state.result().registered["created"] is False
    assert len(mlflow.MlflowClient().search_model_versions("name = 'flow-test'")) == 1


def test_a_rerun_without_prefect_s_cache_record_reuses_the_finished_run(project, first_run, monkeypatch):
    """Another PREFECT_HOME, a cleared cache or another machine sharing data/ has no cache record;
    train then runs on the finished run's folder, which is the result instead of a refusal."""
    from flows import tasks
    from flows.train_spinn import train_spinn

    monkeypatch.setattr(tasks, "train_stage", tasks.train_stage.with_options(refresh_cache=True))
    state = train_spinn(project["corpus"], project["training"], return_state=True)
    assert state.is_completed(), state.message
    assert stage_states(state.state_details.flow_run_id)["train"] == ["Completed"]
    result, first = state.result(), first_run.result()
    assert (result.run_id, result.checkpoint, result.best_dev_accuracy) == (
        first.run_id,
        first.checkpoint,
        first.best_dev_accuracy,
    )
    assert result.registered["created"] is False


def test_a_deleted_output_is_rebuilt_and_nothing_downstream_reruns(project, first_run):
    from flows.train_spinn import train_spinn

    dev = project["root"] / "data" / "prepared" / "dev.parquet"
    before = file_digest(dev, "sha256")
    dev.unlink()
    state = train_spinn(project["corpus"], project["training"], return_state=True)
    states = stage_states(state.state_details.flow_run_id)
    assert states["prepare-dev"] == [CACHED, "Completed"]  # the hit is checked against the files, then redone
    assert states["prepare-train"] == states["train"] == states["evaluate"] == [CACHED]
    assert file_digest(dev, "sha256") == before


def test_evaluate_spinn_scores_the_registered_champion(project, first_run):
    from flows.evaluate_spinn import evaluate_spinn

    output = project["root"] / "eval" / "champion.json"
    settings = EvaluateRequest(
        params=None,
        model="models:/flow-test@champion",
        output=output,
        data=project["root"] / "data" / "prepared" / "test.parquet",
        settings={"device": "cpu"},
    )
    state = evaluate_spinn(settings, return_state=True)
    evaluated = state.result()
    assert evaluated["accuracy"] == pytest.approx(first_run.result().test_metrics["accuracy"])
    facts = facts_table(state, "spinn-evaluation")
    assert facts["model"] == "models:/flow-test@champion" and facts["pairs"] == evaluated["examples"]
    assert json.loads(output.read_text())["accuracy"] == pytest.approx(evaluated["accuracy"])
    assert json.loads(report_path(output).read_text())["model"] == "models:/flow-test@champion"
    assert (output.parent / "champion_predictions.csv").is_file()
    assert (output.parent / "champion_reliability" / "reliability.png").is_file()
    assert evaluated["uncalibrated_ece"] >= 0 and evaluated["temperature"] > 0  # the flow reports calibration


def test_download_is_retried_and_resumes_after_a_dropped_connection(tmp_path, server, monkeypatch, prefect_api):
    from flows import tasks
    from flows.prepare_corpus import prepare_corpus
    from tests.httpserver import Cut

    archive = write_smoke_corpus(tmp_path / "mirror.zip")
    payload = archive.read_bytes()
    server.state.files["/snli_1.0.zip"] = payload
    server.state.cuts["/snli_1.0.zip"] = Cut(after=len(payload) // 3, times=1)
    monkeypatch.setattr(tasks, "download_stage", tasks.download_stage.with_options(retry_delay_seconds=0))
    corpus = CorpusRequest(
        params=None,
        data_dir=tmp_path / "data",
        download={"url": server.url("/snli_1.0.zip"), "checksum": f"sha256:{file_digest(archive)}"},
        prepare={"workers": 1},
    )
    prepared = prepare_corpus(corpus)
    assert prepared.counts["train"]["written"] > 0
    ranges = [request.range for request in server.state.seen if request.method == "GET"]
    assert ranges == [None, f"bytes={len(payload) // 3}-"]


def test_a_wrong_checksum_is_not_retried(tmp_path, server, prefect_api):
    from flows.prepare_corpus import prepare_corpus

    server.state.files["/snli_1.0.zip"] = write_smoke_corpus(tmp_path / "mirror.zip").read_bytes()
    corpus = CorpusRequest(
        params=None,
        data_dir=tmp_path / "d",
        download={"url": server.url("/snli_1.0.zip"), "checksum": "sha256:" + "0" * 64},
    )
    state = prepare_corpus(corpus, return_state=True)
    assert state.is_failed() and "sha256 mismatch" in str(state.result(raise_on_failure=False))
    assert len([request for request in server.state.seen if request.method == "GET"]) == 1


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (lambda: CorpusRequest(params=None, download={"url": "http://127.0.0.1/x.zip", "file": "x.zip"}), "not both"),
        (lambda: CorpusRequest(params=None, download={"checksum": "sha256:xyz"}), "checksum 'sha256:xyz'"),
        (lambda: CorpusRequest(params=None, prepare={"splits": {"train": "a.jsonl"}}), "missing ['dev', 'test']"),
        (lambda: TrainRequest(params=None, settings={"model": {"variant": "rnn"}}), "Input should be 'pi-nt'"),
        (lambda: TrainRequest(params=None, settings={"max_stepz": 3}), "max_stepz"),
        (lambda: TrainRequest(params=Path("no/such/params.yaml")), "no such file"),
    ],
)
def test_parameters_are_validated_with_messages_that_name_the_setting(settings, message):
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings()


def test_a_flow_run_with_bad_parameters_fails_before_any_work(tmp_path, prefect_api):
    from prefect.exceptions import ParameterTypeError

    from flows.train_spinn import train_spinn

    with pytest.raises(ParameterTypeError, match="max_stepz"):
        train_spinn(
            training={"params": None, "settings": {"max_stepz": 3}},
            corpus={"params": None, "data_dir": str(tmp_path / "data")},
        )
    assert not (tmp_path / "data").exists()


def readme_lines(heading: str, marker: str) -> list[str]:
    """The lines of README's first ```bash block under `heading` that contains `marker`."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split(heading, 1)[1]
    block = next(block for block in re.findall(r"```bash\n(.+?)\n```", section, re.DOTALL) if marker in block)
    return block.splitlines()


def shell(line: str, cwd: Path, env: dict[str, str], timeout: float = CLI_TIMEOUT_S) -> str:
    done = subprocess.run(line, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{line} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def triggered(line: str, checkout: Path, env: dict[str, str]) -> UUID:
    """README's `prefect deployment run NAME` line as written; the flow run it scheduled."""
    return UUID(re.search(r"UUID: ([0-9a-f-]{36})", shell(line, checkout, env)).group(1))


def worker_pass(checkout: Path, env: dict[str, str], *flow_run_ids: UUID) -> list:
    """One process worker pass (it takes every scheduled run); the finished flow runs."""
    from prefect.client.orchestration import get_client

    shell(".venv/bin/prefect worker start --pool spinn --run-once", checkout, env, timeout=WORKER_TIMEOUT_S)
    with get_client(sync_client=True) as client:
        return [client.read_flow_run(flow_run_id) for flow_run_id in flow_run_ids]


@pytest.mark.stanza
def test_readme_deployments_run_offline_by_name_on_their_defaults(
    project, first_run, tmp_path, prefect_api, migrated_store
):
    """README's Prefect section line by line, offline, on a process worker: the worker's environment names the
    corpus copy and the Stanza folder, params.yaml (shrunk here) everything else; prefect.yaml deploys with its
    working directory and the inbox schedule paused; train-spinn/snli with typed parameters ends Completed and
    registers models:/spinn@champion; in one worker pass, evaluate-spinn/champion scores that champion as its
    training did (its threads by the rule) and label-pairs/inbox labels the good file with it and ends Failed
    on the bad one; the schedule then turns on."""
    import mlflow
    import pyarrow.parquet as pq
    import yaml
    from prefect.client.orchestration import get_client

    checkout = copy_checkout(tmp_path / "checkout")
    (checkout / ".venv").symlink_to(VENV_BIN.parent)
    params = yaml.safe_load((checkout / "params.yaml").read_text(encoding="utf-8"))
    params["train"] = {**nest(SMALL_TRAINING.items()), "experiment": "spinn", "registered_model": "spinn"}
    (checkout / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    archive = project["archive"]
    exported = {
        "SPINN_DOWNLOAD_FILE": str(archive),
        "SPINN_DOWNLOAD_CHECKSUM": f"sha256:{file_digest(archive)}",
        "SPINN_STANZA_DIR": str(stanza_dir()),
    }
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPINN_")}
    env.update(PREFECT_API_URL=prefect_api, MLFLOW_TRACKING_URI=copy_store(migrated_store, tmp_path / "mlflow.db"))
    env.update(exported, **thread_rule_env(trace := tmp_path / "threads.jsonl"))
    worker_lines = readme_lines("## Run it as Prefect deployments", "worker start")
    assert worker_lines[0] == "export PREFECT_API_URL=http://127.0.0.1:4200/api"
    assert set(re.findall(r"(SPINN_\w+)=", worker_lines[1])) <= set(exported)
    with get_client(sync_client=True) as client:
        pools = {pool.name for pool in client.read_work_pools()}
    if "spinn" not in pools:  # another test of this session's server may have made it
        shell(worker_lines[2], checkout, env)
    lines = readme_lines("## Run it as Prefect deployments", "deploy --all")
    assert lines[0] == worker_lines[0]
    shell(lines[1], checkout, env)
    with get_client(sync_client=True) as client:
        evaluation = client.read_deployment_by_name("evaluate-spinn/champion")
        labelling = client.read_deployment_by_name("label-pairs/inbox")
    assert evaluation.pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(checkout.resolve())}}
    ]
    assert [schedule.schedule.cron for schedule in labelling.schedules] == ["*/15 * * * *"]
    assert [schedule.active for schedule in labelling.schedules] == [False]  # README says how to turn it on

    # the line with typed parameters: JSON on the command line, validated into the flow's request
    (trained,) = worker_pass(
        checkout, env, triggered(next(line for line in lines if " -p training=" in line), checkout, env)
    )
    assert trained.state.is_completed(), trained.state.message
    assert trained.parameters["training"]["settings"] == {"model": {"variant": "spinn"}, "batch_size": 256}
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    champion = mlflow.MlflowClient().get_model_version_by_alias("spinn", "champion")
    assert (checkout / "data" / "prepared" / "train.parquet").is_file()

    inbox = checkout / "data" / "inbox"
    inbox.mkdir(parents=True)
    rows = pq.read_table(project["root"] / "data" / "prepared" / "test.parquet").to_pylist()[:12]
    write_rows(inbox / "good.csv", [{"premise": row["premise"], "hypothesis": row["hypothesis"]} for row in rows])
    (inbox / "bad.jsonl").write_text(json.dumps({"text": rows[0]["premise"]}) + "\n", encoding="utf-8")
    evaluated, labelled = worker_pass(  # one pass takes both: neither waits on the other
        checkout,
        env,
        *(triggered(next(line for line in lines if f"'{name}'" in line), checkout, env) for name in LATER_RUNS),
    )
    assert evaluated.state.is_completed(), evaluated.state.message
    (metrics,) = (checkout / "data" / "evaluations").glob("*/metrics.json")
    assert json.loads(metrics.read_text())["accuracy"] == pytest.approx(float(champion.tags["test_accuracy"]))
    decisions = thread_decisions(trace, "evaluate")  # train-spinn's evaluate task, then evaluate-spinn's
    assert len(decisions) == len(["train-spinn", "evaluate-spinn"]), decisions
    for decision in decisions:
        assert_the_thread_rule_ran(decision)
    assert labelled.state.is_failed() and "bad.jsonl" in labelled.state.message, labelled.state.message
    predictions = pq.read_table(checkout / "data" / "labelled" / "good.csv.labels.parquet").to_pylist()
    assert len(predictions) == len(rows) and {row["model"] for row in predictions} == {
        f"models:/spinn/{champion.version}"
    }

    resume = next(line for line in lines if "schedule resume" in line)
    shell(resume, checkout, env)
    try:
        with get_client(sync_client=True) as client:
            schedules = client.read_deployment_by_name("label-pairs/inbox").schedules
        assert [schedule.active for schedule in schedules] == [True]
    finally:  # no label run may come due while later tests start workers on this server
        shell(resume.replace("resume", "pause"), checkout, env)


def test_spinn_pipeline_reports_a_checksum_mismatch_in_one_line_naming_its_option(tmp_path, prefect_api):
    """One `error:` line that names --checksum (the CLI's word, not the flow's corpus.download.checksum), no
    traceback; --debug shows Prefect's failure logs and the traceback."""
    archive = write_smoke_corpus(tmp_path / "snli_1.0.zip")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPINN_")}
    env.update(PREFECT_API_URL=prefect_api, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    command = [str(VENV_BIN / "spinn-pipeline"), "--file", str(archive), "--checksum", "sha256:" + "0" * 64]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    errors = [line for line in done.stderr.splitlines() if "mismatch" in line or "Traceback" in line]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    assert errors[0].startswith("error: snli_1.0.zip: sha256 mismatch")
    assert errors[0].endswith(f"give --checksum sha256:{file_digest(archive)}") and "corpus.download" not in errors[0]
    debug = subprocess.run(
        [*command, "--debug"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    assert "to fix it: if that is the archive you mean (not the official one), give corpus.download.checksum" in (
        debug.stderr + debug.stdout
    )
