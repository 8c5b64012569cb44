"""The registered model is an MLflow model: pyfunc predict equals `spinn label`, it serves, and old versions relog.

The model is the session's small spinn model (tests/conftest.py `smoke_model`),
which training logged as an MLflow 3 logged model and registered; each test
that writes works on a copy of its sqlite store. The 0.1.0 version is the
files of tests/fixtures/release-0.1.0 registered as that release did, as a
folder. `mlflow models predict` and `mlflow models serve` run as real
processes against a real store, the server on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from spinn.labeling.label import label
from spinn.labeling.label_settings import PROBABILITY_COLUMNS, LabelSettings
from spinn.serving.pyfunc import OUTPUT_COLUMNS
from spinn.tracking.register import (
    CHECKPOINT_TAG,
    INPUT_EXAMPLE,
    LOGGED_MODEL_NAME,
    MODEL_INPUTS,
    MODEL_OUTPUTS,
    SELECTION_METRIC,
)
from tests.helpers import (
    RELEASE,
    assert_the_thread_rule_ran,
    register_as_release_0_1_0,
    thread_decisions,
    thread_rule_env,
)

MLFLOW = Path(sys.executable).with_name("mlflow")
PAIRS = 12
SERVER_START_S = 180
"""Bounded wait for `mlflow models serve` to answer /ping (imports take tens of seconds on a busy machine)."""
CLI_TIMEOUT_S = 300
EMPTY = "   "
"""A premise with no tokens: the parser refuses it, and the row says why."""


@pytest.fixture(scope="module")
def store(smoke_model, tmp_path_factory) -> str:
    """A copy of the smoke model's store, so this module's writes leave other tests' store as it was."""
    folder = tmp_path_factory.mktemp("mlflow-model")
    source = Path(smoke_model.tracking_uri.removeprefix("sqlite:///"))
    shutil.copy(source, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        patch.chdir(folder)
        yield uri


@pytest.fixture(autouse=True)
def mlflow_reads_the_store_of_the_environment() -> None:
    """MLflow keeps the last tracking URI set in the process (spinn's door sets it at every call): point it
    at the store MLFLOW_TRACKING_URI names now, so an earlier test's store never answers this one."""
    import mlflow

    if "MLFLOW_TRACKING_URI" in os.environ:
        mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])


@pytest.fixture(scope="module")
def pairs(smoke_model) -> pd.DataFrame:
    """The smoke test split's first pairs, raw text, and one pair the parser must refuse."""
    table = pq.read_table(smoke_model.prepared / "test.parquet", columns=["pair_id", "premise", "hypothesis"])
    frame = table.to_pandas().head(PAIRS)
    frame.loc[len(frame)] = ["empty", EMPTY, "A dog runs."]
    return frame


def model_uri(smoke_model) -> str:
    return smoke_model.registered


def test_training_logs_a_logged_model_with_its_dev_metrics(smoke_model, store):
    import mlflow

    client = mlflow.MlflowClient(store)
    version = client.get_model_version_by_alias("label-test", "champion")
    found = mlflow.search_logged_models(
        experiment_ids=[client.get_run(version.run_id).info.experiment_id], output_format="list"
    )
    assert len(found) == 1, "one best model, one logged model"
    model = found[0]
    assert model.name == LOGGED_MODEL_NAME and model.source_run_id == version.run_id
    assert version.source == f"models:/{model.model_id}", "the version is the logged model"
    assert model.tags[CHECKPOINT_TAG] == version.tags[CHECKPOINT_TAG]
    metrics = {metric.key: metric.value for metric in model.metrics}
    assert metrics["dev_accuracy"] == pytest.approx(float(version.tags[SELECTION_METRIC]))
    assert {"dev_macro_f1", "dev_examples"} <= set(metrics)
    outputs = client.get_run(version.run_id).outputs.model_outputs
    assert [output.model_id for output in outputs] == [model.model_id], "the run lists it in its Logged models"
    listed = json.loads(model.tags["mlflow.modelVersions"])  # the logged model's page: "Model versions"
    assert {"name": "label-test", "version": str(version.version)} in listed


def test_the_model_carries_a_signature_an_example_and_spinn_as_its_code(smoke_model, store, tmp_path):
    from importlib.metadata import version

    import mlflow

    folder = Path(mlflow.artifacts.download_artifacts(model_uri(smoke_model), dst_path=str(tmp_path)))
    model = mlflow.models.Model.load(folder)
    assert model.signature.inputs.input_names() == [column.name for column in MODEL_INPUTS]
    assert model.signature.outputs.input_names() == [column.name for column in MODEL_OUTPUTS] == list(OUTPUT_COLUMNS)
    assert model.load_input_example(folder).to_dict("records") == INPUT_EXAMPLE
    assert f"spinn=={version('spinn')}" in (folder / "requirements.txt").read_text().split()
    assert not list(folder.rglob("*.pkl")), "no pickled code or model"
    assert "set_model(SpinnModel())" in (folder / model.flavors["python_function"]["model_code_path"]).read_text()
    weights = torch.load(folder / "artifacts" / "checkpoint.pt", weights_only=True)
    assert weights["format"] == "spinn.checkpoint"


