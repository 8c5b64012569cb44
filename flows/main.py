"""`spinn-pipeline`: the main job in one command, on embedded defaults.

With no Prefect server configured (no PREFECT_API_URL), running the flow
starts Prefect's temporary local server for the duration of the run; MLflow
writes to `sqlite:///mlflow.db` in the working directory; data goes under
`data/`. `--smoke` runs the same flow on a small synthetic corpus generated
here (spinn.data.smoke), with a small model, in its own folder, experiment and
registered model, so a demo never touches the real champion.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

import click

from spinn.cli.common import SharedEntry
from spinn.data.download import DOWNLOAD_VARIABLES, DownloadSettings
from spinn.ground.settings import DEFAULT_PARAMS, Layer, deep_merge, describe, nest, set_layer
from spinn.options import field_options, given

EPHEMERAL_STARTUP_TIMEOUT_S = "120"
"""Prefect's temporary server takes 10-20 s to start on two cores; its 20 s default is too tight."""
QUIET_AND_OFFLINE = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": EPHEMERAL_STARTUP_TIMEOUT_S,
}
SMOKE_DATA_DIR = Path("data/smoke")
SMOKE_ARCHIVE = "snli_smoke.zip"
SMOKE_OVERRIDES: dict[str, object] = {
    "model.variant": "spinn",
    "model.d_hidden": 48,
    "model.d_tracker": 16,
    "model.mlp_dim": 64,
    "batch_size": 32,
    "max_epochs": 8,
    "max_steps": 320,
    "threads": 1,
    "eval_every": 40,
    "log_every": 10,
    "checkpoint_every": 40,
    "patience": 100,
    "learning_rate": 0.005,
    "experiment": "spinn-smoke",
    "registered_model": "spinn-smoke",
}
"""Small enough that the whole run takes about a CPU-minute (one torch thread: tiny models run fastest on
one, and two threads on two shared cores wait on each other), big enough to beat chance clearly."""


class _PipelineCommand(SharedEntry, click.Command):
    """`spinn-pipeline` enters as every `spinn` command does (spinn.cli.common.SharedEntry)."""


@click.command(cls=_PipelineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--smoke", is_flag=True, help="Run on a small synthetic corpus with a small model (a demo, or CI).")
@field_options(DownloadSettings)
@click.option("--data-dir", type=click.Path(path_type=Path), help="Data folder (default: data, or data/smoke).")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=DEFAULT_PARAMS,
    show_default=True,
    help="params.yaml whose sections set every stage (used when the file exists).",
)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a train setting (repeatable).")
@click.option(
    "--resume", is_flag=True, help="Continue a killed training run from last.pt in its own folder under data/runs/."
)
@click.option(
    "--overwrite", is_flag=True, help="Train again into the run's folder under data/runs/, replacing what is there."
)
@click.option("--debug", is_flag=True, help="Show Prefect's failure logs and the traceback of an error.")
def main(
    smoke: bool,
    debug: bool,
    data_dir: Path | None,
    config_path: Path,
    overrides: tuple[str, ...],
    resume: bool,
    overwrite: bool,
    **options: object,
) -> None:
    """Download, prepare, train, evaluate and register SPINN as one Prefect flow run."""
    for name, value in QUIET_AND_OFFLINE.items():
        os.environ.setdefault(name, value)
    data_dir = data_dir or (SMOKE_DATA_DIR if smoke else Path("data"))
    download = given(DownloadSettings, options)
    if smoke and not {"url", "file"} & set(download):  # the synthetic corpus, whatever SPINN_DOWNLOAD_* say
        for variable in DOWNLOAD_VARIABLES.values():
            os.environ.pop(variable, None)
        download["file"], download["checksum"] = _smoke_archive(data_dir)
    params = config_path if config_path.is_file() else None
    try:
        training = [*([Layer(nest(SMOKE_OVERRIDES.items()), _smoke_key)] if smoke else []), set_layer(overrides)]
        requests = _requests(params, data_dir, download, training, resume=resume, overwrite=overwrite)
    except Exception as error:
        _fail(error, debug)
    _run(*requests, debug)


