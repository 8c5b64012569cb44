"""`spinn evaluate` scores a corpus in its own gold scheme, by the rules `spinn label` follows.

Small hand-written GLUE, HANS and SciTail files (tests/helpers.py) go through
`spinn parse` (tokens only: the smoke `spinn` model builds its own trees) and
`spinn evaluate`; the model's own labels, from `spinn label` on the same file,
give the hand count every figure is checked against. A three-way split scores
exactly as the three-way scoring it replaced did.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main
from spinn.data.label_schemes import SCHEMES
from spinn.data.pairs import read_raw_pairs, split_gold_scheme
from spinn.data.schema import GOLD_COLUMN, LABELS
from spinn.evaluation.evaluate import EvaluateSettings, evaluate, report_path
from spinn.model.checkpoint import load_checkpoint
from tests.helpers import SCHEME_FILES, SCHEME_PAIRS, glue_file

RELEASE_PAIRS = Path(__file__).parent / "fixtures" / "release-0.1.0" / "pairs.parquet"


def parse_command(source: Path, folder: Path, *extra: str):
    return CliRunner().invoke(main, ["parse", str(source), "--output-dir", str(folder), "--trees", "none", *extra])


def evaluate_command(model: Path, data: Path, folder: Path, *extra: str):
    arguments = ["evaluate", "--model", str(model), "--data", str(data), "--output", str(folder / "metrics.json")]
    arguments += ["--plot", str(folder / "confusion.png"), "--predictions", str(folder / "predictions.csv")]
    return CliRunner().invoke(
        main, [*arguments, "--reliability", str(folder / "reliability"), "--device", "cpu", *extra]
    )


def model_labels(source: Path, smoke_model, output: Path) -> list[str]:
    """The model's three-way label of each pair of `source`, in file order, from the labelling door."""
    arguments = ["label", str(source), "--model", str(smoke_model.checkpoint), "--output", str(output)]
    result = CliRunner().invoke(main, [*arguments, "--parser", "model", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    return [row["label"] for row in sorted(pq.read_table(output).to_pylist(), key=lambda row: row["row"])]


def hand_count(labels: list[str]) -> float:
    """Accuracy in a two-way scheme by hand: right where the model says entailment exactly when the pair's
    meaning is entailment."""
    right = sum(
        (label == LABELS[0]) == (meaning == LABELS[0])
        for label, (_, _, meaning) in zip(labels, SCHEME_PAIRS, strict=True)
    )
    return right / len(SCHEME_PAIRS)


@pytest.mark.parametrize("scheme", SCHEME_FILES)
def test_a_two_way_corpus_is_scored_in_its_own_classes(scheme, smoke_model, smoke_store, tmp_path):
    """Accuracy, the 2x2 confusion in the scheme's class names, the predictions CSV and the MLflow run's
    metric and tag all agree with the hand count over the model's own labels."""
    import mlflow

    source = SCHEME_FILES[scheme](tmp_path)
    assert parse_command(source, tmp_path / "prepared").exit_code == 0
    split = tmp_path / "prepared" / f"{source.stem}.parquet"
    labels = model_labels(source, smoke_model, tmp_path / "labels.parquet")
    accuracy = hand_count(labels)

    result = evaluate_command(smoke_model.checkpoint, split, tmp_path)
    assert result.exit_code == 0, result.output
    entails, rest = classes = SCHEMES[scheme].classes
    assert f"on {len(SCHEME_PAIRS)} pairs" in result.output and f"the {scheme} scheme ({entails} / {rest})" in (
        result.output
    )
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert summary["accuracy"] == pytest.approx(accuracy) and summary["examples"] == len(SCHEME_PAIRS)

    said = [entails if label == LABELS[0] else rest for label in labels]
    gold = [entails if meaning == LABELS[0] else rest for _, _, meaning in SCHEME_PAIRS]
    report = json.loads(report_path(tmp_path / "metrics.json").read_text())
    assert report["label_scheme"] == scheme and report["confusion_matrix"]["labels"] == list(classes)
    by_hand = [
        [sum(g == row and s == column for g, s in zip(gold, said, strict=True)) for column in classes]
        for row in classes
    ]
    assert report["confusion_matrix"]["counts"] == by_hand
    assert set(report["per_class"]) == set(classes) and report["gold_outside_the_scheme"] == {}
    assert sum(bin["count"] for bin in report["calibration"]["calibrated"]["bins"]) == len(SCHEME_PAIRS)
    with (tmp_path / "predictions.csv").open(encoding="utf-8") as handle:
        assert [(row["actual"], row["predicted"]) for row in csv.DictReader(handle)] == list(
            zip(gold, said, strict=True)
        )
    assert (tmp_path / "confusion.png").read_bytes()[:4] == b"\x89PNG"

    run = mlflow.MlflowClient().get_run(load_checkpoint(smoke_model.checkpoint).run_id)
    assert run.data.metrics[f"{split.stem}_accuracy"] == pytest.approx(accuracy)
    assert run.data.tags[f"{split.stem}_label_scheme"] == scheme


def test_parse_keeps_the_gold_value_and_its_scheme_and_the_flow_task_scores_in_it(smoke_model, tmp_path):
    """A GLUE file named `1/0` (entailment first) in its sidecar: parse keeps each value and the scheme it
    was given, evaluate-spinn's task scores in it and its table names it."""
    from flows import tasks
    from flows.artifacts import evaluation_facts

    source = tmp_path / "numbered.tsv"
    lines = glue_file(tmp_path).read_text(encoding="utf-8").replace("\tnot_entailment\n", "\t0\n")
    source.write_text(lines.replace("\tentailment\n", "\t1\n"), encoding="utf-8")
    (tmp_path / "numbered.tsv.columns.json").write_text(json.dumps({"label_scheme": "1/0"}), encoding="utf-8")
    assert parse_command(source, tmp_path / "prepared").exit_code == 0
    split = tmp_path / "prepared" / "numbered.parquet"
    gold = ["1" if meaning == LABELS[0] else "0" for _, _, meaning in SCHEME_PAIRS]
    assert pq.read_table(split).column(GOLD_COLUMN).to_pylist() == gold and split_gold_scheme(split) == "1/0"
    assert pq.read_table(split).column("label").to_pylist() == [None] * len(SCHEME_PAIRS)  # never trained on

    folder = tmp_path / "evaluated"
    settings = EvaluateSettings(device="cpu", track=False)
    paths = {"output": folder / "m.json", "plot": folder / "c.png", "predictions": folder / "p.csv"}
    stage = tasks.evaluate_stage.fn(
        str(smoke_model.checkpoint), split, **paths, reliability=folder / "r", settings=settings
    )
    assert stage.summary["label_scheme"] == "1/0" and stage.summary["examples"] == len(SCHEME_PAIRS)
    accuracy = hand_count(model_labels(source, smoke_model, tmp_path / "labels.parquet"))
    assert stage.summary["accuracy"] == pytest.approx(accuracy)
    facts = {row["fact"]: row["value"] for row in evaluation_facts("m", str(split), stage.summary)}
    assert facts["label scheme"] == "1/0" and facts["accuracy"] == round(accuracy, 4)


@pytest.mark.parametrize(
    ("values", "extra", "error"),
    [
        (None, (), "no pair has a gold label, and evaluate needs gold"),
        (("1", "0"), (), "none of its gold labels ('0' 4, '1' 4) is in a known scheme, and evaluate needs gold"),
        (("yes", "no"), ("--label-scheme", "glue"), "none of its gold labels ('no' 4, 'yes' 4) is in the glue scheme"),
    ],
    ids=["no gold column", "in no known scheme", "not the scheme named"],
)
def test_a_split_without_gold_evaluate_can_score_is_one_error_line(values, extra, error, smoke_model, tmp_path):
    source = tmp_path / "pairs.tsv"
    rows = [f"{p}\t{h}" + ("" if values is None else f"\t{values[g != LABELS[0]]}") for p, h, g in SCHEME_PAIRS]
    header = "sentence1\tsentence2" + ("" if values is None else "\tlabel")
    source.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    assert parse_command(source, tmp_path / "prepared").exit_code == 0
    result = evaluate_command(smoke_model.checkpoint, tmp_path / "prepared" / "pairs.parquet", tmp_path, *extra)
    assert result.exit_code == EXIT_USER_ERROR
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'prepared' / 'pairs.parquet'}: ") and error in line
    assert not (tmp_path / "metrics.json").exists()


def test_a_gold_value_outside_the_scheme_is_a_warning_with_counts_and_scores_nothing(smoke_model, tmp_path):
    source = glue_file(tmp_path)
    lines = source.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1].rsplit("\t", 1)[0] + "\tmaybe"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert parse_command(source, tmp_path / "prepared").exit_code == 0
    result = evaluate_command(smoke_model.checkpoint, tmp_path / "prepared" / "rte.parquet", tmp_path, "--no-track")
    assert result.exit_code == 0, result.output
    [warning] = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert "1 rows have gold labels outside the glue" in warning and "'maybe' 1" in warning
    assert "--no-gold" not in warning  # evaluate has none: it needs gold
    report = json.loads(report_path(tmp_path / "metrics.json").read_text())
    assert report["examples"] == len(SCHEME_PAIRS) - 1 and report["gold_outside_the_scheme"] == {"maybe": 1}