def labelled_by_spinn_label(pairs: pd.DataFrame, uri: str, tmp_path: Path) -> pd.DataFrame:
    source = tmp_path / "pairs.csv"
    pairs.to_csv(source, index=False)
    summary = label(source, uri, tmp_path / "out.parquet", LabelSettings(parser="model", device="cpu"))
    assert summary.rejected == 1
    return pq.read_table(tmp_path / "out.parquet").to_pandas()


def assert_same_rows(served: pd.DataFrame, labelled: pd.DataFrame, pairs: pd.DataFrame) -> None:
    """Row for row: the labelled pairs carry `spinn label`'s label, probabilities and trees; the refused one
    only its reason."""
    kept = pairs.pair_id != "empty"
    assert served.loc[~kept.to_numpy(), "rejected"].tolist() == ["empty_sentence"]
    assert served.loc[~kept.to_numpy(), "label"].isna().all()
    served = served[kept.to_numpy()].reset_index(drop=True)
    assert served.rejected.isna().all()
    labelled = labelled.set_index("pair_id").loc[pairs.pair_id[kept]].reset_index()
    for column in ("label", "premise_tree", "hypothesis_tree"):
        assert served[column].tolist() == labelled[column].tolist(), column
    for column in PROBABILITY_COLUMNS:  # spinn label stores float32
        numpy.testing.assert_array_equal(served[column].to_numpy(numpy.float32), labelled[column].to_numpy())


@pytest.mark.usefixtures("one_reading_of_free_cores")
def test_pyfunc_predict_equals_spinn_label_row_for_row(smoke_model, store, pairs, tmp_path):
    import mlflow

    served = mlflow.pyfunc.load_model(model_uri(smoke_model)).predict(pairs[["premise", "hypothesis"]])
    assert list(served.columns) == list(OUTPUT_COLUMNS) and len(served) == len(pairs)
    assert_same_rows(served, labelled_by_spinn_label(pairs, model_uri(smoke_model), tmp_path), pairs)


@pytest.mark.usefixtures("one_reading_of_free_cores")
def test_mlflow_models_predict_writes_the_same_predictions(smoke_model, store, pairs, tmp_path):
    source, output = tmp_path / "pairs.csv", tmp_path / "out.json"
    pairs[["premise", "hypothesis"]].to_csv(source, index=False)
    command = [str(MLFLOW), "models", "predict", "-m", model_uri(smoke_model), "-i", str(source), "-t", "csv"]
    command += ["--env-manager", "local", "-o", str(output)]
    env = {**child_env(), **thread_rule_env(tmp_path / "threads.jsonl")}
    finished = subprocess.run(command, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env)
    assert finished.returncode == 0, finished.stderr[-3000:]
    served = pd.DataFrame(strict_json(output.read_text())["predictions"])
    assert_same_rows(served, labelled_by_spinn_label(pairs, model_uri(smoke_model), tmp_path), pairs)
    (decision,) = thread_decisions(tmp_path / "threads.jsonl", "label")  # the pyfunc's model, by the rule
    assert_the_thread_rule_ran(decision)


