"""The evaluate stage: a trained model + a prepared split -> metrics JSON, a confusion plot, a reliability diagram.

The model is a checkpoint file or an MLflow URI (`models:/spinn@champion`,
`runs:/<id>/model`); either way it is read with weights_only, rebuilt from its
own config and vocabulary, and run by the one inference loop that labelling
uses too (spinn/inference/predict.py), so the same inputs always give the
same numbers. The split is encoded with the model's vocabulary; the metrics
report the share of its tokens outside it, with a warning when that is most
of them. The probabilities are the model's own (its softmax temperature
applied), and the metrics give their expected calibration error before and
after that temperature (spinn.evaluation.calibration). Every figure is in the
split's own gold scheme (spinn.evaluation.scheme_scores: a two-way corpus's
entailment / not_entailment; the identity for three-way splits).
`predict_examples` is also what training calls for its periodic dev
evaluation.
"""

from __future__ import annotations

import csv
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import numpy
import torch
from pydantic import AfterValidator, Field
from tqdm import tqdm

from spinn.data.example import Example
from spinn.data.label_schemes import THREE_WAY, checked_scheme
from spinn.data.pairs import encode_pairs, read_raw_pairs
from spinn.data.split_files import with_partner
from spinn.data.vocab import Vocabulary, unknown_count, warn_if_mostly_unknown
from spinn.evaluation.calibration import RELIABILITY_DIR, Calibration, reliability_files, write_reliability
from spinn.evaluation.metrics import Metrics, plot_confusion, score
from spinn.evaluation.scheme_scores import Judged, read_gold_split
from spinn.ground.cores import torch_threads
from spinn.ground.errors import SpinnError, SpinnWarning
from spinn.ground.io import atomic_path, publishing, write_json
from spinn.ground.progress import ProgressClock
from spinn.ground.settings import AUTO, Device, Settings, ThreadCount
from spinn.inference.infer_step import InferStep
from spinn.inference.predict import Predictions, predict
from spinn.model.checkpoint import Checkpoint, check_vocabulary
from spinn.model.config import SPINNConfig, TransitionSource
from spinn.model.loading import load_model, resolve_device
from spinn.model.parser_choice import auto_source
from spinn.model.spinn import SPINN
from spinn.trees.transitions import bracket_counts

EVAL_BATCH_SIZE = 256
LABEL_SCHEME_TAG = "label_scheme"
"""`<split>_label_scheme`: the tag that names the gold scheme a split's scores on a run are in."""


@dataclass(frozen=True)
class Scored:
    """Gold and predicted class indices of labelled examples, in input order, the tree scores, and the
    classifier's logits with the temperature the probabilities were given at."""

    gold: numpy.ndarray  # (N,) int64
    predicted: numpy.ndarray  # (N,) int64
    transition_accuracy: float | None
    logits: numpy.ndarray  # (N, C) float32
    temperature: float = 1.0
    bracket_f1: float | None = None

    def metrics(self) -> Metrics:
        return score(self.gold, self.predicted, self.transition_accuracy, self.bracket_f1)

    def calibration(self) -> Calibration:
        """Expected calibration error and reliability bins before (T = 1) and after the temperature."""
        return Calibration.of(self.logits, self.gold, self.temperature)


def predict_examples(
    model: SPINN,
    examples: Sequence[Example],
    device: torch.device,
    *,
    source: TransitionSource = TransitionSource.GOLD,
    batch_size: int = EVAL_BATCH_SIZE,
    step: InferStep | None = None,
    progress: bool = False,
    report_every_s: float | None = None,
    temperature: float = 1.0,
) -> Scored:
    """Run `model` over labelled examples (the one inference loop, `predict`) and score every prediction.

    A caller that scores often (training's dev evaluation) passes its own InferStep, so its CUDA graphs
    are kept. Bracket F1 compares the trees the tracker built (greedy) with the examples' own parses.
    `report_every_s`: also print a progress line with an ETA that often (logs, where no bar shows).
    `temperature`: the model's (`Checkpoint.softmax_temperature`); the labels do not depend on it."""
    found, bracket_f1 = run_examples(
        model,
        examples,
        device,
        source=source,
        batch_size=batch_size,
        step=step,
        progress=progress,
        report_every_s=report_every_s,
        temperature=temperature,
    )
    gold = numpy.array([example.label for example in examples], dtype=numpy.int64)  # (N,)
    return Scored(gold, found.labels, found.transition_accuracy, found.logits, found.temperature, bracket_f1)


def run_examples(
    model: SPINN,
    examples: Sequence[Example],
    device: torch.device,
    *,
    source: TransitionSource,
    batch_size: int = EVAL_BATCH_SIZE,
    step: InferStep | None = None,
    progress: bool = False,
    report_every_s: float | None = None,
    temperature: float = 1.0,
) -> tuple[Predictions, float | None]:
    """`predict` over examples, labelled or not, with a bar or progress lines; and the bracket F1 of the trees
    the tracker built (greedy; else None)."""
    bar = tqdm(total=len(examples), disable=not progress, unit="pair", desc="evaluate", dynamic_ncols=True)
    with bar:
        on_batch = _reporting(bar, ProgressClock(len(examples), report_every_s))
        found = predict(
            model, examples, device, batch_size, source, step=step, on_batch=on_batch, temperature=temperature
        )
    return found, _bracket_f1(found, examples) if source is TransitionSource.GREEDY else None


