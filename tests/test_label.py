"""`spinn label`: every input row comes out once, labels do not depend on batch size, a killed job resumes exactly.

The model is the session's small spinn model trained on the smoke corpus; the
inputs are that corpus's test pairs written as CSV, JSONL and Parquet, plus
hand-made bad rows. Stanza runs for real from ../shared/stanza: once for the
module (`stanza_parses`, the smoke test pairs parsed into a cache that each
test copies, so a label run finds its parses there and loads no Stanza), and
again only in the tests about the parser's own running (workers, a killed job).
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import NoneType

import pyarrow.parquet as pq
import pytest

from spinn.data.schema import LABELS
from spinn.ground.errors import SpinnError, SpinnWarning
from spinn.labeling.label import label
from spinn.labeling.label_settings import LabelSettings
from spinn.labeling.published import rejects_file
from spinn.labeling.shard_plan import parts_folder
from spinn.parsing.parser_settings import ParserSettings
from spinn.trees.tokenize import tokenize
from spinn.trees.transitions import parse_binary
from tests.helpers import DAMAGES, damage_shard, smoke_pairs, stanza_dir, stop_before_the_merge, write_rows

TOLERANCE = 1e-5
KILL_SHARD_SIZE = 25
KILL_AFTER_SHARDS = 2
KILL_ROWS = 4 * KILL_SHARD_SIZE
"""The kill lands after two of four shards: two left to resume, each a parse of its own, whatever their size."""
POLL_S = 0.05
LABEL_TIMEOUT_S = 300
SIZES_ROWS = 30
"""The small sizes still split unevenly: four shards of 7 and one of 2, model batches of 3 within each, parser
batches of 5; the behaviour does not depend on the row count."""
CONCURRENT_ROWS = 300
"""Enough rows that a run is still labelling when a second one starts beside it."""
REJECT_TYPES = {
    "file": str,
    "line": int,
    "pair_id": (str, NoneType),  # None: the row's id could not be read (not JSON, no id value)
    "row": int,
    "field": (str, NoneType),  # None: the row as a whole is bad (not JSON, wrong field count)
    "reason": str,
    "message": str,
    "raw": str,
}
"""Every record in a label run's rejects file: where the row is, which field failed, why, and the row as read."""


WARM_PAIRS = 60
"""The smoke test pairs the module's Stanza parses cover: every test here labels some of the first 60."""


@pytest.fixture(scope="module")
def stanza_parses(smoke_model, tmp_path_factory) -> Path:
    """The module's one Stanza load: the first WARM_PAIRS smoke test pairs parsed into a cache."""
    from spinn.parsing.parser import SentenceParser

    cache = tmp_path_factory.mktemp("stanza-parses") / "parses.sqlite"
    rows = smoke_pairs(smoke_model, WARM_PAIRS)
    parsing = ParserSettings(stanza_dir=stanza_dir(), cache_path=cache, device="cpu", workers=1)
    with SentenceParser(parsing) as parser:
        parser.parse(row[side] for row in rows for side in ("premise", "hypothesis"))
    return cache


@pytest.fixture
def parse_cache(stanza_parses, tmp_path) -> Path:
    """tmp_path/parses.sqlite (where `settings` points), a copy of the module's Stanza parses."""
    return Path(shutil.copyfile(stanza_parses, tmp_path / "parses.sqlite"))


def settings(tmp_path: Path, **overrides) -> LabelSettings:
    parsing = ParserSettings(stanza_dir=stanza_dir(), cache_path=tmp_path / "parses.sqlite", device="cpu", workers=1)
    return LabelSettings(**{"parsing": parsing, "device": "cpu", **overrides})


