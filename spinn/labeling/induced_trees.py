"""`spinn trees`: the binary trees a model builds for itself, in SNLI's bracket format.

A `spinn` or `rl` model chooses its own SHIFT/REDUCE sequence (greedy, the
best legal action); writing the trees out lets users see what an `rl` model
learned to parse without ever seeing a parse. The trees come from the same
inference loop as labelling's (spinn/inference/predict.py), so `spinn trees`
draws exactly the trees that `spinn label --parser model` records.

Every tree can be joined back to where its sentence came from: a .txt input's
line N has its tree on the output's line N, and a pairs file's row gives one
JSON line with the row's `pair_id` (the id rules of `spinn label`: the same
reader, columns and sidecar) and its two trees, under label's column names.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import ClassVar, NamedTuple

from pydantic import Field

from spinn.data.example import Example
from spinn.data.limits import TEXT_MAX_TOKENS, UTF8_MAX_BYTES, MaxTokens, max_chars
from spinn.data.sentence_pairs import Columns, Format, InputPair, read_input_pairs
from spinn.data.text_lines import open_bytes, text_lines
from spinn.ground.cores import torch_threads
from spinn.ground.errors import SpinnError, SpinnWarning
from spinn.ground.io import atomic_path, publishing
from spinn.ground.settings import AUTO, Device, Settings, ThreadCount
from spinn.inference.predict import predict
from spinn.model.config import TransitionSource
from spinn.model.loading import LoadedModel, load_model, resolve_device
from spinn.trees.tokenize import tokenize
from spinn.trees.transitions import format_transitions, parse_binary
from spinn.trees.treeview import render_trees

TEXT_SUFFIX = ".txt"
PAIRS_OUTPUT_SUFFIX = ".jsonl"
NO_TREE = ""
"""The tree of a blank line: the line stays, so line numbers still join."""
HTML_TREES = 20
BATCH_SENTENCES = 256
REFUSED_SHOWN = 5
"""How many refused lines a warning names."""
SENTENCES_PER_PAIR = 2
"""The model reads pairs; `spinn trees` feeds it its sentences two at a time."""

Tokens = tuple[str, ...]


class TreesSettings(Settings):
    """How a model's own trees are drawn out."""

    not_on_cli: ClassVar[dict[str, str]] = {
        "columns.label": "`spinn trees` writes trees, not labels; gold labels are for `spinn label` and `spinn parse`",
        "columns.label_scheme": "`spinn trees` writes trees, not labels; gold labels are for `spinn label`",
    }

    batch_size: int = Field(BATCH_SENTENCES, ge=1)
    """Sentences per model batch."""
    html_trees: int = Field(HTML_TREES, ge=1)
    """How many trees the HTML page draws."""
    device: Device = "auto"
    """Where the model runs; auto: the GPU when there is one."""
    threads: ThreadCount = AUTO
    """torch threads on CPU; auto: the cores other work leaves free, within the cores this process may use,
    followed as they change (spinn/ground/cores.py). The trees do not depend on it."""
    max_tokens: MaxTokens = TEXT_MAX_TOKENS
    """A sentence (a .txt line, a pairs file's sentence) longer than this many tokens allows in characters is
    skipped before the tokenizer sees it (spinn/data/limits.py)."""
    columns: Columns = Columns()
    """Which columns of a pairs file hold the pair and its id."""
    input_format: Format | None = Field(None, json_schema_extra={"cli": "--format"})
    """A pairs file's format (default: from the file name)."""


def induce_trees(
    model_reference: str | Path,
    input_path: Path,
    output: Path,
    settings: TreesSettings | None = None,
    *,
    html: Path | None = None,
) -> int:
    """Write the tree of every sentence (a .txt input: one line per input line; a pairs file: one JSON line
    per valid row, with its pair id and both trees; rows `spinn label` would reject are left out), and
    optionally draw the first `html_trees` distinct trees as an HTML page; returns how many trees were
    written. Each distinct sentence is parsed once (SNLI-style data repeats a premise for each of its
    hypotheses). Refused before the model loads when an output is the input or the model, while another run
    writes one (spinn.ground.io.publishing), or when a pairs file's output is not .jsonl."""
    input_path, output = Path(input_path), Path(output)
    written = [output, *([Path(html)] if html is not None else [])]
    with publishing(written, inputs=[input_path, Path(model_reference)]):
        settings = settings or TreesSettings()
        pairs = None if input_path.name.endswith(TEXT_SUFFIX) else _pairs(input_path, output, settings)
        loaded = _tree_builder(model_reference, settings)
        sentences = (
            _lines(input_path, settings.max_tokens) if pairs is None else [side for pair in pairs for side in pair[1:]]
        )
        with torch_threads(settings.threads, where="trees"):
            trees = _distinct_trees(loaded, sentences, settings.batch_size)
        text = _tree_lines(sentences, trees) if pairs is None else _pair_lines(pairs, trees)
        with atomic_path(output) as temporary:
            temporary.write_text(text, encoding="utf-8")
        if html is not None:
            drawn = [parse_binary(tree) for tree in list(trees.values())[: settings.html_trees]]
            render_trees(drawn, html, title=f"Trees of {model_reference}")
        return sum(1 for tokens in sentences if tokens)