def _reporting(bar: tqdm, clock: ProgressClock) -> Callable[[int], None]:
    """A per-batch callback that moves the bar and prints a timed progress line when one is due."""
    done = 0

    def on_batch(pairs: int) -> None:
        nonlocal done
        done += pairs
        bar.update(pairs)
        if clock.due():
            print(f"evaluate {clock.fraction(done)} pairs; {clock.eta(done)}", flush=True)

    return on_batch


def _bracket_f1(found: Predictions, examples: Sequence[Example]) -> float | None:
    """F1 of the spans of the trees that ran against the parses of the sentences that have one."""
    counts = numpy.zeros(3, dtype=numpy.int64)  # (matched, predicted, gold) spans
    for example, premise, hypothesis in zip(
        examples, found.premise_transitions, found.hypothesis_transitions, strict=True
    ):
        for ran, parse in ((premise, example.premise_transitions), (hypothesis, example.hypothesis_transitions)):
            if parse:  # tokens-only sentences have no tree to compare with
                counts += bracket_counts(list(ran), list(parse))
    return float(2 * counts[0] / (counts[1] + counts[2])) if counts[1:].sum() else None


def read_examples(path: Path, vocabulary: Vocabulary) -> list[Example]:
    """Labelled examples of a prepared split, encoded with the model's vocabulary."""
    pairs = [pair for pair in read_raw_pairs(path) if pair.label is not None]
    if not pairs:
        raise SpinnError(f"{path}: no labelled pairs to evaluate on")
    return encode_pairs(pairs, vocabulary)


class EvaluateSettings(Settings):
    """How a model is scored."""

    section: ClassVar[str] = "evaluate"

    transitions: Literal["auto", "gold", "predicted"] = "auto"
    """gold: run on the parses; predicted: on the tracker's own transitions (spinn, rl: no parser needed);
    auto: predicted for spinn and rl, as the paper tested spinn, else gold."""
    batch_size: int = Field(EVAL_BATCH_SIZE, ge=1)
    """Pairs per batch (the scores do not depend on it)."""
    device: Device = "auto"
    """auto: the GPU when there is one."""
    threads: ThreadCount = AUTO
    """torch threads on CPU; auto: the cores other work leaves free, within the cores this process may use,
    followed as they change (spinn/ground/cores.py). The scores do not depend on it."""
    track: bool = True
    """Log <split>_accuracy and <split>_macro_f1 to the MLflow run that trained the model (a model whose
    run is not in this store is scored all the same)."""
    label_scheme: Annotated[str | None, AfterValidator(checked_scheme)] = Field(
        None, json_schema_extra={"cli": "--label-scheme"}
    )
    """The split's gold classes, as `spinn label` takes them: auto (the scheme `spinn parse` was given, else found
    from the values; three-way for SNLI and `spinn prepare`'s splits), three-way, glue, hans, scitail, or the
    file's own in the model's order (yes/no: entailment, the rest; 0/1/2)."""


