"""`spinn <stage>`: a thin command line over the stage functions.

Each command parses options, calls one stage function, and prints that
function's summary. DVC stages and Prefect tasks call the same functions, so
nothing here may hold logic of its own. A SpinnError becomes a one-line
`error: ...` on stderr and exit status 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from spinn.errors import SpinnError

EXIT_USER_ERROR = 1


class _Group(click.Group):
    """Turns user-facing errors into one line instead of a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SpinnError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(EXIT_USER_ERROR)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spinn")
def main() -> None:
    """Train SPINN models for natural language inference and label sentence pairs with them."""


@main.command()
@click.argument("corpus", type=click.Choice(["snli", "multinli"]))
@click.option("--raw-dir", type=click.Path(path_type=Path), default=Path("data/raw"), show_default=True,
              help="Folder for the archive and its extracted files.")
@click.option("--url", envvar="SPINN_DOWNLOAD_URL", show_envvar=True,
              help="Fetch from this mirror instead of the official address.")
@click.option("--file", "local_file", type=click.Path(path_type=Path), envvar="SPINN_DOWNLOAD_FILE", show_envvar=True,
              help="Copy this local archive instead of fetching.")
@click.option("--checksum", envvar="SPINN_DOWNLOAD_CHECKSUM", show_envvar=True,
              help="Expected digest, e.g. sha256:HEX or md5:HEX (default: the published one).")
@click.option("--no-extract", is_flag=True, help="Only fetch and verify the archive.")
def download(corpus: str, raw_dir: Path, url: str | None, local_file: Path | None, checksum: str | None,
             no_extract: bool) -> None:
    """Fetch, verify and extract an official NLI corpus archive (resumable)."""
    from spinn.download import download_corpus

    result = download_corpus(corpus, raw_dir, url=url, file=local_file, checksum=checksum, extract=not no_extract)
    state = "downloaded and verified" if result.fetched else "already present and verified"
    click.echo(f"{result.archive}: {state}")
    if not no_extract:
        click.echo(f"extracted {result.members} files into {result.extracted_to}" if result.members
                   else f"extracted files already up to date in {result.extracted_to}")


@main.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.option("--output", "output_dir", type=click.Path(path_type=Path), default=Path("data/prepared"),
              show_default=True, help="Folder for <split>.parquet and <split>.rejects.jsonl.")
@click.option("--split", help="Split name (default: from the file name, e.g. train, dev_matched).")
@click.option("--member", help="File inside a zip INPUT (full path or unique file name).")
@click.option("--trees", type=click.Choice(["auto", "binary", "nary"]), default="auto", show_default=True,
              help="Tree source: the corpus binary parse, or its n-ary parse through our binarizer.")
@click.option("--max-reject-ratio", type=click.FloatRange(0, 1), default=0.01, show_default=True,
              help="Fail when more than this share of lines is rejected.")
@click.option("--workers", type=click.IntRange(min=1), help="Parsing processes (default: CPU count, at most 4).")
def prepare(input_path: Path, output_dir: Path, split: str | None, member: str | None, trees: str,
            max_reject_ratio: float, workers: int | None) -> None:
    """Convert an SNLI/MultiNLI file (.jsonl/.txt, .gz, or in a zip) into prepared Parquet."""
    from spinn.corpus import TreeSource
    from spinn.prepare import TooManyRejects
    from spinn.prepare import prepare as prepare_stage

    try:
        summary = prepare_stage(input_path, output_dir, split=split, trees=TreeSource(trees), member=member,
                                max_reject_ratio=max_reject_ratio, workers=workers)
    except TooManyRejects as failure:
        click.echo("\n".join(failure.summary.report()))
        raise
    click.echo("\n".join(summary.report()))


