"""One shard's work: read its pairs, parse them (or take their tokens), run the model, write the labels.

A shard's labels Parquet file is written last and atomically, so its presence
means the shard is done; a rerun reuses it (`_reused`) instead of labelling
again. Rows the parser cannot take (too long, no tokens) become rejects with
the reason, and never reach the model.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from spinn.data.example import Example
from spinn.data.rejects import Reject
from spinn.data.schema import LABELS
from spinn.data.vocab import Vocabulary, unknown_count
from spinn.inference.finite import check_probabilities
from spinn.inference.predict import Predictions, predict
from spinn.io import atomic_path
from spinn.labeling.labeller import Labeller
from spinn.labeling.progress import LabelProgress, ShardShare
from spinn.labeling.settings import OUTPUT_SCHEMA, PROBABILITY_COLUMNS, TOKENS_KEY, UNKNOWN_TOKENS_KEY
from spinn.labeling.shards import ShardPlan, read_lines, shard_rows, write_jsonl
from spinn.labeling.summary import ShardResult
from spinn.parsing.cpu import torch_threads
from spinn.parsing.parse import SENTENCES
from spinn.parsing.protocol import Parsed, PendingParse, Unparsed
from spinn.trees.transitions import transitions_to_tree
from spinn.trees.tree import format_binary


@dataclass
class ShardParse:
    """A shard's pairs and the parse of their sentences, started (`start_parse`) and maybe still running."""

    pairs: list[dict]
    pending: PendingParse
    share: ShardShare


def start_parse(plan: ShardPlan, index: int, labeller: Labeller, progress: LabelProgress | None = None) -> ShardParse:
    """Read the shard and hand its sentences to the parser; with parser workers this returns while they parse."""
    pairs = pq.read_table(plan.input_pairs(index)).to_pylist()
    share = ShardShare(progress, len(pairs))
    pending = labeller.parser.submit((pair[name] for pair in pairs for name in SENTENCES), share)
    share.known(pending.to_parse)
    return ShardParse(pairs, pending, share)


def label_shard(
    plan: ShardPlan,
    index: int,
    labeller: Labeller,
    parse: ShardParse | None = None,
    progress: LabelProgress | None = None,
) -> ShardResult:
    """Label one shard unless a finished result is already there (its Parquet file is written last).

    `parse`: the shard's parse, if it was started earlier (see `label_shards`)."""
    if plan.labels(index).is_file():
        result = _reused(plan, index)
        if progress is not None:
            progress.skipped(len(shard_rows(plan, index)))
        return result
    parse = parse or start_parse(plan, index, labeller, progress)
    result = ShardResult(index)
    trees, rejects = _sentence_trees(parse, plan.input, result)
    if progress is not None:
        progress.skipped(len(read_lines(plan.input_rejects(index))))
        progress.labelled(len(rejects))  # rejected by the parser: parsed, and never reach the model
    kept = [pair for pair in parse.pairs if pair["row"] in trees]
    rows = _predict(kept, trees, labeller, result, progress)
    result.labelled, result.rejected = len(rows), len(rejects)
    result.reasons = dict(Counter(reject["reason"] for reject in rejects))
    write_jsonl(plan.label_rejects(index), rejects)
    counts = {TOKENS_KEY: str(result.tokens), UNKNOWN_TOKENS_KEY: str(result.unknown_tokens)}
    with atomic_path(plan.labels(index)) as temporary:
        pq.write_table(pa.Table.from_pylist(rows, schema=OUTPUT_SCHEMA.with_metadata(counts)), temporary)
    return result


def _reused(plan: ShardPlan, index: int) -> ShardResult:
    reasons = Counter(json.loads(line)["reason"] for line in read_lines(plan.label_rejects(index)))
    labelled = pq.read_metadata(plan.labels(index)).num_rows
    counts = pq.read_schema(plan.labels(index)).metadata or {}
    tokens, unknown = (int(counts.get(key.encode(), 0)) for key in (TOKENS_KEY, UNKNOWN_TOKENS_KEY))
    return ShardResult(
        index, labelled, sum(reasons.values()), True, reasons=dict(reasons), tokens=tokens, unknown_tokens=unknown
    )


