"""What a first user meets: git ignores what runs write and keeps the metrics; eval_every follows the data; a
finished run is reused, resumed or refused in one line; progress lines come on time; common gold columns and
sidecars are recognised; downloads under DVC name their variables; a small inbox file still gives every worker
a shard; the smoke run trains on one thread."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import PREPARED_DEV_PAIRS, TINY_MODEL, tiny_config

ROOT = Path(__file__).resolve().parents[1]

RUN_OUTPUTS = [
    "data/runs/a1b2/last.pt",
    "data/inbox/private.csv",
    "data/labelled/private.parquet",
    "data/parse_cache/parses.sqlite",
]


def _git(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=clone, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("path", [*RUN_OUTPUTS, ".venv"])
def test_git_ignores_what_runs_write(tmp_path: Path, path: str) -> None:
    """A `git add -A` after a run must not commit checkpoints, users' corpora or a symlinked `.venv`."""
    _git(tmp_path, "init", "-q")
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    target = tmp_path / path
    if path == ".venv":
        target.symlink_to(tmp_path / "elsewhere")
    else:
        target.parent.mkdir(parents=True)
        target.write_text("x")
    assert _git(tmp_path, "check-ignore", "-q", path).returncode == 0, f"git would commit {path}"


def test_git_keeps_the_metrics(tmp_path: Path) -> None:
    """data/metrics is the one data folder git holds (README)."""
    _git(tmp_path, "init", "-q")
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    (tmp_path / "data" / "metrics").mkdir(parents=True)
    (tmp_path / "data" / "metrics" / "test.json").write_text("{}")
    assert _git(tmp_path, "check-ignore", "-q", "data/metrics/test.json").returncode == 1


SNLI_TRAIN_PAIRS = 550_152


def test_default_eval_every_evaluates_a_small_run_several_times() -> None:
    """1,024 pairs at batch 32 are 32 steps an epoch: the shipped default must evaluate dev at least four
    times an epoch (the old 1000 never evaluated inside the 320 steps of ten epochs)."""
    from spinn.ground.settings import DEFAULT_PARAMS
    from spinn.training.train_config import TrainConfig

    config = TrainConfig.from_params(ROOT / DEFAULT_PARAMS).resolved("cpu", 1_024)
    steps_per_epoch = 1_024 // config.batch_size
    assert steps_per_epoch // config.eval_every >= 4


@pytest.mark.parametrize(("pairs", "expected"), [(1, 1), (1_024, 8), (SNLI_TRAIN_PAIRS, 1_000)])
def test_auto_eval_every_follows_the_data(pairs: int, expected: int) -> None:
    from spinn.training.train_config import TrainConfig

    assert TrainConfig().resolved("cpu", pairs).eval_every == expected


def test_an_explicit_eval_every_is_kept() -> None:
    from spinn.training.train_config import TrainConfig

    assert TrainConfig(eval_every=7).resolved("cpu", SNLI_TRAIN_PAIRS).eval_every == 7


def test_train_help_says_eval_every_follows_the_data() -> None:
    from click.testing import CliRunner

    from spinn.cli import main

    text = " ".join(CliRunner().invoke(main, ["train", "--help"], terminal_width=200).output.split())
    assert "auto: min(1000, steps per epoch // 4)" in text


def _dvc_declared_outputs() -> set[Path]:
    """Every file dvc.yaml's stages declare as an output or metric (templated names left out)."""
    import yaml

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    declared = set()
    for stage in stages.values():
        for kind in ("outs", "metrics"):
            for entry in stage.get(kind, []):
                name = entry if isinstance(entry, str) else next(iter(entry))
                if "${" not in name:
                    declared.add(Path(name))
    return declared


def test_evaluate_flow_never_writes_what_dvc_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    """`evaluate-spinn/champion` with its defaults wrote data/metrics/test*.json, so `dvc metrics show` paired
    the champion's test score with another model's train.json; it must write into a folder of its own."""
    from flows import evaluate_spinn as module
    from flows.caching import StageOutput
    from flows.flow_requests import EvaluateRequest
    from spinn.evaluation.evaluate import report_path

    written: dict[str, object] = {}

    def stage(_task, **parameters):
        written.update(parameters)
        return StageOutput(summary={"accuracy": 0.5, "examples": 2})

    monkeypatch.setattr(module, "run_stage", stage)
    monkeypatch.setattr(module, "create_table_artifact", lambda *args, **kwargs: None)
    monkeypatch.setattr(module, "evaluation_facts", lambda *args: [])
    module.evaluate_spinn.fn(EvaluateRequest(params=None))
    paths = {Path(written[name]) for name in ("output", "plot", "predictions")} | {report_path(written["output"])}
    declared = _dvc_declared_outputs()
    assert Path("data/metrics/test.json") in declared  # the check reads dvc.yaml
    assert not paths & declared
    assert len({path.parent for path in paths}) == 1 and Path(written["output"]).parent.parent == Path(
        "data/evaluations"
    )


