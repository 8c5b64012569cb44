"""The evaluate stage: a trained model + a prepared split -> metrics JSON and a confusion plot.

The model is a checkpoint file or an MLflow URI (`models:/spinn@champion`,
`runs:/<id>/model`); either way it is read with weights_only, rebuilt from its
own config and vocabulary, and run in a fixed order so the same inputs always
give the same numbers. `score_examples` is also what training calls for its
periodic dev evaluation.
"""

from __future__ import annotations

import csv
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy
import torch

from spinn.atomic import atomic_path
from spinn.batching import (
    PAD_TRANSITION,
    Example,
    bucket_batches,
    encode_pairs,
    make_batch,
    own_steps,
    read_raw_pairs,
)
from spinn.checkpoint import check_vocabulary, load_checkpoint
from spinn.errors import SpinnError
from spinn.metrics import Metrics, plot_confusion, score
from spinn.model import SPINN, SPINNConfig, transition_counts
from spinn.schema import LABELS
from spinn.transitions import bracket_counts
from spinn.vocab import Vocabulary

EVAL_BATCH_SIZE = 256


@dataclass(frozen=True)
class LoadedModel:
    model: SPINN
    vocabulary: Vocabulary
    checkpoint: Path
    contents: dict


def resolve_device(device: str) -> torch.device:
    """`auto` is the GPU when there is one; `cuda` without one is a user error, not a crash."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpinnError("--device cuda: this torch build sees no CUDA device")
    return torch.device(device)


def load_model(reference: str | Path, device: torch.device, workdir: Path | None = None) -> LoadedModel:
    """Rebuild a model from a checkpoint path or an MLflow model URI."""
    from spinn.tracking import download_checkpoint, is_model_uri

    if is_model_uri(str(reference)):
        checkpoint = download_checkpoint(str(reference), Path(workdir or tempfile.mkdtemp(prefix="spinn-model-")))
    else:
        checkpoint = Path(reference)
    contents = load_checkpoint(checkpoint)
    config = SPINNConfig.from_dict(contents["model_config"])
    vocabulary = Vocabulary.from_json(contents["vocab"], str(checkpoint))
    model = SPINN(config, torch.zeros(len(vocabulary), config.d_embed))
    try:
        model.load_state_dict(contents["model_state"])
    except RuntimeError as error:
        raise SpinnError(f"{checkpoint}: weights do not fit the model config ({str(error).splitlines()[0]})") from None
    return LoadedModel(model.to(device).eval(), vocabulary, checkpoint, contents)


@dataclass(frozen=True)
class Predictions:
    """Gold and predicted class indices of labelled examples, in scoring order."""

    gold: numpy.ndarray  # (N,) int64
    predicted: numpy.ndarray  # (N,) int64
    transition_accuracy: float | None
    bracket_f1: float | None = None

    def metrics(self) -> Metrics:
        return score(self.gold, self.predicted, self.transition_accuracy, self.bracket_f1)


def predict_examples(model: SPINN, examples: Sequence[Example], device: torch.device, *,
                     batch_size: int = EVAL_BATCH_SIZE, predict_transitions: bool = False) -> Predictions:
    """Run `model` over labelled examples (length-sorted batches, no dropout) and keep every prediction."""
    was_training = model.training
    model.eval()
    gold, predicted = [], []
    correct_steps = total_steps = 0
    brackets = numpy.zeros(3, dtype=numpy.int64)  # matched, predicted, gold
    with torch.no_grad():
        for indices in bucket_batches(examples, batch_size, shuffle=False):
            batch = make_batch([examples[i] for i in indices]).to(device)
            output = model(batch, predict_transitions=predict_transitions)
            gold.append(batch.labels.cpu())
            predicted.append(output.logits.argmax(1).cpu())
            if output.transition_logits is not None:
                steps, correct = transition_counts(output, batch)
                total_steps, correct_steps = total_steps + steps, correct_steps + correct
            if predict_transitions:
                brackets += _bracket_counts(output.transitions.cpu(), batch)
    model.train(was_training)
    transition_accuracy = correct_steps / total_steps if total_steps else None
    bracket_f1 = 2 * brackets[0] / (brackets[1] + brackets[2]) if predict_transitions and brackets[1:].sum() else None
    return Predictions(torch.cat(gold).numpy(), torch.cat(predicted).numpy(), transition_accuracy,
                       None if bracket_f1 is None else float(bracket_f1))


def _bracket_counts(ran: torch.Tensor, batch) -> numpy.ndarray:
    """Summed (matched, predicted, gold) spans of the trees that ran against the batch's gold trees."""
    counts = numpy.zeros(3, dtype=numpy.int64)
    gold = batch.transitions.cpu()
    for row, length in enumerate(batch.lengths.tolist()):
        if gold[row, -1] != PAD_TRANSITION:  # tokens-only rows have no tree to compare with
            counts += bracket_counts(own_steps(ran, row, length), own_steps(gold, row, length))
    return counts