def read_output(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_every_row_comes_out_once_with_its_id_label_probabilities_and_trees(smoke_model, tmp_path, suffix):
    rows = smoke_pairs(smoke_model, 30)
    source = write_rows(tmp_path / f"pairs{suffix}", rows)
    summary = label(source, smoke_model.checkpoint, tmp_path / "out.parquet", settings(tmp_path, parser="model"))
    labelled = read_output(tmp_path / "out.parquet")
    assert summary.labelled == len(labelled) == len(rows) and summary.rejected == 0
    assert [row["pair_id"] for row in labelled] == [row["id"] for row in rows]
    for row, given in zip(labelled, rows, strict=True):
        probabilities = [row[f"p_{name}"] for name in LABELS]
        assert sum(probabilities) == pytest.approx(1.0, abs=1e-5)
        assert row["label"] == LABELS[probabilities.index(max(probabilities))]
        assert row["gold_label"] == given["label"] and row["parser"] == "model"
        assert parse_binary(row["premise_tree"]).leaves() == given["premise"].replace(".", " .").split()
        assert str(smoke_model.checkpoint) in row["model"]


@pytest.mark.stanza
def test_stanza_trees_feed_the_model_and_are_recorded(smoke_model, tmp_path, parse_cache):
    from spinn.parsing.parser import SentenceParser

    rows = smoke_pairs(smoke_model, 12)
    label(
        write_rows(tmp_path / "pairs.jsonl", rows),
        smoke_model.checkpoint,
        tmp_path / "out.parquet",
        settings(tmp_path, parser="stanza"),
    )
    labelled = read_output(tmp_path / "out.parquet")
    parser = SentenceParser(ParserSettings(stanza_dir=stanza_dir(), cache_path=tmp_path / "parses.sqlite", workers=1))
    parsed = parser.parse(row["premise"] for row in rows)
    assert parser.stats.parsed == 0  # the labelling run cached every parse
    parser.close()
    assert [row["premise_tree"] for row in labelled] == [parsed[row["premise"]].binary_parse for row in rows]
    assert {row["parser"] for row in labelled} == {"stanza"}


@pytest.mark.parametrize("parser", [pytest.param("stanza", marks=pytest.mark.stanza), "model"])
def test_labels_do_not_depend_on_batch_size(smoke_model, tmp_path, parser, request):
    if parser == "stanza":
        request.getfixturevalue("parse_cache")
    source = write_rows(tmp_path / "pairs.parquet", smoke_pairs(smoke_model, 60))
    one = label(
        source, smoke_model.checkpoint, tmp_path / "one.parquet", settings(tmp_path, parser=parser, batch_size=1)
    )
    many = label(
        source, smoke_model.checkpoint, tmp_path / "many.parquet", settings(tmp_path, parser=parser, batch_size=256)
    )
    assert one.labelled == many.labelled == 60
    first, second = read_output(tmp_path / "one.parquet"), read_output(tmp_path / "many.parquet")
    assert [row["label"] for row in first] == [row["label"] for row in second]
    assert [row["premise_tree"] for row in first] == [row["premise_tree"] for row in second]
    for a, b in zip(first, second, strict=True):
        for name in LABELS:
            assert abs(a[f"p_{name}"] - b[f"p_{name}"]) <= TOLERANCE


@pytest.mark.parametrize("parser", [pytest.param("stanza", marks=[pytest.mark.slow, pytest.mark.stanza]), "model"])
def test_labels_and_trees_do_not_depend_on_workers_shard_or_batch_sizes(smoke_model, tmp_path, parser):
    """One parser process, big shards and batches, against two worker processes, small shards and batches
    (parses ahead of the model): each run parses for itself (no shared cache), so Stanza really runs twice.
    Without Stanza (parser model) the workers tokenize."""
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, SIZES_ROWS))
    runs = {
        "one": {"shard_size": 1000, "batch_size": 256, "parsing": {"workers": 1, "batch_size": 256}},
        "many": {"shard_size": 7, "batch_size": 3, "parsing": {"workers": 2, "batch_size": 5}},
    }
    outputs = {}
    for name, changes in runs.items():
        changes["parsing"]["cache_path"] = None
        chosen = settings(tmp_path, parser=parser, threads=1).replace(**changes)
        summary = label(source, smoke_model.checkpoint, tmp_path / f"{name}.parquet", chosen)
        assert summary.labelled == SIZES_ROWS and summary.parse_seconds > 0
        assert summary.parser_workers == changes["parsing"]["workers"]
        assert ("2 workers" in summary.report()[-1]) == (name == "many")
        outputs[name] = read_output(tmp_path / f"{name}.parquet")
    first, second = outputs["one"], outputs["many"]
    for name in ("pair_id", "label", "premise_tree", "hypothesis_tree"):
        assert [row[name] for row in first] == [row[name] for row in second]
    for a, b in zip(first, second, strict=True):
        for name in LABELS:
            assert abs(a[f"p_{name}"] - b[f"p_{name}"]) <= TOLERANCE