def _requests(params: Path | None, data_dir: Path, download: dict, training: list[Layer], **run: bool):
    """The flow's two requests. Their settings are resolved first as `spinn train` resolves its own, so a
    mistake is one line naming where it was written (params.yaml and its key, `--set KEY`, the option) in
    the words every command uses; the requests resolve the same settings again as the flow's parameters."""
    from pydantic import ValidationError

    from flows.flow_requests import CorpusRequest, TrainRequest
    from spinn.data.embeddings import EmbeddingSettings
    from spinn.data.prepare import PrepareSettings
    from spinn.data.vocab import VocabSettings
    from spinn.ground.errors import SpinnError
    from spinn.options import resolve
    from spinn.training.train_config import TrainConfig

    resolve(DownloadSettings, params, download)
    for stage in (PrepareSettings, VocabSettings, EmbeddingSettings):
        resolve(stage, params)
    resolve(TrainConfig, params, *training)
    settings: dict[str, object] = {}
    for layer in training:
        settings = deep_merge(settings, layer.values)
    try:
        return (
            CorpusRequest(params=params, data_dir=data_dir, download=download),
            TrainRequest(params=params, settings=settings, **run),
        )
    except ValidationError as error:  # what only a request checks (credentials in a URL): said the same way
        raise SpinnError("; ".join(problem.message for problem in describe(error))) from None


def _smoke_key(key: str) -> str:
    return f"--smoke's {key}"


def _fail(error: BaseException, debug: bool) -> NoReturn:
    """The one `error: ...` line and exit status 1 by the rule every `spinn` command follows
    (spinn.ground.errors.failure_line: a SpinnError, a full disk, a tracking server that did not answer); anything
    else, or any failure with `--debug`, raises with its traceback."""
    from spinn.cli import EXIT_USER_ERROR
    from spinn.ground.errors import failure_line, option_name

    line = failure_line(error, option_name)
    if debug or line is None:
        raise error
    click.echo(f"error: {line}", err=True)
    sys.exit(EXIT_USER_ERROR)


def _run(corpus, training, debug: bool) -> None:
    from flows.artifacts import describe_registration
    from flows.train_spinn import train_spinn
    from spinn.tracking.links import ui_hint

    if not debug:
        _quiet_failures()
    try:
        result = train_spinn(corpus, training)
    except Exception as error:
        _fail(error, debug)
    click.echo(f"MLflow run {result.run_id} (experiment {result.experiment_id}) in {result.tracking_uri}")
    click.echo(f"  {ui_hint(result.experiment_id, result.run_id)}")
    click.echo(
        f"dev accuracy {result.best_dev_accuracy:.4f}; test accuracy {result.test_metrics['accuracy']:.4f} "
        f"(metrics: {result.metrics_file})"
    )
    click.echo(f"model checkpoint {result.checkpoint}")
    if result.registered:
        click.echo(f"registered as {describe_registration(result.registered)}")


class _NoFailureRecords(logging.Filter):
    """Keep Prefect's progress on the console, drop its records of a failure (a page of tracebacks, the
    failed states, the failure hooks): the one `error: ...` line says what failed. `--debug` keeps them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("prefect"):
            return True
        message = record.getMessage()
        return record.levelno < logging.ERROR and "Failed(" not in message and "hook" not in message.lower()


def _quiet_failures() -> None:
    """Filter the console handler Prefect puts on the root logger (the flow runs' logs reach it there)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler):
            handler.addFilter(_NoFailureRecords())


def _smoke_archive(data_dir: Path) -> tuple[Path, str]:
    """Generate the synthetic corpus (deterministic bytes) and return it with its checksum."""
    from spinn.data.smoke import write_smoke_corpus
    from spinn.ground.io import file_digest

    archive = write_smoke_corpus(data_dir / "source" / SMOKE_ARCHIVE)
    return archive, f"sha256:{file_digest(archive, 'sha256')}"


if __name__ == "__main__":
    main()