def strict_json(text: str | bytes) -> dict:
    """JSON as a browser reads it: NaN or Infinity (Python's json accepts them) fail the test."""

    def refuse(constant: str):
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def child_env() -> dict[str, str]:
    """The test's environment for a child process: this checkout first on its Python path, and the venv's
    bin on PATH (`mlflow models serve` starts `uvicorn` by name, as an activated environment would find it)."""
    root = str(Path(__file__).resolve().parents[1])
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        "PATH": os.pathsep.join([str(MLFLOW.parent), os.environ.get("PATH", "")]),
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_up(server: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow models serve exited with {server.returncode}: {server.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    pytest.fail(f"mlflow models serve did not answer /ping within {SERVER_START_S} s")


@pytest.mark.usefixtures("one_reading_of_free_cores")
def test_mlflow_models_serve_answers_invocations(smoke_model, store, pairs, tmp_path, no_proxy):
    port = free_port()
    command = [str(MLFLOW), "models", "serve", "-m", model_uri(smoke_model), "--env-manager", "local"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(server, url)
        body = json.dumps({"dataframe_records": pairs[["premise", "hypothesis"]].to_dict("records")}).encode()
        request = urllib.request.Request(
            f"{url}/invocations", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            served = pd.DataFrame(strict_json(response.read())["predictions"])
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # the server's own session: uvicorn goes with it
        server.communicate(timeout=30)
    assert_same_rows(served, labelled_by_spinn_label(pairs, model_uri(smoke_model), tmp_path), pairs)


@pytest.fixture
def release_store(mlflow_store) -> str:
    """A store where release 0.1.0 registered its model as it did: the run's `model/` folder, @champion, tagged."""
    uri = f"sqlite:///{mlflow_store}"
    register_as_release_0_1_0(uri, tags=OLD_TAGS, description="spinn, old")
    return uri


OLD_TAGS = {SELECTION_METRIC: "0.5", CHECKPOINT_TAG: "0" * 64, "test_accuracy": "0.4"}


def release_pairs() -> pd.DataFrame:
    table = pq.read_table(RELEASE / "pairs.parquet", columns=["pair_id", "premise", "hypothesis"])
    return table.to_pandas()


def test_a_0_1_0_version_still_labels_evaluates_and_draws_trees(release_store, tmp_path):
    from spinn.evaluation.evaluate import evaluate
    from spinn.labeling.induced_trees import induce_trees

    labelled = labelled_by_spinn_label(add_refused(release_pairs()), "models:/spinn/1", tmp_path)
    assert len(labelled) == len(release_pairs())
    metrics = evaluate("models:/spinn/1", RELEASE / "pairs.parquet", tmp_path / "metrics.json")
    assert metrics.examples == len(release_pairs())
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("A dog runs .\nTwo men play music on a stage .\n", encoding="utf-8")
    assert induce_trees("models:/spinn/1", sentences, tmp_path / "trees.txt") == 2


def add_refused(pairs: pd.DataFrame) -> pd.DataFrame:
    pairs = pairs.copy()
    pairs.loc[len(pairs)] = ["empty", EMPTY, "A dog runs."]
    return pairs


def test_relog_model_makes_a_0_1_0_version_a_logged_model_keeping_aliases_and_tags(release_store, tmp_path):
    import mlflow
    from click.testing import CliRunner

    from spinn.cli import main

    result = CliRunner().invoke(main, ["relog-model", "models:/spinn@champion"])
    assert result.exit_code == 0, result.output
    assert "models:/spinn/1 re-registered as models:/spinn/2" in result.output
    client = mlflow.MlflowClient()
    new = client.get_model_version_by_alias("spinn", "champion")
    old = client.get_model_version("spinn", "1")
    assert str(new.version) == "2" and new.source.startswith("models:/m-") and new.run_id == old.run_id
    assert new.tags == {**OLD_TAGS, "relogged_from": "models:/spinn/1"} and new.description == "spinn, old"
    logged = mlflow.get_logged_model(new.source.removeprefix("models:/"))
    assert logged.source_run_id == old.run_id and {metric.key for metric in logged.metrics} >= {"dev_accuracy"}
    pairs = add_refused(release_pairs())
    served = mlflow.pyfunc.load_model("models:/spinn@champion").predict(pairs[["premise", "hypothesis"]])
    assert_same_rows(served, labelled_by_spinn_label(pairs, "models:/spinn/1", tmp_path), pairs)
    again = CliRunner().invoke(main, ["relog-model", "models:/spinn/2"])
    assert again.exit_code == 1 and "is a logged model already" in again.output


def untrained_pi_model(path: Path) -> Path:
    """A pi model (it reads parser trees, it cannot build its own) on the release's vocabulary, random
    weights: enough to show which trees reach it."""
    from spinn.model.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
    from spinn.model.config import SPINNConfig
    from spinn.model.spinn import SPINN

    release = load_checkpoint(RELEASE / "checkpoint.pt")
    config = SPINNConfig.from_dict({**release.model_config, "variant": "pi"})
    torch.manual_seed(0)
    model = SPINN(config, torch.randn(len(release.vocab["tokens"]), config.d_embed))
    saved = Checkpoint(model_state=model.state_dict(), model_config=config.to_dict(), vocab=release.vocab, step=0)
    return save_checkpoint(path, saved)


@pytest.mark.stanza
def test_a_model_that_needs_parses_serves_with_stanza_as_spinn_label_does(tmp_path, monkeypatch):
    """No parser setting is given to the pyfunc: it parses with Stanza, as logged with the model."""
    import mlflow

    from spinn.parsing.parser import ParserSettings
    from spinn.tracking import store as tracking
    from spinn.tracking.register import log_model
    from tests.helpers import stanza_dir

    monkeypatch.setenv("SPINN_STANZA_DIR", str(stanza_dir()))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    checkpoint = untrained_pi_model(tmp_path / "pi.pt")
    with tracking.run("pi-model") as run_id:
        files = (checkpoint, RELEASE / "vocab.json", RELEASE / "config.json")
        model_id = log_model(run_id, *files, {}, needs_parser=True, step=0)
    pairs = add_refused(release_pairs().head(7))
    served = mlflow.pyfunc.load_model(f"models:/{model_id}").predict(pairs[["premise", "hypothesis"]])
    source = tmp_path / "pairs.csv"
    pairs.to_csv(source, index=False)
    parsing = ParserSettings(stanza_dir=stanza_dir(), cache_path=None, workers=1, device="cpu")
    label(source, checkpoint, tmp_path / "out.parquet", LabelSettings(parser="stanza", device="cpu", parsing=parsing))
    assert_same_rows(served, pq.read_table(tmp_path / "out.parquet").to_pandas(), pairs)


def test_logging_a_checkpoint_again_keeps_the_logged_model_the_run_has(tmp_path, monkeypatch):
    """A retried flow or a resumed run publishes its best checkpoint again: one model, not two."""
    import mlflow

    from spinn.tracking import store as tracking
    from spinn.tracking.register import log_model

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    files = [RELEASE / name for name in ("checkpoint.pt", "vocab.json", "config.json")]
    with tracking.run("relogged") as run_id:
        first = log_model(run_id, *files, {"accuracy": 0.5, "per_class": {}}, needs_parser=False, step=3)
        assert log_model(run_id, *files, {"accuracy": 0.5}, needs_parser=False, step=3) == first
    experiment = mlflow.MlflowClient().get_run(run_id).info.experiment_id
    found = mlflow.search_logged_models(experiment_ids=[experiment], output_format="list")
    assert [model.model_id for model in found] == [first]
    assert {metric.key: metric.value for metric in found[0].metrics} == {"dev_accuracy": 0.5}


def recorded_imports(monkeypatch, package: str) -> list[str]:
    """Every import statement of `package` or its modules from now on, recorded (it goes on as usual):
    whether one ran is known even when an earlier test imported the package into this process."""
    import builtins

    attempts: list[str] = []
    real = builtins.__import__

    def recording(name, *args, **kwargs):
        if name == package or name.startswith(f"{package}."):
            attempts.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", recording)
    return attempts


def recorded_predictions(monkeypatch) -> list[int]:
    """The row count of every call of the pyfunc's predict from now on (MLflow's check of the input example
    loads the logged model in this process and predicts the example)."""
    from spinn.serving.pyfunc import SpinnModel

    calls: list[int] = []
    real = SpinnModel.predict

    def recording(self, context, model_input, params=None):
        calls.append(len(model_input))
        return real(self, context, model_input, params)

    monkeypatch.setattr(SpinnModel, "predict", recording)
    return calls


@pytest.mark.parametrize(("variant", "checked"), [("pi", False), ("spinn", True)])
def test_only_a_model_that_labels_without_a_parser_has_its_example_checked_as_it_is_logged(
    variant, checked, tmp_path, monkeypatch
):
    """Logging a pi model predicted MLflow's input example, which loaded Stanza at training time (offline a
    "could not download" warning, online a download of Stanza's models). A spinn model's check is
    cheap and offline and still proves the logged model serves. Both keep the example MLflow's UI shows."""
    import mlflow

    from spinn.tracking import store as tracking
    from spinn.tracking.register import log_model

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    checkpoint = untrained_pi_model(tmp_path / "pi.pt") if variant == "pi" else RELEASE / "checkpoint.pt"
    stanza, predictions = recorded_imports(monkeypatch, "stanza"), recorded_predictions(monkeypatch)
    with tracking.run(f"{variant}-model") as run_id:
        files = (checkpoint, RELEASE / "vocab.json", RELEASE / "config.json")
        model_id = log_model(run_id, *files, {}, needs_parser=not checked, step=0)
    assert predictions == ([len(INPUT_EXAMPLE)] if checked else []), "MLflow predicted the input example"
    assert stanza == [], "logging the model imported Stanza"
    folder = Path(mlflow.artifacts.download_artifacts(f"models:/{model_id}", dst_path=str(tmp_path / "logged")))
    assert mlflow.models.Model.load(folder).load_input_example(folder).to_dict("records") == INPUT_EXAMPLE
    assert (folder / "serving_input_example.json").is_file()


def test_a_missing_sentence_is_refused_not_labelled_as_the_text_none(smoke_model, store):
    import mlflow

    frame = pd.DataFrame({"premise": ["A dog runs.", None], "hypothesis": ["A dog moves.", "A cat sleeps."]})
    served = mlflow.pyfunc.load_model(model_uri(smoke_model)).predict(frame)
    assert served.rejected.tolist() == [None, "empty_sentence"]
    assert served.label[0] in ("entailment", "neutral", "contradiction") and served.label[1] is None