@pytest.mark.stanza
def test_progress_bars_show_pairs_per_second_for_both_phases(smoke_model, tmp_path, parse_cache, capsys):
    """Rows the reader or the parser rejects count too, so both bars end full."""
    rows = smoke_pairs(smoke_model, 10)
    rows[3]["premise"] = ""
    source = write_rows(tmp_path / "pairs.jsonl", rows)
    source.write_text(source.read_text() + '{"id": "broken", "premise": \n', encoding="utf-8")
    summary = label(
        source, smoke_model.checkpoint, tmp_path / "out.parquet", settings(tmp_path, parser="stanza"), progress=True
    )
    bars = capsys.readouterr().err
    assert "parse: 100%" in bars and "model: 100%" in bars and "11/11" in bars and "pairs/s" in bars
    assert summary.rejected == 2
    assert summary.seconds > 0 and summary.pairs_per_second == pytest.approx(11 / summary.seconds)
    assert any("end to end" in line for line in summary.report())


def test_progress_logs_a_line_every_so_often_instead_of_bars(capsys):
    from spinn.labeling.label_progress import LabelProgress, ShardShare

    lines = []
    progress = LabelProgress(10, bars=False, log=lines.append, every_s=0.0)
    share = ShardShare(progress, 10)
    share(3)  # three sentences parsed before the parser said how many it would parse
    share.known(6)
    share(3)
    share.finish()
    progress.labelled(10)
    progress.close()
    assert lines[-1].startswith("parse 10/10 (") and "model 10/10 (" in lines[-1] and "pairs/s" in lines[-1]
    assert [line.split()[1] for line in lines[:3]] == ["5/10", "10/10", "10/10"]
    assert capsys.readouterr().err == ""


def is_reject_record(record: dict) -> bool:
    return record.keys() == REJECT_TYPES.keys() and all(
        isinstance(record[name], kind) for name, kind in REJECT_TYPES.items()
    )


@pytest.mark.stanza
def test_bad_rows_are_listed_with_reasons_while_good_rows_are_labelled(smoke_model, tmp_path, parse_cache):
    good = smoke_pairs(smoke_model, 5)
    lines = [json.dumps(row) for row in good[:2]]
    lines += [
        '{"id": "broken", "premise": ',  # not JSON
        json.dumps({"id": "empty", "premise": "  ", "hypothesis": "A dog runs ."}),
        json.dumps({"id": "long", "premise": " ".join(["dog"] * 40) + " .", "hypothesis": "A dog runs ."}),
        json.dumps({"id": "nohyp", "premise": "A dog runs ."}),
        json.dumps(good[2]),
        json.dumps({**good[3], "id": good[0]["id"]}),
    ]  # duplicate id
    source = tmp_path / "pairs.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    parsing = ParserSettings(stanza_dir=stanza_dir(), cache_path=parse_cache, device="cpu", max_tokens=20, workers=1)
    summary = label(
        source, smoke_model.checkpoint, tmp_path / "out.parquet", LabelSettings(parsing=parsing, device="cpu")
    )
    rejects = [json.loads(line) for line in rejects_file(tmp_path / "out.parquet").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [
        (3, "malformed_json"),
        (4, "empty_sentence"),
        (5, "too_long"),
        (6, "missing_field"),
        (8, "duplicate_id"),
    ]
    assert all(is_reject_record(r) for r in rejects)  # the reader's rejects and the parser's alike
    assert [row["pair_id"] for row in read_output(tmp_path / "out.parquet")] == [r["id"] for r in good[:3]]
    assert summary.rows == len(lines) == summary.labelled + summary.rejected


def test_every_reject_names_its_pair_id_at_the_top_level(smoke_model, tmp_path):
    """The reader's rejects and the tokenizer's (too many tokens) alike: `jq .pair_id` joins them to the input."""
    good = smoke_pairs(smoke_model, 2)
    lines = [
        json.dumps(good[0]),
        '{"id": "broken", "premise": ',  # not JSON: no id to name
        json.dumps({"id": "long", "premise": " ".join(["dog"] * 40) + " .", "hypothesis": "A dog runs ."}),
        json.dumps({"id": "nohyp", "premise": "A dog runs ."}),
        json.dumps({**good[1], "id": good[0]["id"]}),  # a duplicate names the id it repeats
    ]
    source = tmp_path / "pairs.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    chosen = settings(tmp_path, parser="model").replace(parsing={"max_tokens": 20})
    label(source, smoke_model.checkpoint, tmp_path / "out.parquet", chosen)
    rejects = [json.loads(line) for line in rejects_file(tmp_path / "out.parquet").read_text().splitlines()]
    assert [(r["reason"], r["pair_id"]) for r in rejects] == [
        ("malformed_json", None),
        ("too_long", "long"),
        ("missing_field", "nohyp"),
        ("duplicate_id", good[0]["id"]),
    ]
    assert all(is_reject_record(r) for r in rejects)


def test_sentences_whose_tree_the_model_builds_reach_it_as_tokens_only(smoke_model, tmp_path, monkeypatch):
    """With parser `model` no sentence has a parse: the model gets its tokens and no stand-in tree (nothing
    it could read by mistake), and every recorded tree is over exactly the sentence's tokens."""
    import spinn.labeling.labelled_rows as labelled_rows_module
    from spinn.inference.predict import predict

    seen = []

    def recorded(model, examples, *args, **kwargs):
        seen.extend(examples)
        return predict(model, examples, *args, **kwargs)

    monkeypatch.setattr(labelled_rows_module, "predict", recorded)
    rows = smoke_pairs(smoke_model, 5)
    source = write_rows(tmp_path / "pairs.csv", rows)
    label(source, smoke_model.checkpoint, tmp_path / "out.parquet", settings(tmp_path, parser="model"))
    assert len(seen) == len(rows)
    assert all(example.premise_transitions == () == example.hypothesis_transitions for example in seen)
    for row, given in zip(read_output(tmp_path / "out.parquet"), rows, strict=True):
        for name in ("premise", "hypothesis"):
            assert parse_binary(row[f"{name}_tree"]).leaves() == tokenize(given[name])


def test_a_registered_model_is_named_by_its_resolved_version(smoke_model, smoke_store, tmp_path):
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 5))
    summary = label(source, smoke_model.registered, tmp_path / "out.parquet", settings(tmp_path, parser="model"))
    assert summary.model == "models:/label-test/1"
    assert {row["model"] for row in read_output(tmp_path / "out.parquet")} == {"models:/label-test/1"}


