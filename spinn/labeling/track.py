"""A label run as an MLflow run: what was labelled with which model version, and what came out.

`spinn label --track` and the label-pairs flow both log through
`log_label_run`, and both build the figures with `label_metrics`, so the two
record the same things under the same names. The run is linked to the model
version it used (params and tags with its version, run and logged-model ids,
and a description whose links open the version and its training run in the
UI); the predictions stay where they were written: the run names the output
file, it holds no copy.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spinn.data.label_schemes import Agreement
from spinn.ground.settings import flatten
from spinn.labeling.label_settings import LabelSettings
from spinn.labeling.summary import NO_REFERENCE, LabelSummary

LABELING_EXPERIMENT = "spinn-labeling"
DATASET_CONTEXT = "labelling"
AGREEMENT_ARTIFACT = "gold_agreement.json"
OUTPUT_TAG = "spinn.output"
"""The predictions' file URI: a link to the output, not a copy in the artifact store."""


@dataclass(frozen=True)
class TrackedRun:
    run_id: str
    experiment_id: str
    url: str
    """The run's page in the MLflow UI (README's `mlflow ui` address)."""


def label_metrics(summary: LabelSummary) -> dict[str, float]:
    """Every figure of a label run, by its MLflow metric name (figures a run lacks are left out)."""
    from spinn.tracking import links

    figures: dict[str, float | None] = {
        "rows": summary.rows,
        "labelled": summary.labelled,
        "rejected": summary.rejected,
        **{f"rejected_{reason}": count for reason, count in sorted(summary.reasons.items())},
        "shards": summary.shards,
        "shards_reused": summary.shards_reused,
        "seconds": summary.seconds,
        "pairs_per_second": summary.pairs_per_second,
        "parse_pairs_per_second": summary.parse_pairs_per_second,
        "model_pairs_per_second": summary.model_pairs_per_second,
        **links.share_metrics(summary.label_shares),
        "mean_top_probability": summary.mean_top_probability,
        "oov_share": summary.oov_share,
        "mean_sentence_tokens": summary.mean_sentence_tokens,
        "drift": summary.drift,
        **gold_metrics(summary.agreement),
    }
    return {name: float(value) for name, value in figures.items() if value is not None}


def gold_metrics(found: Agreement | None) -> dict[str, float]:
    """Agreement with the file's gold labels, in its own scheme: `gold_accuracy`, `gold_macro_f1`,
    `gold_pairs`, per class `gold_f1_<class>`, `gold_precision_<class>`, `gold_recall_<class>`, and the
    confusion as `gold_confusion_<gold>_as_<predicted>` (none when the file has no gold)."""
    if found is None:
        return {}
    figures = {"gold_accuracy": found.accuracy, "gold_macro_f1": found.macro_f1, "gold_pairs": found.pairs}
    for name in found.scheme.classes:
        figures.update(
            {
                f"gold_f1_{_key(name)}": found.f1(name),
                f"gold_precision_{_key(name)}": found.precision(name),
                f"gold_recall_{_key(name)}": found.recall(name),
                **{
                    f"gold_confusion_{_key(name)}_as_{_key(predicted)}": rows
                    for predicted, rows in found.confusion[name].items()
                },
            }
        )
    figures["gold_outside_the_scheme"] = sum(found.outside.values())
    return figures


def _key(name: str) -> str:
    """A class name as an MLflow key may spell it (letters, digits, `_ - . /` and spaces)."""
    return "".join(character if character.isalnum() or character in "_-." else "_" for character in name)