def _tree_builder(model_reference: str | Path, settings: TreesSettings) -> LoadedModel:
    loaded = load_model(model_reference, resolve_device(settings.device))
    if not loaded.model.config.predicts_transitions:
        raise SpinnError(f"a {loaded.model.config.variant} model does not build its own trees; use spinn or rl")
    return loaded


def _lines(path: Path, max_tokens: int) -> list[Tokens]:
    """A .txt input's sentences, one per line, blank lines kept (as no tokens) so line numbers still join. A
    line longer than `max_tokens` allows in characters, or not UTF-8, draws no tree either (counted in a
    warning): it is never tokenized, nor read whole (spinn.data.text_lines)."""
    limit, sentences, refused = max_chars(max_tokens), [], []
    with open_bytes(path) as stream:
        for line in text_lines(stream, path, limit * UTF8_MAX_BYTES):
            text = line.text.rstrip("\r\n")
            refuse = line.overlong or line.encoding_error or len(text) > limit
            refused += [line.number] if refuse else []
            sentences.append(() if refuse else tuple(tokenize(text)))
    if refused:
        shown = ", ".join(map(str, refused[:REFUSED_SHOWN])) + (", ..." if len(refused) > REFUSED_SHOWN else "")
        message = (
            f"{path}: {len(refused)} lines draw no tree: longer than --max-tokens {max_tokens} allows, or not UTF-8"
        )
        warnings.warn(SpinnWarning(f"{message} (lines {shown})"), stacklevel=2)
    return sentences


class _Pair(NamedTuple):
    """A valid row of a pairs file, tokenized: what its record is made of."""

    source: InputPair
    premise: Tokens
    hypothesis: Tokens


def _pairs(path: Path, output: Path, settings: TreesSettings) -> list[_Pair]:
    """The rows `spinn label` would label (same reader, columns, format and token limit), tokenized; checked
    first: their records go to JSON lines, so the output must say so."""
    if not output.name.endswith(PAIRS_OUTPUT_SUFFIX):
        raise SpinnError(
            f"{output}: the trees of a pairs file are JSON lines that carry each row's pair_id; "
            f"give --output a {PAIRS_OUTPUT_SUFFIX} name"
        )
    rows = read_input_pairs(path, settings.columns, settings.input_format, max_tokens=settings.max_tokens)
    return [
        _Pair(row, tuple(tokenize(row.premise)), tuple(tokenize(row.hypothesis)))
        for row in rows
        if isinstance(row, InputPair)
    ]


def _pair_lines(pairs: list[_Pair], trees: dict[Tokens, str]) -> str:
    """One JSON line per row: its id and row number, which join it back to the input and to label's output,
    and its two trees under label's column names."""
    records = (
        {
            "pair_id": pair.source.pair_id,
            "row": pair.source.row,
            "premise_tree": trees.get(pair.premise, NO_TREE),
            "hypothesis_tree": trees.get(pair.hypothesis, NO_TREE),
        }
        for pair in pairs
    )
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


def _tree_lines(sentences: list[Tokens], trees: dict[Tokens, str]) -> str:
    return "".join(trees.get(tokens, NO_TREE) + "\n" for tokens in sentences)


def _distinct_trees(loaded: LoadedModel, sentences: list[Tokens], batch_size: int) -> dict[Tokens, str]:
    """The tree of each distinct non-empty sentence, in first-seen order."""
    distinct = list(dict.fromkeys(tokens for tokens in sentences if tokens))
    return dict(zip(distinct, _trees(loaded, distinct, batch_size), strict=True)) if distinct else {}


def _trees(loaded: LoadedModel, sentences: list[Tokens], batch_size: int) -> list[str]:
    """Greedy trees of the sentences, through the one inference loop: the model reads pairs, so sentences go
    two by two (the encoder reads every sentence on its own; a lone last one is paired with itself)."""
    model, vocabulary = loaded.model, loaded.vocabulary
    ids = [tuple(vocabulary.encode(tokens)) for tokens in sentences]
    pairs = [
        Example(ids[start], (), ids[min(start + 1, len(ids) - 1)], ())
        for start in range(0, len(ids), SENTENCES_PER_PAIR)
    ]
    pairs_per_batch = max(1, batch_size // SENTENCES_PER_PAIR)
    found = predict(model, pairs, next(model.parameters()).device, pairs_per_batch, TransitionSource.GREEDY)
    ran = [
        steps for both in zip(found.premise_transitions, found.hypothesis_transitions, strict=True) for steps in both
    ]
    return [format_transitions(tokens, steps) for tokens, steps in zip(sentences, ran[: len(sentences)], strict=True)]
