"""The train stage: prepared splits + a TrainConfig -> checkpoints, an MLflow run, a registered model.

The loop is plain PyTorch: length-bucketed batches in a seeded order per
epoch, RMSprop with the paper's step decay, gradient clipping, periodic dev
evaluation with early stopping, and bf16 autocast on GPU. Everything needed to
continue lives in `last.pt` (written atomically every `checkpoint_every`
steps): weights, optimizer, scheduler, position in the epoch, early-stopping
state, RNG states and the MLflow run id. `--resume` therefore continues a
killed run in the same MLflow run and ends with the same weights as a run
that was never interrupted.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from spinn.atomic import atomic_path
from spinn.batching import Batch, Example, bucket_batches, make_batch
from spinn.checkpoint import (
    check_vocabulary,
    load_checkpoint,
    restore_rng_states,
    rng_states,
    save_checkpoint,
)
from spinn.config import TrainConfig
from spinn.download import file_digest
from spinn.embeddings import DEFAULT_CACHE_DIR, OOVPolicy, load_embeddings
from spinn.errors import SpinnError
from spinn.evaluate import read_examples, resolve_device, score_examples
from spinn.metrics import Metrics
from spinn.model import SPINN, SPINNConfig, spinn_loss
from spinn.registry import SELECTION_METRIC
from spinn.vocab import VOCAB_FILENAME, Vocabulary

LAST_CHECKPOINT = "last.pt"
BEST_CHECKPOINT = "best.pt"
REPORT_NAME = "report.json"
TRAIN_METRICS_NAME = "train.json"
TRAIN_CURVE_NAME = "train_curve.csv"
DEV_CURVE_NAME = "dev_curve.csv"
TRAIN_CURVE_KEYS = ["train_loss", "train_accuracy"]
DEV_CURVE_KEYS = ["dev_accuracy", "dev_transition_accuracy", "dev_bracket_f1"]
RESUMABLE_CHANGES = frozenset({"max_epochs", "max_steps", "patience", "eval_every", "checkpoint_every", "log_every",
                               "device", "threads"})
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
    scheduler: torch.optim.lr_scheduler.LRScheduler
    vocabulary: Vocabulary
    train: list[Example]
    dev: list[Example]
    device: torch.device
    output_dir: Path
    data_hashes: dict[str, str]


def train(train_path: Path, dev_path: Path, config: TrainConfig, *, output_dir: Path = Path("data/models"),
          vocab_path: Path | None = None, embeddings_dir: Path = DEFAULT_CACHE_DIR, resume: bool = False,
          run_name: str | None = None, register: bool = True, progress: bool = True) -> TrainResult:
    """Train until max_steps, max_epochs or early stopping; see the module docstring."""
    from spinn import tracking

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    output_dir = Path(output_dir)
    run = _build(Path(train_path), Path(dev_path), config, output_dir, vocab_path, Path(embeddings_dir), progress)
    state = _resume(run) if resume and (output_dir / LAST_CHECKPOINT).exists() else TrainState()
    if resume and not (output_dir / LAST_CHECKPOINT).exists() and progress:
        tqdm.write(f"no {output_dir / LAST_CHECKPOINT} to resume from; starting a new run")
    with tracking.run(config.experiment, run_name, state.run_id) as run_id:
        if state.run_id is None:
            state.run_id = run_id
            _log_run_start(run, tracking)
        if not state.finished:
            _loop(run, state, tracking, progress)
        return _finish(run, state, tracking, register)


# ----------------------------------------------------------------------------- setup


def _build(train_path: Path, dev_path: Path, config: TrainConfig, output_dir: Path, vocab_path: Path | None,
           embeddings_dir: Path, progress: bool) -> _Run:
    vocab_path = vocab_path or train_path.parent / VOCAB_FILENAME
    if not vocab_path.exists():
        raise SpinnError(f"{vocab_path}: no vocabulary; run `spinn vocab {train_path}` first or pass --vocab")
    vocabulary = Vocabulary.load(vocab_path)
    vectors, report = load_embeddings(config.embeddings, vocabulary, cache_dir=embeddings_dir,
                                      oov=OOVPolicy(config.oov), seed=config.embeddings_seed, progress=progress)
    model_config = _fit_embedding_size(config.model, vectors.shape[1])
    config = replace(config, model=model_config)
    device = resolve_device(config.device)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    model = SPINN(model_config, torch.from_numpy(vectors)).to(device)
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.RMSprop(trainable, lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=config.lr_decay_steps, gamma=config.lr_decay)
    hashes = {"train_sha256": file_digest(train_path, "sha256"), "dev_sha256": file_digest(dev_path, "sha256"),
              "vocab_sha256": hashlib.sha256("\n".join(vocabulary.tokens).encode()).hexdigest(),
              "embeddings_coverage": f"{report.coverage:.4f}"}
    return _Run(config, model, optimizer, scheduler, vocabulary, read_examples(train_path, vocabulary),
                read_examples(dev_path, vocabulary), device, output_dir, hashes)


def _fit_embedding_size(model: SPINNConfig, dim: int) -> SPINNConfig:
    """The model takes its embedding size from the vectors; a preset's 300 yields to GloVe 50d."""
    return model if model.d_embed == dim else replace(model, d_embed=dim)


