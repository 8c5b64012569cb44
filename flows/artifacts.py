"""What the Prefect runs show: tables of counts and facts, and one Markdown note that links the MLflow run.

Tabular summaries are Prefect table artifacts, rows as dicts: the UI renders
a real table and the API hands the rows back as JSON. Markdown stays only
where a link has to be clickable: the train-spinn note links its MLflow run,
and the MLflow run carries the Prefect flow run id as a tag, so either UI
leads to the other.
"""

from __future__ import annotations

from typing import Any

from spinn.data.schema import LABELS
from spinn.tracking.links import PREDICTED_SHARE, ui_url

DISPLAY_DIGITS = 4
"""Decimals of scores and rates in a table; MLflow and the metrics files keep the full values."""
PROBABILITY_DIGITS, DRIFT_DIGITS, LENGTH_DIGITS = 3, 3, 1
"""Decimals of a labelled file's mean top-class probability, drift and mean sentence length."""
PREPARED_CORPUS_KEY = "spinn-prepared-corpus"
PREPARED_VOCABULARY_KEY = "spinn-prepared-vocabulary"
TRAINING_RUN_KEY = "spinn-training-run"
TRAINING_RUN_LINK_KEY = "spinn-training-run-link"
EVALUATION_KEY = "spinn-evaluation"

Row = dict[str, Any]


def facts(rows: list[tuple[str, Any]]) -> list[Row]:
    """A two-column table, one (fact, value) row per pair."""
    return [{"fact": name, "value": _shown(value)} for name, value in rows]


def _shown(value: Any) -> Any:
    return round(value, DISPLAY_DIGITS) if isinstance(value, float) else value


def split_counts(splits: dict[str, dict[str, Any]]) -> list[Row]:
    """One row per split: pairs read, written, skipped for want of a gold label, rejected."""
    return [
        {
            "split": split,
            "read": counts["read"],
            "written": counts["written"],
            "skipped (no consensus)": counts["skipped"],
            "rejected": counts["rejected"],
        }
        for split, counts in splits.items()
    ]


def vocabulary_facts(vocab: dict[str, Any], embeddings: dict[str, Any]) -> list[Row]:
    return facts(
        [
            ("vocabulary entries", vocab["entries"]),
            ("vectors", embeddings["source"]),
            ("coverage", embeddings["coverage"]),
        ]
    )


def run_facts(
    run: dict[str, Any], trained: dict[str, Any], evaluated: dict[str, Any] | None, registration: dict[str, Any] | None
) -> list[Row]:
    """The training run at a glance: where it is in MLflow, what it scored, what it was registered as."""
    rows: list[tuple[str, Any]] = [
        ("MLflow run", run["run_id"]),
        ("MLflow run name", run["run_name"]),
        ("MLflow store", run["tracking_uri"]),
        ("artifacts", run["artifact_uri"]),
        ("steps", trained["steps"]),
        ("best step", trained["best_step"]),
        ("best dev accuracy", trained["best_dev_accuracy"]),
        ("pairs/s", trained["pairs_per_second"]),
        ("checkpoint", trained["checkpoint"]),
    ]
    if evaluated is not None:
        rows += _scores("test ", evaluated)
    if registration is not None:
        rows.append(("registered model", describe_registration(registration)))
    return facts(rows)


def _scores(prefix: str, evaluated: dict[str, Any]) -> list[tuple[str, Any]]:
    rows = [(f"{prefix}accuracy", evaluated["accuracy"]), (f"{prefix}macro F1", evaluated["macro_f1"])]
    if "transition_accuracy" in evaluated:
        rows.append((f"{prefix}transition accuracy", evaluated["transition_accuracy"]))
    return rows


def run_link_markdown(run: dict[str, Any]) -> str:
    """The clickable way from the Prefect run to its MLflow run (a table cell shows no link)."""
    link = ui_url(run["experiment_id"], run["run_id"])
    return (
        f"# SPINN training run\n\nMLflow run [{run['run_name']}]({link}) in `{run['tracking_uri']}`; "
        f"its facts and scores are in the `{TRAINING_RUN_KEY}` table."
    )


def describe_registration(registration: dict[str, Any]) -> str:
    """`models:/spinn/3 (now @champion)`, `(... @champion)` when it already was, or why the alias stayed."""
    alias = registration["alias"]
    state = (
        f"now @{alias}"
        if registration["promoted"]
        else f"@{alias}"
        if registration["champion"]
        else f"@{alias} stays on a version as good or better on dev"
    )
    return f"{registration['uri']} ({state})"


def evaluation_facts(model: str, data: str, evaluated: dict[str, Any]) -> list[Row]:
    """`label scheme`: the gold classes every score is in (three-way, glue, ...)."""
    rows = [("model", model), ("data", data), ("label scheme", evaluated.get("label_scheme"))]
    return facts([*rows, ("pairs", evaluated["examples"]), *_scores("", evaluated)])


def labelled_file_rows(entries: dict[str, dict[str, Any]]) -> list[Row]:
    """One row per inbox file of a label-pairs run, every row with every column: a labelled file's figures
    (those its MLflow run logs, rounded for reading: shares as percentages; the accuracy against its gold
    labels, in their own scheme), a failed file's error."""
    return [{"file": name, **_file_figures(entry)} for name, entry in entries.items()]


def _file_figures(entry: dict[str, Any]) -> Row:
    figures = entry.get("metrics") or {}
    return {
        "status": entry["status"],
        "rows": entry.get("rows"),
        "labelled": entry.get("labelled"),
        "rejected": entry.get("rejected"),
        "pairs/s": _whole(figures.get("pairs_per_second")),
        **{label: percent(figures.get(f"{PREDICTED_SHARE}{label}")) for label in LABELS},
        "mean top probability": _rounded(figures.get("mean_top_probability"), PROBABILITY_DIGITS),
        "OOV tokens": percent(figures.get("oov_share")),
        "tokens per sentence": _rounded(figures.get("mean_sentence_tokens"), LENGTH_DIGITS),
        "drift": _rounded(figures.get("drift"), DRIFT_DIGITS),
        "accuracy": percent(entry.get("accuracy")),
        "label scheme": entry.get("label_scheme"),
        "parser": entry.get("parser"),
        "output": entry.get("output"),
        "MLflow run": entry.get("mlflow_run"),
        "error": entry.get("error"),
    }


def percent(share: float | None) -> str | None:
    """0.41234 -> '41.2%': a share as people read it."""
    return None if share is None else f"{share:.1%}"


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _whole(value: float | None) -> int | None:
    return None if value is None else round(value)
