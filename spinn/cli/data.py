"""`spinn download | prepare | vocab | embeddings | check-binarization | check-tokens`: the data stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import click

from spinn.cli.common import PATH, config_option, input_file, output_folder, output_with_suffix
from spinn.data.download import CorpusName, DownloadSettings
from spinn.data.embeddings import EmbeddingSettings
from spinn.data.prepare import PrepareSettings
from spinn.data.vocab import VocabSettings
from spinn.ground.io import publishing
from spinn.options import field_options, given, renamed_option, resolve


@click.command()
@click.argument("corpus", type=click.Choice(get_args(CorpusName)), required=False)
@click.option("--raw-dir", type=PATH, default=Path("data/raw"), show_default=True, help="Folder for the archive.")
@click.option("--no-extract", is_flag=True, help="Only fetch and verify the archive.")
@config_option("download")
@field_options(DownloadSettings, exclude=("corpus",))
def download(corpus: str | None, raw_dir: Path, no_extract: bool, config_path: Path | None, **options: Any) -> None:
    """Fetch, verify and extract an official NLI corpus archive (resumable). CORPUS: snli (default) or multinli."""
    from spinn.data.download import download as download_stage
    from spinn.data.download import for_chosen_corpus

    chosen = {"corpus": corpus} if corpus else {}
    values = given(DownloadSettings, options)
    settings = resolve(DownloadSettings, config_path, values, chosen)
    settings = for_chosen_corpus(settings, resolve(DownloadSettings, config_path), "archive" in values)
    result = download_stage(raw_dir, settings, extract=not no_extract)
    state = "downloaded and verified" if result.fetched else "already present and verified"
    click.echo(f"{result.archive}: {state}")
    if not no_extract:
        click.echo(
            f"extracted {result.members} files into {result.extracted_to}"
            if result.members
            else f"extracted files already up to date in {result.extracted_to}"
        )


@click.command()
@click.argument("input_path", metavar="INPUT", type=PATH, callback=input_file)
@click.option(
    "--output-dir", type=PATH, help="Folder for <split>.parquet and <split>.rejects.jsonl.  [default: data/prepared]"
)
@renamed_option("--output", "--output-dir", "old_output", type=PATH)
@click.option("--split", help="Split name (default: from the file name, e.g. train, dev_matched).")
@click.option("--member", help="File inside a zip INPUT (full path or unique file name).")
@config_option("prepare")
@field_options(PrepareSettings)
def prepare(
    input_path: Path,
    output_dir: Path | None,
    old_output: Path | None,
    split: str | None,
    member: str | None,
    config_path: Path | None,
    **options: Any,
) -> None:
    """Convert an SNLI/MultiNLI file (.jsonl/.txt, .gz, or in a zip) into prepared Parquet."""
    from spinn.data.prepare import TooManyRejects
    from spinn.data.prepare import prepare as prepare_stage

    settings = resolve(PrepareSettings, config_path, given(PrepareSettings, options))
    folder = output_folder(output_dir, old_output, Path("data/prepared"))
    try:
        summary = prepare_stage(input_path, folder, settings, split=split, member=member)
    except TooManyRejects as failure:
        click.echo("\n".join(failure.summary.report()))
        raise
    click.echo("\n".join(summary.report()))


@click.command()
@click.argument("train", type=PATH, callback=input_file)
@click.option(
    "--output", callback=output_with_suffix(".json"), help="Where to write (default: vocab.json beside TRAIN)."
)
@config_option("vocab")
@field_options(VocabSettings)
def vocab(train: Path, output: Path | None, config_path: Path | None, **options: Any) -> None:
    """Build the word vocabulary from a prepared training split."""
    from spinn.data.vocab import vocab_stage

    settings = resolve(VocabSettings, config_path, given(VocabSettings, options))
    vocabulary, path = vocab_stage(train, output, settings)
    click.echo(f"{path}: {len(vocabulary)} entries (lowercase={vocabulary.lowercase}, min_freq={vocabulary.min_freq})")


@click.command()
@click.option(
    "--vocab",
    "vocab_path",
    type=PATH,
    default=Path("data/prepared/vocab.json"),
    show_default=True,
    callback=input_file,
    help="The vocabulary to align the vectors to.",
)
@click.option(
    "--cache-dir",
    type=PATH,
    default=Path("data/embeddings"),
    show_default=True,
    help="Where the aligned matrix is cached; `spinn train` looks here.",
)
@config_option("embeddings")
@field_options(EmbeddingSettings)
def embeddings(vocab_path: Path, cache_dir: Path, config_path: Path | None, **options: Any) -> None:
    """Align word vectors to the vocabulary and cache them for training."""
    from spinn.data.embeddings import embeddings_stage

    settings = resolve(EmbeddingSettings, config_path, given(EmbeddingSettings, options))
    with publishing((cache_dir,), inputs=(vocab_path,)):
        report = embeddings_stage(vocab_path, settings, cache_dir=cache_dir)
    state = "cached already" if report.from_cache else "aligned and cached"
    click.echo(
        f"{report.source}: {report.dim}d vectors for {report.found} of {report.found + report.oov} words "
        f"({report.coverage:.2%}), {state} in {report.cache_path}"
    )


@click.command("check-binarization")
@click.argument("input_path", metavar="FILE", type=PATH, callback=input_file)
@click.option("--member", help="File inside a zip FILE.")
@click.option("--show", type=click.IntRange(min=0), default=5, show_default=True, help="Mismatches to print.")
def check_binarization(input_path: Path, member: str | None, show: int) -> None:
    """Binarize every sentence*_parse and report agreement with sentence*_binary_parse."""
    from spinn.data.check_binarization import binarization_agreement

    agreement = binarization_agreement(input_path, member)
    for mismatch in agreement.examples[:show]:
        click.echo(f"line {mismatch.line} {mismatch.field}\n  ours:   {mismatch.ours}\n  corpus: {mismatch.theirs}")
    if agreement.unreadable:
        click.echo(f"unreadable sentences skipped: {agreement.unreadable}")
    click.echo(agreement.summary_line())


@click.command("check-tokens")
@click.argument("input_path", metavar="FILE", type=PATH)
@click.option("--member", help="File inside a zip FILE.")
@click.option("--residue", is_flag=True, help="Also print the differing sentences, grouped by kind.")
@click.option("--examples", type=click.IntRange(min=0), default=3, show_default=True, help="Sentences shown per kind.")
def check_tokens(input_path: Path, member: str | None, residue: bool, examples: int) -> None:
    """Tokenize every sentence1/sentence2 with spinn.trees.tokenize and report agreement with the leaves of
    sentence*_binary_parse (the tokens a model trained on the corpus knows)."""
    from spinn.data.token_agreement import token_agreement

    agreement = token_agreement(input_path, member)
    if residue:
        for kind, count in agreement.kinds.most_common():
            click.echo(f"residue {kind.value}: {count}")
            for mismatch in agreement.examples_by_kind[kind][:examples]:
                click.echo(f"  line {mismatch.line} {mismatch.field}\n    ours:   {mismatch.ours}")
                click.echo(f"    corpus: {mismatch.theirs}")
    if agreement.unreadable:
        click.echo(f"unreadable sentences skipped: {agreement.unreadable}")
    click.echo(agreement.summary_line())
