"""The training loop: epochs of seeded, length-bucketed batches, logging, dev evaluation, checkpoints.

Plain PyTorch: RMSprop with the paper's step decay, gradient clipping and
periodic dev evaluation with early stopping (spinn.training.train_step runs each
step). Under torchrun every rank runs this loop on its share of each global
batch; rank 0 (`topology.is_main`) alone evaluates, writes checkpoints and
talks to MLflow, and the others meet it at the same points. best.pt gets the
softmax temperature that calibrates its probabilities on dev
(spinn.evaluation.calibration): from the evaluation that made it best, or, when
the model labels on other trees than dev is scored on, from one run at the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from tqdm import tqdm

from spinn.evaluation.calibration import fit_temperature
from spinn.evaluation.evaluate import Scored, predict_examples, transition_source
from spinn.ground.cores import recheck
from spinn.ground.progress import ProgressClock
from spinn.model.batch import bucket_batches
from spinn.model.checkpoint import load_checkpoint, rng_states, save_checkpoint
from spinn.model.config import SPINNConfig, TransitionSource
from spinn.model.loading import load_model
from spinn.tracking import links
from spinn.training import distributed
from spinn.training.build import TrainingRun
from spinn.training.divergence import check_loss, check_weights
from spinn.training.folders import BEST_CHECKPOINT, LAST_CHECKPOINT
from spinn.training.loader import prefetch
from spinn.training.resume import save_run
from spinn.training.state import TrainState, budget_spent

RL_METRICS = ("rl_reward", "rl_baseline", "policy_entropy", "reduce_fraction")
TEMPERATURE_METRIC = "temperature"
"""Logged at the step of each model best.pt keeps: the softmax temperature fitted on its dev logits."""


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
    window = _Window(time.perf_counter(), logged_steps=(state.step, state.step))
    clock = ProgressClock(planned_steps(run), run.report_every_s if run.topology.is_main else None, state.step)
    lines = _Lines(state.step, time.perf_counter(), state.eval_seconds)
    try:
        _epochs(run, state, window, clock, lines, tracking, bar)
        if clock.every_s is not None and clock.reported != state.step:  # logs end where training stopped
            _report(run, state, clock, window, lines)
    finally:
        bar.close()


def _epochs(
    run: TrainingRun, state: TrainState, window: _Window, clock: ProgressClock, lines: _Lines, tracking, bar
) -> None:
    """Epochs until the budget is spent (finished) or a step says stop (max_steps, early stopping)."""
    config = run.config
    while state.epoch < config.max_epochs:
        order = bucket_batches(run.train, config.batch_size, shuffle=True, seed=config.seed + state.epoch)
        for batch in prefetch(run.train, order[state.batch_in_epoch :], run.device, run.topology):
            lines.pairs += len(order[state.batch_in_epoch])  # the global batch, of which each rank trains a share
            run.step(batch, state.step)
            recheck()  # auto threads follow the cores other work leaves free
            state.step += 1
            state.batch_in_epoch += 1
            bar.update()
            stop = _after_step(run, state, window, tracking, bar)
            if clock.due():
                _report(run, state, clock, window, lines)
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
    what that log line said and at which step (progress lines repeat it rather than read the device again)."""

    started: float
    metrics: dict[str, float] | None = None
    logged_steps: tuple[int, int] = (0, 0)
    """The first and last step the metrics cover."""

    def restart(self) -> None:
        self.started = time.perf_counter()


@dataclass
class _Lines:
    """Where the last progress line left off, so the next one gives the speed since then: the step, the wall
    clock, the dev evaluation seconds so far, and the pairs trained since."""

    step: int
    at: float
    eval_seconds: float
    pairs: int = 0

    def speed(self, state: TrainState) -> str:
        """`49 pairs/s (1.52 steps/s) since the last line`, dev evaluation left out; restarts the count."""
        now = time.perf_counter()
        seconds = now - self.at - (state.eval_seconds - self.eval_seconds)
        steps, pairs = state.step - self.step, self.pairs
        self.step, self.at, self.eval_seconds, self.pairs = state.step, now, state.eval_seconds, 0
        if steps <= 0 or seconds <= 0:
            return ""
        return f"{pairs / seconds:,.0f} pairs/s ({steps / seconds:.2f} steps/s) since the last line"


