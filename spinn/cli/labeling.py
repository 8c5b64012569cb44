"""`spinn parse | label | trees`: stages for new text."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, get_args

import click

from spinn.cli.common import PATH, input_file, output_file, output_folder, output_with_suffix
from spinn.data.label_schemes import NO_GOLD
from spinn.ground.settings import Device
from spinn.labeling.induced_trees import TreesSettings
from spinn.labeling.label_settings import LabelSettings
from spinn.options import field_options, given, renamed_option, resolve
from spinn.parsing.parse import ParseSettings


def _no_parse_cache(command):
    return click.option("--no-parse-cache", is_flag=True, help="Neither read nor write the parse cache.")(command)


def _without_cache(values: dict[str, Any], no_cache: bool) -> dict[str, Any]:
    """--no-parse-cache: the parser settings' cache_path set to none."""
    if no_cache:
        values.setdefault("parsing", {})["cache_path"] = None
    return values


def _no_gold(command):
    return click.option(
        "--no-gold", is_flag=True, help="Ignore the file's gold labels (as --label-column none): nothing is scored."
    )(command)


def _without_gold(values: dict[str, Any], no_gold: bool) -> dict[str, Any]:
    """--no-gold: the label column set to none."""
    if no_gold:
        given = values.get("columns", {}).get("label")
        if given not in (None, NO_GOLD):
            raise click.UsageError(f"--no-gold ignores the gold labels, and --label-column {given} names them")
        values.setdefault("columns", {})["label"] = NO_GOLD
    return values


@click.command()
@click.argument("input_path", metavar="INPUT", type=PATH, callback=input_file)
@click.option(
    "--output-dir", type=PATH, help="Folder for <split>.parquet and <split>.rejects.jsonl.  [default: data/prepared]"
)
@renamed_option("--output", "--output-dir", "old_output", type=PATH)
@renamed_option("--device", "--parser-device", "old_device", type=click.Choice(get_args(Device)))
@click.option("--split", help="Split name (default: from the file name).")
@_no_parse_cache
@_no_gold
@field_options(ParseSettings)
def parse(
    input_path: Path,
    output_dir: Path | None,
    old_output: Path | None,
    old_device: str | None,
    split: str | None,
    no_parse_cache: bool,
    no_gold: bool,
    **options: Any,
) -> None:
    """Parse sentence pairs (CSV, TSV, JSONL, Parquet) with Stanza into prepared Parquet, like `spinn prepare`."""
    from spinn.parsing.parse import parse_pairs

    old = {"parsing": {"device": old_device}} if old_device else {}
    values = _without_gold(_without_cache(given(ParseSettings, options), no_parse_cache), no_gold)
    settings = resolve(ParseSettings, None, old, values)
    folder = output_folder(output_dir, old_output, Path("data/prepared"))
    summary = parse_pairs(input_path, folder, settings, split=split)
    click.echo("\n".join(summary.report()))


@click.command()
@click.argument("input_path", metavar="INPUT", type=PATH, callback=input_file)
@click.option(
    "--model", "model_reference", required=True, help="Checkpoint path or MLflow model URI (models:/spinn@champion)."
)
@click.option(
    "--output", type=click.Path(), callback=output_file(".parquet"), required=True, help="Predictions Parquet file."
)
@_no_parse_cache
@_no_gold
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Bars on stderr with pairs/s for the parse and model phases.  [default: when stderr is a terminal]",
)
@click.option(
    "--track/--no-track",
    default=False,
    help="Log the run to MLflow (experiment spinn-labeling), linked to the model version.  [default: no-track]",
)
@field_options(LabelSettings)
def label(
    input_path: Path,
    model_reference: str,
    output: Path,
    no_parse_cache: bool,
    no_gold: bool,
    progress: bool | None,
    track: bool,
    **options: Any,
) -> None:
    """Label sentence pairs with a trained model: label, probabilities and trees per row; resumable."""
    from spinn.labeling.label import label as label_stage
    from spinn.labeling.summary import TooManyRejected

    values = _without_gold(_without_cache(given(LabelSettings, options), no_parse_cache), no_gold)
    settings = resolve(LabelSettings, None, values)
    shown = sys.stderr.isatty() if progress is None else progress
    try:
        summary = label_stage(input_path, model_reference, output, settings, progress=shown)
    except TooManyRejected as error:  # the output is written: say what it holds, then fail
        _report(error.summary, settings, track)
        raise
    _report(summary, settings, track)


def _report(summary, settings: LabelSettings, track: bool) -> None:
    """The summary, and with --track its MLflow run."""
    click.echo("\n".join(summary.report()))
    if not track:
        return
    from spinn.labeling.track import LABELING_EXPERIMENT, log_label_run
    from spinn.tracking.links import ui_hint
    from spinn.tracking.store import tracking_uri

    tracked = log_label_run(summary, settings)
    if tracked is None:
        click.echo(f"no MLflow run logged: this run did nothing ({summary.output} is already this command's output)")
        return
    click.echo(f"MLflow run {tracked.run_id} (experiment {LABELING_EXPERIMENT}) in {tracking_uri()}")
    click.echo(f"  {ui_hint(tracked.experiment_id, tracked.run_id)}")


@click.command()
@click.argument("input_path", metavar="INPUT", type=PATH, required=False, callback=input_file)
@renamed_option("--input", "the INPUT argument", "old_input", type=PATH)
@click.option("--model", "model_reference", required=True, help="A spinn or rl checkpoint, or an MLflow model URI.")
@click.option(
    "--output",
    type=PATH,
    required=True,
    help="A .txt INPUT: its tree per line, line for line. A pairs file: .jsonl, per row its pair_id, row and trees.",
)
@click.option(
    "--html", callback=output_with_suffix(".html", ".htm"), help="Also draw the first trees as SVG in this HTML page."
)
@field_options(TreesSettings)
def trees(
    input_path: Path | None,
    old_input: Path | None,
    model_reference: str,
    output: Path,
    html: Path | None,
    **options: Any,
) -> None:
    """Write the binary trees a model builds by itself, in SNLI's bracket format.

    INPUT: a .txt file with one sentence per line, or a sentence-pair file (CSV, TSV, JSONL, Parquet) whose rows
    keep their pair ids as `spinn label` gives them."""
    from spinn.labeling.induced_trees import induce_trees

    source = input_path or old_input
    if source is None:
        raise click.UsageError("Missing argument 'INPUT'.")
    settings = resolve(TreesSettings, None, given(TreesSettings, options))
    count = induce_trees(model_reference, source, output, settings, html=html)
    click.echo(f"{count} trees written to {output}" + (f"; drawings in {html}" if html else ""))
