"""What a training run publishes: its MLflow params and datasets, the best model's files and report,
the registered version, and the DVC metrics and curves.

Rank 0 alone publishes; MLflow is reached through spinn.tracking.store, passed
in as `tracking`, or imported here only when the metrics files are written.
"""

from __future__ import annotations

import csv
import json
import secrets
import tempfile
import time
from pathlib import Path

from spinn.data.vocab import VOCAB_FILENAME
from spinn.evaluation.metrics import Metrics, plot_confusion
from spinn.ground.io import atomic_path, publishing, write_json
from spinn.model.checkpoint import load_checkpoint
from spinn.model.parser_choice import needs_parser
from spinn.tracking.register import SELECTION_METRIC
from spinn.training import continuation, distributed
from spinn.training.build import TrainingRun
from spinn.training.folders import BEST_CHECKPOINT, LAST_CHECKPOINT, REPORT_NAME
from spinn.training.loop import calibrate_best, evaluate_dev
from spinn.training.resume import save_run
from spinn.training.state import TrainResult, TrainState
from spinn.training.train_config import TrainConfig

TRAIN_METRICS_NAME = "train.json"
TRAIN_CURVE_NAME = "train_curve.csv"
DEV_CURVE_NAME = "dev_curve.csv"
TRAIN_CURVE_KEYS = ["train_loss", "train_accuracy"]
DEV_CURVE_KEYS = ["dev_accuracy", "dev_transition_accuracy", "dev_bracket_f1"]
DEV_ARTIFACT_DIR = "dev"
"""Where the run's artifacts keep the best model's dev scores and confusion matrix."""


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
    """`spinn-300d snli_1.0_train 2026-11-23T16:20 3f2a`: the variant and its size, the data (`smoke train`
    for the synthetic smoke corpus), the start time and four hex digits from the OS (never the seeded
    generator, which made every MLflow name the same), so runs differ in MLflow's table and compare view,
    even two started in the same minute."""
    started = time.strftime("%Y-%m-%dT%H:%M")
    model = f"{config.model.variant}-{config.model.d_hidden}d"
    return f"{model} {_data_label(Path(train_path))} {started} {secrets.token_hex(2)}"


def _data_label(path: Path) -> str:
    """`smoke <split>` for a split of the smoke corpus, which is laid out as SNLI (its file names say
    snli_1.0_train) and only its pair ids tell; else `data_name`."""
    import pyarrow.parquet as pq

    from spinn.data.smoke import SMOKE_ID_PREFIX

    try:
        first = pq.ParquetFile(path).read_row_group(0, columns=["pair_id"]).column(0)[0].as_py()
    except (OSError, ValueError, KeyError, IndexError):  # not a prepared split, or an empty one
        first = ""
    return f"smoke {path.stem}" if str(first).startswith(SMOKE_ID_PREFIX) else data_name(path)


def log_run_start(run: TrainingRun, tracking) -> None:
    """Once, when a run starts: every setting and the data digests as params, tags, and the datasets."""
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


