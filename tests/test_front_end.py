"""Every mistake on a command line or in params.yaml is one `error:` line and exit status 1,
said before any work, for every command that can make it; a setting that must be finite (every float) and
is given as inf or NaN is one of them.

The commands run in-process with click's runner on tiny files that exist but are never read: each case fails
while the command line or its settings are read, so nothing else runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main

Arguments = Callable[[Path], list[str]]
INPUTS: dict[str, Arguments] = {
    "download": lambda d: ["snli", "--raw-dir", str(d / "raw")],
    "prepare": lambda d: [str(d / "dev.jsonl"), "--output-dir", str(d / "out")],
    "vocab": lambda d: [str(d / "train.parquet"), "--output", str(d / "out" / "vocab.json")],
    "embeddings": lambda d: ["--vocab", str(d / "vocab.json"), "--cache-dir", str(d / "out")],
    "check-binarization": lambda d: [str(d / "dev.jsonl")],
    "train": lambda d: ["--train", str(d / "train.parquet"), "--dev", str(d / "dev.parquet")],
    "evaluate": lambda d: ["--model", str(d / "m.pt"), "--data", str(d / "dev.parquet")],
    "parse": lambda d: [str(d / "pairs.csv"), "--output-dir", str(d / "out")],
    "label": lambda d: [str(d / "pairs.csv"), "--model", str(d / "m.pt"), "--output", str(d / "out.parquet")],
    "trees": lambda d: [str(d / "pairs.csv"), "--model", str(d / "m.pt"), "--output", str(d / "trees.jsonl")],
    "bench-label": lambda d: [str(d / "pairs.csv"), "--model", str(d / "m.pt")],
    "bench": lambda d: [],
}
"""Each command with inputs that exist (made by `inputs`): the case under test adds the one mistake."""
MISSING_INPUT = {
    "prepare": "dev.jsonl",
    "vocab": "train.parquet",
    "embeddings": "vocab.json",
    "check-binarization": "dev.jsonl",
    "train": "dev.parquet",
    "evaluate": "dev.parquet",
    "parse": "pairs.csv",
    "label": "pairs.csv",
    "trees": "pairs.csv",
    "bench-label": "pairs.csv",
}
"""The input file each command reads (download reads none it can be given as an argument)."""
WITH_CONFIG = ("download", "prepare", "vocab", "embeddings", "train", "evaluate")
"""The commands that read a params file (`--config`)."""
INPUT_NAMES = ("dev.jsonl", "train.parquet", "dev.parquet", "vocab.json", "m.pt", "pairs.csv")
CLASS_NAME = re.compile(r"\b\w+(Settings|Config|Overrides|Request)\b")
"""A settings class's name, which a user never typed: an error names the option, `--set` key or params.yaml
entry that gave the value (`spinn bench --profile` once said `BenchSettings:`)."""


def inputs(folder: Path) -> Path:
    for name in INPUT_NAMES:
        (folder / name).write_bytes(b"")
    return folder


def params(folder: Path, data: bytes) -> Path:
    path = folder / "params.yaml"
    path.write_bytes(data)
    return path


def rewritten(name: str, data: bytes) -> Arguments:
    """A mistake in the input itself: `name` rewritten with `data`, no argument added."""

    def write(folder: Path) -> list[str]:
        (folder / name).write_bytes(data)
        return []

    return write


def parquet_bytes() -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"premise": ["A dog runs."], "hypothesis": ["An animal moves."]}), sink)
    return sink.getvalue()


def bad_config(make: Callable[[Path], Path], expected: str):
    """A case: each --config command given the params file `make` writes."""
    return [
        pytest.param(command, lambda d, make=make: ["--config", str(make(d))], expected, id=f"{command}-{expected}")
        for command in WITH_CONFIG
    ]


CASES = [
    *[pytest.param(command, None, "no such file", id=f"{command}-missing-input") for command in MISSING_INPUT],
    *bad_config(lambda d: params(d, "train:\n  seed: 1  # é\n".encode("utf-16")), "not UTF-8"),
    *bad_config(lambda d: d, "is a folder"),
    *bad_config(lambda d: params(d, b"trian:\n  seed: 1\n"), "unknown section 'trian'"),
    pytest.param(
        "prepare",
        lambda d: ["--config", str(params(d, b"prepare:\n  splits: {train: a, dev: b, test: c, ../x: d}\n"))],
        "not a plain file name",
        id="prepare-split-in-params",
    ),
    pytest.param("train", lambda d: ["--set", "max_steps=[1"], "not valid YAML", id="train-set-not-yaml"),
    pytest.param("train", lambda d: ["--set", "max_epochs=true"], "must be a number, not true", id="train-bool"),
    pytest.param(
        "train",
        lambda d: ["--config", str(params(d, b"train:\n  max_epochs: true\n"))],
        "must be a number, not true",
        id="train-bool-in-params",
    ),
    pytest.param("train", lambda d: ["--learning-rate", "inf"], "finite number", id="train-inf-option"),
    pytest.param("train", lambda d: ["--set", "learning_rate=nan"], "finite number", id="train-nan-set"),
    pytest.param(
        "train",
        lambda d: ["--config", str(params(d, b"train:\n  learning_rate: .inf\n"))],
        "finite number",
        id="train-inf-in-params",
    ),
    pytest.param("prepare", lambda d: ["--max-reject-ratio", "nan"], "finite number", id="prepare-nan-option"),
    pytest.param("evaluate", lambda d: ["--plot", str(d / "m.pt")], "--plot writes .png", id="evaluate-plot"),
    pytest.param("evaluate", lambda d: ["--output", str(d / "m.csv")], "--output writes .json", id="evaluate-output"),
    pytest.param(
        "parse",
        rewritten("pairs.csv", "premise,hypothesis\nA dog runs.,An animal moves.\n".encode("utf-16")),
        "is UTF-16 text; save it as UTF-8",
        id="parse-utf16-csv",
    ),
    pytest.param(
        "parse", rewritten("pairs.csv", parquet_bytes()), "is a Parquet file, not csv", id="parse-parquet-named-csv"
    ),
    pytest.param("trees", lambda d: ["--html", str(d / "t.txt")], "--html writes .html", id="trees-html"),
    pytest.param(
        "label",
        lambda d: ["--output", str(d / "dev.rejects.jsonl")],
        "--output writes .parquet",
        id="label-output-suffix",
    ),
    pytest.param("vocab", lambda d: ["--output", str(d / "v.parquet")], "--output writes .json", id="vocab-output"),
    *bad_config(lambda d: params(d, b"train:\n  seed: 1\n  seed: 2\n"), "key 'seed' given twice"),
    *bad_config(lambda d: params(d, b"train:\n  seed: 1\ntrain:\n  seed: 2\n"), "key 'train' given twice"),
    pytest.param("bench", lambda d: ["--profile"], "error: --corpus: is required", id="bench-no-corpus"),
    pytest.param(
        "bench",
        lambda d: ["--corpus", str(d / "dev.jsonl"), "--profile"],
        "error: --profile: measures GPU kernels, so it needs device cuda",
        id="bench-profile-on-cpu",
    ),
    pytest.param(
        "bench",
        lambda d: ["--corpus", str(d / "dev.jsonl"), "--variant", "rl", "--impl", "reference"],
        "error: --impl: variant rl has no reference implementation",
        id="bench-rl-reference",
    ),
    pytest.param(
        "bench-label",
        lambda d: ["--threads", "zero"],
        "error: --threads: must be a number of threads",
        id="bench-label",
    ),
    pytest.param(
        "download",
        lambda d: ["--url", "http://127.0.0.1/snli.zip", "--file", str(d / "dev.jsonl")],
        "error: --url: give url (a mirror) or file (a local copy), not both",
        id="download-url-and-file",
    ),
    pytest.param(
        "train",
        lambda d: ["--set", "model.d_tracker=0"],
        "error: --set model.d_tracker: variant spinn needs d_tracker >= 1",
        id="train-no-tracker",
    ),
]


@pytest.mark.parametrize(("command", "mistake", "expected"), CASES)
def test_a_front_end_mistake_is_one_error_line_before_any_work(command, mistake, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a command that went on would write its default folders here, not in the checkout
    folder = inputs(tmp_path)
    if mistake is None:
        (folder / MISSING_INPUT[command]).unlink()
    arguments = [command, *INPUTS[command](folder), *(mistake(folder) if mistake else [])]
    result = CliRunner().invoke(main, arguments)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert not CLASS_NAME.search(lines[0]), lines[0]
    assert not {"out", "raw", "data"} & {path.name for path in folder.iterdir()}


# ----------------------------------------------------------------------------- the parser's own

EXIT_USAGE = 2
"""click's (and POSIX's) status for a command line the parser refuses; README says so."""
USAGE_MISTAKES = [
    *[
        pytest.param(command, ["--no-such-flag"], "no such option '--no-such-flag'", id=f"{command}-unknown-flag")
        for command in INPUTS
    ],
    pytest.param(
        "spinn-pipeline", ["--no-such-flag"], "no such option '--no-such-flag'", id="spinn-pipeline-unknown-flag"
    ),
    pytest.param("relog-model", [], "missing argument 'model'", id="relog-model-missing-argument"),
    pytest.param("nosuch", [], "no such command 'nosuch'", id="unknown-command"),
    pytest.param("label", ["--parser", "psychic"], "invalid value for '--parser'", id="label-bad-choice"),
    pytest.param("train", ["--device", "tpu"], "invalid value for '--device'", id="train-bad-choice"),
    pytest.param("bench", ["--variant", "nope"], "invalid value for '--variant'", id="bench-bad-choice"),
    pytest.param(
        "spinn-pipeline", ["--corpus", "imdb"], "invalid value for '--corpus'", id="spinn-pipeline-bad-choice"
    ),
    pytest.param("prepare", ["--max-reject-ratio", "2"], "invalid value for '--max-reject-ratio'", id="prepare-range"),
    pytest.param("check-binarization", ["--show", "-1"], "invalid value for '--show'", id="check-binarization-range"),
    pytest.param("evaluate", ["--batch-size", "0"], "invalid value for '--batch-size'", id="evaluate-range"),
    pytest.param("prepare", ["--split"], "option '--split' requires an argument", id="prepare-no-value"),
    pytest.param("check-tokens", [], "missing argument 'file'", id="check-tokens-missing-argument"),
]
REQUIRED_OPTIONS = {"label": "--model", "evaluate": "--data", "trees": "--output", "bench-label": "--model"}
"""A required option of each command that has one, left off by the case."""


def without(arguments: list[str], option: str) -> list[str]:
    at = arguments.index(option)
    return arguments[:at] + arguments[at + 2 :]


@pytest.mark.parametrize(
    ("command", "mistake", "expected"),
    [
        *USAGE_MISTAKES,
        *[
            pytest.param(command, None, f"missing option '{option}'", id=f"{command}-missing-{option}")
            for command, option in REQUIRED_OPTIONS.items()
        ],
    ],
)
def test_a_usage_mistake_is_one_error_line_for_every_command(command, mistake, expected, tmp_path, monkeypatch):
    """Missing options and arguments, bad choices, values out of range, unknown flags and commands: click's
    three-line `Usage:`/`Error:` block becomes the one `error:` line, exit status 2, for `spinn` and
    `spinn-pipeline` alike."""
    from flows.main import main as pipeline

    monkeypatch.chdir(tmp_path)
    folder = inputs(tmp_path)
    if command == "spinn-pipeline":
        entry, arguments = pipeline, mistake
    else:
        given = INPUTS[command](folder) if command in INPUTS else []
        if mistake is None:
            given = without(given, REQUIRED_OPTIONS[command])
        entry, arguments = main, [command, *given, *(mistake or [])]
    result = CliRunner().invoke(entry, arguments)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == EXIT_USAGE, (result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0].lower(), result.stderr
    assert "--help" in lines[0] and not {"out", "raw", "data"} & {path.name for path in folder.iterdir()}


THREAD_OPTIONS = [
    (command, option)
    for command, options in {
        "train": ["--threads"],
        "evaluate": ["--threads"],
        "label": ["--threads", "--parser-threads"],
        "trees": ["--threads"],
        "bench": ["--threads"],
        "bench-label": ["--threads", "--parser-threads"],
        "parse": ["--parser-threads"],
    }.items()
    for option in options
]
"""Every command that runs torch, with each of its thread options (spinn/ground/cores.py bounds them all)."""


@pytest.mark.parametrize(("command", "option"), THREAD_OPTIONS)
def test_more_threads_than_the_machine_can_run_are_one_error_line(command, option, tmp_path, monkeypatch):
    """`--threads 100000` made libgomp print `Out of memory`; it is refused before any work, naming the option."""
    from spinn.ground import cores

    monkeypatch.chdir(tmp_path)
    folder = inputs(tmp_path)
    arguments = [command, *INPUTS[command](folder), option, "100000"]
    if command == "bench":
        arguments += ["--corpus", str(folder / "dev.jsonl")]
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    expected = f"error: {option}: must be at most {cores.most_threads()}: {cores.MOST_THREADS_PER_CORE} per core"
    assert result.stderr.strip().startswith(expected) and len(result.stderr.strip().splitlines()) == 1, result.stderr
