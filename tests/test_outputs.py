"""No command destroys its input, and every publishing command holds its outputs'
locks (spinn.ground.io.publishing), checked over every command that publishes through it.

Each case runs the command in-process on a file holding bytes no stage could write, then checks the one
`error:` line, exit status 1, and that the input still holds those bytes. train's run folder is held by its
own folder lock (lock_folder), so BUSY lists train only through that lock's own tests.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main
from spinn.ground.io import file_digest, publishing

PRECIOUS = b"precious: no stage writes this\n"
Case = Callable[[Path], list[str]]
SAME_FILE: dict[str, Case] = {
    "prepare-into-its-rejects": lambda d: [
        "prepare",
        str(d / "x.rejects.jsonl"),
        "--output-dir",
        str(d),
        "--split",
        "x",
    ],
    "parse-onto-itself": lambda d: ["parse", str(d / "s.parquet"), "--output-dir", str(d), "--split", "s"],
    "download-onto-its-copy": lambda d: ["download", "--raw-dir", str(d), "--file", str(d / "snli_1.0.zip")],
    "embeddings-onto-its-vocab": lambda d: [
        "embeddings",
        "--vocab",
        str(d / "v.json"),
        "--cache-dir",
        str(d / "v.json"),
    ],
    "evaluate-onto-its-vocab": lambda d: [
        "evaluate",
        "--model",
        str(d / "m.pt"),
        "--data",
        str(d / "s.parquet"),
        "--vocab",
        str(d / "v.json"),
        "--output",
        str(d / "v.json"),
    ],
    "label-into-its-rejects": lambda d: [
        "label",
        str(d / "x.rejects.jsonl"),
        "--model",
        str(d / "m.pt"),
        "--output",
        str(d / "x.parquet"),
    ],
    "train-metrics-onto-its-dev": lambda d: [
        "train",
        "--train",
        str(d / "s.parquet"),
        "--dev",
        str(d / "train.json"),
        "--metrics-dir",
        str(d),
    ],
    "train-run-folder-onto-its-vocab": lambda d: [
        "train",
        "--train",
        str(d / "s.parquet"),
        "--dev",
        str(d / "s.parquet"),
        "--vocab",
        str(d / "last.pt"),
        "--output-dir",
        str(d),
    ],
    "trees-onto-its-input": lambda d: [
        "trees",
        str(d / "x.jsonl"),
        "--model",
        str(d / "m.pt"),
        "--output",
        str(d / "x.jsonl"),
    ],
    "trees-onto-its-model": lambda d: [
        "trees",
        str(d / "x.jsonl"),
        "--model",
        str(d / "m.pt"),
        "--output",
        str(d / "m.pt"),
    ],
}
"""Each publishing command told to write over what it reads (or the file that belongs with it)."""
WRONG_KIND: dict[str, Case] = {
    "vocab-onto-itself": lambda d: ["vocab", str(d / "s.parquet"), "--output", str(d / "s.parquet")],
    "vocab-onto-its-rejects": lambda d: ["vocab", str(d / "s.parquet"), "--output", str(d / "s.rejects.jsonl")],
}
"""Outputs over an input that the output's kind refuses first: vocab writes JSON, so --output ends .json."""
NOT_A_FILE_NAME: dict[str, Case] = {
    "prepare-split-outside": lambda d: ["prepare", str(d / "x.jsonl"), "--output-dir", str(d / "o"), "--split", "../x"],
    "parse-split-outside": lambda d: ["parse", str(d / "x.jsonl"), "--output-dir", str(d / "o"), "--split", "../../x"],
    "prepare-split-dot-dot": lambda d: ["prepare", str(d / "x.jsonl"), "--output-dir", str(d / "o"), "--split", ".."],
    "download-archive-outside": lambda d: ["download", "--raw-dir", str(d / "o"), "--archive", "../x.zip"],
    "prepare-split-newline": lambda d: ["prepare", str(d / "x.jsonl"), "--output-dir", str(d / "o"), "--split", "a\nb"],
    "parse-split-tab": lambda d: ["parse", str(d / "x.jsonl"), "--output-dir", str(d / "o"), "--split", "a\tb"],
    "download-archive-newline": lambda d: ["download", "--raw-dir", str(d / "o"), "--archive", "x\n.zip"],
}
BUSY: dict[str, tuple[Case, Callable[[Path], Path]]] = {
    "prepare": (
        lambda d: ["prepare", str(d / "x.jsonl"), "--output-dir", str(d / "o")],
        lambda d: d / "o" / "x.parquet",
    ),
    "parse": (
        lambda d: ["parse", str(d / "x.jsonl"), "--output-dir", str(d / "o")],
        lambda d: d / "o" / "x.rejects.jsonl",
    ),
    "vocab": (
        lambda d: ["vocab", str(d / "s.parquet"), "--output", str(d / "o" / "v.json")],
        lambda d: d / "o" / "v.json",
    ),
    "download": (
        lambda d: ["download", "--raw-dir", str(d / "o"), "--file", str(d / "c.zip")],
        lambda d: d / "o" / "snli_1.0.zip",
    ),
    "embeddings": (
        lambda d: ["embeddings", "--vocab", str(d / "v.json"), "--cache-dir", str(d / "o")],
        lambda d: d / "o",
    ),
    "evaluate": (
        lambda d: [
            "evaluate",
            "--model",
            str(d / "m.pt"),
            "--data",
            str(d / "s.parquet"),
            "--output",
            str(d / "o" / "m.json"),
        ],
        lambda d: d / "o" / "m_report.json",
    ),
    "label": (
        lambda d: ["label", str(d / "x.jsonl"), "--model", str(d / "m.pt"), "--output", str(d / "o" / "l.parquet")],
        lambda d: d / "o" / "l.rejects.jsonl",
    ),
    "trees": (
        lambda d: ["trees", str(d / "x.jsonl"), "--model", str(d / "m.pt"), "--output", str(d / "o" / "t.txt")],
        lambda d: d / "o" / "t.txt",
    ),
}
"""Each publishing command, and one of its outputs another run is writing."""
INPUTS = (
    "x.rejects.jsonl",
    "x.jsonl",
    "x.csv",
    "s.parquet",
    "s.rejects.jsonl",
    "snli_1.0.zip",
    "c.zip",
    "v.json",
    "m.pt",
    "train.json",
    "last.pt",
)


