"""Labelled rows: parsed sentence pairs -> label, class probabilities and trees; the one labelling step.

`spinn label`'s shards (spinn/labeling/shard_job.py) and the MLflow model
(spinn/serving/pyfunc.py) both call it, so a row served by `mlflow models
serve` equals the row `spinn label` writes for the same pair: same encoding,
same inference loop (spinn/inference/predict.py), same trees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spinn.data.example import Example
from spinn.data.schema import LABELS
from spinn.data.vocab import Vocabulary, unknown_count
from spinn.ground.cores import torch_threads
from spinn.inference.finite import check_probabilities
from spinn.inference.predict import Predictions, predict
from spinn.labeling.label_settings import PROBABILITY_COLUMNS
from spinn.labeling.labeller import Labeller
from spinn.parsing.parse import SENTENCES
from spinn.parsing.protocol import Parsed, Unparsed
from spinn.trees.transitions import format_transitions

TREE_COLUMNS = tuple(f"{name}_tree" for name in SENTENCES)
PREDICTION_COLUMNS = ("label", *PROBABILITY_COLUMNS, *TREE_COLUMNS)
"""What label_parsed_pairs says about each pair, in this order."""
REJECTED_COLUMN = "rejected"
"""label_texts: why the parser refused a pair (None for a labelled pair, whose other columns are then set)."""


@dataclass(frozen=True)
class Sentence:
    """One sentence ready for the model."""

    tokens: list[str]
    transitions: list[int] | None
    """None: the model predicts them."""
    tree: str | None

    @classmethod
    def from_parsed(cls, parsed: Parsed) -> Sentence:
        """Tokens only (no transitions) means the model builds the tree."""
        if not parsed.transitions:
            return cls(list(parsed.tokens), None, None)
        return cls(list(parsed.tokens), list(parsed.transitions), parsed.binary_parse)


SentencePair = tuple[Sentence, Sentence]


@dataclass(frozen=True)
class Labelled:
    """label_parsed_pairs' answer: a row per pair (PREDICTION_COLUMNS) and what the model read."""

    rows: list[dict]
    tokens: int
    unknown_tokens: int
    """Tokens of the pairs, and those outside the model's vocabulary."""
    seconds: float
    """Wall time of the model."""


def label_parsed_pairs(
    labeller: Labeller,
    pairs: Sequence[SentencePair],
    on_batch: Callable[[int], None] | None = None,
    rows: Sequence[int] | None = None,
) -> Labelled:
    """The model over parsed pairs, in input order; the batch size and the order of pairs change no number.

    on_batch: told the pair count of each batch (progress). rows: the pairs' row numbers in their file, which a
    refusal names (default: their positions). Probabilities that are not finite are refused, never written."""
    if not pairs:
        return Labelled([], 0, 0, 0.0)
    vocabulary, model = labeller.loaded.vocabulary, labeller.loaded.model
    examples = [_example(pair, vocabulary) for pair in pairs]
    tokens, unknown = unknown_count(ids for e in examples for ids in (e.premise, e.hypothesis))
    start = time.perf_counter()
    with torch_threads(labeller.settings.threads, labeller.sharing, where="label"):
        found = predict(
            model,
            examples,
            next(model.parameters()).device,
            labeller.settings.batch_size,
            labeller.transitions,
            step=labeller.step,
            on_batch=on_batch,
            temperature=labeller.loaded.saved.softmax_temperature,
        )
    seconds = time.perf_counter() - start
    check_probabilities(found.probabilities, rows if rows is not None else range(len(pairs)), labeller.model_name)
    return Labelled([_row(pair, found, i) for i, pair in enumerate(pairs)], tokens, unknown, seconds)


def label_texts(labeller: Labeller, premises: Sequence[str], hypotheses: Sequence[str]) -> list[dict]:
    """Raw text pairs -> one row each, in input order: PREDICTION_COLUMNS and REJECTED_COLUMN.

    A pair the parser refuses (no tokens, too long) keeps its place with only
    the reason set, so a caller can line the answer up with its input."""
    if len(premises) != len(hypotheses):
        raise ValueError(f"{len(premises)} premises but {len(hypotheses)} hypotheses")
    analysed = labeller.parser.submit([*premises, *hypotheses]).result()
    parsed: dict[int, SentencePair] = {}
    rows: list[dict] = []
    for index, texts in enumerate(zip(premises, hypotheses, strict=True)):
        sentences = [analysed[text] for text in texts]
        failed = next((s for s in sentences if isinstance(s, Unparsed)), None)
        rows.append(dict.fromkeys((*PREDICTION_COLUMNS, REJECTED_COLUMN)))
        if failed is None:
            parsed[index] = (Sentence.from_parsed(sentences[0]), Sentence.from_parsed(sentences[1]))
        else:
            rows[index][REJECTED_COLUMN] = failed.reason.value
    labelled = label_parsed_pairs(labeller, list(parsed.values()))
    for index, row in zip(parsed, labelled.rows, strict=True):
        rows[index].update(row)
    return rows


def _example(pair: SentencePair, vocabulary: Vocabulary) -> Example:
    """A pair for the model: a sentence whose tree the model builds comes as tokens only."""
    premise, hypothesis = pair
    return Example(
        tuple(vocabulary.encode(premise.tokens)),
        tuple(premise.transitions or ()),
        tuple(vocabulary.encode(hypothesis.tokens)),
        tuple(hypothesis.transitions or ()),
    )


def _row(pair: SentencePair, found: Predictions, index: int) -> dict:
    """A pair's label and probabilities, and a tree per sentence (the parser's, or the one the model built)."""
    ran = (found.premise_transitions[index], found.hypothesis_transitions[index])
    trees = [
        sentence.tree or format_transitions(sentence.tokens, steps) for sentence, steps in zip(pair, ran, strict=True)
    ]
    probabilities = found.probabilities[index].tolist()  # (C,)
    return {
        "label": LABELS[int(found.labels[index])],
        **{name: float(value) for name, value in zip(PROBABILITY_COLUMNS, probabilities, strict=True)},
        **dict(zip(TREE_COLUMNS, trees, strict=True)),
    }
