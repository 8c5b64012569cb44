"""The register stage: a trained run's model -> a registry version, and the alias when it is better.

Models are chosen on dev accuracy, never on test (the test split stays held
out for reporting). Each version is tagged with its dev accuracy and the
SHA-256 of its checkpoint: a resumed run keeps logging to one MLflow run, so
the run's latest metric cannot describe an older version, and the digest lets
a rerun (a retried Prefect flow, a repeated `dvc repro`) find the version it
already made instead of registering the same model twice.

What is registered is an MLflow 3 logged model of the run (`log_model`): a
pyfunc whose code is the installed spinn package (spinn/serving, named by its
file, run by MLflow wherever the model loads), whose files are the checkpoint,
vocabulary and config, with a signature, an input example and the dev scores
linked, so `mlflow.pyfunc.load_model`, `mlflow models serve` and `mlflow
models predict` take `models:/spinn@champion`. Runs logged before that have a
`model/` folder instead, and register it as before.

Promotion is atomic among spinn processes: the whole read-compare-set runs
under the store's file lock, so two models registered at the same instant
end with the better one as champion. After setting the alias it is read
back, and set again while a worse model holds it (a writer outside the lock
may have moved it meanwhile).

A model that is not finite is never registered: a NaN weight or a NaN dev
accuracy (a diverged run) is refused in one line before the registry is
touched, so it can never become the champion that labels with NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version as installed_version
from numbers import Real
from pathlib import Path
from typing import Any

import torch

import spinn
from spinn.data.schema import LABELS
from spinn.ground.errors import SpinnError
from spinn.ground.io import file_digest
from spinn.parsing.parse import SENTENCES
from spinn.parsing.parser_settings import ParserSettings
from spinn.tracking import store as tracking
from spinn.tracking.logged_models import ColumnSpec, PythonModelSpec, log_python_model, logged_model_of_run

SELECTION_METRIC = "best_dev_accuracy"
CHECKPOINT_TAG = "checkpoint_sha256"
LOGGED_MODEL_NAME = "model"
"""The logged model's name in its run: `runs:/<run>/model` finds it, as it found the folder before."""
MODEL_CODE = Path(spinn.__file__).parent / "serving" / "model_code.py"
"""The models-from-code file MLflow runs to build the model. Named by path, not imported: it is the model's
code (spinn/serving, above this layer), which runs wherever the model is loaded."""
CHECKPOINT_ARTIFACT, VOCABULARY_ARTIFACT, CONFIG_ARTIFACT = "checkpoint", "vocabulary", "config"
"""The logged model's files, as the pyfunc finds them in context.artifacts."""
PARSING_CONFIG = "parsing"
"""The model_config key of the parser settings a model that needs parses is served with."""
LOGGED_PARSER_SETTINGS = ("language", "max_tokens", "pretokenized")
"""What of ParserSettings travels with the model: how its input is parsed, not where this machine keeps things."""
MODEL_INPUTS = [ColumnSpec(name, "string") for name in SENTENCES]
MODEL_OUTPUTS = [
    ColumnSpec("label", "string", required=False),
    *(ColumnSpec(f"p_{label}", "double", required=False) for label in LABELS),
    *(ColumnSpec(f"{name}_tree", "string", required=False) for name in SENTENCES),
    ColumnSpec("rejected", "string", required=False),
]
"""The pyfunc's columns (spinn/labeling/labelled_rows.py makes them; a test holds the two together). A pair the
parser refuses has only `rejected` set."""
INPUT_EXAMPLE = [
    {"premise": "A man is playing a guitar on a stage.", "hypothesis": "A man is performing music."},
    {"premise": "Two dogs run through a field.", "hypothesis": "The dogs are asleep."},
]
PROMOTION_ATTEMPTS = 3
"""Times the alias is set and read back before a writer outside the store lock that keeps moving it wins."""


@dataclass(frozen=True)
class Registration:
    """What registering did: the version, and whether the alias now points at it."""

    name: str
    version: str
    alias: str
    promoted: bool
    """The alias moved to this version in this call."""
    champion: bool
    """The alias points at this version now (just promoted, or earlier)."""
    created: bool
    previous_champion: float | None
    """The dev accuracy behind the alias before this call (None: there was no champion)."""

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.version}"


def version_description(variant: str, dev_accuracy: float) -> str:
    """Every path that registers (the flow, `spinn train`, `dvc repro`) describes a version the same way."""
    return f"{variant}, dev accuracy {dev_accuracy:.4f}"


def score_tags(split: str, scores: dict[str, float]) -> dict[str, str]:
    """`test_accuracy`, `test_macro_f1`, ...: a split's scores as version tags, whichever path scored it."""
    return {f"{split}_{key}": repr(float(value)) for key, value in scores.items()}


def logged_by(run_id: str, checkpoint: Path) -> bool:
    """Whether `run_id` logged exactly this checkpoint: a logged model, or a registered version (0.1.0's
    folders), tagged with its sha256. The run id inside a checkpoint is only a claim; this is the proof."""
    digest = file_digest(Path(checkpoint), "sha256")
    if logged_model_of_run(run_id, CHECKPOINT_TAG, digest) is not None:
        return True
    return any(tags.get(CHECKPOINT_TAG) == digest for _, _, tags in tracking.versions_from_run(run_id))


