"""Markdown tables for the Prefect run's artifacts, so the Prefect and MLflow UIs point at each other.

The train-spinn artifact names the MLflow run, experiment, store and model
version next to the metrics; the MLflow run carries the Prefect flow run id
as a tag. Either UI leads to the other.
"""

from __future__ import annotations

from typing import Any

MLFLOW_UI = "http://127.0.0.1:5000"
"""Where README's `mlflow ui` command serves the store."""


def table(rows: list[tuple[str, Any]], header: tuple[str, str] = ("", "")) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    lines += [f"| {name} | {_cell(value)} |" for name, value in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value).replace("|", "\\|")


def corpus_markdown(corpus: str, splits: dict[str, dict[str, Any]], vocab: dict[str, Any],
                    embeddings: dict[str, Any]) -> str:
    lines = [f"# Prepared corpus: {corpus}", "", "| split | read | written | skipped (no consensus) | rejected |",
             "|---|---|---|---|---|"]
    lines += [f"| {split} | {counts['read']} | {counts['written']} | {counts['skipped']} | {counts['rejected']} |"
              for split, counts in splits.items()]
    lines += ["", table([("vocabulary entries", vocab["entries"]), ("vectors", embeddings["source"]),
                         ("coverage", embeddings["coverage"])], ("", ""))]
    return "\n".join(lines)


def run_markdown(run: dict[str, Any], trained: dict[str, Any], evaluated: dict[str, Any] | None,
                 registration: dict[str, Any] | None) -> str:
    """The training run at a glance: where it is in MLflow, what it scored, what it was registered as."""
    link = f"{MLFLOW_UI}/#/experiments/{run['experiment_id']}/runs/{run['run_id']}"
    rows: list[tuple[str, Any]] = [
        ("MLflow run", f"[{run['run_id']}]({link})"),
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
        rows += [("test accuracy", evaluated["accuracy"]), ("test macro F1", evaluated["macro_f1"])]
        if "transition_accuracy" in evaluated:
            rows.append(("test transition accuracy", evaluated["transition_accuracy"]))
    if registration is not None:
        rows.append(("registered model", describe_registration(registration)))
    return "# SPINN training run\n\n" + table(rows, ("", "value"))


def describe_registration(registration: dict[str, Any]) -> str:
    """`models:/spinn/3 (now @champion)`, `(... @champion)` when it already was, or why the alias stayed."""
    alias = registration["alias"]
    state = (f"now @{alias}" if registration["promoted"] else f"@{alias}" if registration["champion"]
             else f"@{alias} stays on a better version")
    return f"{registration['uri']} ({state})"


def evaluation_markdown(model: str, data: str, evaluated: dict[str, Any]) -> str:
    rows = [("model", model), ("data", data), ("pairs", evaluated["examples"]), ("accuracy", evaluated["accuracy"]),
            ("macro F1", evaluated["macro_f1"])]
    if "transition_accuracy" in evaluated:
        rows.append(("transition accuracy", evaluated["transition_accuracy"]))
    return "# SPINN evaluation\n\n" + table(rows, ("", "value"))