def _after_step(run: TrainingRun, state: TrainState, window: _Window, tracking, bar) -> bool:
    """Log, evaluate, checkpoint; True when training should stop now."""
    config, is_main = run.config, run.topology.is_main
    if state.step % config.log_every == 0 or budget_spent(config, state):
        _log_window(run, state, window, tracking, bar)
    if state.step % config.eval_every == 0 or state.step % config.checkpoint_every == 0 or budget_spent(config, state):
        check_weights(run.model, state.step, run.output_dir)
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
        check_loss(sums["loss"], state.step, run.output_dir)
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
    window.metrics, window.logged_steps = metrics, (window.logged_steps[1] + 1, state.step)
    # the bar's own rate is live; loss and accuracy say the steps they cover, being read once per interval
    bar.set_postfix(loss=f"{metrics['train_loss']:.3f}", acc=f"{metrics['train_accuracy']:.3f}", at=state.step)
    state.train_seconds += seconds
    state.train_pairs += int(sums["pairs"])
    window.restart()


def _report(run: TrainingRun, state: TrainState, clock: ProgressClock, window: _Window, lines: _Lines) -> None:
    print(_progress_line(state, clock, window, lines), flush=True)
    clock.reported = state.step


def _progress_line(state: TrainState, clock: ProgressClock, window: _Window, lines: _Lines) -> str:
    """Where training stands, each part current or saying when it was measured: the step, the speed since
    the last line, the last logged loss and accuracy with the steps they cover (no device read of its own),
    the best dev accuracy and the ETA."""
    parts = [lines.speed(state)]
    if window.metrics is not None:
        first, last = window.logged_steps
        metrics = window.metrics
        parts.append(
            f"loss {metrics['train_loss']:.3f}, accuracy {metrics['train_accuracy']:.3f} over steps {first}-{last}"
        )
    if state.best_step:
        parts.append(f"best dev accuracy {state.best_dev_accuracy:.4f} at step {state.best_step}")
    parts.append(clock.eta(state.step))
    return f"train step {clock.fraction(state.step)}: " + "; ".join(part for part in parts if part)


def evaluate_dev(run: TrainingRun, state: TrainState, tracking) -> int:
    """Dev accuracy now (rank 0); keeps best.pt, with the temperature that calibrates it when these dev logits
    are the ones it labels with (else `calibrate_best` fits it at the end); returns evaluations since the
    best one (for early stopping)."""
    # rl is scored on the trees it builds itself (greedy): that is how it will be used.
    started = time.perf_counter()
    found = predict_examples(
        run.model,
        run.dev,
        run.device,
        source=run.dev_infer.source,
        step=run.dev_infer,
        report_every_s=run.report_every_s,
    )
    metrics = found.metrics()
    state.eval_seconds += time.perf_counter() - started
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
        temperature = None
        if run.dev_infer.source is labelling_source(run.model.config):  # the logits at hand: dev is not run again
            temperature = _fitted(found, state.step, tracking)
        save_run(run, state, run.output_dir / BEST_CHECKPOINT, metrics, temperature)
    else:
        state.evals_since_best += 1
    return state.evals_since_best


def calibrate_best(run: TrainingRun, state: TrainState, tracking) -> None:
    """Give best.pt its temperature if it has none: its model labels on other trees than dev was scored on
    (spinn: scored on the parses, labelling on its own trees), or it predates calibration. Fitted once, at the
    end, on dev run the way the model labels."""
    path = run.output_dir / BEST_CHECKPOINT
    best = load_checkpoint(path)
    if best.temperature is not None:
        return
    started = time.perf_counter()
    loaded = load_model(path, run.device)
    source = labelling_source(loaded.model.config)
    found = predict_examples(loaded.model, run.dev, run.device, source=source, report_every_s=run.report_every_s)
    save_checkpoint(path, replace(best, temperature=_fitted(found, best.step, tracking)))
    state.eval_seconds += time.perf_counter() - started


def labelling_source(config: SPINNConfig) -> TransitionSource:
    """The trees a model labels with by default (`spinn label`, `spinn evaluate`): its probabilities there are
    the ones to calibrate."""
    return transition_source("auto", config)


def _fitted(found: Scored, step: int, tracking) -> float:
    temperature = fit_temperature(found.logits, found.gold)
    tracking.log_metrics({TEMPERATURE_METRIC: temperature}, step)
    return temperature
