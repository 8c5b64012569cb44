"""The train stage: prepared splits + a TrainConfig -> checkpoints, an MLflow run, a registered model.

The loop is plain PyTorch: length-bucketed batches in a seeded order per
epoch, RMSprop with the paper's step decay, gradient clipping, periodic dev
evaluation with early stopping, and bf16 autocast on GPU. Everything needed to
continue lives in `last.pt` (written atomically every `checkpoint_every`
steps): weights, optimizer, scheduler, position in the epoch, early-stopping
state, RNG states and the MLflow run id. `--resume` therefore continues a
killed run in the same MLflow run and ends with the same weights as a run
that was never interrupted.

Under torchrun (spinn/training/distributed.py) every rank runs this loop on its
share of each global batch; rank 0 alone evaluates, writes checkpoints (with
every rank's RNG state), talks to MLflow and registers, and the others wait for
it at the same points, so a resumed job is exact at the same world size.

An output folder holds one run. A run holds the folder's lock while it works
(a second run there is refused, naming it) and records its MLflow run id in
it; a new run refuses a folder that holds an earlier run's checkpoints
unless told to `resume` or `overwrite` it, and marks the previous holder's
MLflow run KILLED when that one died still RUNNING (before its first
checkpoint, say), since nothing else ever would.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from spinn.data.embeddings import DEFAULT_CACHE_DIR, load_settings_embeddings
from spinn.data.pairs import Example
from spinn.data.vocab import VOCAB_FILENAME, Vocabulary
from spinn.errors import SpinnError
from spinn.inference.step import InferStep
from spinn.io import FolderLock, atomic_path, file_digest, lock_folder, tidy_folder, write_json
from spinn.model.batch import bucket_batches
from spinn.model.checkpoint import check_vocabulary, load_checkpoint, restore_rng_states, rng_states, save_checkpoint
from spinn.model.config import SPINNConfig
from spinn.model.loading import resolve_device
from spinn.model.spinn import SPINN
from spinn.tracking.register import SELECTION_METRIC
from spinn.training import distributed
from spinn.training.config import TrainConfig
from spinn.training.distributed import Topology
from spinn.training.evaluate import dev_source, read_examples, score_examples
from spinn.training.folders import RUNS_DIR, run_folder
from spinn.training.loader import prefetch
from spinn.training.metrics import Metrics, plot_confusion
from spinn.training.step import StepOptions, TrainStep, make_optimizer

LAST_CHECKPOINT = "last.pt"
BEST_CHECKPOINT = "best.pt"
REPORT_NAME = "report.json"
RUN_FILES = (LAST_CHECKPOINT, BEST_CHECKPOINT, REPORT_NAME)
"""What a run leaves in its output folder; `overwrite` removes them before a new run starts."""
MLFLOW_RUN_FACT = "mlflow_run_id"
"""The fact a run records in its folder's lock, so the next run there can close it if it died."""
TRAIN_METRICS_NAME = "train.json"
TRAIN_CURVE_NAME = "train_curve.csv"
DEV_CURVE_NAME = "dev_curve.csv"
TRAIN_CURVE_KEYS = ["train_loss", "train_accuracy"]
DEV_CURVE_KEYS = ["dev_accuracy", "dev_transition_accuracy", "dev_bracket_f1"]
DEV_ARTIFACT_DIR = "dev"
"""Where the run's artifacts keep the best model's dev scores and confusion matrix."""
RESULT_NAME = "result.json"
"""What rank 0 leaves for the process that launched a distributed run: the TrainResult."""
RESUMABLE_CHANGES = frozenset(
    {
        "max_epochs",
        "max_steps",
        "patience",
        "eval_every",
        "checkpoint_every",
        "log_every",
        "device",
        "threads",
        "processes",
        "graphs",
    }
)
"""Settings a resumed run may change: how long it goes on and where it runs, not what it learns."""


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint so a resumed run picks up exactly here."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_dev_accuracy: float = -1.0
    best_step: int = 0
    evals_since_best: int = 0
    last_eval_step: int = -1
    finished: bool = False
    early_stopped: bool = False
    run_id: str | None = None
    train_seconds: float = 0.0
    train_pairs: int = 0
    model_version: str | None = None
    registered_best_step: int = -1


