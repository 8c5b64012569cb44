"""What every `spinn` command shares: its entry (`SharedEntry`), path options, `--config`, the folder-option
convention, and the checks on a command's paths that run before any work (a missing input, an output of the
wrong kind)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from spinn.ground import children
from spinn.ground.errors import SpinnError
from spinn.ground.paths import refuse_special_file

PATH = click.Path(path_type=Path)


class SharedEntry:
    """What every command's process does around its work, mixed into `spinn`'s group and `spinn-pipeline`'s
    command: it stops, in one line, once the process that started it is gone (spinn.ground.children), and a
    command line the parser refuses (a missing option, a bad choice, a value out of range, an unknown flag
    or command) is one `error:` line too, with click's exit status, 2, instead of its Usage/Error block."""

    def main(self, *args, **kwargs):
        children.stop_when_orphaned()
        try:
            return super().main(*args, **kwargs)
        except children.Hangup:
            _say(f"error: stopped: {_why_stopped()}")
            sys.exit(children.EXIT_ORPHANED)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra):
        with _usage_in_one_line(lambda: " ".join(filter(None, [parent and parent.command_path, info_name]))):
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context):
        # a subcommand's own command line is read here, once the group has named it
        with _usage_in_one_line(lambda: " ".join(filter(None, [ctx.command_path, ctx.invoked_subcommand]))):
            return super().invoke(ctx)


class OneLineUsageError(click.ClickException):
    """A refused command line, shown as one `error:` line that points at the command's help."""

    def __init__(self, error: click.ClickException, command: str) -> None:
        super().__init__(_first_lower(error.format_message()))
        self.exit_code = error.exit_code
        context = getattr(error, "ctx", None)
        self.help = f"{context.command_path if context is not None else command} --help"

    def show(self, file=None) -> None:
        _say(f"error: {'; '.join(filter(None, self.message.splitlines())).rstrip('.')}; see '{self.help}'")


@contextlib.contextmanager
def _usage_in_one_line(command: Callable[[], str]):
    """Turn click's refusal of a command line into OneLineUsageError; `command` names the command being read
    when click's error does not (an option missing its value)."""
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:  # `spinn` alone shows the help, as ever
        raise
    except OneLineUsageError:
        raise
    except click.ClickException as error:
        raise OneLineUsageError(error, command()) from None


def _first_lower(text: str) -> str:
    """`Missing option '--model'.` -> `missing option '--model'.`: the way every other error line reads."""
    return text[:1].lower() + text[1:]


def _why_stopped() -> str:
    starter = children.orphaned()
    if starter is None:
        return "hung up (SIGHUP)"
    return f"the process that started it (pid {starter}) is gone; rerun the command to go on"


def _say(line: str) -> None:
    """Print to stderr, which may be a pipe its dead reader closed."""
    with contextlib.suppress(OSError):
        click.echo(line, err=True)


def input_file(_context: click.Context, parameter: click.Parameter, value: Path | None) -> Path | None:
    """A command's input file, checked while the command line is read, before any other work (a model
    download, a Stanza download): a misspelt name is the one `error:` line the user sees, exit status 1,
    like every other user error (not Click's three-line usage error). A folder is left to the stage, which
    says what kind of file it expected there."""
    if value is not None and not Path(value).exists():
        raise SpinnError(f"{value}: no such file")
    return None if value is None else refuse_special_file(Path(value))


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


def output_file(*suffixes: str) -> Callable[[click.Context, click.Parameter, str | None], Path | None]:
    """`--output` names a file of a kind its extension names: a value spelled as a folder (`data/labelled/`)
    is refused before any work, since a Path would drop the slash that says so, and so is a wrong extension
    (`output_with_suffix`)."""
    suffixed = output_with_suffix(*suffixes)

    def check(context: click.Context, parameter: click.Parameter, value: str | None) -> Path | None:
        if value is not None and (value.endswith(("/", os.sep)) or Path(value).is_dir()):
            example = f"{value}labels{suffixes[0]}"
            raise SpinnError(f"{value}: names a folder; {parameter.opts[0]} is the predictions file, e.g. {example}")
        return suffixed(context, parameter, value)

    return check


def output_with_suffix(*suffixes: str) -> Callable[[click.Context, click.Parameter, str | None], Path | None]:
    """An output file whose kind its extension names (a PNG plot, a JSON metrics file): a wrong extension is
    refused while the command line is read, not after the whole run has been spent producing it."""

    def check(_context: click.Context, parameter: click.Parameter, value: str | None) -> Path | None:
        if value is not None and not str(value).lower().endswith(suffixes):
            raise SpinnError(f"{value}: {parameter.opts[0]} writes {' or '.join(suffixes)}; name a file ending so")
        return None if value is None else Path(value)

    return check
