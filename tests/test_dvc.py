"""`dvc repro` runs the real pipeline end to end, reproduces nothing when nothing changed, and round-trips a remote.

dvc.yaml is only worth keeping if DVC itself accepts it: every stage's command,
deps, params, outs, metrics and plots are checked by nothing but running DVC on
it. So this module copies the repository (its git files, without data/) into a
temporary git repository, shrinks the train params to two CPU steps, serves
the synthetic smoke corpus from a loopback HTTP mirror (through the
SPINN_DOWNLOAD_* variables the download stage reads) and runs the `dvc` and
`git` executables as a user would. It proves that the first `dvc repro` builds
all eight stages and writes sane metrics; that `dvc metrics` and `dvc plots`
read what the stages declare; that a second `dvc repro` on a committed tree is a
no-op, so the deps are complete and the outputs deterministic enough; that
changing one train param re-runs exactly train and evaluate; and that `dvc
push` to a local remote and `dvc pull` in a fresh `git clone` restore the same
model. The tests share one project and run in file order; each later test only
needs the fixture's first reproduction.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from spinn.data.schema import NO_CONSENSUS_LABEL
from spinn.data.smoke import SMOKE_ARCHIVE_ROOT, write_smoke_corpus
from spinn.ground.io import file_digest
from spinn.model.checkpoint import load_checkpoint
from tests.helpers import (
    TINY_MODEL,
    assert_the_thread_rule_ran,
    command_line,
    copy_checkout,
    copy_store,
    kill_if_running,
    run_statuses,
    running,
    spinn_processes,
    thread_decisions,
    thread_rule_env,
    wait_for,
)
from tests.httpserver import LocalServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BIN = Path(sys.executable).parent
"""The environment running the tests, whose bin holds the `spinn` and `dvc` executables."""
VENV = BIN.parent
DVC = str(BIN / "dvc")
README = Path(__file__).resolve().parents[1] / "README.md"
MIRROR_PATH = "/mirror/snli_1.0.zip"
STAGES = ("download", "prepare@train", "prepare@dev", "prepare@test", "vocab", "embeddings", "train", "evaluate")
SPLITS = ("train", "dev", "test")
TINY_TRAIN = {
    "model": {"variant": "pi", **TINY_MODEL},
    "max_steps": 2,
    "eval_every": 2,
    "log_every": 1,
    "checkpoint_every": 2,
    "device": "cpu",
    "experiment": "spinn-dvc-test",
    "registered_model": "spinn-dvc-test",
}
"""Two steps: the wiring (a checkpoint, both curves, metrics, a registered model), not a training result."""
STEP_INCREASE = 2
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "spinn tests",
    "GIT_AUTHOR_EMAIL": "tests@spinn.invalid",
    "GIT_COMMITTER_NAME": "spinn tests",
    "GIT_COMMITTER_EMAIL": "tests@spinn.invalid",
}
RUNNING_STAGE = "Running stage '"
UP_TO_DATE = "Data and pipelines are up to date."
THREADS_TRACE = "threads.jsonl"

OUTPUTS = (
    "data/raw/snli_1.0.zip",
    *(f"data/prepared/{split}.parquet" for split in SPLITS),
    *(f"data/prepared/{split}.rejects.jsonl" for split in SPLITS),
    "data/prepared/vocab.json",
    "data/models/best.pt",
    "data/metrics/train.json",
    "data/metrics/test.json",
    "data/metrics/train_curve.csv",
    "data/metrics/dev_curve.csv",
    "data/metrics/test_predictions.csv",
    "data/metrics/confusion.png",
    "data/metrics/reliability/reliability.png",
    "data/metrics/reliability/uncalibrated.csv",
    "data/metrics/reliability/calibrated.csv",
)
MODEL = "data/models/best.pt"
TRAIN_METRICS = "data/metrics/train.json"
TEST_METRICS = "data/metrics/test.json"
PARAMS = "params.yaml"
PLOTS = ("Training curve", "Training loss", "data/metrics/confusion.png", "Reliability on test")
"""Plots dvc.yaml declares, each once: the curves (Vega), the confusion matrix (an image, viewable offline) and
the reliability diagram before and after the temperature (Vega, one line per file)."""


@dataclass
class Project:
    """The temporary DVC project, the environment its commands run in, and what its first repro did."""

    repo: Path
    env: dict[str, str]
    server: LocalServer
    corpus: Path
    first_repro: subprocess.CompletedProcess[str]
    workdir: Path


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a command, failing the test with its whole output if it fails."""
    result = subprocess.run(command, check=False, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, (
        f"{' '.join(command)} exited {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    return result


def output_of(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def stages_run(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The stages a `dvc repro` says it ran, in order."""
    return [
        line.split(RUNNING_STAGE, 1)[1].split("'", 1)[0]
        for line in output_of(result).splitlines()
        if RUNNING_STAGE in line
    ]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def labelled_pairs(corpus: Path, split: str) -> int:
    """Pairs of a split in the archive with a gold label, the ones evaluation scores."""
    with zipfile.ZipFile(corpus) as archive:
        lines = archive.read(f"{SMOKE_ARCHIVE_ROOT}/snli_1.0_{split}.jsonl").splitlines()
    return sum(json.loads(line)["gold_label"] != NO_CONSENSUS_LABEL for line in lines)


def commit_all(repo: Path, env: dict[str, str], message: str) -> None:
    run(["git", "add", "-A"], repo, env)
    run(["git", "commit", "-q", "--allow-empty", "-m", message], repo, env)


def command_env(workdir: Path, repo: Path, mirror_url: str, corpus: Path) -> dict[str, str]:
    """os.environ, off the network and the user's git and tool settings, pointed at the mirror."""
    env = {key: value for key, value in os.environ.items() if key not in PROXY_VARIABLES}
    env.update(GIT_IDENTITY)
    env.update(
        {
            "PATH": os.pathsep.join(  # README's commands name .venv/bin: they must not need it on PATH
                entry for entry in env.get("PATH", "").split(os.pathsep) if Path(entry) != BIN
            ),
            "PYTHONPATH": str(repo),  # run the copy's spinn, the code its stages depend on
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}",
            "DVC_NO_ANALYTICS": "1",
            "DVC_SITE_CACHE_DIR": str(workdir / "dvc-site-cache"),
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
            "SPINN_DOWNLOAD_URL": mirror_url,
            "SPINN_DOWNLOAD_CHECKSUM": f"sha256:{file_digest(corpus, 'sha256')}",
            # DVC runs a stage with $SHELL -c, else /bin/sh -c (CI, cron): pin the dash that stays between
            # `dvc repro` and the stage, the case a killed repro's orphan has to see through
            "SHELL": "/bin/sh",
            **thread_rule_env(workdir / THREADS_TRACE),  # one free core: the stages' auto threads run one
        }
    )
    env.pop("SPINN_DOWNLOAD_FILE", None)
    return env


def set_train_params(repo: Path, **settings: object) -> None:
    params = yaml.safe_load((repo / PARAMS).read_text(encoding="utf-8"))
    params["train"].update(settings)
    (repo / PARAMS).write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def readme_repro_line() -> str:
    """README's `dvc repro` line, as written (its comment left to the shell)."""
    section = README.read_text(encoding="utf-8").split("## Reproduce with DVC", 1)[1]
    return next(line for line in section.splitlines() if line.startswith(".venv/bin/dvc repro"))


def run_line(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run one shell line as a user types it, failing the test with its whole output if it fails."""
    result = subprocess.run(line, shell=True, check=False, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{line}\nexited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, migrated_store: Path) -> Iterator[Project]:
    """A git + DVC copy of the repository with tiny train params, after its first `dvc repro`."""
    workdir = tmp_path_factory.mktemp("dvc")
    copy_store(migrated_store, workdir / "mlflow.db")
    repo = workdir / "repo"
    corpus = write_smoke_corpus(workdir / "snli_1.0.zip")
    with LocalServer() as server:
        env = command_env(workdir, repo, server.serve(MIRROR_PATH, corpus.read_bytes()), corpus)
        copy_checkout(repo)
        (repo / ".venv").symlink_to(VENV)  # README's install made .venv here; git ignores it
        run(["git", "init", "-q", "-b", "main"], repo, env)
        commit_all(repo, env, "copy of the repository")
        set_train_params(repo, **TINY_TRAIN)
        commit_all(repo, env, "tiny training")
        yield Project(repo, env, server, corpus, run_line(readme_repro_line(), repo, env), workdir)


def test_first_repro_builds_every_stage(project: Project):
    repo = project.repo
    assert stages_run(project.first_repro) == list(STAGES), output_of(project.first_repro)
    missing = [name for name in OUTPUTS if not (repo / name).is_file()]
    assert not missing, f"missing outputs {missing}\n{output_of(project.first_repro)}"
    assert list((repo / "data/embeddings").glob("*.npy")), "the embeddings stage wrote no .npy"
    lock = yaml.safe_load((repo / "dvc.lock").read_text(encoding="utf-8"))
    assert set(lock["stages"]) == set(STAGES)
    assert [request.path for request in project.server.requests if request.method == "GET"] == [MIRROR_PATH]
    assert sha256(repo / "data/raw/snli_1.0.zip") == sha256(project.corpus)
    test = read_json(repo / TEST_METRICS)
    assert isinstance(test["accuracy"], float) and 0.0 <= test["accuracy"] <= 1.0
    assert test["examples"] == labelled_pairs(project.corpus, "test")
    assert read_json(repo / TRAIN_METRICS)["steps"] == TINY_TRAIN["max_steps"]


def test_the_stages_that_run_the_model_decide_their_threads_by_the_rule(project: Project):
    """params.yaml's `threads: auto` in train and evaluate reaches each stage's process, decided by
    spinn/ground/cores.py with OpenMP's wait set before torch loaded."""
    for stage in ("train", "evaluate"):
        decisions = thread_decisions(project.workdir / THREADS_TRACE, stage)
        assert decisions and all(decision["argv"][1] == stage for decision in decisions)
        for decision in decisions:
            assert_the_thread_rule_ran(decision)


def test_metrics_and_plots_read_what_the_stages_declare(project: Project):
    shown = json.loads(run([DVC, "metrics", "show", "--json"], project.repo, project.env).stdout)
    (workspace,) = shown.values()  # DVC 3.67 keys the workspace "" here, not "workspace"
    metrics = workspace["data"]
    assert 0.0 <= metrics[TEST_METRICS]["data"]["accuracy"] <= 1.0
    assert 0.0 <= metrics[TRAIN_METRICS]["data"]["best_dev_accuracy"] <= 1.0
    # a table a person reads: headline numbers only, the per-class report is a file of its own
    assert set(metrics[TRAIN_METRICS]["data"]) == {"best_dev_accuracy", "best_step", "steps", "temperature"}
    headline = {"accuracy", "macro_f1", "examples", "transition_accuracy", "oov_share"}
    calibration = {"temperature", "uncalibrated_ece", "calibrated_ece"}
    calibration |= {"uncalibrated_mean_confidence", "calibrated_mean_confidence"}
    assert calibration <= set(metrics[TEST_METRICS]["data"]) <= headline | calibration
    # -o: image plots are copied out, by default into dvc_plots/ in the workspace
    shown = run([DVC, "plots", "show", "--json", "-o", str(project.workdir / "plots")], project.repo, project.env)
    plots = json.loads(shown.stdout)["data"]
    assert sorted(plots) == sorted(PLOTS), f"dvc plots show draws {sorted(plots)}"
    (reliability,) = plots["Reliability on test"]
    drawn = {point["filename"] for point in reliability["content"]["data"]["values"]}  # one line per file
    assert drawn == {"uncalibrated.csv", "calibrated.csv"}


def test_second_repro_of_a_committed_tree_is_a_no_op(project: Project):
    commit_all(project.repo, project.env, "first reproduction")
    model = project.repo / MODEL
    before = model.stat().st_mtime_ns
    again = run([DVC, "repro"], project.repo, project.env)
    assert stages_run(again) == [], output_of(again)
    assert UP_TO_DATE in output_of(again)
    status = run([DVC, "status"], project.repo, project.env)
    assert UP_TO_DATE in output_of(status)
    assert model.stat().st_mtime_ns == before
    assert run(["git", "status", "--porcelain"], project.repo, project.env).stdout == ""


def test_touching_any_module_the_train_stage_imports_marks_it_changed(project: Project):
    """A module reached only through other imports (the policy, through the model) counts like the stage's own."""
    repo, env = project.repo, project.env
    for module in ("spinn/model/policy.py", "spinn/evaluation/evaluate.py", "spinn/model/checkpoint.py"):
        path = repo / module
        original = path.read_text(encoding="utf-8")
        path.write_text(original + "\n# touched\n", encoding="utf-8")
        try:
            status = json.loads(run([DVC, "status", "--json"], repo, env).stdout)
        finally:
            path.write_text(original, encoding="utf-8")
        assert {"train", "evaluate"} <= set(status), f"{module}: {status}"
    assert UP_TO_DATE in output_of(run([DVC, "status"], repo, env))


def test_changing_a_train_param_marks_only_train_changed_and_params_diff_names_it(project: Project):
    """What the rerun then runs (train and evaluate only) is checked after the killed repro below, whose rerun
    follows a params change too."""
    repo, env = project.repo, project.env
    original = (repo / PARAMS).read_text(encoding="utf-8")
    steps = read_json(repo / TRAIN_METRICS)["steps"] + STEP_INCREASE
    set_train_params(repo, max_steps=steps)
    try:
        status = json.loads(run([DVC, "status", "--json"], repo, env).stdout)
        diff = json.loads(run([DVC, "params", "diff", "--json"], repo, env).stdout)
    finally:
        (repo / PARAMS).write_text(original, encoding="utf-8")
    assert set(status) == {"train"}, status
    assert set(diff[PARAMS]) == {"train.max_steps"}, diff
    assert (diff[PARAMS]["train.max_steps"]["old"], diff[PARAMS]["train.max_steps"]["new"]) == (
        steps - STEP_INCREASE,
        steps,
    ), diff


def test_push_then_pull_into_a_fresh_clone_restores_the_model(project: Project):
    repo, env = project.repo, project.env
    store, clone = project.workdir / "store", project.workdir / "clone"
    run([DVC, "remote", "add", "-d", "local", str(store)], repo, env)
    commit_all(repo, env, "local remote")
    run([DVC, "push"], repo, env)
    run(["git", "clone", "-q", str(repo), str(clone)], project.workdir, env)
    assert not (clone / MODEL).exists()
    run([DVC, "pull"], clone, env)
    assert UP_TO_DATE in output_of(run([DVC, "status"], clone, env))
    assert sha256(clone / MODEL) == sha256(repo / MODEL)
    assert sha256(clone / "data/raw/snli_1.0.zip") == sha256(project.corpus)


ORPHAN_STEPS = 100_000
"""A train stage that goes on until it is stopped: one left running fails the wait, not a later check."""
RERUN_STEPS = 6
"""The rerun's budget: what it shows is whose files data/models holds, not a long training."""
ORPHAN_END_S = 45
"""How long a stage orphaned by a killed `dvc repro` may take to stop by itself: the parent poll, a step, ending the
run, on cores the rest of the suite keeps busy. Below ORPHAN_GRACE_S (60 s), so a stage that the watch had to end
outright still fails here."""
STAGE_START_S = 300


def modified(path: Path) -> int | None:
    """When `path` was last written (ns), or None while it does not exist."""
    return path.stat().st_mtime_ns if path.exists() else None


def train_stage(dvc: int) -> int | None:
    """The `spinn train` process below the `dvc repro` process `dvc`, once it runs."""
    return next((pid for pid in spinn_processes(dvc) if "train" in command_line(pid)), None)


def test_a_repro_killed_in_its_train_stage_leaves_no_orphan_and_its_rerun_one_runs_files(project: Project):
    """SIGKILL `dvc repro` while train runs, then run `dvc repro` again (with a short budget): the orphaned
    stage stops and ends its MLflow run; the rerun, after a params change, runs only train and evaluate and
    trains alone, into a data/models holding one run's checkpoints."""
    repo, env = project.repo, project.env
    set_train_params(repo, max_steps=ORPHAN_STEPS, max_epochs=ORPHAN_STEPS, eval_every=ORPHAN_STEPS, checkpoint_every=2)
    # the module's earlier repros left a last.pt, which DVC deletes as the stage starts: only a new one says
    # that training began (a SIGKILL before the stage arms its watch would leave it adopted by init, unwatched)
    last = (repo / MODEL).with_name("last.pt")
    before = modified(last)
    with (project.workdir / "killed-repro.log").open("w") as log:
        job = subprocess.Popen([DVC, "repro"], cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    stage = None
    try:
        wait_for(lambda: train_stage(job.pid) is not None, STAGE_START_S, "the train stage to start")
        stage = train_stage(job.pid)
        wait_for(lambda: modified(last) not in (None, before), STAGE_START_S, "its first checkpoint")
        job.kill()
        job.wait()
        wait_for(lambda: not running(stage), ORPHAN_END_S, f"the orphaned train stage {stage} to stop")
    finally:
        kill_if_running([stage] if stage else [])
    assert not (repo / "data/models/.spinn.lock").exists(), "the lock lives beside data/models, not in it"
    set_train_params(repo, max_steps=RERUN_STEPS, eval_every=RERUN_STEPS)
    rerun = run([DVC, "repro"], repo, env)
    assert stages_run(rerun) == ["train", "evaluate"], output_of(rerun)  # what a params change reruns
    assert read_json(repo / TRAIN_METRICS)["steps"] == RERUN_STEPS
    assert UP_TO_DATE in output_of(run([DVC, "status"], repo, env))
    best, last = (load_checkpoint(repo / "data/models" / name) for name in ("best.pt", "last.pt"))
    assert best.run_id == last.run_id and last.step == RERUN_STEPS
    assert spinn_processes(os.getpid()) == []
    statuses = run_statuses(env["MLFLOW_TRACKING_URI"])
    assert "RUNNING" not in statuses and statuses.count("FAILED") + statuses.count("KILLED") >= 1, statuses