@dataclass
class TrainResult:
    run_id: str
    steps: int
    best_step: int
    best_dev_accuracy: float
    best_checkpoint: Path
    last_checkpoint: Path
    model_version: str | None
    promoted: bool
    train_seconds: float
    pairs_per_second: float
    dev_metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Run:
    """What one training run works with (built once, shared by the helpers below)."""

    config: TrainConfig
    model: SPINN
    optimizer: torch.optim.Optimizer
    step: TrainStep
    dev_infer: InferStep
    vocabulary: Vocabulary
    train: list[Example]
    dev: list[Example]
    device: torch.device
    output_dir: Path
    data_hashes: dict[str, str]
    topology: Topology
    train_path: Path
    dev_path: Path
    rng_ranks: list[dict] = field(default_factory=list)  # every rank's RNG states at the last checkpoint
    report_every_s: float | None = None
    next_report: float = 0.0


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
    replace the run there; with neither, a folder holding a run is refused. `report_every_s`: also print
    a progress line at the first log interval after each such span (where no bar is seen: Prefect's logs).
    With `processes` > 1 outside torchrun, starts torchrun on this node and returns what its rank 0
    trained. Under torchrun, rank 0 returns the result and the other ranks None."""
    from spinn.tracking import store as tracking

    if output_dir is None:
        output_dir = run_folder(RUNS_DIR, config, Path(train_path), Path(dev_path), vocab_path)
    if resume and overwrite:
        raise SpinnError(
            f"{output_dir}: resume continues the run there and overwrite replaces it",
            fix=(("resume", "overwrite"), "give {} or {}, not both"),
        )
    topology = Topology.from_environment()
    if config.processes > 1 and not topology.distributed:
        arguments = dict(vocab_path=vocab_path, embeddings_dir=embeddings_dir, run_name=run_name, register=register)
        arguments.update(progress=progress, report_every_s=report_every_s)
        return train_distributed(
            train_path, dev_path, config, output_dir, resume=resume, overwrite=overwrite, **arguments
        )
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    run_name = run_name or default_run_name(config, Path(train_path))
    output_dir = Path(output_dir)
    paths = (Path(train_path), Path(dev_path), config, output_dir, vocab_path, Path(embeddings_dir))
    try:
        if not topology.is_main:
            run = _build(*paths, progress=False)
            return _follow(run, _starting_state(run, resume, overwrite=False, progress=False))
        with lock_folder(output_dir) as lock:
            _check_folder(output_dir, resume or overwrite, tracking)
            run = _build(*paths, progress=progress)
            run.report_every_s = report_every_s
            state = _starting_state(run, resume, overwrite, progress)
            _close_abandoned_run(lock, state.run_id, tracking)
            with tracking.run(config.experiment, run_name, state.run_id) as run_id:
                lock.record(**{MLFLOW_RUN_FACT: run_id})
                if state.run_id is None:
                    state.run_id = run_id
                    _log_run_start(run, tracking)
                if not state.finished:
                    _loop(run, state, tracking, progress)
                result = _finish(run, state, tracking, register)
            _write_result(result, output_dir)
        distributed.barrier()  # the other ranks wait in _follow until the model is published
        return result
    finally:
        distributed.teardown()


def _follow(run: _Run, state: TrainState) -> None:
    """A rank other than 0: train its shares, join rank 0 at every exchange, never touch MLflow or files."""
    if not state.finished:
        _loop(run, state, None, progress=False)
    distributed.barrier()


def _write_result(result: TrainResult, output_dir: Path) -> None:
    with atomic_path(output_dir / RESULT_NAME) as temporary:
        temporary.write_text(json.dumps(asdict(result), default=str, indent=2), encoding="utf-8")


def read_result(output_dir: Path) -> TrainResult:
    data = json.loads((Path(output_dir) / RESULT_NAME).read_text(encoding="utf-8"))
    for name in ("best_checkpoint", "last_checkpoint"):
        data[name] = Path(data[name])
    return TrainResult(**data)


def train_distributed(
    train_path: Path,
    dev_path: Path,
    config: TrainConfig,
    output_dir: Path,
    *,
    vocab_path: Path | None = None,
    embeddings_dir: Path = DEFAULT_CACHE_DIR,
    resume: bool = False,
    overwrite: bool = False,
    run_name: str | None = None,
    register: bool = True,
    progress: bool = True,
    report_every_s: float | None = None,
) -> TrainResult:
    """Run `spinn train` under torchrun with `config.processes` ranks on this node, and read rank 0's result.

    The config travels as a params file of its own, so every rank builds exactly this config."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spinn-distributed-") as folder:
        params = Path(folder) / "params.yaml"
        settings = config.to_dict()
        embeddings = settings.pop("embeddings")
        params.write_text(yaml.safe_dump({"train": settings, "embeddings": embeddings}), encoding="utf-8")
        arguments = [
            "--config",
            str(params),
            "--train",
            str(train_path),
            "--dev",
            str(dev_path),
            "--output-dir",
            str(output_dir),
            "--embeddings-dir",
            str(embeddings_dir),
        ]
        arguments += ["--vocab", str(vocab_path)] if vocab_path is not None else []
        arguments += ["--resume"] if resume else []
        arguments += ["--overwrite"] if overwrite else []
        arguments += ["--run-name", run_name] if run_name else []
        arguments += [] if register else ["--no-register"]
        arguments += [] if progress else ["--no-progress"]
        arguments += ["--report-every", str(report_every_s)] if report_every_s is not None else []
        (output_dir / RESULT_NAME).unlink(missing_ok=True)
        distributed.launch(config.processes, arguments)
    return read_result(output_dir)