@dataclass(frozen=True)
class _Sentence:
    tokens: list[str]
    transitions: list[int] | None  # None: the model predicts them
    tree: str | None


def _sentence_trees(
    parse: ShardParse, source: str, result: ShardResult
) -> tuple[dict[int, tuple[_Sentence, _Sentence]], list[dict]]:
    """Row -> (premise, hypothesis) ready for the model, and a reject for every row that is not."""
    analysed = parse.pending.result()
    parse.share.finish()
    result.parse_seconds = parse.pending.seconds
    trees, rejects = {}, []
    for pair in parse.pairs:
        sentences = [analysed[pair[name]] for name in SENTENCES]
        failed = next(
            ((name, s) for name, s in zip(SENTENCES, sentences, strict=True) if isinstance(s, Unparsed)), None
        )
        if failed is None:
            trees[pair["row"]] = tuple(_as_sentence(s) for s in sentences)
        else:
            name, problem = failed
            raw = json.dumps(pair, ensure_ascii=False)
            reject = Reject(source, pair["line"], problem.reason, name, problem.message, raw)
            rejects.append({**reject.to_dict(), "row": pair["row"]})
    return trees, rejects


def _as_sentence(analysed: Parsed) -> _Sentence:
    """Tokens only (no transitions) means the model builds the tree."""
    if not analysed.transitions:
        return _Sentence(list(analysed.tokens), None, None)
    return _Sentence(list(analysed.tokens), list(analysed.transitions), analysed.binary_parse)


def _predict(
    pairs: list[dict], trees: dict, labeller: Labeller, result: ShardResult, progress: LabelProgress | None
) -> list[dict]:
    """The model over the shard's parsed pairs (the one inference loop); the order of rows changes no number."""
    if not pairs:
        return []
    vocabulary, model = labeller.loaded.vocabulary, labeller.loaded.model
    examples = [_example(trees[pair["row"]], vocabulary) for pair in pairs]
    result.tokens, result.unknown_tokens = unknown_count(ids for e in examples for ids in (e.premise, e.hypothesis))
    start = time.perf_counter()
    with torch_threads(labeller.settings.threads):
        found = predict(
            model,
            examples,
            next(model.parameters()).device,
            labeller.settings.batch_size,
            labeller.source,
            step=labeller.step,
            on_batch=None if progress is None else progress.labelled,
        )
    result.model_seconds = time.perf_counter() - start
    check_probabilities(found.probabilities, [pair["row"] for pair in pairs], labeller.model_name)
    return [_output_row(pair, trees[pair["row"]], found, i, labeller) for i, pair in enumerate(pairs)]


def _example(sentences: tuple[_Sentence, _Sentence], vocabulary: Vocabulary) -> Example:
    """A pair for the model: a sentence whose tree the model builds comes as tokens only."""
    premise, hypothesis = sentences
    return Example(
        tuple(vocabulary.encode(premise.tokens)),
        tuple(premise.transitions or ()),
        tuple(vocabulary.encode(hypothesis.tokens)),
        tuple(hypothesis.transitions or ()),
    )


def _output_row(pair: dict, sentences: tuple, found: Predictions, index: int, labeller: Labeller) -> dict:
    """One output row: the pair, its label and probabilities, and a tree per sentence (the parser's, or the
    one the model built)."""
    ran = (found.premise_transitions[index], found.hypothesis_transitions[index])
    trees = [
        sentence.tree or format_binary(transitions_to_tree(sentence.tokens, list(steps)))
        for sentence, steps in zip(sentences, ran, strict=True)
    ]
    row = {
        "pair_id": pair["pair_id"],
        "row": pair["row"],
        "premise": pair["premise"],
        "hypothesis": pair["hypothesis"],
        "label": LABELS[int(found.labels[index])],
        "premise_tree": trees[0],
        "hypothesis_tree": trees[1],
        "gold_label": pair["gold_label"],
        "model": labeller.model_name,
        "parser": labeller.parser_name,
    }
    probabilities = found.probabilities[index].tolist()  # (C,)
    row.update({name: float(value) for name, value in zip(PROBABILITY_COLUMNS, probabilities, strict=True)})
    return row