def finish(run: TrainingRun, state: TrainState, tracking, register: bool) -> TrainResult:
    """Make sure the best model is evaluated, then log artifacts and register it (once per best model)."""
    if state.last_eval_step != state.step:
        evaluate_dev(run, state, tracking)
    calibrate_best(run, state, tracking)
    best = load_checkpoint(run.output_dir / BEST_CHECKPOINT)
    pairs_per_second = _pairs_per_second(state)
    tracking.log_metrics({SELECTION_METRIC: state.best_dev_accuracy}, state.step)  # what registration compares
    tracking.set_tags(  # one value per run, read in the run's overview and table, not drawn as one-point charts
        {
            "best_step": str(state.best_step),
            "steps": str(state.step),
            "mean_pairs_per_second": f"{pairs_per_second:.1f}",
            "train_seconds": f"{state.train_seconds:.1f}",
            "eval_seconds": f"{state.eval_seconds:.1f}",
            "temperature": f"{best.softmax_temperature:.4f}",
        }
    )
    report = {
        "run_id": state.run_id,
        "steps": state.step,
        "best_step": state.best_step,
        "best_dev_accuracy": state.best_dev_accuracy,
        "temperature": best.softmax_temperature,
        "dev": best.metrics,
        "train_seconds": state.train_seconds,
        "eval_seconds": state.eval_seconds,
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
    save_run(run, state, run.output_dir / LAST_CHECKPOINT)
    return _result(run, state, version, promoted)


def nothing_to_publish(run: TrainingRun, state: TrainState, register: bool) -> bool:
    """Whether `finish` would add nothing: the run trained to its end, was scored at its last step, best.pt
    has its temperature, and its model is registered (when asked to be). Such a run, finished in MLflow, is
    the result as its folder holds it (spinn.training.continuation)."""
    calibrated = load_checkpoint(run.output_dir / BEST_CHECKPOINT).temperature is not None
    registered = not register or state.registered_best_step == state.best_step
    return state.finished and state.last_eval_step == state.step and calibrated and registered


def reused_result(run: TrainingRun, state: TrainState) -> TrainResult:
    """The result of a finished run that has nothing to publish, read from its folder alone."""
    return _result(run, state, state.model_version, promoted=False)


def _result(run: TrainingRun, state: TrainState, version: str | None, promoted: bool) -> TrainResult:
    best = load_checkpoint(run.output_dir / BEST_CHECKPOINT)
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
        _pairs_per_second(state),
        best.metrics or {},
        best.softmax_temperature,
        state.eval_seconds,
    )


def _pairs_per_second(state: TrainState) -> float:
    return state.train_pairs / state.train_seconds if state.train_seconds else 0.0


def _publish(run: TrainingRun, state: TrainState, report: dict, tracking, register: bool) -> tuple[str | None, bool]:
    """Log the model (an MLflow logged model of checkpoint, vocab, config) and the report; register; move the
    alias if better."""
    from spinn.tracking.register import log_model, register_model, version_description

    config = run.config
    best = run.output_dir / BEST_CHECKPOINT
    with tempfile.TemporaryDirectory(prefix="spinn-publish-") as folder:
        folder = Path(folder)
        checkpoint = folder / tracking.CHECKPOINT_NAME
        checkpoint.write_bytes(best.read_bytes())
        run.vocabulary.save(folder / VOCAB_FILENAME)
        (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2), encoding="utf-8")
        files = (checkpoint, folder / VOCAB_FILENAME, folder / "config.json")
        log_model(state.run_id, *files, report["dev"], needs_parser=needs_parser(config.model), step=state.best_step)
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
    return [scores, plot_confusion(Metrics.from_json(report["dev"]), folder / "confusion.png", title=title)]


def write_metrics_files(result: TrainResult, metrics_dir: Path) -> tuple[Path, Path, Path]:
    """`train.json` (DVC metrics) and the train / dev curves read back from MLflow (DVC plots).

    The curves come from the run's metric history, where a resumed run's
    repeated steps resolve to their latest value, so they match the MLflow UI;
    a run that continues a finished one starts with that run's history.
    """
    from spinn.tracking import store as tracking

    metrics_dir = Path(metrics_dir)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    summary = {  # what selects a model; speed is machine-dependent and lives in the MLflow run
        "best_dev_accuracy": result.best_dev_accuracy,
        "best_step": result.best_step,
        "steps": result.steps,
        "temperature": result.temperature,
    }
    paths = metrics_files(metrics_dir)
    with publishing(paths):
        write_json(paths[0], summary)
        history = continuation.history(result.run_id, [*TRAIN_CURVE_KEYS, *DEV_CURVE_KEYS], tracking)
        _write_curve(paths[1], TRAIN_CURVE_KEYS, history)
        _write_curve(paths[2], [key for key in DEV_CURVE_KEYS if history[key]], history)
    return paths


def metrics_files(metrics_dir: Path) -> tuple[Path, Path, Path]:
    """What `write_metrics_files` writes: known before training, so a clash with an input is refused first."""
    return tuple(Path(metrics_dir) / name for name in (TRAIN_METRICS_NAME, TRAIN_CURVE_NAME, DEV_CURVE_NAME))


def _write_curve(path: Path, keys: list[str], history: dict[str, dict[int, float]]) -> None:
    steps = sorted(set().union(*(history[key] for key in keys)))
    with atomic_path(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", *keys])
        writer.writerows([step, *(history[key].get(step, "") for key in keys)] for step in steps)
