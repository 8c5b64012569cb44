"""What every `spinn` command shares: path options, `--config`, the folder-option convention, and the checks
on a command's paths that run before any work (a missing input, an output of the wrong kind)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import click

from spinn.errors import SpinnError

PATH = click.Path(path_type=Path)


def input_file(_context: click.Context, parameter: click.Parameter, value: Path | None) -> Path | None:
    """A command's input file, checked while the command line is read, before any other work (a model
    download, a Stanza download): a misspelt name is the one `error:` line the user sees, exit status 1,
    like every other user error (not Click's three-line usage error). A folder is left to the stage, which
    says what kind of file it expected there."""
    if value is not None and not Path(value).exists():
        raise SpinnError(f"{value}: no such file")
    return None if value is None else Path(value)


def config_option(section: str):
    """`--config params.yaml`: the stage's section of the params file, under the options given."""
    return click.option(
        "--config",
        "config_path",
        type=PATH,
        callback=input_file,
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


def output_with_suffix(*suffixes: str) -> Callable[[click.Context, click.Parameter, str | None], Path | None]:
    """An output file whose kind its extension names (a PNG plot, a JSON metrics file): a wrong extension is
    refused while the command line is read, not after the whole run has been spent producing it."""

    def check(_context: click.Context, parameter: click.Parameter, value: str | None) -> Path | None:
        if value is not None and not str(value).lower().endswith(suffixes):
            raise SpinnError(f"{value}: {parameter.opts[0]} writes {' or '.join(suffixes)}; name a file ending so")
        return None if value is None else Path(value)

    return check
