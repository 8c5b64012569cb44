"""A full disk that no stage translated (a checkpoint writer, the MLflow store's SQLite) is
one `error:` line from the CLI's one handler, which every command runs under."""

from __future__ import annotations

import errno
import os
import re
import sqlite3

import click
import pytest
from click.testing import CliRunner

from spinn.cli import EXIT_USER_ERROR, main


def raw_enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/store/last.pt")


def wrapped_sqlite_full(*_args, **_kwargs):
    try:
        raise sqlite3.OperationalError("database or disk is full")
    except sqlite3.OperationalError as error:
        raise RuntimeError("(sqlite3.OperationalError) see the cause") from error


FULL = {
    "checkpoint": (raw_enospc, r"error: no space left on \S+ \(mounted at /\) writing /store/last\.pt$"),
    "mlflow-store": (
        wrapped_sqlite_full,
        r"error: no space left on \S+ \(mounted at /\S*\) writing the MLflow store \S*mlflow\.db \(database",
    ),
}
"""Each names the device and the file."""


def failing_command(monkeypatch, failing) -> None:
    """Every command runs under the group's one handler: any command stands for all of them."""
    monkeypatch.setattr(type(main), "get_command", lambda _self, _ctx, name: click.Command(name, callback=failing))


@pytest.mark.parametrize("case", FULL)
def test_a_full_disk_is_one_error_line_from_the_cli_handler(case, monkeypatch):
    failing, expected = FULL[case]
    failing_command(monkeypatch, failing)
    result = CliRunner().invoke(main, ["train"])
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(expected, lines[0]), result.stderr


def test_other_errors_are_not_called_a_full_disk(monkeypatch):
    def broken(*_args, **_kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    failing_command(monkeypatch, broken)
    result = CliRunner().invoke(main, ["train"])
    assert isinstance(result.exception, OSError) and "no space" not in result.stderr