def label_command(source: Path, output: Path, smoke_model, tmp_path: Path, workers: int = 1) -> list[str]:
    return [
        str(Path(sys.executable).parent / "spinn"),
        "label",
        str(source),
        "--model",
        str(smoke_model.checkpoint),
        "--output",
        str(output),
        "--parser",
        "stanza",
        "--shard-size",
        str(KILL_SHARD_SIZE),
        "--batch-size",
        "8",
        "--device",
        "cpu",
        "--stanza-dir",
        str(stanza_dir()),
        "--parse-cache",
        str(tmp_path / "parses.sqlite"),
        "--workers",
        str(workers),
    ]


@pytest.mark.slow
@pytest.mark.stanza
@pytest.mark.parametrize("workers", [1, 2])
def test_a_killed_job_resumes_without_duplicates_or_gaps(smoke_model, tmp_path, workers):
    """With two workers the kill also lands while they parse ahead; they go with the job."""
    import psutil

    rows = smoke_pairs(smoke_model, KILL_ROWS)
    rows[7]["premise"] = ""  # one reject, so rejects are checked for exactness too
    source = write_rows(tmp_path / "pairs.jsonl", rows)
    output = tmp_path / "out.parquet"
    command = label_command(source, output, smoke_model, tmp_path, workers)
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    deadline = time.monotonic() + LABEL_TIMEOUT_S
    while len(list(parts_folder(output).glob("labels-*.parquet"))) < KILL_AFTER_SHARDS:
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(POLL_S)
    children = psutil.Process(process.pid).children(recursive=True)
    parsers = [child for child in children if "resource_tracker" not in " ".join(child.cmdline())]
    assert len(parsers) == (workers if workers > 1 else 0)
    process.send_signal(signal.SIGKILL)
    process.wait()
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"worker processes outlived the killed job: {alive}"
    assert not output.exists()
    done = spinn_label_here(command)
    assert done.exit_code == 0, done.output
    assert "reused from an earlier run" in done.stdout and " 0 reused" not in done.stdout
    labelled = [row["pair_id"] for row in read_output(output)]
    rejected = [json.loads(line)["row"] for line in rejects_file(output).read_text().splitlines()]
    assert rejected == [8]
    assert labelled == [row["id"] for index, row in enumerate(rows) if index != 7]
    assert not parts_folder(output).exists()  # what the resume needed goes once the output is published


