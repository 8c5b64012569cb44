"""Nothing hangs. A tracking server that accepts and never answers is one `error:` line
within the timeout the user set (MLflow's own MLFLOW_HTTP_REQUEST_TIMEOUT; spinn gives it a sane default),
with the URI's password hidden; a reader given what is not a regular file (a FIFO) refuses it by name
instead of blocking on it. Each case runs every command that can meet it, in-process."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main
from tests.helpers import TINY_MODEL_SETTINGS, one_error_line, set_options, smoke_pairs, write_rows

SECRET = "s3cr3t-password"
REQUEST_TIMEOUT_S = 1
ANSWER_WITHIN_S = 60
"""One refused request takes REQUEST_TIMEOUT_S; the rest is importing MLflow and torch on busy cores."""
POLL_S = 0.05
"""How often the FIFO is watched: a reader that opened it (the failure under test) is let go at once, so the test
fails instead of hanging."""


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for connection in [*held, listener]:
        connection.close()


MODEL_URI = "models:/spinn@champion"
PIPELINE = "spinn-pipeline"
TRACKING_COMMANDS: dict[str, Callable[[Path, object], list[str]]] = {
    "train": lambda d, m: (
        ["train", "--train", str(m.prepared / "train.parquet"), "--dev", str(m.prepared / "dev.parquet")]
        + ["--embeddings-dir", str(m.prepared.parent / "embeddings"), "--output-dir", str(d / "run")]
        + [*set_options(TINY_MODEL_SETTINGS), "--no-progress"]
    ),
    "evaluate": lambda d, m: (
        ["evaluate", "--model", MODEL_URI, "--data", str(m.prepared / "dev.parquet")] + ["--output", str(d / "m.json")]
    ),
    "label": lambda d, m: ["label", str(d / "pairs.csv"), "--model", MODEL_URI, "--output", str(d / "out.parquet")],
    "trees": lambda d, m: ["trees", str(d / "pairs.csv"), "--model", MODEL_URI, "--output", str(d / "t.jsonl")],
    "bench-label": lambda d, m: ["bench-label", str(d / "pairs.csv"), "--model", MODEL_URI],
    "relog-model": lambda d, m: ["relog-model", "models:/spinn/1"],
    PIPELINE: lambda d, m: ["--smoke", "--data-dir", str(d / "data")],
}
"""Every command that talks to the tracking store; spinn-pipeline's flow meets it in its train task, on the
session's Prefect server."""


@pytest.mark.parametrize("command", TRACKING_COMMANDS)
def test_a_tracking_server_that_never_answers_is_one_line_without_its_password(
    command, silent_server, smoke_model, tmp_path, monkeypatch, request
):
    from flows.main import main as pipeline

    if command == PIPELINE:
        monkeypatch.setenv("PREFECT_API_URL", request.getfixturevalue("prefect_api"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://spinn:{SECRET}@127.0.0.1:{silent_server}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", str(REQUEST_TIMEOUT_S))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the user's setting wins over spinn's 2
    monkeypatch.setenv("SPINN_LOCK_DIR", str(tmp_path / "locks"))
    write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 2))
    started = time.monotonic()
    entry = pipeline if command == PIPELINE else main
    result = CliRunner().invoke(entry, TRACKING_COMMANDS[command](tmp_path, smoke_model))
    assert time.monotonic() - started < ANSWER_WITHIN_S
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    line = one_error_line(result.stderr)
    assert f"MLflow tracking server http://***@127.0.0.1:{silent_server} did not answer" in line, line
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" in line and SECRET not in result.output + result.stderr