def test_each_evaluation_gets_its_own_folder() -> None:
    from flows.evaluate_spinn import evaluation_output

    first = evaluation_output("models:/spinn@champion", now=0)
    assert first.parent.name == "19700101T000000Z-spinn@champion"
    assert evaluation_output("models:/spinn@champion", now=1).parent != first.parent
    assert evaluation_output("data/runs/pi-train-abc/best.pt", now=0).parent.name == "19700101T000000Z-pi-train-abc"


def _fit(prepared: Path, config, **options):
    from spinn.training.train import train

    paths = (prepared / "train.parquet", prepared / "dev.parquet")
    return train(*paths, config, register=False, progress=False, **options)


def test_the_same_finished_run_again_is_reused_without_any_cache(prepared, workdir) -> None:
    """train-spinn run again when Prefect's cache record is gone calls train on the finished run's folder:
    that run is the result, not the error "holds last.pt, best.pt of an earlier run"."""
    from spinn.training.folders import run_folder

    config = tiny_config(max_steps=2)
    folder = run_folder(workdir / "runs", config, prepared / "train.parquet", prepared / "dev.parquet")
    first = _fit(prepared, config, output_dir=folder)
    before = (folder / "best.pt").read_bytes()
    again = _fit(prepared, config, output_dir=folder)
    assert (again.run_id, again.steps, again.best_step) == (first.run_id, 2, first.best_step)
    assert (folder / "best.pt").read_bytes() == before


def test_a_longer_run_in_a_finished_runs_folder_is_still_refused(prepared, workdir) -> None:
    """Reuse is for the very same settings: asking for more steps without --resume must not return the
    shorter run's model."""
    from spinn.ground.errors import SpinnError

    _fit(prepared, tiny_config(max_steps=2), output_dir=workdir / "m")
    with pytest.raises(SpinnError, match="holds last.pt, best.pt of an earlier run"):
        _fit(prepared, tiny_config(max_steps=3), output_dir=workdir / "m")


def test_resume_with_more_steps_continues_the_same_folder_in_a_run_linked_to_the_finished_one(prepared, workdir):
    """`--set max_steps=6`, then `--set max_steps=12 --resume`, no --output-dir: the run's identity leaves its
    length out, so the resumed run finds its folder and goes on, in a new MLflow run that names the finished
    one (tests/test_store_trust.py has the whole record)."""
    import mlflow

    short = _fit(prepared, tiny_config(max_steps=2))
    longer = _fit(prepared, tiny_config(max_steps=4), resume=True)
    assert longer.best_checkpoint.parent == short.best_checkpoint.parent and longer.steps == 4
    assert mlflow.MlflowClient().get_run(longer.run_id).data.tags["spinn.resumed_from"] == short.run_id


def test_resume_with_nothing_to_resume_says_so_in_one_line(prepared, workdir) -> None:
    from click.testing import CliRunner

    from spinn.cli import main

    data = ["--train", str(prepared / "train.parquet"), "--dev", str(prepared / "dev.parquet"), "--no-register"]
    tiny = [f"--set=model.{key}={value}" for key, value in TINY_MODEL.items()]
    result = CliRunner().invoke(main, ["train", *data, *tiny, "--set=max_steps=1", "--resume"])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert "no last.pt to resume from" in result.stderr and "drop --resume" in result.stderr
    assert not Path("data/runs").exists() or not any(Path("data/runs").rglob("*.pt"))


def test_the_identity_is_declared_once() -> None:
    """Folder digest and resume check read one list: a length setting is outside the identity, a learning
    setting inside it."""
    from spinn.training import folders, resume

    config = tiny_config()
    assert "max_steps" not in config.identity() and "learning_rate" in config.identity()
    assert not hasattr(resume, "RESUMABLE_CHANGES") and not hasattr(folders, "BOOKKEEPING")