def _resume(run: _Run) -> TrainState:
    """Load last.pt into the run, refusing one made with another vocabulary or other learning settings.

    A run that stopped at its step or epoch budget goes on when the new budget
    is larger; an early-stopped run stays stopped.
    """
    path = run.output_dir / LAST_CHECKPOINT
    contents = load_checkpoint(path, map_location=run.device)
    check_vocabulary(contents, run.vocabulary.tokens, path, "this run's vocabulary")
    saved, current = contents["train_config"], run.config.to_dict()
    changed = sorted(key for key in current if key not in RESUMABLE_CHANGES and saved.get(key) != current[key])
    if changed:
        raise SpinnError(f"{path}: was trained with other settings ({', '.join(changed)}); "
                         "resume with the same config or start a new output folder")
    run.model.load_state_dict(contents["model_state"])
    run.optimizer.load_state_dict(contents["optimizer_state"])
    run.scheduler.load_state_dict(contents["scheduler_state"])
    restore_rng_states(contents["rng"])
    state = TrainState(**contents["state"])
    state.finished = state.early_stopped or _budget_spent(run.config, state)
    return state


def _budget_spent(config: TrainConfig, state: TrainState) -> bool:
    return state.epoch >= config.max_epochs or (config.max_steps is not None and state.step >= config.max_steps)


def _log_run_start(run: _Run, tracking) -> None:
    tracking.log_params({**run.config.flat(), **{f"data.{key}": value for key, value in run.data_hashes.items()},
                         "data.train_pairs": len(run.train), "data.dev_pairs": len(run.dev),
                         "vocab_size": len(run.vocabulary), "device": str(run.device)})
    tracking.set_tags({"variant": run.config.model.variant, "git_commit": tracking.git_commit(),
                       "spinn.stage": "train"})


# ----------------------------------------------------------------------------- loop


def _loop(run: _Run, state: TrainState, tracking, progress: bool) -> None:
    """Epochs of seeded, length-bucketed batches until a stopping rule fires."""
    config = run.config
    bar = tqdm(total=_planned_steps(run), initial=state.step, disable=not progress, unit="step", dynamic_ncols=True)
    window = _Window()
    try:
        while state.epoch < config.max_epochs:
            order = bucket_batches(run.train, config.batch_size, shuffle=True, seed=config.seed + state.epoch)
            while state.batch_in_epoch < len(order):
                batch = make_batch([run.train[i] for i in order[state.batch_in_epoch]]).to(run.device)
                window.add(_step(run, batch))
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
class _StepResult:
    loss: float
    correct: int
    pairs: int
    seconds: float
    policy: dict[str, float] = field(default_factory=dict)  # rl: reward, baseline, entropy, REDUCE share