def test_resuming_with_other_arguments_is_refused(smoke_model, tmp_path, monkeypatch):
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 10))
    output = tmp_path / "out.parquet"
    with monkeypatch.context() as patched, pytest.raises(SpinnError, match="stopped before the merge"):
        stop_before_the_merge(patched)
        label(source, smoke_model.checkpoint, output, settings(tmp_path, parser="model", shard_size=4))
    with pytest.raises(SpinnError, match="holds shards of another run .*shard_size"):
        label(source, smoke_model.checkpoint, output, settings(tmp_path, parser="model", shard_size=5))


def test_a_published_output_is_not_replaced_by_a_run_with_other_arguments(smoke_model, tmp_path):
    """Its shards are gone, but its record keeps the arguments: refused as a resume with other ones is."""
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 10))
    output = tmp_path / "out.parquet"
    label(source, smoke_model.checkpoint, output, settings(tmp_path, parser="model", shard_size=4))
    before = output.read_bytes()
    refused = re.escape(f"{output}: holds the labels of another run (different shard_size")
    with pytest.raises(SpinnError, match=refused):
        label(source, smoke_model.checkpoint, output, settings(tmp_path, parser="model", shard_size=5))
    assert output.read_bytes() == before


# ----------------------------------------------------------------------------- after the publish


def published_files(output: Path) -> list[str]:
    return sorted(path.name for path in output.parent.iterdir() if path.name.startswith(output.stem))


def test_a_published_output_keeps_no_shards_and_rerun_as_it_was_does_nothing(smoke_model, tmp_path, monkeypatch):
    """The parts folder held a second copy of every row; the record beside the output stays instead, and
    the same command again changes nothing, loads no model, labels nothing and reports the first run's
    counts."""
    import spinn.labeling.labeller as labeller_module

    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 30))
    output = tmp_path / "out.parquet"
    chosen = settings(tmp_path, parser="model", shard_size=10)
    first = label(source, smoke_model.checkpoint, output, chosen)
    assert not parts_folder(output).exists()
    assert published_files(output) == ["out.parquet", "out.rejects.jsonl", "out.run.json"]
    published = output.stat()

    def no_labelling(*args, **kwargs):
        raise AssertionError("a finished output was labelled again, or its model loaded")

    monkeypatch.setattr(labeller_module, "load_model", no_labelling)
    again = label(source, smoke_model.checkpoint, output, chosen, run_shards=no_labelling)
    assert (output.stat().st_ino, output.stat().st_mtime_ns) == (published.st_ino, published.st_mtime_ns)
    assert again.published_before and again.shards_reused == again.shards == first.shards == 3
    figures = ("rows", "labelled", "rejected", "reasons", "label_shares", "mean_top_probability", "oov_share")
    assert [getattr(again, name) for name in figures] == [getattr(first, name) for name in figures]
    assert again.model == first.model and again.input_sha256 == first.input_sha256
    assert any(line.startswith("nothing to do: ") for line in again.report())
    assert not parts_folder(output).exists()


def test_a_deleted_output_is_labelled_again_from_the_start(smoke_model, tmp_path):
    rows = smoke_pairs(smoke_model, 20)
    source = write_rows(tmp_path / "pairs.csv", rows)
    output = tmp_path / "out.parquet"
    label(source, smoke_model.checkpoint, output, settings(tmp_path, parser="model", shard_size=10))
    output.unlink()
    again = label(source, smoke_model.checkpoint, output, settings(tmp_path, parser="model", shard_size=10))
    assert not again.published_before and again.shards_reused == 0
    assert_every_row_once_in_order(output, rows)


def test_a_run_killed_after_its_publish_leaves_a_rerun_nothing_but_clearing_its_shards(
    smoke_model, tmp_path, monkeypatch
):
    """Killed between the publish (output, rejects and record at once) and emptying the parts folder."""
    import spinn.labeling.published as published_module

    rows = smoke_pairs(smoke_model, 20)
    source = write_rows(tmp_path / "pairs.csv", rows)
    output = tmp_path / "out.parquet"
    chosen = settings(tmp_path, parser="model", shard_size=10)

    def killed(parts):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(published_module, "clear_parts", killed)
        label(source, smoke_model.checkpoint, output, chosen)
    assert (parts_folder(output) / "labels-00001.parquet").is_file()
    again = label(source, smoke_model.checkpoint, output, chosen)
    assert again.published_before and not parts_folder(output).exists()
    assert_every_row_once_in_order(output, rows)


