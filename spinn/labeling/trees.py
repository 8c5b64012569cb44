"""`spinn trees`: the binary trees a model builds for itself, in SNLI's bracket format.

A `spinn` or `rl` model chooses its own SHIFT/REDUCE sequence (greedy, the
best legal action); writing the trees out lets users see what an `rl` model
learned to parse without ever seeing a parse. The trees come from the same
inference loop as labelling's (spinn/inference/predict.py), so `spinn trees`
draws exactly the trees that `spinn label --parser model` records.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import Field

from spinn.data.example import Example
from spinn.data.limits import DEFAULT_MAX_TOKENS
from spinn.data.sentence_pairs import InputPair, read_input_pairs
from spinn.errors import SpinnError
from spinn.inference.predict import predict
from spinn.io import atomic_path, publishing
from spinn.model.config import TransitionSource
from spinn.model.loading import LoadedModel, load_model, resolve_device
from spinn.settings import Device, Settings
from spinn.trees.tokenize import tokenize
from spinn.trees.transitions import format_transitions, parse_binary
from spinn.trees.treeview import render_trees

TEXT_SUFFIX = ".txt"
HTML_TREES = 20
BATCH_SENTENCES = 256
SENTENCES_PER_PAIR = 2
"""The model reads pairs; `spinn trees` feeds it its sentences two at a time."""


class TreesSettings(Settings):
    """How a model's own trees are drawn out."""

    batch_size: int = Field(BATCH_SENTENCES, ge=1)
    """Sentences per model batch."""
    html_trees: int = Field(HTML_TREES, ge=1)
    """How many trees the HTML page draws."""
    device: Device = "auto"
    """Where the model runs; auto: the GPU when there is one."""
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1)
    """A pairs file's sentence longer than this many tokens allows in characters is skipped before the
    tokenizer sees it (spinn/data/limits.py)."""


def induce_trees(
    model_reference: str | Path,
    input_path: Path,
    output: Path,
    settings: TreesSettings | None = None,
    *,
    html: Path | None = None,
) -> int:
    """Write one tree per sentence (a .txt input: one per line, as given; a pairs file: each distinct
    premise and hypothesis once, in first-seen order, since SNLI-style data repeats a premise for each of
    its hypotheses), and optionally draw the first `html_trees` as an HTML page; returns how many trees
    were written. Refused before the model loads when an output is the input or the model, or while another
    run writes one (spinn.io.publishing)."""
    written = [Path(output), *([Path(html)] if html is not None else [])]
    with publishing(written, inputs=[Path(input_path), Path(model_reference)]):
        settings = settings or TreesSettings()
        loaded = load_model(model_reference, resolve_device(settings.device))
        if not loaded.model.config.predicts_transitions:
            raise SpinnError(f"a {loaded.model.config.variant} model does not build its own trees; use spinn or rl")
        sentences = [tokens for tokens in _sentences(Path(input_path), settings.max_tokens) if tokens]
        trees = _trees(loaded, sentences, settings.batch_size) if sentences else []
        with atomic_path(Path(output)) as temporary:
            temporary.write_text("".join(tree + "\n" for tree in trees), encoding="utf-8")
        if html is not None:
            render_trees(
                [parse_binary(tree) for tree in trees[: settings.html_trees]], html, title=f"Trees of {model_reference}"
            )
        return len(trees)


def _sentences(path: Path, max_tokens: int) -> Iterator[list[str]]:
    if path.name.endswith(TEXT_SUFFIX):
        for line in path.read_text(encoding="utf-8").splitlines():
            yield tokenize(line)
        return
    seen: set[tuple[str, ...]] = set()
    for item in read_input_pairs(path, max_tokens=max_tokens):
        if not isinstance(item, InputPair):
            continue
        for tokens in (tokenize(item.premise), tokenize(item.hypothesis)):
            if tuple(tokens) not in seen:
                seen.add(tuple(tokens))
                yield tokens


def _trees(loaded: LoadedModel, sentences: list[list[str]], batch_size: int) -> list[str]:
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