@main.command()
@click.argument("train", type=click.Path(path_type=Path))
@click.option("--output", type=click.Path(path_type=Path), help="Where to write (default: vocab.json beside TRAIN).")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="params.yaml whose `vocab` section sets the options below (options given here win).")
@click.option("--lowercase/--keep-case", default=None, help="Fold case (default: true).")
@click.option("--min-freq", type=click.IntRange(min=1), help="Keep words seen at least this often (default: 1).")
@click.option("--max-size", type=click.IntRange(min=2), help="Keep at most this many entries, specials included.")
def vocab(train: Path, output: Path | None, config_path: Path | None, lowercase: bool | None, min_freq: int | None,
          max_size: int | None) -> None:
    """Build the word vocabulary from a prepared training split."""
    from spinn.vocab import vocab_stage

    settings = _section(config_path, "vocab", lowercase=lowercase, min_freq=min_freq, max_size=max_size)
    vocabulary, path = vocab_stage(train, output, **settings)
    click.echo(f"{path}: {len(vocabulary)} entries (lowercase={vocabulary.lowercase}, min_freq={vocabulary.min_freq})")


@main.command()
@click.option("--vocab", "vocab_path", type=click.Path(path_type=Path), default=Path("data/prepared/vocab.json"),
              show_default=True, help="The vocabulary to align the vectors to.")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="params.yaml whose `embeddings` section sets source, oov and seed (options given here win).")
@click.option("--source", help="glove-6b-50d (packaged, offline; the default), a GloVe text file, or its URL.")
@click.option("--oov", type=click.Choice(["random", "zeros"]), help="Vectors for words without one (default: random).")
@click.option("--seed", type=int, help="Seed of the random OOV vectors (default: 1234).")
@click.option("--cache-dir", type=click.Path(path_type=Path), default=Path("data/embeddings"), show_default=True,
              help="Where the aligned matrix is cached; `spinn train` looks here.")
def embeddings(vocab_path: Path, config_path: Path | None, source: str | None, oov: str | None, seed: int | None,
               cache_dir: Path) -> None:
    """Align word vectors to the vocabulary and cache them for training."""
    from spinn.embeddings import embeddings_stage

    settings = _section(config_path, "embeddings", source=source, oov=oov, seed=seed)
    report = embeddings_stage(vocab_path, cache_dir=cache_dir, **settings)
    state = "cached already" if report.from_cache else "aligned and cached"
    click.echo(f"{report.source}: {report.dim}d vectors for {report.found} of {report.found + report.oov} words "
               f"({report.coverage:.2%}), {state} in {report.cache_path}")


def _section(config_path: Path | None, section: str, **options) -> dict:
    """A params.yaml section overlaid with the options given on the command line (None = not given)."""
    from spinn.config import read_params_section

    settings = read_params_section(config_path, section) if config_path is not None else {}
    unknown = sorted(set(settings) - set(options))
    if unknown:
        raise SpinnError(f"{config_path}: unknown {section} settings {unknown}; known: {sorted(options)}")
    settings.update({key: value for key, value in options.items() if value is not None})
    return settings


@main.command("check-binarization")
@click.argument("input_path", metavar="FILE", type=click.Path(path_type=Path))
@click.option("--member", help="File inside a zip FILE.")
@click.option("--show", type=click.IntRange(min=0), default=5, show_default=True, help="Mismatches to print.")
def check_binarization(input_path: Path, member: str | None, show: int) -> None:
    """Binarize every sentence*_parse and report agreement with sentence*_binary_parse."""
    from spinn.agreement import binarization_agreement

    agreement = binarization_agreement(input_path, member)
    for mismatch in agreement.examples[:show]:
        click.echo(f"line {mismatch.line} {mismatch.field}\n  ours:   {mismatch.ours}\n  corpus: {mismatch.theirs}")
    if agreement.unreadable:
        click.echo(f"unreadable sentences skipped: {agreement.unreadable}")
    click.echo(agreement.summary_line())


@main.command()
@click.option("--train", "train_path", type=click.Path(path_type=Path), default=Path("data/prepared/train.parquet"),
              show_default=True, help="Prepared training split.")
@click.option("--dev", "dev_path", type=click.Path(path_type=Path), default=Path("data/prepared/dev.parquet"),
              show_default=True, help="Prepared dev split (periodic evaluation, early stopping, model selection).")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="params.yaml whose `train` and `embeddings` sections set the run.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a setting, e.g. --set model.variant=spinn --set max_steps=2000 (repeatable).")