# ----------------------------------------------------------------------------- two runs, one output


def model_label_command(source: Path, output: Path, smoke_model, shard_size: int) -> list[str]:
    """`spinn label` with the model building its own trees: no Stanza, so two runs start in seconds."""
    return [
        str(Path(sys.executable).with_name("spinn")),
        "label",
        str(source),
        "--model",
        str(smoke_model.checkpoint),
        "--output",
        str(output),
        "--parser",
        "model",
        "--shard-size",
        str(shard_size),
        "--batch-size",
        "8",
        "--device",
        "cpu",
    ]


def many_pairs(smoke_model, count: int) -> list[dict]:
    """`count` pairs: the smoke test pairs over and over, each copy with its own id."""
    pairs = smoke_pairs(smoke_model, count)
    return [{**pairs[i % len(pairs)], "id": f"{pairs[i % len(pairs)]['id']}-{i // len(pairs)}"} for i in range(count)]


def spinn_label_here(command: list[str]):
    """`command` (a `spinn label` command line) run in this process: for a run that is not itself the one killed,
    stopped or raced (a child process costs seconds of imports). Its click Result: exit_code, stdout, stderr."""
    from click.testing import CliRunner

    from spinn.cli import main

    return CliRunner().invoke(main, command[1:])


def one_thread() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def assert_every_row_once_in_order(output: Path, rows: list[dict]) -> None:
    assert [row["pair_id"] for row in read_output(output)] == [row["id"] for row in rows]
    assert rejects_file(output).read_text() == ""


def test_a_second_run_on_the_same_output_is_refused_at_once_naming_the_first(smoke_model, tmp_path):
    """The first run is stopped (SIGSTOP) while it holds the output, so the second meets it for certain."""
    rows = many_pairs(smoke_model, CONCURRENT_ROWS)
    source = write_rows(tmp_path / "pairs.jsonl", rows)
    output = tmp_path / "out.parquet"
    command = model_label_command(source, output, smoke_model, shard_size=5)
    first = start_until_a_shard_is_labelled(command, output)
    try:
        first.send_signal(signal.SIGSTOP)
        second = spinn_label_here(command)
    finally:
        first.send_signal(signal.SIGCONT)
    assert second.exit_code == 1, second.output
    message = second.stderr.strip()
    assert "\n" not in message and f"pid {first.pid} on " in message
    assert f"{output}: being written by another run" in message
    assert first.wait(timeout=LABEL_TIMEOUT_S) == 0, first.stderr.read()
    assert_every_row_once_in_order(output, rows)


def start_until_a_shard_is_labelled(command: list[str], output: Path) -> subprocess.Popen:
    """`spinn label` started in the background, returned once its first labelled shard is in the parts folder."""
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=one_thread())
    deadline = time.monotonic() + LABEL_TIMEOUT_S
    while not list(parts_folder(output).glob("labels-*.parquet")):
        assert run.poll() is None, run.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(POLL_S)
    return run


def test_a_run_killed_before_its_publish_is_finished_by_a_rerun_that_then_clears_its_shards(smoke_model, tmp_path):
    """kill -9 while shards are being labelled (no Stanza: the model builds its trees): the parts folder is
    what the rerun resumes from, and it goes once the rerun has published every row once."""
    rows = many_pairs(smoke_model, CONCURRENT_ROWS)
    source = write_rows(tmp_path / "pairs.jsonl", rows)
    output = tmp_path / "out.parquet"
    command = model_label_command(source, output, smoke_model, shard_size=5)
    first = start_until_a_shard_is_labelled(command, output)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert not output.exists() and (parts_folder(output) / "plan.json").is_file()
    again = spinn_label_here(command)
    assert again.exit_code == 0, again.output
    assert " 0 reused" not in again.stdout
    assert_every_row_once_in_order(output, rows)
    assert not parts_folder(output).exists()


