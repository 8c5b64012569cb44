"""What every `spinn` command shares: path options, `--config`, and the folder-option convention."""

from __future__ import annotations

import os
from pathlib import Path

import click

from spinn.errors import SpinnError

PATH = click.Path(path_type=Path)
INPUT_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
"""A command's INPUT: checked before any other work (a model download, a Stanza download), so a
misspelt name is the error the user sees."""


def config_option(section: str):
    """`--config params.yaml`: the stage's section of the params file, under the options given."""
    return click.option(
        "--config",
        "config_path",
        type=PATH,
        help=f"params.yaml whose `{section}` section sets the options below (options given here win).",
    )


def output_folder(new: Path | None, old: Path | None, default: Path) -> Path:
    """The --output-dir given, else the deprecated --output spelling of it, else the default."""
    return new or old or default


def output_file(_context: click.Context, _parameter: click.Parameter, value: str | None) -> Path | None:
    """`--output` names a file: a value spelled as a folder (`data/labelled/`) is refused before any work,
    since a Path would drop the slash that says so."""
    if value is not None and value.endswith(("/", os.sep)):
        raise SpinnError(f"{value}: names a folder; --output is the predictions file, e.g. {value}labels.parquet")
    return None if value is None else Path(value)
