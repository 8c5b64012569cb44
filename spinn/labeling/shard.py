"""One shard's work: read its pairs, parse them (or take their tokens), run the model, write the labels.

A shard's labels Parquet file is written last and atomically, so its presence
means the shard is done; a rerun reuses it (`_reused`) instead of labelling
again. Rows the parser cannot take (too long, no tokens) become rejects with
the reason, and never reach the model.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from spinn.data.rejects import Reject
from spinn.io import atomic_path
from spinn.labeling.labeller import Labeller
from spinn.labeling.predictions import Sentence, SentencePair, label_pairs
from spinn.labeling.progress import LabelProgress, ShardShare
from spinn.labeling.settings import OUTPUT_SCHEMA, TOKENS_KEY, UNKNOWN_TOKENS_KEY
from spinn.labeling.shards import ShardPlan, read_lines, shard_rows, write_jsonl
from spinn.labeling.summary import ShardResult
from spinn.parsing.parse import SENTENCES
from spinn.parsing.protocol import PendingParse, Unparsed


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


def _sentence_trees(parse: ShardParse, source: str, result: ShardResult) -> tuple[dict[int, SentencePair], list[dict]]:
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
            trees[pair["row"]] = tuple(Sentence.from_parsed(s) for s in sentences)
        else:
            name, problem = failed
            raw = json.dumps(pair, ensure_ascii=False)
            reject = Reject(source, pair["line"], problem.reason, name, problem.message, raw, pair["pair_id"])
            rejects.append({**reject.to_dict(), "row": pair["row"]})
    return trees, rejects


def _predict(
    pairs: list[dict], trees: dict, labeller: Labeller, result: ShardResult, progress: LabelProgress | None
) -> list[dict]:
    """The shared labelling step over the shard's parsed pairs, each row completed with the pair it labels."""
    labelled = label_pairs(
        labeller,
        [trees[pair["row"]] for pair in pairs],
        None if progress is None else progress.labelled,
        rows=[pair["row"] for pair in pairs],
    )
    result.tokens, result.unknown_tokens, result.model_seconds = (
        labelled.tokens,
        labelled.unknown_tokens,
        labelled.seconds,
    )
    return [_output_row(pair, row, labeller) for pair, row in zip(pairs, labelled.rows, strict=True)]


def _output_row(pair: dict, predicted: dict, labeller: Labeller) -> dict:
    """One output row: the pair, what the model said about it, and which model and parser said it."""
    return {
        "pair_id": pair["pair_id"],
        "row": pair["row"],
        "premise": pair["premise"],
        "hypothesis": pair["hypothesis"],
        **predicted,
        "gold_label": pair["gold_label"],
        "model": labeller.model_name,
        "parser": labeller.parser_name,
    }
