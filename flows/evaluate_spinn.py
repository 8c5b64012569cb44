"""evaluate-spinn: score a checkpoint or a registered model (default `models:/spinn@champion`) on a split.

A registry URI is resolved at run time and never cached (the alias moves);
a checkpoint file is cached on its contents and the data's.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_table_artifact

from flows import tasks
from flows.artifacts import EVALUATION_KEY, evaluation_facts
from flows.caching import run_stage
from flows.settings import EvaluateRequest


@flow(name="evaluate-spinn", log_prints=True)
def evaluate_spinn(evaluation: EvaluateRequest | None = None) -> dict[str, Any]:
    """Accuracy, macro F1 and the confusion matrix, written beside `output`; logged to the model's MLflow run."""
    evaluation = evaluation or EvaluateRequest()
    output = evaluation.output
    stem = output.with_suffix("")
    evaluated = run_stage(
        tasks.evaluate_stage,
        model=evaluation.model,
        data=evaluation.data,
        output=output,
        plot=stem.with_name(f"{stem.name}_confusion.png"),
        predictions=stem.with_name(f"{stem.name}_predictions.csv"),
        settings=evaluation.evaluation(),
    ).summary
    create_table_artifact(
        evaluation_facts(evaluation.model, str(evaluation.data), evaluated),
        key=EVALUATION_KEY,
        description=f"{evaluation.model} on {evaluation.data}",
    )
    print(f"accuracy {evaluated['accuracy']:.4f} on {evaluated['examples']} pairs; metrics in {output}")
    return evaluated