@click.option("--variant", type=click.Choice(["cbow", "pi-nt", "pi", "spinn", "rl"]),
              help="Shortcut for --set model.variant=...")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), help="Shortcut for --set device=...")
@click.option("--vocab", "vocab_path", type=click.Path(path_type=Path), help="Vocabulary (default: vocab.json beside --train).")
@click.option("--output", "output_dir", type=click.Path(path_type=Path), default=Path("data/models"), show_default=True,
              help="Folder for last.pt, best.pt and report.json.")
@click.option("--embeddings-dir", type=click.Path(path_type=Path), default=Path("data/embeddings"), show_default=True,
              help="Cache of aligned word vectors (`spinn embeddings` fills it).")
@click.option("--metrics-dir", type=click.Path(path_type=Path),
              help="Also write train.json and the train/dev curves (CSV) here, for DVC metrics and plots.")
@click.option("--resume", is_flag=True, help="Continue from OUTPUT/last.pt (same MLflow run).")
@click.option("--run-name", help="MLflow run name.")
@click.option("--no-register", is_flag=True, help="Do not register the model in the MLflow registry.")
def train(train_path: Path, dev_path: Path, config_path: Path | None, overrides: tuple[str, ...], variant: str | None,
          device: str | None, vocab_path: Path | None, output_dir: Path, embeddings_dir: Path, metrics_dir: Path | None,
          resume: bool, run_name: str | None, no_register: bool) -> None:
    """Train a SPINN model with MLflow tracking, checkpoints and model registration."""
    from spinn.config import load_train_config
    from spinn.train import train as train_stage
    from spinn.train import write_metrics_files

    shortcuts = [f"model.variant={variant}"] if variant else []
    shortcuts += [f"device={device}"] if device else []
    config = load_train_config(config_path, [*shortcuts, *overrides])
    result = train_stage(train_path, dev_path, config, output_dir=output_dir, vocab_path=vocab_path,
                         embeddings_dir=embeddings_dir, resume=resume, run_name=run_name, register=not no_register)
    click.echo(f"best dev accuracy {result.best_dev_accuracy:.4f} at step {result.best_step} of {result.steps} "
               f"({result.pairs_per_second:.0f} pairs/s over {result.train_seconds:.0f} s of training)")
    click.echo(f"checkpoint {result.best_checkpoint}; MLflow run {result.run_id}")
    if result.model_version is not None:
        promoted = f", now @{config.alias}" if result.promoted else f"; @{config.alias} stays (it scores higher on dev)"
        click.echo(f"registered as models:/{config.registered_model}/{result.model_version}{promoted}")
    if metrics_dir is not None:
        click.echo(f"metrics and curves written to {', '.join(map(str, write_metrics_files(result, metrics_dir)))}")


@main.command()
@click.option("--model", "model_reference", required=True,
              help="Checkpoint path or MLflow model URI (models:/spinn@champion, runs:/ID/model).")
@click.option("--data", type=click.Path(path_type=Path), required=True, help="Prepared split to score.")
@click.option("--output", type=click.Path(path_type=Path), default=Path("metrics.json"), show_default=True)
@click.option("--plot", type=click.Path(path_type=Path), help="Also write the confusion matrix as a PNG here.")
@click.option("--predictions", type=click.Path(path_type=Path),
              help="Also write actual,predicted per pair as CSV here (DVC's confusion plot).")
@click.option("--track/--no-track", default=True, show_default=True,
              help="Log <split>_accuracy and <split>_macro_f1 to the MLflow run that trained the model.")
@click.option("--vocab", type=click.Path(path_type=Path), help="Check the model was trained with this vocabulary.")
@click.option("--transitions", type=click.Choice(["auto", "gold", "predicted"]), default="auto", show_default=True,
              help="Run on the parses, or on the model's own transitions (spinn); auto: predicted for spinn.")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
