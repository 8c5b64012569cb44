"""The training loop: epochs of seeded, length-bucketed batches, logging, dev evaluation, checkpoints.

Plain PyTorch: RMSprop with the paper's step decay, gradient clipping and
periodic dev evaluation with early stopping (spinn.training.step runs each
step). Under torchrun every rank runs this loop on its share of each global
batch; rank 0 (`topology.is_main`) alone evaluates, writes checkpoints and
talks to MLflow, and the others meet it at the same points.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tqdm import tqdm

from spinn.cores import recheck
from spinn.model.batch import bucket_batches
from spinn.model.checkpoint import rng_states
from spinn.tracking import links
from spinn.training import distributed
from spinn.training.build import TrainingRun
from spinn.training.checkpoints import save_run
from spinn.training.divergence import check_loss, check_weights
from spinn.training.evaluate import score_examples
from spinn.training.folders import BEST_CHECKPOINT, LAST_CHECKPOINT
from spinn.training.loader import prefetch
from spinn.training.progress import ProgressClock
from spinn.training.state import TrainState, budget_spent

RL_METRICS = ("rl_reward", "rl_baseline", "policy_entropy", "reduce_fraction")


def loop(run: TrainingRun, state: TrainState, tracking, progress: bool) -> None:
    """Epochs of seeded, length-bucketed batches until a stopping rule fires.

    Batches are made (their step plans too) and moved to the device by a loader
    thread one step ahead of the model; the step never waits for the device, and
    the loop reads the accumulated metrics once per log interval. `tracking`
    (spinn.tracking.store) is used on rank 0 only."""
    bar = tqdm(
        total=planned_steps(run),
        initial=state.step,
        disable=not progress or not run.topology.is_main,
        unit="step",
        dynamic_ncols=True,
    )
    window = _Window(time.perf_counter())
    clock = ProgressClock(planned_steps(run), run.report_every_s if run.topology.is_main else None, state.step)
    try:
        _epochs(run, state, window, clock, tracking, bar)
        if clock.every_s is not None and clock.reported != state.step:  # logs end where training stopped
            _report(run, state, clock, window)
    finally:
        bar.close()


def _epochs(run: TrainingRun, state: TrainState, window: _Window, clock: ProgressClock, tracking, bar) -> None:
    """Epochs until the budget is spent (finished) or a step says stop (max_steps, early stopping)."""
    config = run.config
    while state.epoch < config.max_epochs:
        order = bucket_batches(run.train, config.batch_size, shuffle=True, seed=config.seed + state.epoch)
        for batch in prefetch(run.train, order[state.batch_in_epoch :], run.device, run.topology):
            run.step(batch, state.step)
            recheck()  # auto threads follow the cores other work leaves free
            state.step += 1
            state.batch_in_epoch += 1
            bar.update()
            stop = _after_step(run, state, window, tracking, bar)
            if clock.due():
                _report(run, state, clock, window)
            if stop:
                return
        state.epoch += 1
        state.batch_in_epoch = 0
    state.finished = True


def planned_steps(run: TrainingRun) -> int:
    per_epoch = -(-len(run.train) // run.config.batch_size)
    planned = per_epoch * run.config.max_epochs
    return min(planned, run.config.max_steps) if run.config.max_steps else planned


@dataclass
class _Window:
    """When the time since the last log line began (wall clock, evaluation and checkpoints excluded), and
    what that log line said (progress lines repeat it rather than read the device again)."""

    started: float
    metrics: dict[str, float] | None = None

    def restart(self) -> None:
        self.started = time.perf_counter()


def _after_step(run: TrainingRun, state: TrainState, window: _Window, tracking, bar) -> bool:
    """Log, evaluate, checkpoint; True when training should stop now."""
    config, is_main = run.config, run.topology.is_main
    if state.step % config.log_every == 0 or budget_spent(config, state):
        _log_window(run, state, window, tracking, bar)
    if state.step % config.eval_every == 0 or state.step % config.checkpoint_every == 0 or budget_spent(config, state):
        check_weights(run.model, state.step)
    if state.step % config.eval_every == 0:
        stop = evaluate_dev(run, state, tracking) >= config.patience if is_main else None
        state.early_stopped = distributed.broadcast(stop, run.topology)  # rank 0 decides, every rank stops
    if state.early_stopped or budget_spent(config, state):
        state.finished = True
    if state.finished or state.step % config.checkpoint_every == 0:
        run.rng_ranks = distributed.gathered(rng_states(), run.topology)
        if is_main:
            save_run(run, state, run.output_dir / LAST_CHECKPOINT)
    if state.step % config.eval_every == 0 or state.step % config.checkpoint_every == 0:
        window.restart()  # speed counts training only
    return state.finished


def _log_window(run: TrainingRun, state: TrainState, window: _Window, tracking, bar) -> None:
    """Read the device accumulators (the loop's one host sync per interval, summed over the ranks: every rank
    reads) and log them (rank 0)."""
    sums = run.step.metrics.read()
    if sums["steps"]:
        check_loss(sums["loss"], state.step)
    if not sums["steps"] or not run.topology.is_main:
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
        metrics.update({name: sums[name] for name in RL_METRICS})
    tracking.log_metrics(metrics, state.step)
    window.metrics = metrics
    bar.set_postfix(
        loss=f"{metrics['train_loss']:.3f}",
        acc=f"{metrics['train_accuracy']:.3f}",
        pairs_s=f"{metrics['pairs_per_second']:.0f}",
    )
    state.train_seconds += seconds
    state.train_pairs += int(sums["pairs"])
    window.restart()


def _report(run: TrainingRun, state: TrainState, clock: ProgressClock, window: _Window) -> None:
    print(_progress_line(run, state, clock, window), flush=True)
    clock.reported = state.step


def _progress_line(run: TrainingRun, state: TrainState, clock: ProgressClock, window: _Window) -> str:
    """Where training stands: the step, the last logged metrics (no device read of its own) and the ETA."""
    line = f"train step {clock.fraction(state.step)}"
    if window.metrics is not None:
        metrics = window.metrics
        line += (
            f": loss {metrics['train_loss']:.3f}, accuracy {metrics['train_accuracy']:.3f}, "
            f"{metrics['pairs_per_second']:,.0f} pairs/s"
        )
    if state.best_step:
        line += f"; best dev accuracy {state.best_dev_accuracy:.4f} at step {state.best_step}"
    return f"{line}; {clock.eta(state.step)}"


def evaluate_dev(run: TrainingRun, state: TrainState, tracking) -> int:
    """Dev accuracy now (rank 0); keeps best.pt; returns evaluations since the best one (for early stopping)."""
    # rl is scored on the trees it builds itself (greedy): that is how it will be used.
    metrics = score_examples(
        run.model,
        run.dev,
        run.device,
        source=run.dev_infer.source,
        step=run.dev_infer,
        report_every_s=run.report_every_s,
    )
    state.last_eval_step = state.step
    logged = {"dev_accuracy": metrics.accuracy}
    if metrics.transition_accuracy is not None:
        logged["dev_transition_accuracy"] = metrics.transition_accuracy
    if metrics.bracket_f1 is not None:
        logged["dev_bracket_f1"] = metrics.bracket_f1
    logged.update(links.share_metrics(metrics.predicted_shares, "dev_"))  # what labelling runs measure drift against
    tracking.log_metrics(logged, state.step)
    if metrics.accuracy > state.best_dev_accuracy:
        state.best_dev_accuracy, state.best_step, state.evals_since_best = metrics.accuracy, state.step, 0
        save_run(run, state, run.output_dir / BEST_CHECKPOINT, metrics)
    else:
        state.evals_since_best += 1
    return state.evals_since_best