def test_two_runs_started_together_never_mix_their_shards(smoke_model, tmp_path):
    """The issue's case: the same input and output, shard sizes 5 and 50, started at the same moment."""
    rows = many_pairs(smoke_model, CONCURRENT_ROWS)
    source = write_rows(tmp_path / "pairs.jsonl", rows)
    output = tmp_path / "out.parquet"
    runs = [
        subprocess.Popen(
            model_label_command(source, output, smoke_model, shard_size),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=one_thread(),
        )
        for shard_size in (5, 50)
    ]
    results = [(run.wait(timeout=LABEL_TIMEOUT_S), *run.communicate()) for run in runs]
    assert sorted(code for code, _, _ in results)[0] == 0
    for code, _, stderr in results:
        if code != 0:
            assert code == 1 and "\n" not in stderr.strip()
            assert any(busy in stderr for busy in ("in use by", "holds shards of", "being written by"))
    assert_every_row_once_in_order(output, rows)


def test_a_lock_left_by_a_dead_run_is_taken_over(smoke_model, tmp_path, monkeypatch):
    """The lock's record names this run while it works (read as it plans); the folder goes once it is done."""
    import spinn.labeling.label as label_module
    from spinn.ground.io import HOST, LOCK_NAME
    from spinn.labeling.shard_plan import plan_shards

    gone = subprocess.Popen(["true"])
    gone.wait()
    output = tmp_path / "out.parquet"
    parts_folder(output).mkdir()
    stale = {"pid": str(gone.pid), "host": HOST, "started": "2026-01-01 00:00:00", "command": "spinn label"}
    (parts_folder(output) / LOCK_NAME).write_text(json.dumps(stale))
    holders = []

    def planning(*args, **kwargs):
        holders.append(json.loads((parts_folder(output) / LOCK_NAME).read_text())["pid"])
        return plan_shards(*args, **kwargs)

    monkeypatch.setattr(label_module, "plan_shards", planning)
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 10))
    summary = label(source, smoke_model.checkpoint, output, settings(tmp_path, parser="model"))
    assert summary.labelled == 10
    assert holders == [str(os.getpid())]
    assert not parts_folder(output).exists()


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_shard_left_by_a_killed_run_is_named_and_labelled_again(smoke_model, tmp_path, monkeypatch, damage):
    """A truncated or hand-edited shard, a deleted input shard, a record that is not JSON: the rerun of the
    same command names the damaged file in a warning and in its summary and redoes that part, and the output
    still holds every row once. (An earlier output at the same path stays as it was until then.)"""
    rows = smoke_pairs(smoke_model, 30)
    source = write_rows(tmp_path / "pairs.csv", rows)
    output = tmp_path / "out.parquet"
    output.write_bytes(b"an earlier output")
    chosen = settings(tmp_path, parser="model", shard_size=10)
    with monkeypatch.context() as patched, pytest.raises(SpinnError, match="stopped before the merge"):
        stop_before_the_merge(patched)
        label(source, smoke_model.checkpoint, output, chosen)
    assert output.read_bytes() == b"an earlier output"
    damaged = damage_shard(parts_folder(output), damage, 1)
    with pytest.warns(SpinnWarning, match=re.escape(damaged)):
        summary = label(source, smoke_model.checkpoint, output, chosen)
    assert_every_row_once_in_order(output, rows)
    assert [Path(line.split(": ")[0]).name for line in summary.repaired] == [damaged]
    assert f"repaired: {summary.repaired[0]}" in summary.report()
    redone = 3 if damage == "plan not JSON" else 1 if damage.startswith(("label", "a row")) else 0
    assert summary.shards_reused == 3 - redone


def test_a_shard_is_labelled_with_the_collector_paused_and_it_runs_again_after(smoke_model, tmp_path, monkeypatch):
    """Each pair's objects make no cycles, so a shard's collections would walk them for nothing; the run must
    hand the collector back as it found it."""
    import spinn.parsing.parse as parse_module

    enabled = []

    def tokens(text: str) -> list[str]:
        enabled.append(gc.isenabled())
        return tokenize(text)

    monkeypatch.setattr(parse_module, "tokenize", tokens)
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 5))
    label(source, smoke_model.checkpoint, tmp_path / "out.parquet", settings(tmp_path, parser="model", shard_size=2))
    assert enabled and not any(enabled)
    assert gc.isenabled()
