"""Training, checkpoints, resume and evaluation, with real MLflow (sqlite) and real SNLI pairs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from spinn.data.vocab import Vocabulary
from spinn.evaluation.evaluate import EvaluateSettings, evaluate
from spinn.ground.errors import SpinnError, advice, option_name
from spinn.model.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from spinn.training.train import train
from tests.helpers import PREPARED_DEV_PAIRS, TINY_MODEL, tiny_config

pytestmark = pytest.mark.integration

KILL_RUN_STEPS = 30
"""The kill lands as the first checkpoint (step 5) appears: some 25 steps and their evaluations are left to resume."""


def test_two_step_run_is_tracked_checkpointed_and_registered(prepared, workdir):
    import mlflow

    config = tiny_config(max_steps=2, registered_model="spinn-test")
    result = train(
        prepared / "train.parquet", prepared / "dev.parquet", config, output_dir=workdir / "models", progress=False
    )
    assert result.steps == 2 and result.model_version == "1" and result.promoted
    client = mlflow.MlflowClient()
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["model.variant"] == "spinn" and params["model.d_embed"] == "50"  # from GloVe 50d
    assert params["learning_rate"] == str(2e-3) and params["embeddings.source"] == "glove-6b-50d"
    assert len(params["data.train_sha256"]) == 64 and params["data.dev_pairs"] == str(PREPARED_DEV_PAIRS - 1)
    assert run.data.tags["variant"] == "spinn" and run.data.tags["git_commit"]
    for metric in (
        "train_loss",
        "train_accuracy",
        "dev_accuracy",
        "dev_transition_accuracy",
        "learning_rate",
        "pairs_per_second",
        "best_dev_accuracy",
    ):
        assert metric in run.data.metrics, metric
    assert [m.step for m in client.get_metric_history(result.run_id, "train_loss")] == [1, 2]
    model = Path(mlflow.artifacts.download_artifacts(f"runs:/{result.run_id}/model", dst_path=str(workdir / "dl")))
    assert {path.name for path in (model / "artifacts").iterdir()} == {"checkpoint.pt", "vocab.json", "config.json"}
    champion = client.get_model_version_by_alias("spinn-test", "champion")
    assert str(champion.version) == "1" and champion.run_id == result.run_id
    contents = torch.load(result.best_checkpoint, weights_only=True)  # the file is the same plain dict as ever
    assert {
        "format",
        "version",
        "model_state",
        "optimizer_state",
        "model_config",
        "train_config",
        "vocab",
        "step",
        "rng",
        "rng_ranks",
        "state",
        "data",
        "metrics",
        "temperature",
    } == set(contents)
    assert load_checkpoint(result.best_checkpoint).to_dict().keys() == contents.keys()


@pytest.mark.parametrize("variant", ["pi", "spinn"])
def test_best_pt_keeps_the_temperature_fitted_on_its_dev_logits_and_the_logged_model_carries_it(
    prepared, workdir, variant
):
    """Temperature scaling after training: fitted on dev's logits on the trees the model labels with (pi: the
    parses, those of the evaluation that made it best, not a second run; spinn: its own, one run at the end),
    kept in best.pt and the logged MLflow model, logged as a metric at the best step."""
    import mlflow

    from spinn.evaluation.calibration import fit_temperature
    from spinn.evaluation.evaluate import predict_examples, read_examples
    from spinn.model.loading import load_model
    from spinn.training.loop import labelling_source

    model = {"variant": variant, **TINY_MODEL}
    config = tiny_config(max_steps=3, registered_model="spinn-calibrated", model=model)
    result = train(
        prepared / "train.parquet", prepared / "dev.parquet", config, output_dir=workdir / "m", progress=False
    )
    saved = load_checkpoint(result.best_checkpoint)
    assert saved.temperature == result.temperature and 0 < saved.temperature != 1.0
    loaded = load_model(result.best_checkpoint, torch.device("cpu"))
    dev = read_examples(prepared / "dev.parquet", loaded.vocabulary)
    source = labelling_source(loaded.model.config)
    found = predict_examples(loaded.model, dev, torch.device("cpu"), source=source)
    assert saved.temperature == pytest.approx(fit_temperature(found.logits, found.gold), rel=1e-6)
    client = mlflow.MlflowClient()
    history = client.get_metric_history(result.run_id, "temperature")
    assert [(point.step, point.value) for point in history] == [(result.best_step, saved.temperature)]
    assert client.get_run(result.run_id).data.tags["temperature"] == f"{saved.temperature:.4f}"
    model = Path(mlflow.artifacts.download_artifacts("models:/spinn-calibrated@champion", dst_path=str(workdir / "dl")))
    assert load_checkpoint(model / "artifacts" / "checkpoint.pt").temperature == saved.temperature


def test_the_dev_curve_holds_each_evaluation_once_at_its_own_step(prepared, workdir):
    """The best model's dev scores, linked to the logged model, are the points its evaluation
    logged, not a second dev_accuracy at step 0, where the curve in MLflow and dev_curve.csv began at its end."""
    import csv

    import mlflow

    from spinn.training.publish import write_metrics_files

    config = tiny_config(max_steps=4, eval_every=2)
    result = train(
        prepared / "train.parquet", prepared / "dev.parquet", config, output_dir=workdir / "m", progress=False
    )
    client = mlflow.MlflowClient()
    history = client.get_metric_history(result.run_id, "dev_accuracy")
    assert [point.step for point in history] == [2, 4], [(point.step, point.value) for point in history]
    (model,) = client.search_logged_models(experiment_ids=[client.get_run(result.run_id).info.experiment_id])
    linked = {metric.key: (metric.step, metric.value) for metric in model.metrics}
    assert linked["dev_accuracy"] == (result.best_step, result.best_dev_accuracy)
    _, _, dev_curve = write_metrics_files(result, workdir / "metrics")
    with dev_curve.open(encoding="utf-8") as handle:
        assert [int(row["step"]) for row in csv.DictReader(handle)] == [2, 4]


def test_resuming_a_finished_run_registers_nothing_new(prepared, workdir):
    import mlflow

    config = tiny_config(max_steps=2, registered_model="spinn-once")
    first = train(
        prepared / "train.parquet", prepared / "dev.parquet", config, output_dir=workdir / "m", progress=False
    )
    again = train(
        prepared / "train.parquet",
        prepared / "dev.parquet",
        config,
        output_dir=workdir / "m",
        resume=True,
        progress=False,
    )
    assert (again.steps, again.run_id, again.model_version) == (first.steps, first.run_id, "1")
    assert len(mlflow.MlflowClient().search_model_versions("name = 'spinn-once'")) == 1
    longer = train(
        prepared / "train.parquet",
        prepared / "dev.parquet",
        tiny_config(max_steps=4, registered_model="spinn-once"),
        output_dir=workdir / "m",
        resume=True,
        progress=False,
    )
    assert longer.steps == 4 and longer.run_id != first.run_id  # the finished run stays as it ended
    assert mlflow.MlflowClient().get_run(longer.run_id).data.tags["spinn.resumed_from"] == first.run_id


def test_alias_moves_only_to_a_better_model(prepared, workdir):
    first = train(
        prepared / "train.parquet",
        prepared / "dev.parquet",
        tiny_config(max_steps=12, eval_every=1, registered_model="spinn-alias"),
        output_dir=workdir / "a",
        progress=False,
    )
    worse = train(
        prepared / "train.parquet",
        prepared / "dev.parquet",
        tiny_config(max_steps=1, learning_rate=1e-9, registered_model="spinn-alias"),
        output_dir=workdir / "b",
        progress=False,
    )
    assert first.promoted
    assert worse.best_dev_accuracy < first.best_dev_accuracy, "the control run should be worse"
    assert not worse.promoted and worse.model_version == "2"


@pytest.mark.usefixtures("one_reading_of_free_cores")
def test_evaluate_from_checkpoint_and_registry_agree(prepared, workdir):
    result = train(
        prepared / "train.parquet",
        prepared / "dev.parquet",
        tiny_config(max_steps=3, registered_model="spinn-eval"),
        output_dir=workdir / "m",
        progress=False,
    )
    from_file = evaluate(
        result.best_checkpoint,
        prepared / "dev.parquet",
        workdir / "a.json",
        EvaluateSettings(transitions="gold"),
        plot=workdir / "confusion.png",
    )
    from_registry = evaluate(
        "models:/spinn-eval@champion",
        prepared / "dev.parquet",
        workdir / "b.json",
        EvaluateSettings(transitions="gold"),
    )
    assert from_file == from_registry
    assert from_file.accuracy == pytest.approx(result.best_dev_accuracy)
    summary = json.loads((workdir / "a.json").read_text())
    assert summary["examples"] == PREPARED_DEV_PAIRS - 1 and 0.0 <= summary["transition_accuracy"] <= 1.0
    report = json.loads((workdir / "a_report.json").read_text())
    assert (
        report["transitions"] == "gold"
        and sum(map(sum, report["confusion_matrix"]["counts"])) == PREPARED_DEV_PAIRS - 1
    )
    assert (workdir / "confusion.png").read_bytes()[:4] == b"\x89PNG"
    predicted = evaluate(result.best_checkpoint, prepared / "dev.parquet", workdir / "c.json")
    assert json.loads((workdir / "c_report.json").read_text())["transitions"] == "predicted"
    assert predicted.examples == from_file.examples


def test_another_vocabulary_is_refused(prepared, workdir):
    result = train(
        prepared / "train.parquet",
        prepared / "dev.parquet",
        tiny_config(max_steps=1),
        output_dir=workdir / "m",
        progress=False,
        register=False,
    )
    other = Vocabulary.load(prepared / "vocab.json")
    other = Vocabulary(other.tokens[:-1] + ("zebra-unseen",), other.counts, other.lowercase, other.min_freq)
    other.save(workdir / "other_vocab.json")
    with pytest.raises(SpinnError, match="vocabulary .* differs from .*other_vocab.json"):
        evaluate(
            result.best_checkpoint, prepared / "dev.parquet", workdir / "x.json", vocab=workdir / "other_vocab.json"
        )
    with pytest.raises(SpinnError, match="last.pt: checkpoint vocabulary"):
        train(
            prepared / "train.parquet",
            prepared / "dev.parquet",
            tiny_config(max_steps=2),
            output_dir=workdir / "m",
            vocab_path=workdir / "other_vocab.json",
            resume=True,
            progress=False,
        )


def test_wrong_schema_is_refused(prepared, workdir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    result = train(
        prepared / "train.parquet",
        prepared / "dev.parquet",
        tiny_config(max_steps=1),
        output_dir=workdir / "m",
        progress=False,
        register=False,
    )
    pq.write_table(pa.table({"premise": ["a"]}), workdir / "bad.parquet")
    with pytest.raises(SpinnError, match="bad.parquet: prepared-pairs schema version none"):
        evaluate(result.best_checkpoint, workdir / "bad.parquet", workdir / "x.json")


def test_checkpoints_never_unpickle_code(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, ("echo should-not-run",))

    torch.save({"format": "spinn.checkpoint", "version": 1, "evil": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(SpinnError, match="not a spinn checkpoint, or one from an untrusted source"):
        load_checkpoint(tmp_path / "evil.pt")
    save_checkpoint(tmp_path / "ok.pt", Checkpoint(model_state={}, model_config={}, vocab={}, step=0))
    assert load_checkpoint(tmp_path / "ok.pt").step == 0


def test_every_torch_load_is_weights_only():
    root = Path(__file__).resolve().parents[1] / "spinn"
    call = "torch." + "load("  # spelled apart so this file does not match its own search
    for path in root.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if call in line:
                assert "weights_only=True" in line, f"{path}:{number}"


def spinn_train(*args: str, cwd: Path) -> subprocess.Popen:
    command = [str(Path(sys.executable).with_name("spinn")), "train", *args]
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def spinn_train_here(*args: str) -> None:
    """`spinn train` in this process, in the working folder: for the runs that are not the one killed or raced
    (a child process costs seconds of imports)."""
    from click.testing import CliRunner

    from spinn.cli import main

    trained = CliRunner().invoke(main, ["train", *args])
    assert trained.exit_code == 0, trained.output


@pytest.mark.slow
def test_resume_after_kill_reaches_the_same_weights(prepared, workdir):
    common = [
        "--train",
        str(prepared / "train.parquet"),
        "--dev",
        str(prepared / "dev.parquet"),
        "--no-register",
        "--set",
        "model.variant=spinn",
        *[f"--set=model.{k}={v}" for k, v in TINY_MODEL.items()],
        "--set",
        f"max_steps={KILL_RUN_STEPS}",
        "--set",
        "checkpoint_every=5",
        "--set",
        "eval_every=10",
        "--set",
        "batch_size=16",
        "--set",
        "seed=3",
        "--set",
        "threads=1",
        "--device",
        "cpu",
    ]
    spinn_train_here(*common, "--output", "whole")

    killed = spinn_train(*common, "--output", "killed", cwd=workdir)
    last = workdir / "killed" / "last.pt"
    deadline = time.monotonic() + 300
    while not last.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    assert killed.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    interrupted_at = load_checkpoint(last).step
    assert 0 < interrupted_at < KILL_RUN_STEPS

    spinn_train_here(*common, "--output", "killed", "--resume")
    expected = load_checkpoint(workdir / "whole" / "last.pt")
    actual = load_checkpoint(last)
    assert actual.step == expected.step == KILL_RUN_STEPS
    for name, tensor in expected.model_state.items():
        assert torch.equal(tensor, actual.model_state[name]), name
    assert actual.state["best_dev_accuracy"] == expected.state["best_dev_accuracy"]
    assert actual.run_id == load_checkpoint(workdir / "killed" / "best.pt").run_id


def test_rng_states_restore_whatever_device_or_dtype_they_come_back_as():
    """A resumed run on CUDA got its CPU generator state back as a CUDA tensor (torch.load's map_location
    moves every tensor); set_rng_state wants a CPU byte tensor. Restoring must not care how they come back."""
    import random

    from spinn.model.checkpoint import restore_rng_states, rng_states

    saved = rng_states()
    expected = (torch.rand(4), random.random())
    changed = {**saved, "torch": saved["torch"].to(torch.int64)}  # another dtype, as a careless load can give
    restore_rng_states(changed)
    assert torch.equal(torch.rand(4), expected[0]) and random.random() == expected[1]
    restore_rng_states({**saved, "torch": saved["torch"].clone().as_strided(saved["torch"].shape, (1,))})
    assert torch.equal(torch.rand(4), expected[0])


# ----------------------------------------------------------------------------- an output folder holds one run


def test_run_names_say_the_variant_its_size_and_whether_the_data_is_the_synthetic_smoke_corpus(prepared, smoke_model):
    """Smoke runs were named `spinn snli_1.0_train <time>` like runs on real SNLI (the smoke
    corpus is laid out as snli_1.0.zip), so the runs table could not tell them apart."""
    from spinn.training.publish import default_run_name

    config = tiny_config()
    real = default_run_name(config, prepared / "train.parquet")
    smoke = default_run_name(config, smoke_model.prepared / "train.parquet")
    assert real.startswith("spinn-16d snli_1.0_train_first1024 ") and "smoke" not in real, real
    assert smoke.startswith("spinn-16d smoke train "), smoke
    assert re.fullmatch(r"spinn-16d smoke train \d{4}-\d\d-\d\dT\d\d:\d\d [0-9a-f]{4}", smoke), smoke


def test_runs_get_distinct_names_and_hold_their_data_and_confusion_matrices(prepared, workdir):
    """Without --run-name, each run is named by variant, data and time (not by the seeded generator); a run
    lists its data as dataset inputs, keeps the dev and (after evaluate) test scores and confusion matrices
    as artifacts, its summary as tags; its version is described and tagged as every path does it."""

    import mlflow

    from spinn.tracking.register import version_description

    config = tiny_config(max_steps=2, registered_model="spinn-named")
    first, second = (
        train(prepared / "train.parquet", prepared / "dev.parquet", config, output_dir=workdir / name, progress=False)
        for name in ("one", "two")
    )
    client = mlflow.MlflowClient()
    runs = [client.get_run(result.run_id) for result in (first, second)]
    names = [run.info.run_name for run in runs]
    assert names[0] != names[1], names
    assert all(name.startswith("spinn-16d snli_1.0_train_first1024 ") for name in names), names

    run = runs[0]
    inputs = {item.tags[0].value: item.dataset for item in run.inputs.dataset_inputs}
    assert set(inputs) == {"training", "validation"}
    assert inputs["training"].name == "snli_1.0_train_first1024"
    assert run.data.params["data.train_sha256"].startswith(inputs["training"].digest)
    assert str(prepared / "train.parquet") in inputs["training"].source
    assert "best_step" in run.data.tags and "best_step" not in run.data.metrics
    dev = {item.path for item in client.list_artifacts(run.info.run_id, "dev")}
    assert dev == {"dev/confusion.png", "dev/dev_scores.json"}  # the same name as test/confusion.png

    test = shutil.copy(prepared / "dev.parquet", workdir / "test.parquet")
    metrics = evaluate(first.best_checkpoint, test, workdir / "test.json", plot=workdir / "confusion.png")
    assert {item.path for item in client.list_artifacts(run.info.run_id, "test")} == {
        "test/test.json",
        "test/test_report.json",
        "test/confusion.png",
    }
    version = client.get_model_version("spinn-named", first.model_version)
    assert version.description == version_description("spinn", first.best_dev_accuracy)
    assert float(version.tags["test_accuracy"]) == pytest.approx(metrics.accuracy)
    assert "test_accuracy" not in client.get_model_version("spinn-named", second.model_version).tags


def short_run(prepared: Path, output_dir: Path, **options):
    return train(
        prepared / "train.parquet",
        prepared / "dev.parquet",
        tiny_config(max_steps=options.pop("max_steps", 2)),
        output_dir=output_dir,
        progress=False,
        register=False,
        **options,
    )


def test_a_new_run_refuses_a_folder_holding_an_earlier_run_unless_told_to_overwrite(prepared, workdir):
    first = short_run(prepared, workdir / "m", max_steps=3)
    before = {name: (workdir / "m" / name).read_bytes() for name in ("last.pt", "best.pt")}
    with pytest.raises(SpinnError, match=r"m: holds last\.pt, best\.pt of an earlier run") as refused:
        short_run(prepared, workdir / "m")
    assert advice(refused.value, option_name) == (
        "continue it with --resume, replace it with --overwrite, or choose another output folder"
    )
    assert "--" not in str(refused.value)  # the library names settings; each front end words them
    assert {name: (workdir / "m" / name).read_bytes() for name in before} == before
    replaced = short_run(prepared, workdir / "m", overwrite=True)
    assert replaced.run_id != first.run_id and load_checkpoint(workdir / "m" / "last.pt").step == 2
    with pytest.raises(SpinnError, match="resume continues the run there and overwrite replaces it") as both:
        short_run(prepared, workdir / "m", resume=True, overwrite=True)
    assert (
        advice(both.value, lambda setting: f"training.{setting}")
        == "give training.resume or training.overwrite, not both"
    )


def test_the_command_refuses_a_folder_holding_an_earlier_run_in_one_line(prepared, workdir):
    from click.testing import CliRunner

    from spinn.cli import main

    short_run(prepared, workdir / "m")
    data = ["--train", str(prepared / "train.parquet"), "--dev", str(prepared / "dev.parquet")]
    tiny = [f"--set=model.{key}={value}" for key, value in TINY_MODEL.items()]
    result = CliRunner().invoke(main, ["train", *data, *tiny, "--output-dir", str(workdir / "m"), "--no-register"])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {workdir / 'm'}: holds last.pt, best.pt of an earlier run")
    assert "continue it with --resume, replace it with --overwrite" in result.stderr
    overwritten = CliRunner().invoke(
        main, ["train", *data, *tiny, "--set=max_steps=1", "--output-dir", str(workdir / "m"), "--overwrite"]
    )
    assert overwritten.exit_code == 0, overwritten.output


def test_a_second_run_in_a_busy_folder_is_refused(prepared, workdir):
    from spinn.ground.io import FolderBusy, lock_output_folder

    busy = f"in use by another run: pid {os.getpid()}"
    with lock_output_folder(workdir / "m"), pytest.raises(FolderBusy, match=busy):
        short_run(prepared, workdir / "m")


def test_temporaries_a_killed_run_left_go_at_the_next_start(prepared, workdir):
    """A temporary named without its writer (as before 0.2) goes once it is a few days old."""
    (workdir / "m").mkdir()
    stale = workdir / "m" / ".last.pt.ab12cd34.tmp"
    stale.write_bytes(b"half a checkpoint")
    days_ago = time.time() - 3 * 24 * 60 * 60
    os.utime(stale, (days_ago, days_ago))
    short_run(prepared, workdir / "m", max_steps=1)
    assert not stale.exists()


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_is_marked_killed_by_the_next(prepared, workdir):
    import mlflow

    slow = ["--set", "max_steps=100000", "--set", "checkpoint_every=100000", "--set", "eval_every=100000"]
    data = ["--train", str(prepared / "train.parquet"), "--dev", str(prepared / "dev.parquet"), "--no-register"]
    tiny = [f"--set=model.{key}={value}" for key, value in TINY_MODEL.items()]
    killed = spinn_train(*data, *tiny, *slow, "--set", "threads=1", "--device", "cpu", "--output-dir", "m", cwd=workdir)
    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])  # not one an earlier test set in-process
    deadline = time.monotonic() + 300
    running = []
    while not running and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
        if (workdir / "mlflow.db").exists():
            running = client.search_runs(
                [e.experiment_id for e in client.search_experiments()], "attributes.status = 'RUNNING'"
            )
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    assert len(running) == 1 and not (workdir / "m" / "last.pt").exists()
    run_id = running[0].info.run_id
    spinn_train_here(*data, *tiny, "--set", "max_steps=1", "--device", "cpu", "--output-dir", "m")
    assert client.get_run(run_id).info.status == "KILLED"


@pytest.mark.slow
def test_two_runs_started_together_on_a_fresh_store_both_work(prepared, fresh_workdir):
    data = ["--train", str(prepared / "train.parquet"), "--dev", str(prepared / "dev.parquet")]
    tiny = [f"--set=model.{key}={value}" for key, value in TINY_MODEL.items()]
    runs = [
        spinn_train(*data, *tiny, "--set", "max_steps=2", "--set", "threads=1", "--output-dir", name, cwd=fresh_workdir)
        for name in ("a", "b")
    ]
    for run in runs:
        assert run.wait(timeout=600) == 0, run.stdout.read()
    spinn_train_here(*data, *tiny, "--set", "max_steps=1", "--output-dir", "c")


def test_without_a_bar_training_prints_progress_lines(prepared, workdir, capsys):
    """Under Prefect no bar shows: every `report_every_s` the run prints a line its logs keep."""
    config = tiny_config(max_steps=3, eval_every=1)  # a dev accuracy before the last line
    data = (prepared / "train.parquet", prepared / "dev.parquet")
    train(*data, config, output_dir=workdir / "m", progress=False, register=False, report_every_s=0.0)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train step ")]
    assert [line.split(":")[0] for line in lines] == [
        "train step 1/3 (33%)",
        "train step 2/3 (67%)",
        "train step 3/3 (100%)",
    ]
    assert "over steps 3-3; best dev accuracy" in lines[-1]


def test_without_a_terminal_the_commands_print_whole_current_lines_and_dev_time_apart(prepared, workdir):
    """Under DVC (stderr a file) `spinn train` drew a tqdm bar with carriage returns, its
    postfix lagging, and its last line hid dev evaluation's time. Without a terminal: plain lines, each saying
    the speed since the last and the steps its loss covers; the last line gives both times."""
    from click.testing import CliRunner

    from spinn.cli import main

    data = ["--train", str(prepared / "train.parquet"), "--dev", str(prepared / "dev.parquet")]
    tiny = [f"--set=model.{key}={value}" for key, value in TINY_MODEL.items()]
    steps = ["--set=max_steps=2", "--set=eval_every=1", "--set=log_every=1", "--set=threads=1", "--set=device=cpu"]
    trained = CliRunner().invoke(main, ["train", *data, *tiny, *steps, "--output-dir", "m", "--no-register"])
    assert trained.exit_code == 0, trained.output
    assert "\r" not in trained.output
    (line,) = [line for line in trained.output.splitlines() if line.startswith("train step ")]
    assert re.match(r"train step 2/2 \(100%\): [\d,]+ pairs/s \([\d.]+ steps/s\) since the last line; ", line), line
    assert "over steps 2-2; best dev accuracy" in line, line
    (final,) = [line for line in trained.output.splitlines() if line.startswith("best dev accuracy")]
    assert re.search(r"over \d+ s of training, \d+ s of dev evaluation; softmax temperature [\d.]+\)$", final), final
    arguments = ["--model", "m/best.pt", "--data", str(prepared / "dev.parquet"), "--output", "dev.json"]
    evaluated = CliRunner().invoke(main, ["evaluate", *arguments, "--no-track", "--device", "cpu"])
    assert evaluated.exit_code == 0 and "\r" not in evaluated.output, evaluated.output
    assert "expected calibration error" in evaluated.output


def test_progress_is_a_bar_on_a_terminal_and_lines_elsewhere():
    from spinn.ground.progress import REPORT_EVERY_S, report_interval

    class Stream:
        def __init__(self, terminal: bool) -> None:
            self.terminal = terminal

        def isatty(self) -> bool:
            return self.terminal

    assert report_interval(None, Stream(terminal=True)) is None
    assert report_interval(None, Stream(terminal=False)) == REPORT_EVERY_S
    assert report_interval(5.0, Stream(terminal=True)) == 5.0


def test_without_an_output_folder_each_distinct_run_trains_into_its_own(prepared, workdir):
    """Two runs that differ in a setting never share checkpoints; the same run again finds its folder."""
    paths = (prepared / "train.parquet", prepared / "dev.parquet")
    first = train(*paths, tiny_config(max_steps=1), register=False, progress=False)
    other = train(*paths, tiny_config(max_steps=1, learning_rate=0.01), register=False, progress=False)
    assert first.best_checkpoint.parent != other.best_checkpoint.parent
    assert first.best_checkpoint.parent.parent == other.best_checkpoint.parent.parent == Path("data/runs")
    assert load_checkpoint(first.best_checkpoint).run_id == first.run_id
    again = train(*paths, tiny_config(max_steps=1), register=False, progress=False)  # the same settings: reused
    assert (again.run_id, again.best_checkpoint) == (first.run_id, first.best_checkpoint)


def test_a_checkpoint_record_round_trips_through_the_file_it_writes(tmp_path):
    """The typed record saves the same plain dict, read back with weights_only, field for field."""
    record = Checkpoint(
        model_state={"w": torch.arange(3.0)},
        model_config={"variant": "pi"},
        vocab={"tokens": ["<pad>", "<unk>", "a"]},
        step=7,
        state={"run_id": "abc", "step": 7},
        rng_ranks=[{"python": None}, {"python": None}],
    )
    save_checkpoint(tmp_path / "c.pt", record)
    raw = torch.load(tmp_path / "c.pt", weights_only=True)
    assert (raw["format"], raw["version"], raw["step"], raw["metrics"]) == ("spinn.checkpoint", 1, 7, None)
    back = load_checkpoint(tmp_path / "c.pt")
    assert torch.equal(back.model_state["w"], record.model_state["w"])
    assert (back.run_id, back.tokens, len(back.rng_by_rank())) == ("abc", ["<pad>", "<unk>", "a"], 2)
    torch.save({key: value for key, value in raw.items() if key != "vocab"}, tmp_path / "partial.pt")
    with pytest.raises(SpinnError, match="partial.pt: checkpoint lacks vocab"):
        load_checkpoint(tmp_path / "partial.pt")
    with pytest.raises(SpinnError, match="no random states"):
        Checkpoint(model_state={}, model_config={}, vocab={}, step=0).rng_by_rank()
