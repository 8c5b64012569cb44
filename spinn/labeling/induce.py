"""`spinn trees`: the binary trees a model builds for itself, in SNLI's bracket format.

A `spinn` or `rl` model chooses its own SHIFT/REDUCE sequence (greedy, the
best legal action); writing the trees out lets users see what an `rl` model
learned to parse without ever seeing a parse.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from pydantic import Field

from spinn.data.sentence_pairs import InputPair, read_input_pairs
from spinn.data.tokens import simple_tokenize
from spinn.data.vocab import PAD_ID
from spinn.errors import SpinnError
from spinn.io import atomic_path
from spinn.model.batch import own_steps
from spinn.model.loading import load_model, resolve_device
from spinn.settings import Device, Settings
from spinn.trees.transitions import parse_binary, transitions_to_tree
from spinn.trees.tree import format_binary
from spinn.trees.treeview import render_trees

TEXT_SUFFIX = ".txt"
HTML_TREES = 20
BATCH_SENTENCES = 256


class TreesSettings(Settings):
    """How a model's own trees are drawn out."""

    batch_size: int = Field(BATCH_SENTENCES, ge=1)
    """Sentences per model batch."""
    html_trees: int = Field(HTML_TREES, ge=1)
    """How many trees the HTML page draws."""
    device: Device = "auto"
    """Where the model runs; auto: the GPU when there is one."""


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
    were written."""
    settings = settings or TreesSettings()
    batch_size = settings.batch_size
    loaded = load_model(model_reference, resolve_device(settings.device))
    if not loaded.model.config.predicts_transitions:
        raise SpinnError(f"a {loaded.model.config.variant} model does not build its own trees; use spinn or rl")
    sentences = [tokens for tokens in _sentences(Path(input_path)) if tokens]
    trees = []
    for start in range(0, len(sentences), batch_size):
        trees += _trees(loaded, sentences[start : start + batch_size])
    with atomic_path(Path(output)) as temporary:
        temporary.write_text("".join(tree + "\n" for tree in trees), encoding="utf-8")
    if html is not None:
        render_trees(
            [parse_binary(tree) for tree in trees[: settings.html_trees]], html, title=f"Trees of {model_reference}"
        )
    return len(trees)


def _sentences(path: Path) -> Iterator[list[str]]:
    if path.name.endswith(TEXT_SUFFIX):
        for line in path.read_text(encoding="utf-8").splitlines():
            yield simple_tokenize(line)
        return
    seen: set[tuple[str, ...]] = set()
    for item in read_input_pairs(path):
        if not isinstance(item, InputPair):
            continue
        for tokens in (simple_tokenize(item.premise), simple_tokenize(item.hypothesis)):
            if tuple(tokens) not in seen:
                seen.add(tuple(tokens))
                yield tokens


def _trees(loaded, sentences: list[list[str]]) -> list[str]:
    """Greedy trees of up to a batch of sentences, encoded together (N sentences, no pairing needed)."""
    model, vocabulary = loaded.model, loaded.vocabulary
    device = next(model.parameters()).device
    lengths = torch.tensor([len(tokens) for tokens in sentences])  # (N,)
    ids = torch.full((len(sentences), int(lengths.max())), PAD_ID, dtype=torch.long)  # (N, L)
    for row, tokens in enumerate(sentences):
        ids[row, : len(tokens)] = torch.tensor(vocabulary.encode(tokens))
    with torch.no_grad():
        taken = model.eval().encode(ids.to(device), lengths.to(device), None).transitions.cpu()  # (N, T)
    return [
        format_binary(transitions_to_tree(tokens, own_steps(taken, row, len(tokens))))
        for row, tokens in enumerate(sentences)
    ]
