"""Gold labels in the scheme they come in: two-way corpora are labelled whole and scored in their own classes.

The three two-way schemes (GLUE's entailment / not_entailment, HANS's entailment / non-entailment,
SciTail's entails / neutral) as small hand-written files in their corpora's own shapes; the counting on
hand-made pairs; the rules every front door shares (`--no-gold`, a gold value outside the scheme, the
share of rejected rows); and `spinn parse`, which keeps a pair whatever its gold label.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main
from spinn.data.label_schemes import SCHEMES, agreement, found_scheme, named_scheme, three_way_label
from spinn.ground.errors import SpinnError
from tests.helpers import SCHEME_FILES, SCHEME_PAIRS, glue_file, hand_count

# ----------------------------------------------------------------------------- counting


def test_a_two_way_scheme_counts_neutral_and_contradiction_as_its_second_class():
    found = agreement(
        [("not_entailment", "neutral"), ("not_entailment", "contradiction"), ("not_entailment", "entailment")]
        + [("entailment", "entailment"), ("entailment", "neutral")]
    )
    assert found.scheme is SCHEMES["glue"]
    assert found.confusion == {
        "entailment": {"entailment": 1, "not_entailment": 1},
        "not_entailment": {"entailment": 1, "not_entailment": 2},
    }
    assert (found.pairs, found.correct, found.accuracy) == (5, 3, 0.6)
    # entailment: precision 1/2, recall 1/2, F1 1/2; not_entailment: precision 2/3, recall 2/3, F1 2/3
    assert found.f1("entailment") == pytest.approx(0.5) and found.f1("not_entailment") == pytest.approx(2 / 3)
    assert found.macro_f1 == pytest.approx((0.5 + 2 / 3) / 2)


@pytest.mark.parametrize(
    ("values", "scheme"),
    [
        ({"entailment": 3, "neutral": 2, "contradiction": 1}, "three-way"),
        ({"entailment": 3, "not_entailment": 5}, "glue"),
        ({"entailment": 3, "non-entailment": 5}, "hans"),
        ({"entails": 3, "neutral": 5}, "scitail"),
        ({"entailment": 3}, "three-way"),
        ({"0": 4, "1": 4}, None),
    ],
)
def test_a_scheme_is_found_from_the_values_a_file_holds(values, scheme):
    found = found_scheme(values)
    assert (found.name if found else None) == scheme


def test_a_named_scheme_maps_the_files_own_classes_in_the_models_order():
    assert named_scheme("yes/no").from_model == {"entailment": "yes", "neutral": "no", "contradiction": "no"}
    assert named_scheme("0/1/2").classes == ("0", "1", "2")
    assert three_way_label("2", "0/1/2") == "contradiction" and three_way_label("not_entailment", "glue") is None
    assert three_way_label("neutral") == "neutral" and three_way_label("maybe") is None
    for wrong in ("yes", "a/b/c/d", "yes/yes", "yes/"):
        with pytest.raises(SpinnError, match="label scheme"):
            named_scheme(wrong)


def test_a_gold_value_outside_the_scheme_is_counted_apart_and_scores_nothing():
    found = agreement([("entails", "entailment"), ("neutral", "neutral"), ("maybe", "neutral"), ("maybe", "x")])
    assert found.scheme.name == "scitail" and found.pairs == 2 and found.outside == {"maybe": 2}


# ----------------------------------------------------------------------------- spinn label


@pytest.mark.parametrize("scheme", SCHEME_FILES)
def test_a_two_way_file_is_labelled_whole_and_scored_in_its_own_classes(scheme, smoke_model, tmp_path):
    source = SCHEME_FILES[scheme](tmp_path)
    output = tmp_path / "out.parquet"
    result = label_command(source, output, smoke_model)
    assert result.exit_code == 0, result.output
    assert f"{len(SCHEME_PAIRS)} labelled, 0 rejected" in result.output
    accuracy = hand_count(output)
    classes = " / ".join(SCHEMES[scheme].classes)
    assert f"accuracy against the file's gold labels ({scheme}: {classes}): {accuracy:.4f} on {len(SCHEME_PAIRS)}" in (
        result.output
    )
    assert "warning" not in result.stderr


def label_command(source: Path, output: Path, smoke_model, *extra: str, model: str | None = None):
    arguments = ["label", str(source), "--model", model or str(smoke_model.checkpoint), "--output", str(output)]
    return CliRunner().invoke(main, [*arguments, "--parser", "model", "--device", "cpu", *extra])


def test_a_gold_value_outside_the_scheme_is_a_warning_with_counts_and_the_pair_is_labelled(smoke_model, tmp_path):
    source = glue_file(tmp_path)
    lines = source.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1].rsplit("\t", 1)[0] + "\tmaybe"  # one row's gold is in no scheme
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = label_command(source, tmp_path / "out.parquet", smoke_model)
    assert result.exit_code == 0 and f"{len(SCHEME_PAIRS)} labelled, 0 rejected" in result.output
    [warning] = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert str(source) in warning and "1 rows have gold labels outside the glue" in warning and "'maybe' 1" in warning
    assert f"on {len(SCHEME_PAIRS) - 1} pairs" in result.output


@pytest.mark.parametrize("ignore", [["--no-gold"], ["--label-column", "none"]])
def test_no_gold_ignores_the_column(smoke_model, tmp_path, ignore):
    result = label_command(glue_file(tmp_path), tmp_path / "out.parquet", smoke_model, *ignore)
    assert result.exit_code == 0, result.output
    assert "accuracy" not in result.output
    assert set(pq.read_table(tmp_path / "out.parquet").column("gold_label").to_pylist()) == {None}


def test_no_gold_with_a_label_column_is_a_usage_error(smoke_model, tmp_path):
    result = label_command(
        glue_file(tmp_path), tmp_path / "out.parquet", smoke_model, "--no-gold", "--label-column", "label"
    )
    assert result.exit_code == 2 and "--no-gold ignores the gold labels" in result.output


def test_a_run_over_its_share_of_rejected_rows_fails_after_writing_and_reporting(smoke_model, tmp_path):
    """Two of eight rows rejected (25%): passes by default, fails over --max-rejected 0.2 with the reasons, the
    option named, and the summary and output written all the same."""
    source = glue_file(tmp_path)
    lines = source.read_text(encoding="utf-8").splitlines()
    for row in (1, 2):
        index, _, hypothesis, gold = lines[row].split("\t")
        lines[row] = f"{index}\t \t{hypothesis}\t{gold}"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert label_command(source, tmp_path / "ok.parquet", smoke_model).exit_code == 0
    result = label_command(source, tmp_path / "out.parquet", smoke_model, "--max-rejected", "0.2")
    assert result.exit_code == EXIT_USER_ERROR, result.output
    assert "6 labelled, 2 rejected" in result.stdout and (tmp_path / "out.parquet").is_file()
    error = result.stderr.strip().splitlines()[-1]
    assert re.match(r"error: 2 of 8 rows rejected \(25\.0%, more than the 20% allowed: 2 empty_sentence\)", error)
    assert error.endswith("raise --max-rejected to accept such a file")


def test_rows_refused_for_length_name_the_option_in_the_summary(smoke_model, tmp_path):
    source = glue_file(tmp_path)
    result = label_command(source, tmp_path / "out.parquet", smoke_model, "--max-tokens", "6")
    assert result.exit_code == 0, result.output
    assert re.search(
        r"rejected too_long: \d+ \(a sentence over 6 tokens; raise the limit with --max-tokens\)", result.output
    )


def test_glue_index_is_the_id_column(smoke_model, tmp_path):
    label_command(glue_file(tmp_path), tmp_path / "out.parquet", smoke_model)
    assert pq.read_table(tmp_path / "out.parquet").column("pair_id").to_pylist() == [
        str(i) for i in range(len(SCHEME_PAIRS))
    ]


# ----------------------------------------------------------------------------- spinn parse


def test_parse_keeps_every_pair_of_a_two_way_file_and_says_its_labels_are_not_the_models(tmp_path):
    """A prepared split trains on the model's three classes: not_entailment is none of them, so those rows are
    written without a training label (and counted in a warning), never rejected, their gold value kept."""
    source = glue_file(tmp_path)
    arguments = ["parse", str(source), "--output-dir", str(tmp_path / "prepared"), "--trees", "none"]
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == 0, result.output
    labels = pq.read_table(tmp_path / "prepared" / "rte.parquet").column("label").to_pylist()
    assert labels == ["entailment" if gold == "entailment" else None for _, _, gold in SCHEME_PAIRS]
    kept = pq.read_table(tmp_path / "prepared" / "rte.parquet").column("gold").to_pylist()
    assert kept == ["entailment" if gold == "entailment" else "not_entailment" for _, _, gold in SCHEME_PAIRS]
    not_entailment = sum(gold != "entailment" for _, _, gold in SCHEME_PAIRS)
    assert f"{not_entailment} rows have gold labels that are not the model's three classes" in result.stderr
    assert "'not_entailment'" in result.stderr


# ----------------------------------------------------------------------------- every door, and where users look


MOSTLY_REJECTED = "mostly_rejected.csv"


def test_each_door_labels_a_two_way_file_alike_and_shows_its_accuracy_where_users_look(
    smoke_model, smoke_store, prefect_api, tmp_path
):
    """The three schemes' files through `spinn label --track`, the inbox flow and the MLflow pyfunc: the same
    labels and the same accuracy, equal to the hand count, in the CLI's summary, the MLflow runs (metric and
    artifact), index.json and the Prefect artifact. Beside them in the inbox, a file with all but one row
    rejected: labelled and published, its label-file run ends Failed with the reasons, the others Completed."""
    import mlflow
    import pandas as pd

    from flows.label_pairs import REFUSED, LabelRequest, label_pairs, read_index
    from spinn.labeling.track import AGREEMENT_ARTIFACT, LABELING_EXPERIMENT
    from tests.helpers import file_runs, run_table

    inbox, command = tmp_path / "inbox", tmp_path / "command"
    inbox.mkdir(), command.mkdir()
    sources = {scheme: make(inbox) for scheme, make in SCHEME_FILES.items()}
    mostly_rejected = [
        {"premise": "" if i else SCHEME_PAIRS[0][0], "hypothesis": SCHEME_PAIRS[0][1]} for i in range(10)
    ]
    pd.DataFrame(mostly_rejected).to_csv(inbox / MOSTLY_REJECTED, index=False)

    by_command = {}
    for scheme, source in sources.items():
        output = command / f"{scheme}.parquet"
        result = label_command(source, output, smoke_model, "--track", model=smoke_model.registered)
        assert result.exit_code == 0, result.output
        by_command[scheme] = (pq.read_table(output).column("label").to_pylist(), hand_count(output))

    request = LabelRequest(
        inbox=inbox,
        outbox=tmp_path / "labelled",
        model=smoke_model.registered,
        settings={"parser": "model", "device": "cpu"},
        dask_workers=1,
        settle_seconds=0,
    )
    state = label_pairs(request, return_state=True)
    assert state.is_failed() and state.message.endswith(
        f"1 of 4 files refused for too many rejected rows (until the file or max_rejected changes): {MOSTLY_REJECTED}"
    )
    entries, index, table = state.result(raise_on_failure=False).entries, read_index(request.outbox), run_table(state)
    subflows = file_runs(state)
    for scheme, source in sources.items():
        labels, accuracy = by_command[scheme]
        output = request.outbox / f"{source.name}.labels.parquet"
        assert pq.read_table(output).column("label").to_pylist() == labels
        assert entries[source.name]["accuracy"] == pytest.approx(accuracy) == index[source.name]["accuracy"]
        assert entries[source.name]["label_scheme"] == scheme
        assert table[source.name]["accuracy"] == f"{accuracy:.1%}"
        assert subflows[f"label-{source.name}"].state.is_completed()

        served = mlflow.pyfunc.load_model(smoke_model.registered).predict(frame_of(source))
        assert served["label"].tolist() == labels
        gold = [row["gold_label"] for row in pq.read_table(output).to_pylist()]
        assert agreement(zip(gold, served["label"], strict=True)).accuracy == pytest.approx(accuracy)

    rejected = entries[MOSTLY_REJECTED]
    assert rejected["status"] == REFUSED == index[MOSTLY_REJECTED]["status"]
    assert "9 of 10 rows rejected (90.0%, more than the 10% allowed: 9 empty_sentence)" in rejected["error"]
    assert (rejected["labelled"], rejected["rejected"]) == (1, 9) and table[MOSTLY_REJECTED]["error"] == rejected[
        "error"
    ]
    assert subflows[f"label-{MOSTLY_REJECTED}"].state.is_failed()
    assert (request.outbox / f"{MOSTLY_REJECTED}.labels.parquet").is_file()

    runs = mlflow.search_runs(experiment_names=[LABELING_EXPERIMENT], output_format="list")
    client = mlflow.MlflowClient()
    for scheme, source in sources.items():
        logged = [run for run in runs if run.data.params["input"] == source.name]
        assert len(logged) == 2  # the command's and the flow's
        for run in logged:
            assert run.data.metrics["gold_accuracy"] == pytest.approx(by_command[scheme][1])
            assert "gold_macro_f1" in run.data.metrics
            [artifact] = [found.path for found in client.list_artifacts(run.info.run_id)]
            assert artifact == AGREEMENT_ARTIFACT
            recorded = json.loads(Path(client.download_artifacts(run.info.run_id, artifact, str(tmp_path))).read_text())
            assert recorded["scheme"] == scheme and recorded["accuracy"] == pytest.approx(by_command[scheme][1])


def frame_of(source: Path):
    """The file's pairs as the pyfunc takes them: premise and hypothesis columns of raw text."""
    import pandas as pd

    from spinn.data.sentence_pairs import InputPair, read_input_pairs

    pairs = [pair for pair in read_input_pairs(source) if isinstance(pair, InputPair)]
    return pd.DataFrame({"premise": [p.premise for p in pairs], "hypothesis": [p.hypothesis for p in pairs]})