def evaluate(model_reference: str, data: Path, output: Path, plot: Path | None, predictions: Path | None, track: bool,
             vocab: Path | None, transitions: str, batch_size: int, device: str) -> None:
    """Score a trained model on a prepared split: accuracy, per-class P/R/F1, confusion matrix."""
    from spinn.evaluate import evaluate as evaluate_stage

    metrics = evaluate_stage(model_reference, data, output, plot=plot, predictions=predictions, vocab=vocab,
                             transitions=transitions, batch_size=batch_size, device=device, track=track)
    line = f"accuracy {metrics.accuracy:.4f} on {metrics.examples} pairs (macro F1 {metrics.macro_f1:.4f})"
    if metrics.transition_accuracy is not None:
        line += f", transition accuracy {metrics.transition_accuracy:.4f}"
    click.echo(line)
    click.echo(f"metrics written to {output}" + (f", confusion matrix to {plot}" if plot else ""))


def _pair_input_options(command):
    """Options shared by `parse` and `label`: which columns hold what, and how Stanza runs."""
    options = [
        click.option("--format", "input_format", type=click.Choice(["csv", "tsv", "jsonl", "parquet"]),
                     help="Input format (default: from the file name)."),
        click.option("--premise-column", help="Default: premise, else sentence1."),
        click.option("--hypothesis-column", help="Default: hypothesis, else sentence2."),
        click.option("--id-column", help="Default: id, pair_id or pairID when present, else the row number."),
        click.option("--label-column", help="Gold labels, optional (default: label or gold_label when present)."),
        click.option("--stanza-dir", type=click.Path(path_type=Path), envvar="SPINN_STANZA_DIR", show_envvar=True,
                     help="A local stanza_resources folder, used offline (default: Stanza's English models "
                          "under STANZA_RESOURCES_DIR, downloaded when missing)."),
        click.option("--parse-batch-size", type=click.IntRange(min=1), default=256, show_default=True,
                     help="Sentences per Stanza batch."),
        click.option("--max-tokens", type=click.IntRange(min=1), default=100, show_default=True,
                     help="Longer sentences are rejected (too_long)."),
        click.option("--parse-cache", type=click.Path(path_type=Path), default=Path("data/parse_cache/parses.sqlite"),
                     show_default=True, help="Parses cached by sentence and parser model."),
        click.option("--no-parse-cache", is_flag=True, help="Neither read nor write the parse cache."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _input_settings(settings: dict, device: str = "auto"):
    """Pop the shared options out of a command's keyword arguments into Columns and ParserSettings."""
    from spinn.parse import ParserSettings
    from spinn.sentence_pairs import Columns

    columns = Columns(premise=settings.pop("premise_column"), hypothesis=settings.pop("hypothesis_column"),
                      id=settings.pop("id_column"), label=settings.pop("label_column"))
    no_cache, cache = settings.pop("no_parse_cache"), settings.pop("parse_cache")
    parsing = ParserSettings(stanza_dir=settings.pop("stanza_dir"), batch_size=settings.pop("parse_batch_size"),
                             device=device, max_tokens=settings.pop("max_tokens"),
                             cache_path=None if no_cache else cache)
    return columns, parsing


@main.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.option("--output", "output_dir", type=click.Path(path_type=Path), default=Path("data/prepared"),
              show_default=True, help="Folder for <split>.parquet and <split>.rejects.jsonl.")
@click.option("--split", help="Split name (default: from the file name).")
@click.option("--trees", type=click.Choice(["stanza", "none"]), default="stanza", show_default=True,
              help="none: tokens only, no parser, for models that build their own trees (rl).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@_pair_input_options
def parse(input_path: Path, output_dir: Path, split: str | None, trees: str, device: str, input_format: str | None,
          **settings) -> None:
    """Parse sentence pairs (CSV, TSV, JSONL, Parquet) with Stanza into prepared Parquet, like `spinn prepare`."""
    from spinn.parse_stage import parse_pairs

    columns, parsing = _input_settings(settings, device)
    summary = parse_pairs(input_path, output_dir, split=split, columns=columns, input_format=input_format,
                          settings=parsing, trees=trees)
    click.echo("\n".join(summary.report()))


@main.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.option("--model", "model_reference", required=True,
              help="Checkpoint path or MLflow model URI (models:/spinn@champion).")
@click.option("--output", type=click.Path(path_type=Path), required=True, help="Predictions Parquet file.")
@click.option("--parser", type=click.Choice(["auto", "stanza", "model"]), default="auto", show_default=True,
              help="stanza: parse first; model: a spinn model builds its own trees from tokens; auto: stanza.")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True, help="Pairs per model batch.")
@click.option("--shard-size", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Rows per shard: the unit of resuming and of parallel work.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@_pair_input_options
def label(input_path: Path, model_reference: str, output: Path, parser: str, batch_size: int, shard_size: int,
          device: str, input_format: str | None, **settings) -> None:
    """Label sentence pairs with a trained model: label, probabilities and trees per row; resumable."""
    from spinn.label import LabelSettings
    from spinn.label import label as label_stage

    columns, parsing = _input_settings(settings, device)
    label_settings = LabelSettings(parser=parser, batch_size=batch_size, shard_size=shard_size, device=device,
                                   columns=columns, input_format=input_format, parsing=parsing)
    summary = label_stage(input_path, model_reference, output, label_settings)
    click.echo("\n".join(summary.report()))


@main.command()
@click.option("--model", "model_reference", required=True, help="A spinn or rl checkpoint, or an MLflow model URI.")
@click.option("--input", "input_path", type=click.Path(path_type=Path), required=True,
              help="A .txt file with one sentence per line, or a sentence-pair file (CSV, TSV, JSONL, Parquet).")
@click.option("--output", type=click.Path(path_type=Path), required=True, help="One bracketed tree per line.")
@click.option("--html", type=click.Path(path_type=Path), help="Also draw the first trees as SVG in this HTML page.")
@click.option("--html-trees", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
def trees(model_reference: str, input_path: Path, output: Path, html: Path | None, html_trees: int,
          device: str) -> None:
    """Write the binary trees a model builds by itself, in SNLI's bracket format."""
    from spinn.induce import induce_trees

    count = induce_trees(model_reference, input_path, output, device=device, html=html, html_trees=html_trees)
    click.echo(f"{count} trees written to {output}" + (f"; drawings in {html}" if html else ""))


@main.command()
@click.option("--corpus", type=click.Path(path_type=Path), required=True,
              help="SNLI-format .jsonl(.gz) with binary parses, or a prepared .parquet split.")
@click.option("--pairs", type=int, help="Resample the corpus to this many pairs (e.g. 550152 for an SNLI epoch).")
@click.option("--variant", type=click.Choice(["pi-nt", "pi", "spinn", "rl"]), default="pi", show_default=True)
@click.option("--mode", type=click.Choice(["train", "infer"]), default="train", show_default=True)
@click.option("--impl", type=click.Choice(["fast", "reference"]), default="fast", show_default=True,
              help="reference: the seed article's per-example stacks, kept only for comparison.")
@click.option("--compose", type=click.Choice(["needed", "all"]), default="needed", show_default=True,
              help="Compose only the rows that reduce, or every row at every step.")
@click.option("--batch-size", type=int, default=128, show_default=True)
@click.option("--d-hidden", type=int, default=300, show_default=True)
@click.option("--d-tracker", type=int, default=64, show_default=True)
@click.option("--d-embed", type=int, default=300, show_default=True)
@click.option("--steps", type=int, default=20, show_default=True, help="Timed steps.")
@click.option("--warmup", type=int, default=3, show_default=True, help="Untimed steps first.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--amp/--no-amp", default=False, show_default=True, help="bf16 autocast (cell state stays fp32).")
@click.option("--compile/--no-compile", "compile_cells", default=False, show_default=True,
              help="torch.compile the elementwise cells.")
@click.option("--threads", type=int, help="torch intra-op threads (default: torch's choice).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line instead of a summary.")
def bench(as_json: bool, compile_cells: bool, **settings) -> None:
    """Time SPINN training or inference steps on real trees and print pairs/s and peak memory."""
    import json

    from spinn.bench import run_bench

    result = run_bench(compile=compile_cells, **settings)
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"{result['variant']} {result['mode']} impl={result['impl']} compose={result['compose']} "
               f"D={result['d_hidden']} batch={result['batch_size']} on {result['device_name']} "
               f"({result['threads']} threads): {result['pairs_per_second']:.0f} pairs/s, "
               f"{result['seconds_per_step'] * 1000:.1f} ms/step, peak memory {result['peak_memory_bytes'] / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
