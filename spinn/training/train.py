"""The train stage: prepared splits + a TrainConfig -> checkpoints, an MLflow run, a registered model.

One function, `train`, that the CLI, the flows and the tests call. It holds
the run's folder (spinn.training.folders), builds the run (build), starts or
resumes it (checkpoints), runs the loop (loop) and publishes what it made
(publish); with `processes` > 1 outside torchrun it relaunches itself under
torchrun (relaunch). `--resume` continues a killed run in the same MLflow run
(a finished one in a new MLflow run linked to it: continuation) and ends with
the same weights as a run that was never interrupted.

Under torchrun (spinn/training/distributed.py) every rank runs the loop on its
share of each global batch; rank 0 alone evaluates, writes checkpoints (with
every rank's RNG state), talks to MLflow and registers, and the others wait for
it at the same points, so a resumed job is exact at the same world size.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from spinn.data.embeddings import DEFAULT_CACHE_DIR
from spinn.data.split_files import with_partner
from spinn.ground.cores import torch_threads
from spinn.ground.errors import SpinnError
from spinn.ground.io import FolderLock, check_outputs, lock_output_folder
from spinn.training import distributed
from spinn.training.build import TrainingRun, build_run
from spinn.training.continuation import continuation_name, continuation_tags, finished_run
from spinn.training.distributed import Topology
from spinn.training.folders import (
    LAST_CHECKPOINT,
    MLFLOW_RUN_FACT,
    RUN_FILES,
    RUNS_DIR,
    check_folder,
    check_resumable,
    check_run_of_folder,
    clear_run_files,
    close_abandoned_run,
    folder_tags,
    holds_finished_run,
    run_folder,
)
from spinn.training.loop import loop
from spinn.training.publish import default_run_name, finish, log_run_start, nothing_to_publish, reused_result
from spinn.training.relaunch import train_distributed, write_result
from spinn.training.resume import resume_run
from spinn.training.state import TrainResult, TrainState
from spinn.training.train_config import TrainConfig


def train(
    train_path: Path,
    dev_path: Path,
    config: TrainConfig,
    *,
    output_dir: Path | None = None,
    vocab_path: Path | None = None,
    embeddings_dir: Path = DEFAULT_CACHE_DIR,
    resume: bool = False,
    overwrite: bool = False,
    run_name: str | None = None,
    register: bool = True,
    progress: bool = True,
    report_every_s: float | None = None,
) -> TrainResult | None:
    """Train until max_steps, max_epochs or early stopping; see the module docstring.

    `output_dir`: by default this run's own folder under data/runs (spinn/training/folders.py).
    `resume`: continue the run whose last.pt is in `output_dir`; `overwrite`:
    replace the run there; with neither, a folder holding a run is refused, unless it holds this very run
    finished (same settings, TrainConfig.same_run_as): that run is the result. `report_every_s`: also print
    a progress line at the first log interval after each such span (where no bar is seen: Prefect's logs).
    With `processes` > 1 outside torchrun, starts torchrun on this node and returns what its rank 0
    trained. Under torchrun, rank 0 returns the result and the other ranks None."""
    from spinn.tracking import store as tracking

    if output_dir is None:
        output_dir = run_folder(RUNS_DIR, config, Path(train_path), Path(dev_path), vocab_path)
    output_dir = Path(output_dir)
    # before anything reads the folder's checkpoints: none of the files a run writes may be one it reads
    check_outputs([output_dir / name for name in RUN_FILES], inputs=training_inputs(train_path, dev_path, vocab_path))
    if resume and overwrite:
        raise SpinnError(
            f"{output_dir}: resume continues the run there and overwrite replaces it",
            fix=(("resume", "overwrite"), "give {} or {}, not both"),
        )
    if resume:
        check_resumable(output_dir)
    resume = resume or _reusable(output_dir, config, overwrite, say=progress or report_every_s is not None)
    topology = Topology.from_environment()
    if config.processes > 1 and not topology.distributed:
        arguments = dict(vocab_path=vocab_path, embeddings_dir=embeddings_dir, run_name=run_name, register=register)
        arguments.update(progress=progress, report_every_s=report_every_s)
        return train_distributed(
            train_path, dev_path, config, output_dir, resume=resume, overwrite=overwrite, **arguments
        )
    paths = (Path(train_path), Path(dev_path), config, output_dir, vocab_path, Path(embeddings_dir))
    with torch_threads(config.threads, where="train"):  # a rank's share: torchrun's OMP_NUM_THREADS
        try:
            if not topology.is_main:
                run = build_run(*paths, progress=False)
                return _follow(run, _starting_state(run, resume, overwrite=False, progress=False), tracking)
            with lock_output_folder(output_dir) as lock:
                check_folder(output_dir, resume or overwrite, tracking)
                run = build_run(*paths, progress=progress)
                run.report_every_s = report_every_s
                state = _starting_state(run, resume, overwrite, progress)
                if state.run_id is not None:
                    check_run_of_folder(state.run_id, output_dir, tracking)
                close_abandoned_run(lock, state.run_id, tracking)
                result = _tracked(run, state, lock, tracking, run_name, register, progress)
                write_result(result, output_dir)
            distributed.barrier()  # the other ranks wait in _follow until the model is published
            return result
        finally:
            distributed.teardown()


def _tracked(
    run: TrainingRun,
    state: TrainState,
    lock: FolderLock,
    tracking,
    run_name: str | None,
    register: bool,
    progress: bool,
) -> TrainResult:
    """Train what is left and publish it in the MLflow run this one writes into: its own, a new one that
    continues the finished run it resumes, or none when that finished run has nothing left to do
    (spinn.training.continuation)."""
    finished = finished_run(state, tracking)
    if finished is not None and nothing_to_publish(run, state, register):
        return reused_result(run, state)
    if finished is not None:
        state.run_id, run_name = None, run_name or continuation_name(finished)
    run_name = run_name or default_run_name(run.config, run.train_path)
    with tracking.run(run.config.experiment, run_name, state.run_id) as run_id:
        lock.record(**{MLFLOW_RUN_FACT: run_id})
        if state.run_id is None:
            state.run_id = run_id
            tracking.set_tags({**folder_tags(run.output_dir), **continuation_tags(finished)})
            log_run_start(run, tracking)
        if not state.finished:
            loop(run, state, tracking, progress)
        return finish(run, state, tracking, register)


def training_inputs(train_path: Path, dev_path: Path, vocab_path: Path | None) -> list[Path]:
    """Every file training reads, with each split's partner: no file the run writes may be one of them."""
    return [*with_partner(Path(train_path)), *with_partner(Path(dev_path)), *([Path(vocab_path)] if vocab_path else [])]


def _follow(run: TrainingRun, state: TrainState, tracking) -> None:
    """A rank other than 0: train its shares and join rank 0 at every exchange; the loop keeps it away from
    MLflow and files (topology.is_main)."""
    if not state.finished:
        loop(run, state, tracking, progress=False)
    distributed.barrier()


def _reusable(output_dir: Path, config: TrainConfig, overwrite: bool, say: bool) -> bool:
    """The folder already holds this very run, finished: it is the result (resumed with nothing to do)."""
    if overwrite or not holds_finished_run(output_dir, config):
        return False
    if say:
        tqdm.write(f"{output_dir}: holds this run, finished; reusing it")
    return True


def _starting_state(run: TrainingRun, resume: bool, overwrite: bool, progress: bool) -> TrainState:
    """Where the run starts: last.pt's state when resuming one, else step 0 (the earlier run's files gone
    first when overwriting it)."""
    last = run.output_dir / LAST_CHECKPOINT
    if overwrite:
        clear_run_files(run.output_dir)
    if resume and last.exists():
        return resume_run(run)
    return TrainState()