def _step(run: _Run, batch: Batch) -> _StepResult:
    """One optimizer step."""
    start = time.perf_counter()
    run.model.train()
    run.optimizer.zero_grad(set_to_none=True)
    with _autocast(run):
        output = run.model(batch)
        loss = spinn_loss(output, batch, run.model.config)
    loss.total.backward()
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.config.clip_norm)
    run.optimizer.step()
    run.scheduler.step()
    policy = {}
    if loss.policy is not None:
        run.model.observe_rewards(loss.policy.rewards)
        policy = {"rl_reward": float(loss.policy.rewards.mean()), "rl_baseline": float(loss.policy.baseline),
                  "policy_entropy": float(loss.policy.entropy.detach()),
                  "reduce_fraction": float(loss.policy.reduce_fraction)}
    correct = int((output.logits.argmax(1) == batch.labels).sum())
    if run.device.type == "cuda":
        torch.cuda.synchronize()
    return _StepResult(float(loss.total.detach()), correct, batch.pairs, time.perf_counter() - start, policy)


def _autocast(run: _Run) -> contextlib.AbstractContextManager:
    if run.device.type == "cuda" and run.config.amp:
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class _Window:
    """Training loss, accuracy and speed since the last log line."""

    loss: float = 0.0
    correct: int = 0
    pairs: int = 0
    seconds: float = 0.0
    steps: int = 0
    policy: dict[str, float] = field(default_factory=dict)

    def add(self, step: _StepResult) -> None:
        self.loss, self.correct, self.pairs = self.loss + step.loss, self.correct + step.correct, self.pairs + step.pairs
        self.seconds, self.steps = self.seconds + step.seconds, self.steps + 1
        for key, value in step.policy.items():
            self.policy[key] = self.policy.get(key, 0.0) + value

    def metrics(self) -> dict[str, float]:
        return {"train_loss": self.loss / self.steps, "train_accuracy": self.correct / self.pairs,
                "pairs_per_second": self.pairs / self.seconds,
                **{key: total / self.steps for key, total in self.policy.items()}}


def _after_step(run: _Run, state: TrainState, window: _Window, tracking, bar) -> bool:
    """Log, evaluate, checkpoint; True when training should stop now."""
    config = run.config
    if state.step % config.log_every == 0 and window.steps:
        metrics = {**window.metrics(), "learning_rate": run.scheduler.get_last_lr()[0]}
        tracking.log_metrics(metrics, state.step)
        bar.set_postfix(loss=f"{metrics['train_loss']:.3f}", acc=f"{metrics['train_accuracy']:.3f}",
                        pairs_s=f"{metrics['pairs_per_second']:.0f}")
        state.train_seconds += window.seconds
        state.train_pairs += window.pairs
        window.__init__()
    if state.step % config.eval_every == 0:
        state.early_stopped = _evaluate_dev(run, state, tracking) >= config.patience
    if state.early_stopped or _budget_spent(config, state):
        state.finished = True
    if state.finished or state.step % config.checkpoint_every == 0:
        _save(run, state, run.output_dir / LAST_CHECKPOINT)
    return state.finished


def _evaluate_dev(run: _Run, state: TrainState, tracking) -> int:
    """Dev accuracy now; keeps best.pt; returns evaluations since the best one (for early stopping)."""
    # rl is scored on the trees it builds itself (greedy): that is how it will be used.
    metrics = score_examples(run.model, run.dev, run.device,
                             predict_transitions=run.model.config.samples_transitions)
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
    save_checkpoint(path, {
        "model_state": run.model.state_dict(),
        "optimizer_state": run.optimizer.state_dict(),
        "scheduler_state": run.scheduler.state_dict(),
        "model_config": run.model.config.to_dict(),
        "train_config": run.config.to_dict(),
        "vocab": run.vocabulary.to_json(),
        "step": state.step,
        "state": asdict(state),
        "rng": rng_states(),
        "data": run.data_hashes,
        "metrics": None if metrics is None else metrics.to_json(),
    })