def test_parse_takes_the_scheme_from_the_files_sidecar(tmp_path):
    """`0/1/2` in the sidecar (no option given): 0 is entailment and 2 contradiction, training labels both."""
    source = tmp_path / "numbered.tsv"
    source.write_text(
        "sentence1\tsentence2\tlabel\nA cat runs.\tAn animal runs.\t0\nA cat runs.\tA cat sleeps.\t2\n",
        encoding="utf-8",
    )
    (tmp_path / "numbered.tsv.columns.json").write_text(json.dumps({"label_scheme": "0/1/2"}), encoding="utf-8")
    arguments = ["parse", str(source), "--output-dir", str(tmp_path / "prepared"), "--trees", "none"]
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == 0 and "warning" not in result.stderr, result.output
    labels = pq.read_table(tmp_path / "prepared" / "numbered.parquet").column("label").to_pylist()
    assert labels == ["entailment", "contradiction"]


def test_label_takes_the_scheme_from_the_files_sidecar(smoke_model, tmp_path):
    """`1/0` in the sidecar, no option given: the labels are scored in the file's own classes, as README says."""
    glue = glue_file(tmp_path)
    numbered = tmp_path / "numbered.tsv"
    numbered.write_text(
        glue.read_text(encoding="utf-8").replace("\tnot_entailment", "\t0").replace("\tentailment", "\t1"),
        encoding="utf-8",
    )
    (tmp_path / "numbered.tsv.columns.json").write_text(json.dumps({"label_scheme": "1/0"}), encoding="utf-8")
    named = label_command(glue, tmp_path / "glue.parquet", smoke_model)
    result = label_command(numbered, tmp_path / "numbered.parquet", smoke_model)
    assert result.exit_code == 0 and "warning" not in result.stderr, result.output
    accuracy = re.search(r"accuracy against the file's gold labels \(glue: .*?\): ([0-9.]+)", named.output)
    assert f"(1/0: 1 / 0): {accuracy.group(1)} on {len(SCHEME_PAIRS)}" in result.output