def data_name(path: Path) -> str:
    """What a prepared split was made from, for names people read: `snli_1.0_train` for the Parquet file
    prepared from `snli_1.0.zip:snli_1.0_train.jsonl`; the file's own name when it does not say."""
    import pyarrow.parquet as pq

    from spinn.data.schema import META_SOURCE

    try:
        source = (pq.read_schema(path).metadata or {}).get(META_SOURCE, b"").decode()
    except (OSError, ValueError):
        source = ""
    name = Path(source.rpartition(":")[2] or path.name).name
    for suffix in (".gz", ".jsonl", ".txt", ".csv", ".tsv", ".parquet"):
        name = name.removesuffix(suffix)
    return name or path.stem


def default_run_name(config: TrainConfig, train_path: Path) -> str:
    """`pi snli_1.0_train 2026-11-23 16:20:05 3f2a`: the variant, the data, the start time and four hex
    digits from the OS (never the seeded generator, which made every MLflow name the same), so runs
    differ in MLflow's table and compare view, even two started in the same second."""
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"{config.model.variant} {data_name(train_path)} {started} {secrets.token_hex(2)}"


def _check_folder(output_dir: Path, told: bool, tracking) -> None:
    """Before any work: tidy what killed runs left, refuse an earlier run's folder unless `told` (to resume
    or overwrite it), and refuse an MLflow store we could not write to."""
    tidy_folder(output_dir)
    found = [name for name in (LAST_CHECKPOINT, BEST_CHECKPOINT) if (output_dir / name).exists()]
    if found and not told:  # a new run would replace them, however much better the earlier run was
        raise SpinnError(
            f"{output_dir}: holds {', '.join(found)} of an earlier run",
            fix=(("resume", "overwrite"), "continue it with {}, replace it with {}, or choose another output folder"),
        )
    tracking.check_writable()


def _starting_state(run: _Run, resume: bool, overwrite: bool, progress: bool) -> TrainState:
    """Where the run starts: last.pt's state when resuming one, else step 0 (the earlier run's files gone
    first when overwriting it)."""
    last = run.output_dir / LAST_CHECKPOINT
    if overwrite:
        for name in RUN_FILES:
            (run.output_dir / name).unlink(missing_ok=True)
    if resume and last.exists():
        return _resume(run)
    if resume and progress:
        tqdm.write(f"no {last} to resume from; starting a new run")
    return TrainState()


def _close_abandoned_run(lock: FolderLock, resuming: str | None, tracking) -> None:
    """Mark the folder's previous MLflow run KILLED if it is still RUNNING: we hold the folder's lock, so
    its process is gone. A run being resumed is left to go on."""
    previous = lock.previous.get(MLFLOW_RUN_FACT)
    if previous is not None and previous != resuming:
        tracking.end_abandoned_run(previous)


# ----------------------------------------------------------------------------- setup