class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_progress_line_is_due_on_time_with_an_eta() -> None:
    from spinn.ground.progress import ProgressClock

    time = _FakeClock()
    clock = ProgressClock(total=100, every_s=30.0, done=10, clock=time)
    assert not clock.due() and clock.eta(10) == "ETA unknown"
    time.now += 29.9
    assert not clock.due()
    time.now += 0.2
    assert clock.due() and not clock.due()  # once per span
    assert clock.eta(40) == "ETA 0:01:00"  # 30 units in 30.1 s: 60 left
    assert clock.fraction(40) == "40/100 (40%)"
    assert not ProgressClock(total=1, every_s=None, clock=time).due()


def test_training_prints_progress_on_time_not_at_log_windows(prepared, workdir, capsys) -> None:
    """With log_every far beyond the run, the old loop printed once, at the end; on time it prints every step
    that finds its line due, each with an ETA, repeating the last logged metrics rather than reading them."""
    _fit(prepared, tiny_config(max_steps=3, log_every=1_000), output_dir=workdir / "m", report_every_s=0.0)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train step ")]
    assert [line.split(";")[0].split(":")[0] for line in lines] == [
        "train step 1/3 (33%)",
        "train step 2/3 (67%)",
        "train step 3/3 (100%)",
    ]
    assert all(" ETA " in line for line in lines)
    assert "loss" not in lines[0] and "loss" in lines[-1]  # the window closed at the budget's end only


def test_evaluation_prints_progress_on_time(prepared, workdir, capsys) -> None:
    from spinn.evaluation.evaluate import EvaluateSettings, evaluate

    trained = _fit(prepared, tiny_config(max_steps=1), output_dir=workdir / "m")
    settings = EvaluateSettings(batch_size=40, device="cpu", track=False)
    evaluate(trained.best_checkpoint, prepared / "dev.parquet", workdir / "x.json", settings, report_every_s=0.0)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("evaluate ")]
    labelled = PREPARED_DEV_PAIRS - 1  # one dev pair of the first 120 has gold '-'
    counts = [int(line.split()[1].split("/")[0]) for line in lines]  # "evaluate 40/119 (34%) pairs; ETA ..."
    assert len(counts) >= 2 and counts == sorted(set(counts)) and counts[-1] == labelled  # a line per batch
    assert all(re.fullmatch(rf"evaluate \d+/{labelled} \(\d+%\) pairs", line.split(";")[0]) for line in lines)
    assert lines[-1].split(";")[0] == f"evaluate {labelled}/{labelled} (100%) pairs"
    assert lines[-1].endswith("ETA 0:00:00")


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    import csv

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


SICK_ROWS = [
    ["1", "A man is playing a guitar.", "A person plays an instrument.", "ENTAILMENT"],
    ["2", "A dog runs on the beach.", "A cat sleeps indoors.", "CONTRADICTION"],
    ["3", "Two kids are smiling.", "Two kids are at school.", "Neutral"],
]
SICK_GOLD = ["entailment", "contradiction", "neutral"]


@pytest.mark.parametrize("gold_column", ["gold", "entailment_label", "entailment_judgment"])
def test_common_gold_columns_are_recognised(tmp_path: Path, gold_column: str) -> None:
    """SICK's `gold` sample and its entailment_label / entailment_judgment columns, values in any case."""
    from spinn.data.sentence_pairs import InputPair, read_input_pairs

    path = _write_csv(tmp_path / "sick.csv", ["pair_ID", "sentence_A", "sentence_B", gold_column], SICK_ROWS)
    pairs = list(read_input_pairs(path))
    assert all(isinstance(pair, InputPair) for pair in pairs)
    assert [pair.label for pair in pairs] == SICK_GOLD
    assert [pair.pair_id for pair in pairs] == ["1", "2", "3"]


def test_a_sidecar_names_a_files_columns(tmp_path: Path) -> None:
    """An inbox file with its own column names: `<file>.columns.json` maps them; a given column still wins."""
    from spinn.data.column_sidecar import sidecar_path
    from spinn.data.sentence_pairs import Columns, read_input_pairs

    path = _write_csv(tmp_path / "odd.csv", ["key", "left", "right", "verdict"], SICK_ROWS)
    mapping = {"id": "key", "premise": "left", "hypothesis": "right", "label": "verdict"}
    sidecar_path(path).write_text(json.dumps(mapping), encoding="utf-8")
    pairs = list(read_input_pairs(path))
    assert [(pair.pair_id, pair.label) for pair in pairs] == list(zip(["1", "2", "3"], SICK_GOLD, strict=True))
    assert [pair.premise for pair in read_input_pairs(path, Columns(premise="right"))] == [r[2] for r in SICK_ROWS]