# ----------------------------------------------------------------------------- finish


def _finish(run: _Run, state: TrainState, tracking, register: bool) -> TrainResult:
    """Make sure the best model is evaluated, then log artifacts and register it (once per best model)."""
    if state.last_eval_step != state.step:
        _evaluate_dev(run, state, tracking)
    best = load_checkpoint(run.output_dir / BEST_CHECKPOINT)
    pairs_per_second = state.train_pairs / state.train_seconds if state.train_seconds else 0.0
    tracking.log_metrics({SELECTION_METRIC: state.best_dev_accuracy, "best_step": state.best_step,
                          "mean_pairs_per_second": pairs_per_second}, state.step)
    report = {"run_id": state.run_id, "steps": state.step, "best_step": state.best_step,
              "best_dev_accuracy": state.best_dev_accuracy, "dev": best["metrics"],
              "train_seconds": state.train_seconds, "pairs_per_second": pairs_per_second,
              "config": run.config.to_dict(), "data": run.data_hashes}
    if register and state.registered_best_step == state.best_step:
        version, promoted = state.model_version, False  # resuming a finished run: this model is registered
    else:
        version, promoted = _publish(run, state, report, tracking, register)
        if version is not None:
            state.model_version, state.registered_best_step = version, state.best_step
    _save(run, state, run.output_dir / LAST_CHECKPOINT)
    return TrainResult(state.run_id, state.step, state.best_step, state.best_dev_accuracy,
                       run.output_dir / BEST_CHECKPOINT, run.output_dir / LAST_CHECKPOINT, version, promoted,
                       state.train_seconds, pairs_per_second, best["metrics"] or {})


def _publish(run: _Run, state: TrainState, report: dict, tracking, register: bool) -> tuple[str | None, bool]:
    """Log the model folder (checkpoint, vocab, config) and the report; register; move the alias if better."""
    from spinn.registry import register_model

    config = run.config
    best = run.output_dir / BEST_CHECKPOINT
    with tempfile.TemporaryDirectory(prefix="spinn-publish-") as folder:
        folder = Path(folder)
        checkpoint = folder / tracking.CHECKPOINT_NAME
        checkpoint.write_bytes(best.read_bytes())
        run.vocabulary.save(folder / VOCAB_FILENAME)
        (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2), encoding="utf-8")
        tracking.log_model_files([checkpoint, folder / VOCAB_FILENAME, folder / "config.json"])
        with atomic_path(run.output_dir / REPORT_NAME) as temporary:
            temporary.write_text(json.dumps(report, indent=2), encoding="utf-8")
        tracking.log_artifact(run.output_dir / REPORT_NAME)
    if not register:
        return None, False
    registration = register_model(state.run_id, best, state.best_dev_accuracy, name=config.registered_model,
                                  alias=config.alias,
                                  description=f"{config.model.variant}, dev accuracy {state.best_dev_accuracy:.4f}")
    return registration.version, registration.promoted


def write_metrics_files(result: TrainResult, metrics_dir: Path) -> tuple[Path, Path, Path]:
    """`train.json` (DVC metrics) and the train / dev curves read back from MLflow (DVC plots).

    The curves come from the run's metric history, where a resumed run's
    repeated steps resolve to their latest value, so they match the MLflow UI.
    """
    from spinn import tracking

    metrics_dir = Path(metrics_dir)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    summary = {"best_dev_accuracy": result.best_dev_accuracy, "best_step": result.best_step, "steps": result.steps,
               "pairs_per_second": result.pairs_per_second, "train_seconds": result.train_seconds}
    paths = (metrics_dir / TRAIN_METRICS_NAME, metrics_dir / TRAIN_CURVE_NAME, metrics_dir / DEV_CURVE_NAME)
    with atomic_path(paths[0]) as temporary:
        temporary.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
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