def test_a_three_way_split_scores_exactly_as_before(smoke_model, tmp_path):
    """The smoke test split in the identity scheme: metrics.json is, to the last bit, what the three-way scoring
    gave (training's Scored.metrics and Calibration.of over the same predictions), the CSV the label names."""
    from spinn.evaluation.evaluate import predict_examples, read_examples, transition_source
    from spinn.model.loading import load_model

    test = smoke_model.prepared / "test.parquet"
    assert split_gold_scheme(test) is None and GOLD_COLUMN not in pq.read_schema(test).names  # prepare's
    settings = EvaluateSettings(device="cpu", track=False)
    metrics = evaluate(smoke_model.checkpoint, test, tmp_path / "test.json", settings, predictions=tmp_path / "p.csv")
    assert metrics.label_scheme == "three-way" and metrics.classes == LABELS

    loaded = load_model(smoke_model.checkpoint, torch.device("cpu"))
    examples = read_examples(test, loaded.vocabulary)
    source = transition_source("auto", loaded.model.config)
    temperature = loaded.saved.softmax_temperature
    found = predict_examples(loaded.model, examples, torch.device("cpu"), source=source, temperature=temperature)
    before = replace(found.metrics(), oov_share=metrics.oov_share, calibration=found.calibration())
    assert json.loads((tmp_path / "test.json").read_text()) == before.summary()
    assert metrics.confusion == before.confusion and metrics.examples == len(examples)
    with (tmp_path / "p.csv").open(encoding="utf-8") as handle:
        rows = [(row["actual"], row["predicted"]) for row in csv.DictReader(handle)]
    assert rows == [(LABELS[g], LABELS[p]) for g, p in zip(found.gold, found.predicted, strict=True)]


def test_a_prepared_file_without_a_gold_column_has_its_labels_as_gold():
    """Release 0.1.0's prepared pairs (schema version 1, no gold column) read as they always did."""
    pairs = read_raw_pairs(RELEASE_PAIRS)
    assert split_gold_scheme(RELEASE_PAIRS) is None
    assert [pair.gold for pair in pairs] == [None if pair.label is None else LABELS[pair.label] for pair in pairs]
