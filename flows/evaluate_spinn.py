"""evaluate-spinn: score a checkpoint or a registered model (default `models:/spinn@champion`) on a split.

A registry URI is resolved at run time and never cached (the alias moves);
a checkpoint file is cached on its contents and the data's.

Each evaluation writes into a folder of its own under data/evaluations
(unless told an `output`): data/metrics holds the outputs `dvc repro`
declares, and a deployment run writing there paired one model's test score
with another model's train.json and left `dvc status` reporting evaluate as
changed.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_table_artifact

from flows import tasks
from flows.artifacts import EVALUATION_KEY, evaluation_facts
from flows.caching import run_stage
from flows.flow_requests import EvaluateRequest
from spinn.data.label_schemes import THREE_WAY
from spinn.evaluation.calibration import RELIABILITY_DIR
from spinn.ground import children

EVALUATIONS_DIR = Path("data/evaluations")
"""Where each evaluation without an explicit `output` gets its own folder."""
METRICS_NAME = "metrics.json"


def evaluation_output(model: str, now: float | None = None) -> Path:
    """`data/evaluations/<UTC time>-<model>/metrics.json`: one folder per evaluation, named so a listing sorts
    by time and says which model (`spinn@champion`, or a checkpoint's run folder)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    reference = model.removeprefix("models:/")
    name = Path(reference).parent.name if reference.endswith(".pt") else reference
    return EVALUATIONS_DIR / f"{stamp}-{re.sub(r'[^A-Za-z0-9@._-]+', '-', name).strip('-')}" / METRICS_NAME


@flow(name="evaluate-spinn", log_prints=True)
def evaluate_spinn(evaluation: EvaluateRequest | None = None) -> dict[str, Any]:
    """Accuracy, macro F1 and the confusion matrix in the split's gold scheme, written beside `output` (by
    default a new folder under data/evaluations); logged to the model's MLflow run."""
    children.stop_when_orphaned()  # a worker's flow run ends with its worker, as a command with its starter
    evaluation = evaluation or EvaluateRequest()
    output = evaluation.output or evaluation_output(evaluation.model)
    stem = output.with_suffix("")
    evaluated = run_stage(
        tasks.evaluate_stage,
        model=evaluation.model,
        data=evaluation.data,
        output=output,
        plot=stem.with_name(f"{stem.name}_confusion.png"),
        predictions=stem.with_name(f"{stem.name}_predictions.csv"),
        reliability=stem.with_name(f"{stem.name}_{RELIABILITY_DIR}"),
        settings=evaluation.evaluation(),
    ).summary
    create_table_artifact(
        evaluation_facts(evaluation.model, str(evaluation.data), evaluated),
        key=EVALUATION_KEY,
        description=f"{evaluation.model} on {evaluation.data}",
    )
    scheme = evaluated.get("label_scheme", THREE_WAY)  # a summary from before schemes: three-way
    print(f"accuracy {evaluated['accuracy']:.4f} on {evaluated['examples']} pairs ({scheme}); metrics in {output}")
    return evaluated
