"""Distributed training under torchrun on the CPU (gloo): the same model as one process, one MLflow run, exact resume.

The jobs are real: `spinn train` with processes=2 starts torchrun, which starts two
ranks; a sitecustomize on their PYTHONPATH makes any rank but 0 fail at once if
it imports MLflow or publishes a file, so a passing run proves they never do.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from spinn.data.example import Example
from spinn.ground import cores
from spinn.model.checkpoint import load_checkpoint
from spinn.training.distributed import Topology, make_share, share
from tests.helpers import (
    TINY_MODEL_SETTINGS,
    assert_the_thread_rule_ran,
    copy_store,
    descendants,
    kill_if_running,
    running,
    thread_decisions,
    thread_rule_env,
    wait_for,
)

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
KILLED_WITHIN_S = 60
SETTINGS = [
    "model.variant=pi",
    *TINY_MODEL_SETTINGS,
    "model.use_batch_norm=false",
    "model.embed_dropout=0.0",
    "model.mlp_dropout=0.0",
    "batch_size=16",
    "learning_rate=0.001",
    "eval_every=10",
    "checkpoint_every=5",
    "log_every=5",
    "device=cpu",
    "experiment=distributed",
]
"""A tiny PI model, no dropout, no batch norm. The learning rate is RMSprop's 1e-3: at the paper's 7e-3
this tiny model amplifies float32 rounding (the ranks' gradients agree with one process's to 4e-7, and to
2e-15 in float64) to 8e-4 in 20 steps."""
WEIGHT_TOLERANCE = 1e-4
THREADS_TRACE = "threads.jsonl"
RANK_PROGRAM = "__main__.py"
"""What a torchrun rank runs (`python -m spinn.cli`), as its sys.argv[0] ends."""
POISON = """
import os, sys, importlib.abc
if os.environ.get("RANK", "0") != "0":
    class _NoMlflow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "mlflow":
                raise ImportError(f"rank {os.environ['RANK']} imported {name}")
    sys.meta_path.insert(0, _NoMlflow())
    import spinn.ground.io
    def _refuse(path):
        raise RuntimeError(f"rank {os.environ['RANK']} tried to publish {path}")
    spinn.ground.io.atomic_path = _refuse
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory, migrated_store) -> Path:
    from spinn.data.prepare import PrepareSettings, prepare
    from spinn.data.smoke import write_smoke_corpus
    from spinn.data.vocab import vocab_stage

    root = tmp_path_factory.mktemp("distributed")
    archive = write_smoke_corpus(root / "snli.zip")
    for split in ("train", "dev"):
        prepare(archive, root / "prepared", PrepareSettings(workers=1), member=f"snli_1.0_{split}.jsonl")
    vocab_stage(root / "prepared" / "train.parquet")
    copy_store(migrated_store, root / "mlflow.db")
    (root / "poison").mkdir()
    (root / "poison" / "sitecustomize.py").write_text(POISON)
    return root


def command(root: Path, output: str, *extra: str) -> list[str]:
    settings = [part for setting in SETTINGS for part in ("--set", setting)]
    return [
        str(BIN / "spinn"),
        "train",
        "--train",
        str(root / "prepared" / "train.parquet"),
        "--dev",
        str(root / "prepared" / "dev.parquet"),
        "--output-dir",
        str(root / output),
        "--embeddings-dir",
        str(root / "embeddings"),
        *settings,
        *extra,
    ]


def environment(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        **thread_rule_env(root / THREADS_TRACE),  # one free core: ranks and single processes run one thread
        "PYTHONPATH": os.pathsep.join([str(root / "poison"), os.environ.get("PYTHONPATH", "")]),
    }


def run(root: Path, output: str, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        command(root, output, *extra),
        cwd=root,
        env=environment(root),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path).model_state


def assert_same_weights(first: Path, second: Path, tolerance: float) -> None:
    a, b = weights(first), weights(second)
    worst = max((a[name].float() - b[name].float()).abs().max().item() for name in a)
    assert worst <= tolerance, f"weights differ by {worst:.3g}"