def evaluate(
    model_reference: str | Path,
    data: Path,
    output: Path,
    settings: EvaluateSettings | None = None,
    *,
    plot: Path | None = None,
    predictions: Path | None = None,
    reliability: Path | None = None,
    vocab: Path | None = None,
    progress: bool = False,
    report_every_s: float | None = None,
) -> Metrics:
    """Score a model on a prepared split in its gold scheme; write metrics JSON (and the confusion PNG, the
    predictions CSV, the reliability diagram and its bins in the folder `reliability`,
    spinn.evaluation.calibration). Gold values outside the scheme are a warning with counts.

    The probabilities are the model's own (its temperature applied); the metrics give the expected
    calibration error before (T = 1) and after it. Holds every file it writes (spinn.ground.io.publishing): refused
    before the model loads when an output is the split, its partner, the vocabulary or the checkpoint.
    `report_every_s`: also print a progress line with an ETA that often (a flow's logs)."""
    written = [Path(output), report_path(Path(output)), *(Path(path) for path in (plot, predictions) if path)]
    written += list(reliability_files(reliability).values()) if reliability is not None else []
    read = [*with_partner(Path(data)), *([Path(vocab)] if vocab else []), Path(model_reference)]
    with publishing(written, inputs=read):
        settings = settings or EvaluateSettings()
        loaded = load_model(model_reference, resolve_device(settings.device))
        if vocab is not None:
            check_vocabulary(loaded.saved, Vocabulary.load(vocab).tokens, loaded.checkpoint, str(vocab))
        source = transition_source(settings.transitions, loaded.model.config)
        split = read_gold_split(data, loaded.vocabulary, settings.label_scheme)
        with torch_threads(settings.threads, where="evaluate"):
            found, bracket_f1 = run_examples(
                loaded.model,
                split.examples,
                next(loaded.model.parameters()).device,
                source=source,
                batch_size=settings.batch_size,
                progress=progress,
                report_every_s=report_every_s,
                temperature=loaded.saved.softmax_temperature,
            )
        tokens, unknown = unknown_count(ids for pair in split.examples for ids in (pair.premise, pair.hypothesis))
        judged = Judged.of(split, found)
        metrics = judged.metrics(found.transition_accuracy, bracket_f1, unknown / tokens if tokens else None)
        warn_if_mostly_unknown(data, metrics.oov_share)
        if (unscored := judged.unscored_warning(split)) is not None:
            warnings.warn(SpinnWarning(unscored), stacklevel=2)
        provenance = {
            "model": str(model_reference),
            "data": str(data),
            "variant": loaded.model.config.variant,
            "transitions": "predicted" if source is TransitionSource.GREEDY else "gold",
            "gold_outside_the_scheme": judged.agreement.outside,
        }
        write_json(Path(output), metrics.summary())
        write_json(report_path(Path(output)), {**metrics.to_json(), **provenance})
        if plot is not None:
            plot_confusion(metrics, plot, title=f"{loaded.model.config.variant} on {Path(data).name}")
        if predictions is not None:
            write_predictions(judged.rows(), Path(predictions))
        diagram = []
        if reliability is not None:
            title = f"{loaded.model.config.variant} on {Path(data).name}"
            diagram = write_reliability(Path(reliability), metrics.calibration, title)
        if settings.track:
            files = [Path(output), report_path(Path(output)), *([Path(plot)] if plot is not None else [])]
            _log_to_training_run(loaded.saved, loaded.checkpoint, split_name(Path(data)), metrics, files, diagram)
        return metrics


def report_path(output: Path) -> Path:
    """Beside the metrics file, the whole report: `test.json` -> `test_report.json`."""
    return output.with_name(f"{output.stem}_report{output.suffix}")


def write_predictions(rows: Iterable[tuple[str, str]], path: Path) -> Path:
    """`actual,predicted` class names per scored pair, in the split's gold scheme: the input of DVC's
    confusion-matrix plot."""
    with atomic_path(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["actual", "predicted"])
        writer.writerows(rows)
    return path


def split_name(data: Path) -> str:
    """`data/prepared/test.parquet` -> `test`: the prefix of the metrics logged to MLflow."""
    return Path(data).name.removesuffix(".parquet")


def _log_to_training_run(
    saved: Checkpoint, checkpoint: Path, split: str, metrics: Metrics, files: list[Path], diagram: list[Path]
) -> None:
    """The scores as the training run's metrics, the report and plot as its artifacts (under `<split>/`, the
    reliability diagram under `<split>/reliability/`), the gold scheme as its tag `<split>_label_scheme`, and
    the scores and scheme as tags of the versions registered from this checkpoint."""
    from spinn.tracking import store as tracking
    from spinn.tracking.register import logged_by, score_tags, tag_versions_of_checkpoint

    run_id = saved.run_id
    if run_id is None or not tracking.run_exists(run_id):
        return
    if not logged_by(run_id, checkpoint):  # a copy someone changed still names the run: trust the store only
        warnings.warn(
            f"{checkpoint}: is not the checkpoint MLflow run {run_id} logged (another sha256); its scores stay "
            "out of that run",
            SpinnWarning,
            stacklevel=2,
        )
        return
    tracking.log_run_artifacts(run_id, files, split)
    values = {f"{split}_accuracy": metrics.accuracy, f"{split}_macro_f1": metrics.macro_f1}
    if metrics.transition_accuracy is not None:
        values[f"{split}_transition_accuracy"] = metrics.transition_accuracy
    if metrics.calibration is not None:
        values.update({f"{split}_{key}": value for key, value in metrics.calibration.summary().items()})
    if diagram:
        tracking.log_run_artifacts(run_id, diagram, f"{split}/{RELIABILITY_DIR}")
    tracking.log_run_metrics(run_id, values, step=saved.step)
    scheme = {f"{split}_{LABEL_SCHEME_TAG}": metrics.label_scheme or THREE_WAY}
    tracking.tag_run(run_id, scheme)
    scores = score_tags(split, {"accuracy": metrics.accuracy, "macro_f1": metrics.macro_f1})
    tag_versions_of_checkpoint(run_id, checkpoint, {**scores, **scheme})


def transition_source(transitions: str, config: SPINNConfig) -> TransitionSource:
    """The setting's `predicted` is the tracker's greedy run; `auto` is greedy for spinn and rl."""
    if transitions == "predicted" and not config.predicts_transitions:
        raise SpinnError(f"a {config.variant} model cannot predict transitions; only spinn and rl can")
    if transitions == "auto":
        return auto_source(config)
    return TransitionSource.GREEDY if transitions == "predicted" else TransitionSource.GOLD