def tag_versions_of_checkpoint(run_id: str, checkpoint: Path, tags: dict[str, str]) -> list[str]:
    """Tag the versions registered from `run_id` with exactly this checkpoint (e.g. with its test scores
    after `spinn evaluate`); returns their URIs. A run's other versions (older best models) are left alone."""
    digest = file_digest(Path(checkpoint), "sha256")
    tagged = []
    for name, version, version_tags in tracking.versions_from_run(run_id):
        if version_tags.get(CHECKPOINT_TAG) == digest:
            tracking.tag_version(name, version, tags)
            tagged.append(f"models:/{name}/{version}")
    return tagged


def register_model(
    run_id: str,
    checkpoint: Path,
    dev_accuracy: float,
    *,
    name: str,
    alias: str,
    description: str = "",
    tags: dict[str, str] | None = None,
) -> Registration:
    """Register the run's logged model of this checkpoint (a run without one: its `model/` folder) once per
    checkpoint; move `alias` if it beats the champion on dev."""
    check_finite(Path(checkpoint), dev_accuracy)
    digest = file_digest(Path(checkpoint), "sha256")
    model_id = logged_model_of_run(run_id, CHECKPOINT_TAG, digest)
    with tracking.store_lock():
        champion = tracking.alias_metric(name, alias, SELECTION_METRIC)
        for version, version_tags in tracking.versions_of_run(name, run_id):
            if version_tags.get(CHECKPOINT_TAG) == digest:
                is_champion = tracking.alias_version(name, alias) == version
                return Registration(name, version, alias, False, is_champion, False, champion)
        version_tags = {**(tags or {}), SELECTION_METRIC: repr(float(dev_accuracy)), CHECKPOINT_TAG: digest}
        version = tracking.register(name, run_id, version_tags, description=description, model_id=model_id)
        promoted = _promote(name, alias, version, dev_accuracy)
    return Registration(name, version, alias, promoted, promoted, True, champion)


def check_finite(checkpoint: Path, dev_accuracy: float) -> None:
    """Refuse, in one line, a model whose dev accuracy or any floating-point tensor is NaN or infinite."""
    if not math.isfinite(dev_accuracy):
        raise SpinnError(f"{checkpoint}: dev accuracy {dev_accuracy} is not finite; the model is not registered")
    try:
        contents = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for unreadable files
        raise SpinnError(f"{checkpoint}: not a readable checkpoint ({type(error).__name__})") from None
    for name, tensor in _tensors(contents):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise SpinnError(f"{checkpoint}: {name} holds NaN or infinite values; the model is not registered")


def _tensors(value: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(dotted name, tensor) of every tensor in a checkpoint's nested dicts and lists."""
    if isinstance(value, torch.Tensor):
        yield prefix or "tensor", value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _tensors(item, f"{prefix}[{index}]")


def _promote(name: str, alias: str, version: str, dev_accuracy: float) -> bool:
    """Point `alias` at `version` unless the model behind it scores as well on dev; True when it ends there.

    Each pass reads the alias afresh: the first compares with the champion,
    the next ones check the alias stayed set."""
    for _ in range(PROMOTION_ATTEMPTS):
        if tracking.alias_version(name, alias) == version:
            return True
        champion = tracking.alias_metric(name, alias, SELECTION_METRIC)
        if champion is not None and champion >= dev_accuracy:
            return False
        tracking.set_alias(name, alias, version)
    return tracking.alias_version(name, alias) == version


def log_model(
    run_id: str,
    checkpoint: Path,
    vocabulary: Path,
    config: Path,
    dev_metrics: dict,
    parser: ParserSettings | None = None,
    *,
    needs_parser: bool,
    step: int,
) -> str:
    """Log the model as an MLflow 3 logged model of `run_id`: a pyfunc whose code is the installed spinn
    package, whose files are the checkpoint (read with weights_only), vocabulary and config, and whose dev
    scores (measured at `step`, the checkpoint's) are linked to it; returns its model id. `register_model`
    then registers it.

    A run that logged this checkpoint already (a retried flow, a resumed run) keeps the model it has.

    parser: the settings a model that needs parses is served with (default: Stanza's defaults).
    needs_parser: the model labels with Stanza's trees (it does not predict its own transitions), so MLflow
    does not check its input example by predicting it: that would load Stanza while training logs the model."""
    digest = file_digest(Path(checkpoint), "sha256")
    logged = logged_model_of_run(run_id, CHECKPOINT_TAG, digest)
    if logged is not None:
        return logged
    spec = PythonModelSpec(
        name=LOGGED_MODEL_NAME,
        code=MODEL_CODE,
        artifacts={CHECKPOINT_ARTIFACT: checkpoint, VOCABULARY_ARTIFACT: vocabulary, CONFIG_ARTIFACT: config},
        inputs=MODEL_INPUTS,
        outputs=MODEL_OUTPUTS,
        input_example=INPUT_EXAMPLE,
        requirements=[f"spinn=={installed_version('spinn')}"],
        model_config={PARSING_CONFIG: (parser or ParserSettings()).model_dump(include=set(LOGGED_PARSER_SETTINGS))},
        tags={CHECKPOINT_TAG: digest},
        validate_example=not needs_parser,
    )
    return log_python_model(run_id, spec, dev_scores(dev_metrics), step)


def dev_scores(metrics: dict) -> dict[str, float]:
    """`dev_accuracy`, `dev_macro_f1`, ...: a checkpoint's headline dev numbers, as the logged model's metrics
    (per-class scores and the confusion matrix stay in the run's dev/ artifacts)."""
    return {
        f"dev_{key}": float(value)
        for key, value in (metrics or {}).items()
        if isinstance(value, Real) and not isinstance(value, bool)
    }