TWO_RANK_STEPS = 40
"""Long enough for a checkpoint to kill the job at, and evaluations on either side of it."""


@pytest.fixture(scope="module")
def two_ranks(project) -> subprocess.CompletedProcess:
    """One two-rank job, registered, that the tests below compare against: one process's run of the same
    settings, and a killed and resumed job. First: rank 0 fills the vector cache. Progress as lines for logs."""
    return run(project, "two", "--set", f"max_steps={TWO_RANK_STEPS}", "--set", "processes=2", "--report-every", "1")


@pytest.mark.slow
def test_two_ranks_train_what_one_process_trains_in_one_run(project, two_ranks):
    import mlflow

    printed = two_ranks.stdout + two_ranks.stderr  # rank 0 prints the progress lines, no rank draws a bar
    assert re.search(rf"train step \d+/{TWO_RANK_STEPS} \(\d+%\)", printed)  # lines on time (every second here)
    assert "s/step" not in printed and "step/s" not in printed
    run(project, "one", "--set", f"max_steps={TWO_RANK_STEPS}", "--no-register")
    assert_same_weights(project / "one" / "last.pt", project / "two" / "last.pt", WEIGHT_TOLERANCE)
    assert len(load_checkpoint(project / "two" / "last.pt").rng_by_rank()) == 2
    mlflow.set_tracking_uri(f"sqlite:///{project / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["distributed"])
    assert sorted(runs["params.world_size"]) == ["1", "2"]  # one run per job, not one per rank
    assert (runs.loc[runs["params.world_size"] == "2", "params.backend"] == "gloo").all()
    versions = mlflow.MlflowClient().search_model_versions("name = 'spinn'")
    assert len(versions) == 1 and versions[0].run_id == runs.loc[runs["params.world_size"] == "2", "run_id"].item()
    decisions = thread_decisions(project / THREADS_TRACE, "train")
    ranks = [decision for decision in decisions if decision["argv"][0].endswith(RANK_PROGRAM)]
    assert len({rank["pid"] for rank in ranks}) == 2 and len(decisions) >= 3  # two ranks and the single process
    for decision in decisions:
        assert_the_thread_rule_ran(decision)
    assert {rank["omp_num_threads"] for rank in ranks} == {cores.share(2)}  # torchrun's ranks split the cores


@pytest.mark.slow
def test_the_poison_would_catch_a_rank_that_touches_mlflow(project):
    """The check above means something: under the sitecustomize, rank 1 cannot import MLflow."""
    probe = subprocess.run(
        [sys.executable, "-c", "import mlflow"],
        env={**environment(project), "RANK": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode != 0 and "rank 1 imported mlflow" in probe.stderr


@pytest.mark.slow
def test_killing_every_rank_after_a_checkpoint_then_resuming_is_exact(project, two_ranks):
    """The killed job, resumed, ends where the whole two-rank job ended (registering that one changed nothing
    it trained)."""
    job = subprocess.Popen(
        command(project, "killed", "--set", f"max_steps={TWO_RANK_STEPS}", "--set", "processes=2", "--no-register"),
        cwd=project,
        env=environment(project),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    last = project / "killed" / "last.pt"
    step = _wait_for_checkpoint(last, job)
    processes = descendants(job.pid)  # torchrun starts each rank in a session of its own: the group kill misses them
    os.killpg(job.pid, signal.SIGKILL)
    kill_if_running(processes)  # every rank at once, as a machine that fails ends them
    job.wait()
    # a killed rank lets go of the output's lock as it ends, not before
    wait_for(lambda: not any(map(running, processes)), KILLED_WITHIN_S, "the killed job's processes ending")
    assert 0 < step < TWO_RANK_STEPS, f"the job was killed at step {step}, not in the middle"
    resume = ("--set", f"max_steps={TWO_RANK_STEPS}", "--set", "processes=2", "--no-register", "--resume")
    run(project, "killed", *resume)
    assert_same_weights(project / "two" / "last.pt", last, 0.0)


def _wait_for_checkpoint(path: Path, job: subprocess.Popen, at_least: int = 10) -> int:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if path.is_file():
            step = load_checkpoint(path).step
            if step >= at_least:
                return step
        assert job.poll() is None, "the job ended before it could be killed"
        time.sleep(0.02)
    raise AssertionError("no checkpoint in time")


def example(length: int) -> Example:
    tokens = tuple(range(2, 2 + length))
    transitions = (0,) + (0, 1) * (length - 1)
    return Example(tokens, transitions, tokens, transitions, 0)


@pytest.mark.parametrize("size", [1, 7, 16])
def test_ranks_share_a_batch_exactly(size):
    indices = list(range(100, 100 + size))
    shares = [share(indices, Topology(rank, 3)) for rank in range(3)]
    assert sum(shares, []) == indices
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_loss_scales_turn_rank_means_into_the_global_mean():
    examples = [example(length) for length in (1, 2, 3, 4, 5)]
    scales = [make_share(examples, range(5), Topology(rank, 2)).loss_scale for rank in range(2)]
    pairs = [len(share(range(5), Topology(rank, 2))) for rank in range(2)]
    assert [scale[0].item() for scale in scales] == pytest.approx([2 * count / 5 for count in pairs])
    assert sum(scale[1].item() for scale in scales) == pytest.approx(2.0)  # shares of the real steps


BN_ROWS, BN_CHANNELS, BN_RANKS = 8, 3, 2


def _batch_norm_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows, their real-row mask and the loss weights: one global batch, the same on every rank (float64)."""
    generator = torch.Generator().manual_seed(3)
    rows = torch.randn(BN_ROWS, BN_CHANNELS, generator=generator, dtype=torch.float64)  # (R, C)
    real = torch.tensor([1, 1, 0, 1, 1, 1, 1, 0], dtype=torch.bool)  # (R,)
    loss_weights = torch.randn(BN_ROWS, BN_CHANNELS, generator=generator, dtype=torch.float64)  # (R, C)
    return rows, real, loss_weights


def _batch_norm(rows: torch.Tensor, real: torch.Tensor, loss_weights: torch.Tensor):
    """Output, row gradients and parameter gradients of MaskedBatchNorm1d under a weighted-sum loss."""
    from spinn.model.cells import MaskedBatchNorm1d

    norm = MaskedBatchNorm1d(BN_CHANNELS).double().train()
    rows = rows.clone().requires_grad_(True)
    output = norm(rows, real)  # (R, C)
    (output * loss_weights).sum().backward()
    return output.detach(), rows.grad, norm.weight.grad, norm.bias.grad


def _batch_norm_rank(rank: int, init_file: str, folder: str) -> None:
    import warnings

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=BN_RANKS)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rows, real, loss_weights = _batch_norm_inputs()
            mine = slice(rank * BN_ROWS // BN_RANKS, (rank + 1) * BN_ROWS // BN_RANKS)
            found = _batch_norm(rows[mine], real[mine], loss_weights[mine])
        torch.save({"found": found, "warnings": [str(w.message) for w in caught]}, Path(folder) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_batch_norm_over_two_ranks_is_one_process_batch_norm_without_warnings(tmp_path):
    """README: batch norm counts the whole global batch. Two gloo ranks, each with half the rows: the outputs
    and row gradients are one process's over all rows, the parameter gradients add up to its, and no rank
    warns (torch's deprecated differentiable all_reduce printed a FutureWarning on every rank)."""
    import torch.multiprocessing as mp

    mp.spawn(_batch_norm_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=BN_RANKS)
    ranks = [torch.load(tmp_path / f"{rank}.pt", weights_only=True) for rank in range(BN_RANKS)]
    output, row_grad, weight_grad, bias_grad = _batch_norm(*_batch_norm_inputs())
    assert [rank["warnings"] for rank in ranks] == [[]] * BN_RANKS
    torch.testing.assert_close(torch.cat([rank["found"][0] for rank in ranks]), output)
    torch.testing.assert_close(torch.cat([rank["found"][1] for rank in ranks]), row_grad)
    torch.testing.assert_close(sum(rank["found"][2] for rank in ranks), weight_grad)
    torch.testing.assert_close(sum(rank["found"][3] for rank in ranks), bias_grad)