def score_examples(model: SPINN, examples: Sequence[Example], device: torch.device, *,
                   batch_size: int = EVAL_BATCH_SIZE, predict_transitions: bool = False) -> Metrics:
    """Accuracy and friends of `model` on labelled examples."""
    return predict_examples(model, examples, device, batch_size=batch_size,
                            predict_transitions=predict_transitions).metrics()


def read_examples(path: Path, vocabulary: Vocabulary) -> list[Example]:
    """Labelled examples of a prepared split, encoded with the model's vocabulary."""
    pairs = [pair for pair in read_raw_pairs(path) if pair.label is not None]
    if not pairs:
        raise SpinnError(f"{path}: no labelled pairs to evaluate on")
    return encode_pairs(pairs, vocabulary)


def evaluate(model_reference: str | Path, data: Path, output: Path, *, plot: Path | None = None,
             predictions: Path | None = None, vocab: Path | None = None, transitions: str = "auto",
             batch_size: int = EVAL_BATCH_SIZE, device: str = "auto", track: bool = True) -> Metrics:
    """Score a model on a prepared split; write metrics JSON (and the confusion PNG, the predictions CSV).

    transitions: `gold` runs on the parses, `predicted` on the tracker's own
    transitions (spinn only, no parser needed), `auto` picks predicted for
    spinn, as the paper tested it, and gold otherwise.

    track: also log `<split>_accuracy` and `<split>_macro_f1` to the MLflow run
    that trained the model, so the MLflow UI compares runs on held-out data
    too; a model whose run is not in the current store is scored all the same.
    """
    loaded = load_model(model_reference, resolve_device(device))
    if vocab is not None:
        check_vocabulary(loaded.contents, Vocabulary.load(vocab).tokens, loaded.checkpoint, str(vocab))
    predict = _predicted_run(transitions, loaded.model.config)
    found = predict_examples(loaded.model, read_examples(data, loaded.vocabulary),
                             next(loaded.model.parameters()).device, batch_size=batch_size,
                             predict_transitions=predict)
    metrics = found.metrics()
    report = {**metrics.to_json(), "model": str(model_reference), "data": str(data),
              "variant": loaded.model.config.variant, "transitions": "predicted" if predict else "gold"}
    with atomic_path(Path(output)) as temporary:
        temporary.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    if plot is not None:
        plot_confusion(metrics, plot, title=f"{loaded.model.config.variant} on {Path(data).name}")
    if predictions is not None:
        write_predictions(found, Path(predictions))
    if track:
        _log_to_training_run(loaded.contents, split_name(Path(data)), metrics)
    return metrics


def write_predictions(found: Predictions, path: Path) -> Path:
    """`actual,predicted` label names per example: the input of DVC's confusion-matrix plot."""
    with atomic_path(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["actual", "predicted"])
        writer.writerows((LABELS[gold], LABELS[predicted]) for gold, predicted in zip(found.gold, found.predicted))
    return path


def split_name(data: Path) -> str:
    """`data/prepared/test.parquet` -> `test`: the prefix of the metrics logged to MLflow."""
    return Path(data).name.removesuffix(".parquet")


def _log_to_training_run(contents: dict, split: str, metrics: Metrics) -> None:
    from spinn import tracking

    run_id = (contents.get("state") or {}).get("run_id")
    values = {f"{split}_accuracy": metrics.accuracy, f"{split}_macro_f1": metrics.macro_f1}
    if metrics.transition_accuracy is not None:
        values[f"{split}_transition_accuracy"] = metrics.transition_accuracy
    if run_id is not None:
        tracking.log_run_metrics(run_id, values, step=contents.get("step", 0))


def _predicted_run(transitions: str, config: SPINNConfig) -> bool:
    if transitions not in ("auto", "gold", "predicted"):
        raise SpinnError(f"--transitions must be auto, gold or predicted, got {transitions!r}")
    if transitions == "predicted" and not config.predicts_transitions:
        raise SpinnError(f"a {config.variant} model cannot predict transitions; only spinn can")
    return transitions == "predicted" or (transitions == "auto" and config.predicts_transitions)
