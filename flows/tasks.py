"""The pipeline's stages as Prefect tasks: each calls the same `spinn` stage function as the CLI and DVC.

A task adds only what orchestration needs: retries where trying again can
help (downloads), caching keyed on the contents of what the stage reads
(`flows.caching`), and a JSON-serializable result naming the files it wrote.
Results are stored as JSON, never pickled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.client.schemas.objects import TaskRun
from prefect.states import State

from flows.caching import StageOutput, cache_on
from spinn.data.download import DownloadSettings
from spinn.data.embeddings import EmbeddingSettings
from spinn.data.prepare import PrepareSettings
from spinn.data.vocab import VocabSettings
from spinn.evaluation.evaluate import EvaluateSettings
from spinn.ground.progress import REPORT_EVERY_S
from spinn.training.train_config import TrainConfig

DOWNLOAD_RETRIES = 3
DOWNLOAD_RETRY_DELAYS_S = [10, 60, 300]
"""Academic servers drop connections and rate-limit; a retry resumes the `.part` file."""
RESULTS = {"persist_result": True, "result_serializer": "json"}


def retryable(_task: Task, _run: TaskRun, state: State) -> bool:
    """Retry only failures marked retryable (network, 5xx), never a wrong checksum or a 404."""
    error = state.result(raise_on_failure=False)
    return bool(getattr(error, "retryable", False))


def say_how_to_fix(parameter: str) -> Callable[[Task, TaskRun, State], None]:
    """An on_failure hook that logs what would mend the failure in the flow's words (`corpus.download.checksum`,
    `training.resume`), not the CLI's; `parameter` is where the stage's settings sit in the flow's parameters."""

    def hook(_task: Task, _run: TaskRun, state: State) -> None:
        from prefect.logging import get_run_logger

        from spinn.ground.errors import advice

        fix = advice(state.result(raise_on_failure=False), lambda setting: f"{parameter}.{setting}")
        if fix:
            get_run_logger().error(f"to fix it: {fix}")

    return hook


@task(
    name="download",
    task_run_name="download",
    retries=DOWNLOAD_RETRIES,
    retry_delay_seconds=DOWNLOAD_RETRY_DELAYS_S,
    retry_condition_fn=retryable,
    cache_key_fn=cache_on("settings.file"),
    on_failure=[say_how_to_fix("corpus.download")],
    **RESULTS,
)
def download_stage(raw_dir: Path, settings: DownloadSettings) -> StageOutput:
    from spinn.data.download import download

    result = download(raw_dir, settings, extract=False, progress=False)
    return StageOutput.of({"archive": str(result.archive), "fetched": result.fetched}, result.archive)


@task(name="prepare", task_run_name="prepare-{split}", cache_key_fn=cache_on("archive"), **RESULTS)
def prepare_stage(archive: Path, member: str, split: str, output_dir: Path, settings: PrepareSettings) -> StageOutput:
    from spinn.data.prepare import prepare

    summary = prepare(archive, output_dir, settings, split=split, member=member)
    counts = {
        "read": summary.read,
        "written": summary.written,
        "skipped": summary.skipped,
        "rejected": summary.rejected_total,
        "reasons": dict(summary.rejected),
    }
    return StageOutput.of(counts, summary.output, summary.rejects)


@task(name="vocab", task_run_name="vocab", cache_key_fn=cache_on("train"), **RESULTS)
def vocab_stage(train: Path, output: Path, settings: VocabSettings) -> StageOutput:
    from spinn.data.vocab import vocab_stage as build

    vocabulary, path = build(train, output, settings)
    return StageOutput.of({"entries": len(vocabulary)}, path)


@task(name="embeddings", task_run_name="embeddings", cache_key_fn=cache_on("vocab"), **RESULTS)
def embeddings_stage(vocab: Path, settings: EmbeddingSettings, cache_dir: Path) -> StageOutput:
    from spinn.data.embeddings import embeddings_stage as align

    report = align(vocab, settings, cache_dir=cache_dir, progress=False)
    summary = {
        "source": report.source,
        "dim": report.dim,
        "found": report.found,
        "oov": report.oov,
        "coverage": report.coverage,
    }
    return StageOutput.of(summary, report.cache_path)


@task(
    name="train",
    task_run_name="train",
    cache_key_fn=cache_on("train", "dev", "vocab"),
    log_prints=True,
    on_failure=[say_how_to_fix("training")],
    **RESULTS,
)
def train_stage(
    train: Path,
    dev: Path,
    vocab: Path,
    config: TrainConfig,
    embeddings_dir: Path,
    output_dir: Path,
    metrics_dir: Path,
    resume: bool,
    overwrite: bool,
    run_name: str | None,
) -> StageOutput:
    """Train without registering: the flow registers after evaluation, as its own step."""
    from spinn.training.publish import write_metrics_files
    from spinn.training.train import train as fit

    result = fit(
        train,
        dev,
        config,
        output_dir=output_dir,
        vocab_path=vocab,
        embeddings_dir=embeddings_dir,
        resume=resume,
        overwrite=overwrite,
        run_name=run_name,
        register=False,
        progress=False,
        report_every_s=REPORT_EVERY_S,
    )
    metrics_files = write_metrics_files(result, metrics_dir)
    summary = {
        "run_id": result.run_id,
        "steps": result.steps,
        "best_step": result.best_step,
        "best_dev_accuracy": result.best_dev_accuracy,
        "pairs_per_second": result.pairs_per_second,
        "train_seconds": result.train_seconds,
        "eval_seconds": result.eval_seconds,
        "checkpoint": str(result.best_checkpoint),
    }
    return StageOutput.of(summary, result.best_checkpoint, *metrics_files)


@task(name="evaluate", task_run_name="evaluate", cache_key_fn=cache_on("model", "data"), log_prints=True, **RESULTS)
def evaluate_stage(
    model: str, data: Path, output: Path, plot: Path, predictions: Path, reliability: Path, settings: EvaluateSettings
) -> StageOutput:
    """`reliability`: the folder of the reliability diagram and its bins (spinn.evaluation.calibration)."""
    from spinn.evaluation.calibration import reliability_files
    from spinn.evaluation.evaluate import evaluate, report_path

    metrics = evaluate(
        model,
        data,
        output,
        settings,
        plot=plot,
        predictions=predictions,
        reliability=reliability,
        report_every_s=REPORT_EVERY_S,
    )
    written = (output, report_path(output), plot, predictions, *reliability_files(reliability).values())
    return StageOutput.of({**metrics.summary(), "label_scheme": metrics.label_scheme}, *written)


@task(name="register", task_run_name="register")
def register_stage(
    run_id: str, checkpoint: Path, dev_accuracy: float, variant: str, name: str, alias: str, tags: dict[str, str]
) -> dict[str, Any]:
    """Not cached: the registry is the state, and `register_model` already finds a version it made.
    The description is the one `spinn train` gives, so a version reads the same whichever path made it."""
    from spinn.tracking.register import register_model, version_description

    description = version_description(variant, dev_accuracy)
    registration = register_model(
        run_id, checkpoint, dev_accuracy, name=name, alias=alias, description=description, tags=tags
    )
    return {**asdict(registration), "uri": registration.uri}
