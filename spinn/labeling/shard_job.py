"""One shard's work, and the job that does it wherever the run's shards are run.

`label_shard` reads a shard's pairs, parses them (or takes their tokens), runs
the model and writes the labels. A shard's labels Parquet file is written
last and atomically, so its presence means the shard is done. Rows the parser
cannot take (too long, no tokens) become rejects with the reason, and never
reach the model.

`ShardJob` is the shard function that `label()` hands to its runner: called
in the process that made it (the serial runner, `spinn label`), it loads its
own labeller on the first shard and closes it with the run, and with parser
workers it starts the next shard's parse before the model labels this one,
so the workers parse while the model runs. Pickled to a Dask worker (the
label-pairs flow), it labels with that worker's own labeller, loaded once
for every shard the worker is given (`worker_labeller`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from spinn.data.rejects import Reject
from spinn.ground.collector import gc_paused
from spinn.ground.errors import SpinnError
from spinn.ground.io import atomic_path
from spinn.labeling.label_progress import LabelProgress, ShardShare
from spinn.labeling.label_settings import OUTPUT_SCHEMA, TOKENS_KEY, UNKNOWN_TOKENS_KEY, LabelSettings
from spinn.labeling.labelled_rows import Sentence, SentencePair, label_parsed_pairs
from spinn.labeling.labeller import Labeller, ModelSource, worker_labeller
from spinn.labeling.shard_plan import ShardPlan, read_records, write_jsonl
from spinn.labeling.summary import ShardResult
from spinn.parsing.parse import SENTENCES
from spinn.parsing.protocol import PendingParse, Unparsed

PARSED_AHEAD = 2
"""Shards whose parse is under way at once with parser workers: the one the model labels next, and the next."""


class ShardJob:
    """Label shard `index` of `plan` with the model of `source`: `job(index)` -> its ShardResult.

    `order`: the shards this run labels, in the order the runner takes them (which to parse ahead);
    `progress`: the run's bars, in the process that made the job."""

    def __init__(
        self,
        plan: ShardPlan,
        source: ModelSource,
        settings: LabelSettings,
        order: Sequence[int] = (),
        progress: LabelProgress | None = None,
    ) -> None:
        self.plan, self.source, self.settings, self.order = plan, source, settings, list(order)
        self.progress = progress
        self._in_maker = True
        self._labeller: Labeller | None = None
        self._started: dict[int, ShardParse] = {}
        self._busy_until = 0.0

    def __getstate__(self) -> dict:
        """What crosses to a worker: the plan, the model and the settings; no labeller, parses or bars."""
        return {"plan": self.plan, "source": self.source, "settings": self.settings, "order": self.order}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)
        self._in_maker = False

    def __call__(self, index: int, progress: LabelProgress | None = None) -> ShardResult:
        with gc_paused():  # a shard's per-pair objects make no cycles: collections would only walk them
            return self._label(index, progress)

    def _label(self, index: int, progress: LabelProgress | None) -> ShardResult:
        labeller = self.labeller()
        progress = progress or self.progress
        if labeller.parser.workers > 1:
            self._parse_ahead(index, labeller, progress)
        parse = self._started.pop(index, None)
        result = label_shard(self.plan, index, labeller, parse, progress)
        if parse is not None:  # parses run back to back in the workers: count each second once
            result.parse_seconds = parse.pending.seconds_after(self._busy_until)
            self._busy_until = parse.pending.finished_at
        result.parser_workers, result.model_threads = labeller.parser.workers, labeller.threads
        return result

    def labeller(self) -> Labeller:
        """The labeller of this process: the job's own where it was made, the worker's shared one elsewhere;
        checked to hold the checkpoint the plan was made for."""
        if not self._in_maker:
            labeller = worker_labeller(self.source, self.settings)
        else:
            if self._labeller is None:
                self._labeller = Labeller(self.source, self.settings)
            labeller = self._labeller
        if labeller.model_source.checkpoint_sha256 != self.plan.fingerprint["checkpoint_sha256"]:
            raise SpinnError(f"{self.source.reference}: this process loaded another checkpoint than the plan's")
        return labeller

    def close(self) -> None:
        """Close the labeller this job loaded in the process that made it (a worker's stays for its next)."""
        if self._labeller is not None:
            self._labeller.close()
            self._labeller = None

    def _parse_ahead(self, index: int, labeller: Labeller, progress: LabelProgress | None) -> None:
        position = self.order.index(index) if index in self.order else len(self.order)
        for upcoming in [index, *self.order[position + 1 : position + PARSED_AHEAD]]:
            if upcoming not in self._started:
                self._started[upcoming] = start_parse(self.plan, upcoming, labeller, progress)


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
    """Label one shard, its labels Parquet file written last. `parse`: the shard's parse, if it was started
    earlier (see `ShardJob`)."""
    parse = parse or start_parse(plan, index, labeller, progress)
    result = ShardResult(index)
    trees, rejects = _sentence_trees(parse, plan.input, result)
    if progress is not None:
        progress.skipped(len(read_records(plan.input_rejects(index))))
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
    labelled = label_parsed_pairs(
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