@pytest.mark.parametrize(
    ("variable", "default"), [("MLFLOW_HTTP_REQUEST_TIMEOUT", "10"), ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")]
)
def test_mlflow_requests_get_a_short_timeout_and_few_retries_unless_the_user_set_them(variable, default, monkeypatch):
    """MLflow's own defaults (120 s, 7 retries with backoff) made a silent server a wait of minutes."""
    from spinn.tracking.store import request_limits

    monkeypatch.delenv(variable, raising=False)
    request_limits()
    assert os.environ[variable] == default
    monkeypatch.setenv(variable, "33")
    request_limits()
    assert os.environ[variable] == "33"


# ----------------------------------------------------------------------------- what is not a regular file

FIFO_INPUTS: dict[str, Callable[[Path, object], list[str]]] = {
    "prepare": lambda f, m: ["prepare", str(f), "--output-dir", str(f.parent / "out")],
    "prepare-config": lambda f, m: ["prepare", str(m.prepared / "dev.parquet"), "--config", str(f)],
    "vocab": lambda f, m: ["vocab", str(f), "--output", str(f.parent / "v.json")],
    "embeddings": lambda f, m: ["embeddings", "--vocab", str(f), "--cache-dir", str(f.parent / "e")],
    "check-binarization": lambda f, m: ["check-binarization", str(f)],
    "check-tokens": lambda f, m: ["check-tokens", str(f)],
    "train": lambda f, m: ["train", "--train", str(f), "--dev", str(m.prepared / "dev.parquet")],
    "evaluate": lambda f, m: ["evaluate", "--model", str(m.checkpoint), "--data", str(f)],
    "evaluate-model": lambda f, m: ["evaluate", "--model", str(f), "--data", str(m.prepared / "dev.parquet")],
    "parse": lambda f, m: ["parse", str(f), "--output-dir", str(f.parent / "out")],
    "label": lambda f, m: ["label", str(f), "--model", str(m.checkpoint), "--output", str(f.parent / "o.parquet")],
    "label-model": lambda f, m: (
        ["label", str(m.prepared / "test.parquet"), "--model", str(f)] + ["--output", str(f.parent / "o.parquet")]
    ),
    "trees": lambda f, m: ["trees", str(f), "--model", str(m.checkpoint), "--output", str(f.parent / "t.jsonl")],
    "bench-label": lambda f, m: ["bench-label", str(f), "--model", str(m.checkpoint)],
    "bench": lambda f, m: ["bench", "--corpus", str(f), "--steps", "1"],
    "download": lambda f, m: ["download", "--raw-dir", str(f.parent / "raw"), "--file", str(f)],
}
"""Each command, given a FIFO where it reads a file (an input, a model, a params file)."""


class Fifo(NamedTuple):
    path: Path
    opened: threading.Event
    """Set once a reader opened the pipe: the command tried to read it (and blocked until it was let go)."""


@pytest.fixture
def fifo(tmp_path) -> Iterator[Fifo]:
    """A named pipe named like a corpus, watched: a reader that opens it is seen at once and let go (end of file).

    Opening a FIFO to write without blocking succeeds only while a reader holds it open, and a reader blocks
    there until a writer comes, so polling sees every reader, however loaded the machine is."""
    path = tmp_path / "dev.jsonl"
    os.mkfifo(path)
    stop, opened = threading.Event(), threading.Event()

    def watch() -> None:
        while not stop.wait(POLL_S):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as error:
                if error.errno != errno.ENXIO:  # ENXIO: nobody reads it, which is what should happen
                    return
            else:
                opened.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    yield Fifo(path, opened)
    stop.set()
    thread.join()


@pytest.mark.parametrize("command", FIFO_INPUTS)
def test_every_reader_refuses_what_is_not_a_regular_file_naming_it(command, fifo, smoke_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, FIFO_INPUTS[command](fifo.path, smoke_model))
    assert not fifo.opened.is_set(), f"{command} opened the pipe to read it"
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    assert one_error_line(result.stderr) == f"error: {fifo.path}: is a named pipe (FIFO), not a regular file"


DOWNLOADS: dict[str, Callable[[Path, int], list[str]]] = {
    "download": lambda d, port: ["download", "--raw-dir", str(d), "--url", f"http://127.0.0.1:{port}/snli_1.0.zip"],
    "embeddings": lambda d, port: (
        ["embeddings", "--vocab", str(d / "vocab.json"), "--cache-dir", str(d / "e")]
        + ["--source", f"http://127.0.0.1:{port}/vectors.txt"]
    ),
}
"""Every command that downloads (spinn-pipeline downloads through download's door)."""


@pytest.mark.parametrize("command", DOWNLOADS)
def test_a_download_server_that_never_answers_is_one_line_within_the_timeout_set(
    command, silent_server, smoke_model, tmp_path, monkeypatch
):
    import shutil

    monkeypatch.setenv("SPINN_DOWNLOAD_TIMEOUT", str(REQUEST_TIMEOUT_S))
    shutil.copyfile(smoke_model.prepared / "vocab.json", tmp_path / "vocab.json")
    started = time.monotonic()
    result = CliRunner().invoke(main, DOWNLOADS[command](tmp_path, silent_server))
    assert time.monotonic() - started < ANSWER_WITHIN_S
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    assert f"waited {REQUEST_TIMEOUT_S} s, and SPINN_DOWNLOAD_TIMEOUT" in one_error_line(result.stderr)