def pairs_parquet() -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"premise": ["A dog runs."], "hypothesis": ["An animal moves."]}), sink)
    return sink.getvalue()


def precious_inputs(folder: Path) -> dict[Path, bytes]:
    """The inputs, readable where a stage reads its input before its outputs are checked (parse's header)."""
    pair = b'{"premise": "A dog runs.", "hypothesis": "An animal moves."}\n'
    readable = {"x.jsonl": pair, "s.parquet": pairs_parquet()}
    for name in INPUTS:
        (folder / name).write_bytes(readable.get(name, PRECIOUS))
    return {path: path.read_bytes() for path in folder.iterdir()}


def refused(arguments: list[str], folder: Path, before: dict[Path, bytes], expected: str) -> None:
    result = CliRunner().invoke(main, arguments)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert {path: path.read_bytes() for path in before} == before
    assert not (folder.parent / "x.parquet").exists() and not (folder / "o" / "x.parquet").exists()


@pytest.mark.parametrize("case", SAME_FILE)
def test_an_output_that_is_an_input_is_refused_before_any_work(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "d"
    folder.mkdir()
    before = precious_inputs(folder)
    refused(SAME_FILE[case](folder), folder, before, "writing it would destroy what the command reads")
    assert sorted(path.name for path in folder.iterdir()) == sorted(INPUTS)


@pytest.mark.parametrize("case", WRONG_KIND)
def test_an_output_over_an_input_of_another_kind_is_refused_by_its_suffix(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "d"
    folder.mkdir()
    before = precious_inputs(folder)
    refused(WRONG_KIND[case](folder), folder, before, "--output writes .json")


@pytest.mark.parametrize("case", NOT_A_FILE_NAME)
def test_a_split_or_archive_name_must_be_a_plain_file_name(case, tmp_path, monkeypatch):
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    monkeypatch.chdir(folder)
    before = precious_inputs(folder)
    refused(NOT_A_FILE_NAME[case](folder), folder, before, "not a plain file name")
    assert not any(path.suffix in (".parquet", ".zip") for path in tmp_path.rglob("x.*"))


@pytest.mark.parametrize("command", BUSY)
def test_an_output_another_run_is_writing_is_refused(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arguments, output = BUSY[command]
    before = precious_inputs(tmp_path)
    with publishing((output(tmp_path),)):
        refused(arguments(tmp_path), tmp_path, before, f"{output(tmp_path)}: being written by another run: pid")
    assert not output(tmp_path).exists() or output(tmp_path).is_dir()


# ----------------------------------------------------------------------------- names

LONG_NAME = 240
"""A legal file name (the limit is 255 bytes) whose companions (lock, temporary, journal) would pass the limit."""


def long_name(suffix: str) -> str:
    return "n" * (LONG_NAME - len(suffix)) + suffix


def snli_jsonl(path: Path) -> Path:
    record = {
        "gold_label": "entailment",
        "pairID": "p1",
        "sentence1": "A dog runs.",
        "sentence1_binary_parse": "( ( A dog ) ( runs . ) )",
        "sentence2": "Animals move.",
        "sentence2_binary_parse": "( Animals ( move . ) )",
    }
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    return path


LONG_OUTPUT: dict[str, Callable[[Path, object], tuple[list[str], Path]]] = {
    "prepare": lambda d, m: (
        ["prepare", str(snli_jsonl(d / "dev.jsonl")), "--output-dir", str(d / "o"), "--split", long_name("")],
        d / "o" / f"{long_name('')}.parquet",
    ),
    "vocab": lambda d, m: (
        ["vocab", str(m.prepared / "train.parquet"), "--output", str(d / long_name(".json"))],
        d / long_name(".json"),
    ),
    "evaluate": lambda d, m: (
        ["evaluate", "--model", str(m.checkpoint), "--data", str(m.prepared / "dev.parquet")]
        + ["--output", str(d / long_name(".json")), "--no-track"],
        d / long_name(".json"),
    ),
    "label": lambda d, m: (
        ["label", str(m.prepared / "test.parquet"), "--model", str(m.checkpoint), "--parser", "model"]
        + ["--output", str(d / long_name(".parquet")), "--id-column", "pair_id"],
        d / long_name(".parquet"),
    ),
    "trees": lambda d, m: (
        ["trees", str(m.prepared / "test.parquet"), "--model", str(m.checkpoint)]
        + ["--output", str(d / long_name(".jsonl")), "--id-column", "pair_id"],
        d / long_name(".jsonl"),
    ),
    "download": lambda d, m: (
        ["download", "--raw-dir", str(d / "raw"), "--file", str(m.archive), "--archive", long_name(".zip")]
        + ["--checksum", f"sha256:{file_digest(m.archive)}", "--no-extract"],
        d / "raw" / long_name(".zip"),
    ),
}
"""Each command that publishes a file the user names, given a legal name of LONG_NAME characters."""


@pytest.mark.parametrize("command", LONG_OUTPUT)
def test_a_long_legal_output_name_is_written(command, smoke_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arguments, output = LONG_OUTPUT[command](tmp_path, smoke_model)
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == 0, (result.output, result.exception)
    assert output.is_file() and not [path for path in output.parent.iterdir() if path.name.startswith(".")]
