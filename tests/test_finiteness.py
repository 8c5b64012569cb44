"""Every reader checks what it reads. A model whose weights are not finite (one infinite
weight, one NaN word vector) is refused where it is loaded, by every command that loads one and by the
served MLflow model; a premise or hypothesis that is not text is rejected as what it is, by every pairs
reader and by the served model, instead of being labelled as the text "inf".
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main
from spinn.ground.errors import SpinnError
from spinn.model.checkpoint import load_checkpoint, save_checkpoint
from tests.helpers import one_error_line, smoke_pairs, write_rows

EMBEDDING = "embedding.vectors.weight"
"""The word vectors' tensor in a checkpoint's weights."""


def damaged(smoke_model, folder: Path, damage: str) -> tuple[Path, str]:
    """A copy of the smoke model with one infinite weight, or one word's vector NaN; the tensor's name and
    how many of its values are damaged, as the refusal says them."""
    saved = load_checkpoint(smoke_model.checkpoint)
    weights = dict(saved.model_state)
    name = (
        EMBEDDING
        if damage == "nan-word-vector"
        else next(key for key, tensor in weights.items() if tensor.is_floating_point() and key != EMBEDDING)
    )
    tensor = weights[name].clone()
    if damage == "nan-word-vector":
        tensor[len(tensor) // 2] = math.nan
    else:
        tensor.view(-1)[0] = math.inf
    weights[name] = tensor
    path = save_checkpoint(folder / f"{damage}.pt", dataclasses.replace(saved, model_state=weights))
    count = tensor.shape[1] if damage == "nan-word-vector" else 1
    return path, f"{name} holds {count} NaN or infinite value{'' if count == 1 else 's'}"


LOADERS: dict[str, Callable[[Path, Path, object], list[str]]] = {
    "evaluate": lambda m, d, s: (
        ["evaluate", "--model", str(m), "--data", str(s.prepared / "dev.parquet")]
        + ["--output", str(d / "m.json"), "--no-track"]
    ),
    "label": lambda m, d, s: (
        ["label", str(d / "pairs.csv"), "--model", str(m), "--output", str(d / "o.parquet")] + ["--parser", "model"]
    ),
    "trees": lambda m, d, s: ["trees", str(d / "pairs.csv"), "--model", str(m), "--output", str(d / "t.jsonl")],
    "bench-label": lambda m, d, s: ["bench-label", str(d / "pairs.csv"), "--model", str(m), "--parser", "model"],
}
"""Every command that loads a trained model (the served model is the case below)."""


@pytest.mark.parametrize("damage", ["inf-weight", "nan-word-vector"])
@pytest.mark.parametrize("command", LOADERS)
def test_a_model_whose_weights_are_not_finite_is_refused_where_it_is_loaded(
    command, damage, smoke_model, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    model, name = damaged(smoke_model, tmp_path, damage)
    write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 3))
    result = CliRunner().invoke(main, LOADERS[command](model, tmp_path, smoke_model))
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    assert one_error_line(result.stderr).startswith(f"error: {model}: weights are not finite ({name})")
    assert not [path for path in tmp_path.iterdir() if path.suffix in (".json", ".parquet", ".jsonl")]


@pytest.mark.parametrize("damage", ["inf-weight", "nan-word-vector"])
def test_the_served_model_refuses_weights_that_are_not_finite_as_it_loads(damage, smoke_model, tmp_path):
    from mlflow.pyfunc import PythonModelContext

    from spinn.serving.pyfunc import SpinnModel
    from spinn.tracking.register import CHECKPOINT_ARTIFACT

    model, name = damaged(smoke_model, tmp_path, damage)
    with pytest.raises(SpinnError, match=re.escape(f"weights are not finite ({name})")):
        SpinnModel().load_context(PythonModelContext({CHECKPOINT_ARTIFACT: str(model)}, {}))


NOT_TEXT = [(math.inf, "a number"), (7, "a number"), (True, "true or false"), (["A", "dog"], "a list")]
"""A premise that is not text, and what its reject calls it."""


def pairs_file(path: Path, premise: object) -> Path:
    """One pair whose premise is `premise`, then a good pair, in the format `path`'s suffix names (Parquet
    keeps one type per column: the good pair's premise is then of the same kind)."""
    if path.suffix == ".parquet":
        pq.write_table(pa.table({"premise": [premise, premise], "hypothesis": ["Dogs run.", "Dogs sit."]}), path)
    else:
        rows = [{"premise": premise, "hypothesis": "Dogs run."}, {"premise": "A dog runs.", "hypothesis": "Dogs sit."}]
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize(("premise", "kind"), NOT_TEXT)
def test_every_pairs_reader_rejects_a_sentence_that_is_not_text_as_what_it_is(suffix, premise, kind, tmp_path):
    """The one reader of sentence pairs (label, trees, parse, bench-label, the label flow); CSV and TSV
    cells are always text."""
    from spinn.data.rejects import Reject
    from spinn.data.sentence_pairs import read_input_pairs

    found = list(read_input_pairs(pairs_file(tmp_path / f"pairs{suffix}", premise)))
    reject = found[0]
    assert isinstance(reject, Reject), found
    assert (reject.reason.value, reject.field, reject.message) == (
        "invalid_field",
        "premise",
        f"field 'premise' is {kind}, not text",
    )


@pytest.mark.parametrize(("premise", "kind"), NOT_TEXT)
def test_prepare_rejects_a_sentence_that_is_not_text_as_what_it_is(premise, kind, tmp_path):
    from spinn.data.prepare import PrepareSettings, prepare

    record = {
        "gold_label": "entailment",
        "sentence1": "A dog runs.",
        "sentence1_binary_parse": "( ( A dog ) ( runs . ) )",
        "sentence2": "Animals move.",
        "sentence2_binary_parse": "( Animals ( move . ) )",
    }
    lines = [{**record, "pairID": "good"}, {**record, "pairID": "bad", "sentence1": premise}]
    corpus = tmp_path / "dev.jsonl"
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = prepare(corpus, tmp_path / "out", PrepareSettings(workers=1, max_reject_ratio=1))
    (reject,) = [json.loads(line) for line in summary.rejects.read_text().splitlines()]
    assert (reject["reason"], reject["message"]) == ("invalid_field", f"field 'sentence1' is {kind}, not text")


def test_the_served_model_rejects_a_sentence_that_is_not_text(smoke_store, smoke_model):
    import mlflow.pyfunc

    mlflow.set_tracking_uri(smoke_store)  # MLflow keeps the last URI any earlier test set in this process
    served = mlflow.pyfunc.load_model(smoke_model.registered)
    frame = pd.DataFrame(
        {"premise": [math.inf, 7, "A dog runs."], "hypothesis": [-math.inf, "Dogs run.", "An animal moves."]}
    )
    answer = served.predict(frame)
    assert list(answer["rejected"]) == ["invalid_field", "invalid_field", None]
    assert answer["label"][2] is not None and answer["label"][:2].isna().all()


def test_probabilities_that_are_not_finite_are_never_written():
    """Finite weights can still overflow: label's last guard names the row (it met none in the cases above,
    which loading refuses first)."""
    import numpy

    from spinn.inference.finite import check_probabilities

    probabilities = numpy.array([[0.2, 0.3, 0.5], [math.nan, 0.5, 0.5]])
    with pytest.raises(SpinnError, match="row 7: model m.pt gives probabilities that are not finite"):
        check_probabilities(probabilities, [4, 7], "m.pt")
    check_probabilities(probabilities[:1], [4], "m.pt")