def test_a_sidecar_with_an_unknown_role_is_refused(tmp_path: Path) -> None:
    from spinn.data.column_sidecar import sidecar_path
    from spinn.data.sentence_pairs import read_input_pairs
    from spinn.ground.errors import SpinnError

    path = _write_csv(tmp_path / "odd.csv", ["premise", "hypothesis"], [["a", "b"]])
    sidecar_path(path).write_text(json.dumps({"premis": "premise"}), encoding="utf-8")
    with pytest.raises(SpinnError, match="odd.csv.columns.json"):
        list(read_input_pairs(path))


def test_gold_agreement_counts_only_rows_with_gold() -> None:
    from spinn.data.label_schemes import agreement

    found = agreement(
        [("entailment", "entailment"), ("neutral", "entailment"), (None, "neutral"), ("neutral", "neutral")]
    )
    assert found is not None and (found.pairs, found.correct) == (3, 2)
    assert found.confusion["neutral"] == {"entailment": 1, "neutral": 1, "contradiction": 0}
    assert found.report()[0].startswith(
        "accuracy against the file's gold labels (three-way: entailment / neutral / contradiction): 0.6667 on 3 pairs"
    )
    assert agreement([(None, "neutral")]) is None


def test_a_label_run_with_gold_reports_accuracy_and_confusion(smoke_model, tmp_path: Path) -> None:
    """A corpus that brings gold is a test set too: the summary says how often the model agrees."""
    import pyarrow.parquet as pq

    from spinn.labeling.label import label
    from spinn.labeling.label_settings import LabelSettings

    table = pq.read_table(smoke_model.prepared / "test.parquet", columns=["premise", "hypothesis", "label"])
    rows = [[row["premise"], row["hypothesis"], row["label"].upper()] for row in table.to_pylist()[:30]]
    source = _write_csv(tmp_path / "sick.csv", ["sentence_A", "sentence_B", "entailment_label"], rows)
    output = tmp_path / "out.parquet"
    summary = label(source, smoke_model.checkpoint, output, LabelSettings(parser="model", device="cpu"))
    predicted = pq.read_table(output, columns=["gold_label", "label"]).to_pylist()
    correct = sum(row["gold_label"] == row["label"] for row in predicted)
    report = summary.report()
    scheme = "three-way: entailment / neutral / contradiction"
    assert any(
        line.startswith(f"accuracy against the file's gold labels ({scheme}): {correct / 30:.4f} on 30 pairs")
        for line in report
    )
    confusion = [line.split(" -> ")[1] for line in report if line.startswith("  gold ")]
    assert len(confusion) == 3
    assert sum(int(count) for line in confusion for count in re.findall(r" (\d+)", line)) == 30


def _spinn_download(tmp_path: Path, **variables: str):
    from click.testing import CliRunner

    from spinn.cli import main

    return CliRunner().invoke(main, ["download", "--raw-dir", str(tmp_path / "raw"), "--no-extract"], env=variables)


def test_under_dvc_an_offline_download_names_the_variable_not_the_flag(tmp_path: Path) -> None:
    """`dvc repro` has no --file to give: the fix names SPINN_DOWNLOAD_FILE (DVC sets DVC_STAGE for stages)."""
    mirror = {"SPINN_DOWNLOAD_URL": "http://no-such-host.invalid/snli_1.0.zip", "DVC_STAGE": "download"}
    result = _spinn_download(tmp_path, **mirror)
    assert result.exit_code == 1, result.output
    assert "cannot resolve no-such-host.invalid" in result.stderr
    assert "goes in the SPINN_DOWNLOAD_FILE variable" in result.stderr and "--file" not in result.stderr
    by_hand = _spinn_download(tmp_path, SPINN_DOWNLOAD_URL=mirror["SPINN_DOWNLOAD_URL"], DVC_STAGE="")
    assert "goes in --file" in by_hand.stderr


def test_under_dvc_a_checksum_mismatch_names_the_checksum_variable(tmp_path: Path) -> None:
    local = tmp_path / "mine.zip"
    local.write_bytes(b"not the official archive")
    result = _spinn_download(tmp_path, SPINN_DOWNLOAD_FILE=str(local), DVC_STAGE="download")
    assert result.exit_code == 1, result.output
    assert "give the SPINN_DOWNLOAD_CHECKSUM variable sha256:" in result.stderr and "--checksum" not in result.stderr


