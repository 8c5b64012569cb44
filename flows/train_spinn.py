"""train-spinn: prepare the corpus if needed -> train -> evaluate on test -> register, alias if better.

Registration comes after evaluation and chooses on dev accuracy only; the
test scores are logged to the MLflow run and shown beside it. The Prefect run
and the MLflow run name each other (an artifact here, tags there). Each
distinct run trains into a folder of its own, `<data_dir>/runs/<variant>-train-<digest>/`
(checkpoints, and its metrics and curves under metrics/), so the artifact's
checkpoint path keeps pointing at this run's model.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import BaseModel

from flows import tasks
from flows.artifacts import TRAINING_RUN_KEY, TRAINING_RUN_LINK_KEY, run_facts, run_link_markdown
from flows.caching import run_stage
from flows.flow_requests import CorpusRequest, EvaluateOverrides, EvaluateRequest, TrainRequest
from flows.prepare_corpus import prepare_corpus
from spinn.evaluation.calibration import RELIABILITY_DIR
from spinn.ground import children

TEST_SPLIT = "test"


class TrainedModel(BaseModel):
    """Where the pipeline's results are: the MLflow run, the metrics files, the model."""

    run_id: str
    experiment_id: str
    tracking_uri: str
    checkpoint: str
    best_dev_accuracy: float
    test_metrics: dict[str, Any]
    metrics_file: str
    registered: dict[str, Any] | None


@flow(name="train-spinn", log_prints=True)
def train_spinn(
    corpus: CorpusRequest | None = None,
    training: TrainRequest | None = None,
    evaluation: EvaluateOverrides | None = None,  # type: ignore[valid-type]
) -> TrainedModel:
    """The whole pipeline. Settings left out come from params.yaml (in the working directory), else the
    stages' defaults. Training uses the word vectors the corpus's embeddings stage aligned; `evaluation`
    sets transitions, batch size and device of the test scoring (the model and data are this run's)."""
    from spinn.tracking import store as tracking
    from spinn.training.folders import run_folder

    children.stop_when_orphaned()  # a worker's flow run ends with its worker, as a command with its starter
    corpus, training = corpus or CorpusRequest(), training or TrainRequest()
    testing = EvaluateRequest(params=corpus.params, settings=evaluation or EvaluateOverrides()).evaluation()
    prepared = prepare_corpus(corpus)
    config = training.config().replace(embeddings=corpus.stages().embeddings)
    splits = prepared.splits
    output_dir = run_folder(corpus.data_dir / "runs", config, splits["train"], splits["dev"], prepared.vocab)
    metrics_dir = output_dir / "metrics"
    trained = run_stage(
        tasks.train_stage,
        train=prepared.splits["train"],
        dev=prepared.splits["dev"],
        vocab=prepared.vocab,
        config=config,
        embeddings_dir=corpus.embeddings_dir,
        output_dir=output_dir,
        metrics_dir=metrics_dir,
        resume=training.resume,
        overwrite=training.overwrite,
        run_name=training.run_name,
    ).summary
    evaluated = run_stage(
        tasks.evaluate_stage,
        model=trained["checkpoint"],
        data=prepared.splits[TEST_SPLIT],
        output=metrics_dir / f"{TEST_SPLIT}.json",
        plot=metrics_dir / "confusion.png",
        predictions=metrics_dir / f"{TEST_SPLIT}_predictions.csv",
        reliability=metrics_dir / RELIABILITY_DIR,
        settings=testing,
    ).summary
    registered = None
    if training.register_model:
        registered = tasks.register_stage(
            trained["run_id"],
            trained["checkpoint"],
            trained["best_dev_accuracy"],
            config.model.variant,
            config.registered_model,
            config.alias,
            _test_tags(evaluated),
        )
    tracking.tag_run(trained["run_id"], _prefect_tags())
    run = tracking.run_summary(trained["run_id"])
    description = f"MLflow run {trained['run_id']}"
    create_table_artifact(run_facts(run, trained, evaluated, registered), key=TRAINING_RUN_KEY, description=description)
    create_markdown_artifact(run_link_markdown(run), key=TRAINING_RUN_LINK_KEY, description=description)
    return TrainedModel(
        run_id=trained["run_id"],
        experiment_id=run["experiment_id"],
        tracking_uri=run["tracking_uri"],
        checkpoint=trained["checkpoint"],
        best_dev_accuracy=trained["best_dev_accuracy"],
        test_metrics=evaluated,
        metrics_file=str(metrics_dir / f"{TEST_SPLIT}.json"),
        registered=registered,
    )


def _test_tags(evaluated: dict[str, Any]) -> dict[str, str]:
    """The test scores as version tags, as `spinn evaluate` tags a version `spinn train` registered."""
    from spinn.tracking.register import score_tags

    return score_tags(TEST_SPLIT, {key: evaluated[key] for key in ("accuracy", "macro_f1")})


def _prefect_tags() -> dict[str, str]:
    """Tags on the MLflow run that lead back to this Prefect run; the UI address only when there is a UI
    to reach (a temporary server has none, and Prefect then builds `None/flow-runs/...`)."""
    tags = {
        "prefect.flow_run_id": str(flow_run.id),
        "prefect.flow_run_name": str(flow_run.name),
        "prefect.flow_name": "train-spinn",
    }
    url = flow_run.ui_url
    if url and url.startswith(("http://", "https://")):
        tags["prefect.flow_run_url"] = url
    return tags