def log_label_run(summary: LabelSummary, settings: LabelSettings) -> TrackedRun | None:
    """One run in the `spinn-labeling` experiment with the run's params, figures and its model's links, named
    by its input and model (`label pairs.csv with spinn/3`); None, and nothing logged, for a rerun that did
    nothing (its output already published: the run that labelled it was logged then, and a second would
    show a throughput for work not done beside it)."""
    from spinn.tracking import links
    from spinn.tracking import store as tracking

    if summary.published_before:
        return None

    version = links.model_version_facts(summary.model)
    name = summary.input.name if summary.input else "pairs"
    run_name = f"label {name} with {_short_model(summary.model, version)}"
    with links.run_started_at(LABELING_EXPERIMENT, run_name, summary.started_at) as run_id:
        tracking.log_params(_params(summary, settings, version))
        tracking.set_tags(_tags(summary, version, tracking.git_commit()))
        tracking.log_metrics(label_metrics(summary), step=0)
        if summary.input is not None:
            tracking.log_dataset(summary.input, name, summary.input_sha256, DATASET_CONTEXT)
        if version and "model_id" in version:
            links.log_model_input(run_id, version["model_id"])
        _log_agreement(summary.agreement)
        links.describe_run(_description(summary, version))
    experiment_id = tracking.run_summary(run_id)["experiment_id"]
    return TrackedRun(run_id, experiment_id, links.ui_url(experiment_id, run_id))


def _log_agreement(found: Agreement | None) -> None:
    """The agreement with the file's gold labels as the run's artifact AGREEMENT_ARTIFACT (scheme, classes,
    per-class figures, the confusion)."""
    if found is None:
        return
    from spinn.tracking import store as tracking

    with tempfile.TemporaryDirectory(prefix="spinn-agreement-") as folder:
        path = Path(folder) / AGREEMENT_ARTIFACT
        path.write_text(json.dumps(found.to_json(), indent=2) + "\n", encoding="utf-8")
        tracking.log_artifact(path)


def _short_model(model: str, version: dict[str, str] | None) -> str:
    """`spinn/3` for a registered version, else the checkpoint's file name and digest (`best.pt (sha256 ...)`):
    runs of one input told apart."""
    if version is not None:
        return f"{version['name']}/{version['version']}"
    return Path(model).name


def _params(summary: LabelSummary, settings: LabelSettings, version: dict[str, str] | None) -> dict[str, Any]:
    params = {
        "model": summary.model,
        "parser": summary.parser,
        "input": summary.input.name if summary.input else "",
        "input_path": str(summary.input.absolute()) if summary.input else "",
        "input_sha256": summary.input_sha256,
        "output": str(Path(summary.output).absolute()),
        **{f"settings.{key}": value for key, value in flatten(settings.to_dict())},
    }
    ran = {"parser_workers": summary.parser_workers, "model_threads": summary.model_threads}
    params.update({name: value for name, value in ran.items() if value is not None})  # None: no shard ran
    params.update({_model_key(key): value for key, value in (version or {}).items() if key != "experiment_id"})
    return params


def _tags(summary: LabelSummary, version: dict[str, str] | None, commit: str) -> dict[str, str]:
    tags = {"spinn.stage": "label", "git_commit": commit, OUTPUT_TAG: Path(summary.output).absolute().as_uri()}
    tags.update({f"spinn.{_model_key(key)}": value for key, value in (version or {}).items() if key != "source"})
    return tags


def _model_key(fact: str) -> str:
    """A model version fact's name among the run's params and tags: `run_id` -> `model_run_id`."""
    return fact if fact.startswith("model_") else f"model_{fact}"


def _description(summary: LabelSummary, version: dict[str, str] | None) -> str:
    """What the run page says first: the input, the model (linked), the output, the drift and the accuracy."""
    from spinn.tracking import links

    name = summary.input.name if summary.input else "pairs"
    model = f"`{summary.model}`"
    if version is not None:
        model = f"[{summary.model}]({links.version_page(version['name'], version['version'])})"
        if "experiment_id" in version:
            training = links.ui_page(version["experiment_id"], version["run_id"])
            model += f", trained in run [{version['run_id'][:8]}]({training})"
    drift = summary.drift
    drift_line = NO_REFERENCE if drift is None else f"Drift from the model's dev predictions: {drift:.3f}"
    found = summary.agreement
    gold = "" if found is None else f"\n\n{found.report()[0][0].upper()}{found.report()[0][1:]}."
    return (
        f"Labelled `{name}` ({summary.labelled} of {summary.rows} rows) with {model}.\n\n"
        f"Predictions: `{Path(summary.output).absolute()}`\n\n{drift_line}.{gold}"
    )
