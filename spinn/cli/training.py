"""`spinn train | evaluate`: the training and evaluation stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from spinn.cli.common import PATH, config_option, input_file, output_with_suffix
from spinn.evaluation.evaluate import EvaluateSettings
from spinn.options import field_options, given, renamed_option, resolve
from spinn.training.train_config import TrainConfig


@click.command()
@click.option(
    "--train",
    "train_path",
    type=PATH,
    default=Path("data/prepared/train.parquet"),
    show_default=True,
    callback=input_file,
    help="Prepared training split.",
)
@click.option(
    "--dev",
    "dev_path",
    type=PATH,
    default=Path("data/prepared/dev.parquet"),
    show_default=True,
    callback=input_file,
    help="Prepared dev split (periodic evaluation, early stopping, model selection).",
)
@click.option(
    "--vocab", "vocab_path", type=PATH, callback=input_file, help="Vocabulary (default: vocab.json beside --train)."
)
@click.option(
    "--output-dir",
    type=PATH,
    help="Folder for last.pt, best.pt and report.json.  [default: this run's own folder under data/runs]",
)
@renamed_option("--output", "--output-dir", "old_output", type=PATH)
@click.option(
    "--embeddings-dir",
    type=PATH,
    default=Path("data/embeddings"),
    show_default=True,
    help="Cache of aligned word vectors (`spinn embeddings` fills it).",
)
@click.option("--metrics-dir", type=PATH, help="Also write train.json and the train/dev curves (CSV) here, for DVC.")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue from OUTPUT_DIR/last.pt: a killed run in its MLflow run, a finished one in a new, linked run.",
)
@click.option(
    "--overwrite", is_flag=True, help="Replace the run in OUTPUT_DIR (without it, a folder holding one is refused)."
)
@click.option("--run-name", help="MLflow run name.")
@click.option("--no-register", is_flag=True, help="Do not register the model in the MLflow registry.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--report-every",
    type=click.FloatRange(min=1),
    help="Print a progress line every SECONDS instead of a progress bar (for logs: Prefect, CI, torchrun).",
)
@click.option(
    "--config",
    "config_path",
    type=PATH,
    callback=input_file,
    help="params.yaml whose `train` and `embeddings` sections set the run.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any setting by its dotted name, e.g. --set model.d_hidden=100 (repeatable; read as YAML).",
)
@field_options(TrainConfig)
def train(
    train_path: Path,
    dev_path: Path,
    vocab_path: Path | None,
    output_dir: Path | None,
    old_output: Path | None,
    embeddings_dir: Path,
    metrics_dir: Path | None,
    resume: bool,
    overwrite: bool,
    run_name: str | None,
    no_register: bool,
    no_progress: bool,
    report_every: float | None,
    config_path: Path | None,
    overrides: tuple[str, ...],
    **options: Any,
) -> None:
    """Train a SPINN model with MLflow tracking, checkpoints and model registration."""
    from spinn.ground.io import check_outputs
    from spinn.ground.progress import report_interval
    from spinn.ground.settings import set_layer
    from spinn.training.publish import metrics_files, write_metrics_files
    from spinn.training.train import train as train_stage
    from spinn.training.train import training_inputs

    config = resolve(TrainConfig, config_path, set_layer(overrides), given(TrainConfig, options))
    # no bar: nothing (--no-progress), or lines where no terminal shows one (DVC, CI)
    report_every_s = report_every if no_progress else report_interval(report_every)
    if metrics_dir is not None:
        check_outputs(metrics_files(metrics_dir), inputs=training_inputs(train_path, dev_path, vocab_path))
    result = train_stage(
        train_path,
        dev_path,
        config,
        output_dir=output_dir or old_output,
        vocab_path=vocab_path,
        embeddings_dir=embeddings_dir,
        resume=resume,
        overwrite=overwrite,
        run_name=run_name,
        register=not no_register,
        progress=not no_progress and report_every_s is None,
        report_every_s=report_every_s,
    )
    if result is None:  # a rank other than 0 under torchrun: rank 0 reports
        return
    click.echo(
        f"best dev accuracy {result.best_dev_accuracy:.4f} at step {result.best_step} of {result.steps} "
        f"({result.pairs_per_second:.0f} pairs/s over {result.train_seconds:.0f} s of training, "
        f"{result.eval_seconds:.0f} s of dev evaluation; softmax temperature {result.temperature:.4f})"
    )
    click.echo(f"checkpoint {result.best_checkpoint}; MLflow run {result.run_id}")
    if result.model_version is not None:
        promoted = (
            f", now @{config.alias}" if result.promoted else f"; @{config.alias} stays (as good or better on dev)"
        )
        click.echo(f"registered as models:/{config.registered_model}/{result.model_version}{promoted}")
    if metrics_dir is not None:
        click.echo(f"metrics and curves written to {', '.join(map(str, write_metrics_files(result, metrics_dir)))}")


@click.command()
@click.option(
    "--model",
    "model_reference",
    required=True,
    help="Checkpoint path or MLflow model URI (models:/spinn@champion, runs:/ID/model).",
)
@click.option(
    "--data",
    type=PATH,
    required=True,
    callback=input_file,
    help="Prepared split to score (`spinn prepare`'s, or `spinn parse`'s for sentence pairs in any gold scheme).",
)
@click.option(
    "--output", default="metrics.json", show_default=True, callback=output_with_suffix(".json"), help="Metrics JSON."
)
@click.option("--plot", callback=output_with_suffix(".png"), help="Also write the confusion matrix as a PNG here.")
@click.option(
    "--predictions",
    callback=output_with_suffix(".csv"),
    help="Also write actual,predicted per pair as CSV here (DVC's plot).",
)
@click.option(
    "--reliability",
    type=PATH,
    help="Also write the reliability diagram (reliability.png) and its bins before and after the model's "
    "temperature (uncalibrated.csv, calibrated.csv: DVC's plot) into this folder.",
)
@click.option("--vocab", type=PATH, callback=input_file, help="Check the model was trained with this vocabulary.")
@config_option("evaluate")
@field_options(EvaluateSettings)
def evaluate(
    model_reference: str,
    data: Path,
    output: Path,
    plot: Path | None,
    predictions: Path | None,
    reliability: Path | None,
    vocab: Path | None,
    config_path: Path | None,
    **options: Any,
) -> None:
    """Score a trained model on a prepared split in its gold scheme: accuracy, per-class P/R/F1, confusion."""
    from spinn.evaluation.evaluate import evaluate as evaluate_stage
    from spinn.evaluation.evaluate import report_path
    from spinn.ground.progress import report_interval

    settings = resolve(EvaluateSettings, config_path, given(EvaluateSettings, options))
    report_every_s = report_interval(None)
    metrics = evaluate_stage(
        model_reference,
        data,
        output,
        settings,
        plot=plot,
        predictions=predictions,
        reliability=reliability,
        vocab=vocab,
        progress=report_every_s is None,
        report_every_s=report_every_s,
    )
    line = f"accuracy {metrics.accuracy:.4f} on {metrics.examples} pairs (macro F1 {metrics.macro_f1:.4f})"
    line += f" in the {metrics.label_scheme} scheme ({' / '.join(metrics.classes)})"
    if metrics.transition_accuracy is not None:
        line += f", transition accuracy {metrics.transition_accuracy:.4f}"
    if metrics.oov_share is not None:
        line += f"; {metrics.oov_share:.1%} of tokens out of the model's vocabulary"
    click.echo(line)
    click.echo(metrics.calibration.describe())
    written = f"metrics written to {output}, the per-class report to {report_path(output)}"
    written += f", reliability diagram to {reliability}" if reliability else ""
    click.echo(written + (f", confusion matrix to {plot}" if plot else ""))