def _build(
    train_path: Path,
    dev_path: Path,
    config: TrainConfig,
    output_dir: Path,
    vocab_path: Path | None,
    embeddings_dir: Path,
    progress: bool,
) -> _Run:
    vocab_path = vocab_path or train_path.parent / VOCAB_FILENAME
    if not vocab_path.exists():
        raise SpinnError(
            f"{vocab_path}: no vocabulary; build it from the training split first (`spinn vocab`), or name another"
        )
    vocabulary = Vocabulary.load(vocab_path)
    topology = Topology.from_environment()
    device = distributed.setup(topology, resolve_device(config.device).type)
    vectors, report = _vectors(config, vocabulary, embeddings_dir, progress, topology)
    model_config = _fit_embedding_size(config.model, vectors.shape[1])
    config = config.replace(model=model_config).resolved(device.type)
    random.seed(config.seed)
    torch.manual_seed(config.seed)  # every rank starts from the same weights
    model = SPINN(model_config, torch.from_numpy(vectors)).to(device)
    schedule = config.schedule()
    optimizer = make_optimizer(model, schedule, config.weight_decay, device)
    network = _network(model, device, topology)
    options = StepOptions(config.clip_norm, config.amp, config.graphs)
    step = TrainStep(model, optimizer, schedule, options, network=network)
    hashes = {
        "train_sha256": file_digest(train_path, "sha256"),
        "dev_sha256": file_digest(dev_path, "sha256"),
        "vocab_sha256": hashlib.sha256("\n".join(vocabulary.tokens).encode()).hexdigest(),
        "embeddings_coverage": f"{report.coverage:.4f}",
    }
    return _Run(
        config,
        model,
        optimizer,
        step,
        InferStep(model, dev_source(model_config), graphs=config.graphs),
        vocabulary,
        read_examples(train_path, vocabulary),
        read_examples(dev_path, vocabulary),
        device,
        output_dir,
        hashes,
        topology,
        train_path,
        dev_path,
    )


def _vectors(config: TrainConfig, vocabulary: Vocabulary, embeddings_dir: Path, progress: bool, topology: Topology):
    """The aligned word vectors: rank 0 aligns (and caches) them first, the other ranks then read its cache,
    so only one process downloads or writes."""
    if not topology.is_main:
        distributed.barrier()
    found = load_settings_embeddings(config.embeddings, vocabulary, cache_dir=embeddings_dir, progress=progress)
    if topology.is_main:
        distributed.barrier()
    return found


def _network(model: SPINN, device: torch.device, topology: Topology) -> torch.nn.Module:
    """What a training step calls: the model, or under torchrun the model in DistributedDataParallel,
    which averages the gradients over the ranks as backward produces them."""
    if not topology.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def _fit_embedding_size(model: SPINNConfig, dim: int) -> SPINNConfig:
    """The model takes its embedding size from the vectors; a preset's 300 yields to GloVe 50d."""
    return model if model.d_embed == dim else model.replace(d_embed=dim)


def _resume(run: _Run) -> TrainState:
    """Load last.pt into the run, refusing one made with another vocabulary or other learning settings.

    A run that stopped at its step or epoch budget goes on when the new budget
    is larger; an early-stopped run stays stopped.
    """
    path = run.output_dir / LAST_CHECKPOINT
    contents = load_checkpoint(path)  # on the CPU: load_state_dict moves what it needs; RNG states must stay
    check_vocabulary(contents, run.vocabulary.tokens, path, "this run's vocabulary")
    saved, current = TrainConfig.from_dict(contents["train_config"]).to_dict(), run.config.to_dict()
    changed = sorted(key for key in current if key not in RESUMABLE_CHANGES and saved.get(key) != current[key])
    if changed:
        raise SpinnError(
            f"{path}: was trained with other settings ({', '.join(changed)}); "
            "resume with the same config or start a new output folder"
        )
    run.model.load_state_dict(contents["model_state"])
    run.optimizer.load_state_dict(contents["optimizer_state"])
    restore_rng_states(_own_rng(contents, run.topology, path))
    state = TrainState(**contents["state"])
    state.finished = state.early_stopped or _budget_spent(run.config, state)
    return state


def _own_rng(contents: dict, topology: Topology, path: Path) -> dict:
    """This rank's RNG states from a checkpoint: exact at the world size that wrote it. At another world
    size the batches are shared differently anyway: every rank takes rank 0's states, and the log says
    the resumed run will not repeat the uninterrupted one bit for bit."""
    ranks = contents.get("rng_ranks") or [contents["rng"]]
    if len(ranks) == topology.world:
        return ranks[topology.rank]
    if topology.is_main:
        tqdm.write(
            f"{path}: written by {len(ranks)} process(es), resumed on {topology.world}: training goes on "
            "from the same weights and position, but not bit for bit as the uninterrupted run would"
        )
    return ranks[0]


