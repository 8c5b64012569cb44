"""`spinn <stage>`: a thin command line over the stage functions.

Each command parses its paths, resolves the stage's settings (the model's
defaults, then params.yaml's section with `--config`, then the options given),
calls one stage function, and prints that function's summary. The settings
options are generated from the stage's settings model (spinn/options.py), so
their names, choices and defaults live in one place. DVC stages and Prefect
tasks call the same functions. A SpinnError becomes a one-line `error: ...`
on stderr (its notes, such as what a failed run left for the next, joined on)
and exit status 1; a SpinnWarning a one-line `warning: ...`.

Conventions: the input a command reads is a positional INPUT; `--output` is
always a file, and a command that writes several files takes `--output-dir`.

Commands live in one module per layer and are imported when they run, so a
command loads only its own stage's code (and `dvc.yaml` can declare exactly
that code as the stage's deps).
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import warnings
from importlib import import_module

import click

from spinn.cli.common import SharedEntry
from spinn.ground.errors import SpinnWarning, failure_line, option_name

DVC_STAGE_VARIABLE = "DVC_STAGE"

EXIT_USER_ERROR = 1
COMMANDS: dict[str, tuple[str, str]] = {
    "download": ("spinn.cli.data", "download"),
    "prepare": ("spinn.cli.data", "prepare"),
    "vocab": ("spinn.cli.data", "vocab"),
    "embeddings": ("spinn.cli.data", "embeddings"),
    "check-binarization": ("spinn.cli.data", "check_binarization"),
    "check-tokens": ("spinn.cli.data", "check_tokens"),
    "train": ("spinn.cli.training", "train"),
    "evaluate": ("spinn.cli.training", "evaluate"),
    "parse": ("spinn.cli.labeling", "parse"),
    "label": ("spinn.cli.labeling", "label"),
    "trees": ("spinn.cli.labeling", "trees"),
    "relog-model": ("spinn.cli.serving", "relog_model"),
    "bench": ("spinn.cli.benchmark", "bench"),
    "bench-label": ("spinn.cli.benchmark", "bench_label"),
}
"""Command -> (module, function): the only place that says which code a command runs."""


class _Group(SharedEntry, click.Group):
    """Loads each command from its module on use, and turns user-facing errors into one line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, function = COMMANDS[name]
        return getattr(import_module(module), function)

    def invoke(self, ctx: click.Context):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always", SpinnWarning)
                warnings.showwarning = _one_line_for_ours(warnings.showwarning)
                return super().invoke(ctx)
        except Exception as error:
            line = failure_line(error, _fix_words())
            if line is None:
                raise
            click.echo(f"error: {line}", err=True)
            sys.exit(EXIT_USER_ERROR)


def _fix_words():
    """How a fix names a setting: an option at the command line; under `dvc repro` (DVC sets DVC_STAGE for
    stage commands), whose commands users do not type, the variable or params.yaml entry that sets it."""
    if not os.environ.get(DVC_STAGE_VARIABLE):
        return option_name
    from spinn.data.download import variable_name

    return variable_name


def _one_line_for_ours(show):
    """A warnings.showwarning that prints a SpinnWarning as one `warning: ...` line, and others as `show` does."""

    def shown(message, category, *args, **kwargs):
        if issubclass(category, SpinnWarning):
            click.echo(f"warning: {message}", err=True)
        else:
            show(message, category, *args, **kwargs)

    return shown


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spinn")
def main() -> None:
    """Train SPINN models for natural language inference and label sentence pairs with them."""
    # At exit, after the handlers registered later (atexit runs last-in first-out), the interpreter's final
    # collections need not walk what the process's end frees anyway: about 1 s once Stanza has loaded.
    atexit.register(gc.freeze)


if __name__ == "__main__":
    main()