def test_a_verified_archive_in_place_is_used_without_the_network(tmp_path: Path) -> None:
    """Regression guard (the newcomer's case did not reproduce here): an archive in data/raw that verifies
    is the stage's result, with no request to the (here unresolvable) source."""
    import hashlib

    archive = tmp_path / "raw" / "snli_1.0.zip"
    archive.parent.mkdir()
    archive.write_bytes(b"an SNLI-shaped archive")
    checksum = "sha256:" + hashlib.sha256(archive.read_bytes()).hexdigest()
    variables = {"SPINN_DOWNLOAD_URL": "http://no-such-host.invalid/snli_1.0.zip", "DVC_STAGE": "download"}
    result = _spinn_download(tmp_path, SPINN_DOWNLOAD_CHECKSUM=checksum, **variables)
    assert result.exit_code == 0, result.output
    assert archive.read_bytes() == b"an SNLI-shaped archive"


@pytest.mark.parametrize(
    ("rows", "workers", "shard_size", "expected"), [(30, 2, 10_000, 15), (31, 2, 10_000, 16), (100, 4, 10, 10)]
)
def test_a_file_gives_every_worker_a_shard(rows: int, workers: int, shard_size: int, expected: int) -> None:
    from spinn.labeling.shard_plan import spread_shard_size

    size = spread_shard_size(rows, workers, shard_size)
    assert size == expected and -(-rows // size) >= min(workers, rows)


def test_a_small_inbox_file_is_cut_into_a_shard_per_worker(tmp_path: Path) -> None:
    """A 30-row file was one shard at the default shard_size, so one of two Dask workers sat idle."""
    from spinn.labeling.label_settings import LabelSettings
    from spinn.labeling.shard_plan import plan_shards, run_fingerprint, spread_over

    rows = [[str(index), f"A man sits number {index}.", "A man sits."] for index in range(30)]
    path = _write_csv(tmp_path / "pairs.csv", ["id", "premise", "hypothesis"], rows)
    settings = spread_over(LabelSettings(parser="model", device="cpu"), path, workers=2)
    plan, _ = plan_shards(path, tmp_path / "out.parquet", settings, run_fingerprint(path, settings, {"model": "m"}))
    assert (plan.shards, plan.rows) == (2, 30)


def test_a_pi_run_logs_no_rl_or_spinn_only_params() -> None:
    from spinn.training.train_config import TrainConfig

    pi = TrainConfig.build({"model": {"variant": "pi"}}).flat()
    assert "model.reward" not in pi and "model.entropy_weight" not in pi
    assert "model.transition_loss_weight" not in pi and pi["model.d_tracker"] > 0
    rl = TrainConfig.build({"model": {"variant": "rl"}}).flat()
    assert {"model.reward", "model.entropy_weight", "model.transition_loss_weight"} <= rl.keys()
    assert "model.d_tracker" not in TrainConfig.build({"model": {"variant": "pi-nt"}}).flat()


def test_the_smoke_run_trains_on_one_thread() -> None:
    """On two shared cores torch's threads wait on each other: the smoke run is quickest on one."""
    from flows.main import SMOKE_OVERRIDES
    from spinn.ground.settings import nest
    from spinn.training.train_config import TrainConfig

    config = TrainConfig.build(nest(SMOKE_OVERRIDES.items()))
    assert config.threads == 1 and config.max_steps <= 320


def test_retraining_identical_settings_reuses_the_registered_version(prepared, workdir) -> None:
    """The same settings again are the same run: no second version with the same checkpoint digest."""
    import mlflow

    from spinn.training.train import train

    paths = (prepared / "train.parquet", prepared / "dev.parquet")
    config = tiny_config(max_steps=2, registered_model="spinn-again")
    first = train(*paths, config, progress=False)
    again = train(*paths, config, progress=False)
    assert (again.run_id, again.model_version) == (first.run_id, first.model_version)
    assert len(mlflow.MlflowClient().search_model_versions("name = 'spinn-again'")) == 1


def test_an_unverified_archive_in_place_offline_names_its_checksum(tmp_path: Path) -> None:
    """The newcomer's local SNLI-shaped archive sat in data/raw and the stage went to the network: offline,
    the error now says that archive is there and which checksum variable would accept it."""
    import hashlib

    archive = tmp_path / "raw" / "snli_1.0.zip"
    archive.parent.mkdir()
    archive.write_bytes(b"an SNLI-shaped archive")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    variables = {"SPINN_DOWNLOAD_URL": "http://no-such-host.invalid/snli_1.0.zip", "DVC_STAGE": "download"}
    result = _spinn_download(tmp_path, **variables)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert "is in place but does not match" in result.stderr
    assert f"give the SPINN_DOWNLOAD_CHECKSUM variable sha256:{digest}" in result.stderr