def _budget_spent(config: TrainConfig, state: TrainState) -> bool:
    return state.epoch >= config.max_epochs or (config.max_steps is not None and state.step >= config.max_steps)


def _log_run_start(run: _Run, tracking) -> None:
    tracking.log_params(
        {
            **run.config.flat(),
            **{f"data.{key}": value for key, value in run.data_hashes.items()},
            "data.train_pairs": len(run.train),
            "data.dev_pairs": len(run.dev),
            "vocab_size": len(run.vocabulary),
            "device": str(run.device),
            "world_size": run.topology.world,
            "backend": distributed.backend() or "none",
        }
    )
    tracking.set_tags(
        {"variant": run.config.model.variant, "git_commit": tracking.git_commit(), "spinn.stage": "train"}
    )
    for context, path, digest in (
        ("training", run.train_path, run.data_hashes["train_sha256"]),
        ("validation", run.dev_path, run.data_hashes["dev_sha256"]),
    ):
        tracking.log_dataset(path, data_name(path), digest, context)


# ----------------------------------------------------------------------------- loop


def _loop(run: _Run, state: TrainState, tracking, progress: bool) -> None:
    """Epochs of seeded, length-bucketed batches until a stopping rule fires.

    Batches are made (their step plans too) and moved to the device by a loader
    thread one step ahead of the model; the step never waits for the device, and
    the loop reads the accumulated metrics once per log interval."""
    config = run.config
    bar = tqdm(
        total=_planned_steps(run),
        initial=state.step,
        disable=not progress or not run.topology.is_main,
        unit="step",
        dynamic_ncols=True,
    )
    window = _Window(time.perf_counter())
    try:
        while state.epoch < config.max_epochs:
            order = bucket_batches(run.train, config.batch_size, shuffle=True, seed=config.seed + state.epoch)
            for batch in prefetch(run.train, order[state.batch_in_epoch :], run.device, run.topology):
                run.step(batch, state.step)
                state.step += 1
                state.batch_in_epoch += 1
                bar.update()
                if _after_step(run, state, window, tracking, bar):
                    return
            state.epoch += 1
            state.batch_in_epoch = 0
        state.finished = True
    finally:
        bar.close()


def _planned_steps(run: _Run) -> int:
    per_epoch = -(-len(run.train) // run.config.batch_size)
    planned = per_epoch * run.config.max_epochs
    return min(planned, run.config.max_steps) if run.config.max_steps else planned


@dataclass
class _Window:
    """When the time since the last log line began (wall clock, evaluation and checkpoints excluded)."""

    started: float

    def restart(self) -> None:
        self.started = time.perf_counter()


def _after_step(run: _Run, state: TrainState, window: _Window, tracking, bar) -> bool:
    """Log, evaluate, checkpoint; True when training should stop now."""
    config = run.config
    if state.step % config.log_every == 0 or _budget_spent(config, state):
        _log_window(run, state, window, tracking, bar)
    if state.step % config.eval_every == 0:
        stop = _evaluate_dev(run, state, tracking) >= config.patience if tracking is not None else None
        state.early_stopped = distributed.broadcast(stop, run.topology)  # rank 0 decides, every rank stops
    if state.early_stopped or _budget_spent(config, state):
        state.finished = True
    if state.finished or state.step % config.checkpoint_every == 0:
        run.rng_ranks = distributed.gathered(rng_states(), run.topology)
        if tracking is not None:
            _save(run, state, run.output_dir / LAST_CHECKPOINT)
    if state.step % config.eval_every == 0 or state.step % config.checkpoint_every == 0:
        window.restart()  # speed counts training only
    return state.finished


def _log_window(run: _Run, state: TrainState, window: _Window, tracking, bar) -> None:
    """Read the device accumulators (the loop's one host sync per interval, summed over the ranks) and log
    them (rank 0)."""
    sums = run.step.metrics.read()
    if not sums["steps"] or tracking is None:
        window.restart()
        return
    seconds = time.perf_counter() - window.started
    metrics = {
        "train_loss": sums["loss"],
        "train_accuracy": sums["correct"] / sums["pairs"],
        "pairs_per_second": sums["pairs"] / seconds,
        "learning_rate": run.step.schedule.rate(state.step - 1),
    }
    if run.model.config.samples_transitions:
        metrics.update({name: sums[name] for name in ("rl_reward", "rl_baseline", "policy_entropy", "reduce_fraction")})
    tracking.log_metrics(metrics, state.step)
    bar.set_postfix(
        loss=f"{metrics['train_loss']:.3f}",
        acc=f"{metrics['train_accuracy']:.3f}",
        pairs_s=f"{metrics['pairs_per_second']:.0f}",
    )
    state.train_seconds += seconds
    state.train_pairs += int(sums["pairs"])
    window.restart()
    if run.report_every_s is not None and time.monotonic() >= run.next_report:
        run.next_report = time.monotonic() + run.report_every_s
        print(_progress_line(run, state, metrics), flush=True)


def _progress_line(run: _Run, state: TrainState, metrics: dict[str, float]) -> str:
    planned = _planned_steps(run)
    line = (
        f"train step {state.step}/{planned} ({state.step / planned:.0%}): loss {metrics['train_loss']:.3f}, "
        f"accuracy {metrics['train_accuracy']:.3f}, {metrics['pairs_per_second']:,.0f} pairs/s"
    )
    if state.best_step:
        line += f"; best dev accuracy {state.best_dev_accuracy:.4f} at step {state.best_step}"
    return line


def _evaluate_dev(run: _Run, state: TrainState, tracking) -> int:
    """Dev accuracy now; keeps best.pt; returns evaluations since the best one (for early stopping)."""
    metrics = score_examples(run.model, run.dev, run.device, source=run.dev_infer.source, step=run.dev_infer)
    state.last_eval_step = state.step
    logged = {"dev_accuracy": metrics.accuracy}
    if metrics.transition_accuracy is not None:
        logged["dev_transition_accuracy"] = metrics.transition_accuracy
    if metrics.bracket_f1 is not None:
        logged["dev_bracket_f1"] = metrics.bracket_f1
    tracking.log_metrics(logged, state.step)
    if metrics.accuracy > state.best_dev_accuracy:
        state.best_dev_accuracy, state.best_step, state.evals_since_best = metrics.accuracy, state.step, 0
        _save(run, state, run.output_dir / BEST_CHECKPOINT, metrics)
    else:
        state.evals_since_best += 1
    return state.evals_since_best


def _save(run: _Run, state: TrainState, path: Path, metrics: Metrics | None = None) -> None:
    save_checkpoint(
        path,
        {
            "model_state": run.model.state_dict(),
            "optimizer_state": run.optimizer.state_dict(),
            "model_config": run.model.config.to_dict(),
            "train_config": run.config.to_dict(),
            "vocab": run.vocabulary.to_json(),
            "step": state.step,
            "state": asdict(state),
            "rng": rng_states(),
            "rng_ranks": run.rng_ranks or [rng_states()],
            "data": run.data_hashes,
            "metrics": None if metrics is None else metrics.to_json(),
        },
    )


# ----------------------------------------------------------------------------- finish


def _finish(run: _Run, state: TrainState, tracking, register: bool) -> TrainResult:
    """Make sure the best model is evaluated, then log artifacts and register it (once per best model)."""
    if state.last_eval_step != state.step:
        _evaluate_dev(run, state, tracking)
    best = load_checkpoint(run.output_dir / BEST_CHECKPOINT)
    pairs_per_second = state.train_pairs / state.train_seconds if state.train_seconds else 0.0
    tracking.log_metrics({SELECTION_METRIC: state.best_dev_accuracy}, state.step)  # what registration compares
    tracking.set_tags(  # one value per run, read in the run's overview and table, not drawn as one-point charts
        {
            "best_step": str(state.best_step),
            "steps": str(state.step),
            "mean_pairs_per_second": f"{pairs_per_second:.1f}",
            "train_seconds": f"{state.train_seconds:.1f}",
        }
    )
    report = {
        "run_id": state.run_id,
        "steps": state.step,
        "best_step": state.best_step,
        "best_dev_accuracy": state.best_dev_accuracy,
        "dev": best["metrics"],
        "train_seconds": state.train_seconds,
        "pairs_per_second": pairs_per_second,
        "config": run.config.to_dict(),
        "data": run.data_hashes,
    }
    if register and state.registered_best_step == state.best_step:
        version, promoted = state.model_version, False  # resuming a finished run: this model is registered
    else:
        version, promoted = _publish(run, state, report, tracking, register)
        if version is not None:
            state.model_version, state.registered_best_step = version, state.best_step
    _save(run, state, run.output_dir / LAST_CHECKPOINT)
    return TrainResult(
        state.run_id,
        state.step,
        state.best_step,
        state.best_dev_accuracy,
        run.output_dir / BEST_CHECKPOINT,
        run.output_dir / LAST_CHECKPOINT,
        version,
        promoted,
        state.train_seconds,
        pairs_per_second,
        best["metrics"] or {},
    )


def _publish(run: _Run, state: TrainState, report: dict, tracking, register: bool) -> tuple[str | None, bool]:
    """Log the model folder (checkpoint, vocab, config) and the report; register; move the alias if better."""
    from spinn.tracking.register import log_model, register_model, version_description

    config = run.config
    best = run.output_dir / BEST_CHECKPOINT
    with tempfile.TemporaryDirectory(prefix="spinn-publish-") as folder:
        folder = Path(folder)
        checkpoint = folder / tracking.CHECKPOINT_NAME
        checkpoint.write_bytes(best.read_bytes())
        run.vocabulary.save(folder / VOCAB_FILENAME)
        (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2), encoding="utf-8")
        log_model(state.run_id, checkpoint, folder / VOCAB_FILENAME, folder / "config.json", report["dev"])
        tracking.log_run_artifacts(state.run_id, _dev_report(report, folder), DEV_ARTIFACT_DIR)
        with atomic_path(run.output_dir / REPORT_NAME) as temporary:
            temporary.write_text(json.dumps(report, indent=2), encoding="utf-8")
        tracking.log_artifact(run.output_dir / REPORT_NAME)
    if not register:
        return None, False
    registration = register_model(
        state.run_id,
        best,
        state.best_dev_accuracy,
        name=config.registered_model,
        alias=config.alias,
        description=version_description(config.model.variant, state.best_dev_accuracy),
    )
    return registration.version, registration.promoted


def _dev_report(report: dict, folder: Path) -> list[Path]:
    """The best model's dev scores as files for the run's artifacts: per-class precision / recall / F1 with
    the confusion matrix (JSON), and the matrix drawn (PNG)."""
    if not report["dev"]:
        return []
    scores = folder / "dev_scores.json"
    scores.write_text(json.dumps(report["dev"], indent=2), encoding="utf-8")
    title = f"{report['config']['model']['variant']} on dev, step {report['best_step']}"
    return [scores, plot_confusion(Metrics.from_json(report["dev"]), folder / "dev_confusion.png", title=title)]


def write_metrics_files(result: TrainResult, metrics_dir: Path) -> tuple[Path, Path, Path]:
    """`train.json` (DVC metrics) and the train / dev curves read back from MLflow (DVC plots).

    The curves come from the run's metric history, where a resumed run's
    repeated steps resolve to their latest value, so they match the MLflow UI.
    """
    from spinn.tracking import store as tracking

    metrics_dir = Path(metrics_dir)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    summary = {  # what selects a model; speed is machine-dependent and lives in the MLflow run
        "best_dev_accuracy": result.best_dev_accuracy,
        "best_step": result.best_step,
        "steps": result.steps,
    }
    paths = (metrics_dir / TRAIN_METRICS_NAME, metrics_dir / TRAIN_CURVE_NAME, metrics_dir / DEV_CURVE_NAME)
    write_json(paths[0], summary)
    history = tracking.metric_history(result.run_id, [*TRAIN_CURVE_KEYS, *DEV_CURVE_KEYS])
    _write_curve(paths[1], TRAIN_CURVE_KEYS, history)
    _write_curve(paths[2], [key for key in DEV_CURVE_KEYS if history[key]], history)
    return paths


def _write_curve(path: Path, keys: list[str], history: dict[str, dict[int, float]]) -> None:
    steps = sorted(set().union(*(history[key] for key in keys)))
    with atomic_path(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", *keys])
        writer.writerows([step, *(history[key].get(step, "") for key in keys)] for step in steps)
