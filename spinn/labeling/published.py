"""The published output of a label run: the merge that publishes it, and the record that stays beside it.

While a run works, its parts folder holds the plan and every finished shard
(spinn/labeling/shard_plan.py). The merge concatenates the shards in row
order into the output and its rejects file, checking that every input row is
in its shard exactly once, labelled or rejected, before it publishes
anything; it publishes, in the same step, a small record of the run (`out.parquet`
-> `out.run.json`): the run's fingerprint (the input's and the checkpoint's
digests, parser, columns, shard size: what the plan checks on a resume), the
digests of the two files it published, and the counts. Then it empties the
parts folder, whose shards would otherwise double the disk the output takes.

A rerun of the same command then does nothing, and says so: it finds the
record, sees the output is still the one recorded, and reports the recorded
counts without loading a model or a shard. A rerun with other arguments is
refused, as a resume with other arguments is, rather than overwriting labels
the user may still want (unless asked to replace them: the inbox's files
come back changed). An output deleted or changed since makes the record
stale: the run labels again from the start, which is what deleting an output
asks for.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pyarrow.parquet as pq

from spinn.data.vocab import warn_if_mostly_unknown
from spinn.ground.errors import SpinnError
from spinn.ground.io import atomic_paths, file_digest
from spinn.labeling.label_settings import OUTPUT_SCHEMA
from spinn.labeling.shard_plan import (
    PartsFolderError,
    ShardPlan,
    changed_arguments,
    clear_parts,
    jsonl,
    read_records,
    shard_problems,
)
from spinn.labeling.summary import LabelCounts, PredictionCounts, ShardResult

RECORD_SUFFIX = ".run.json"
RECORD_VERSION = 1
_KEPT_AS_IS = ("rows", "labelled", "rejected", "shards", "reasons", "tokens", "unknown_tokens")
"""The counts the record keeps as they are (the rest are the prediction counts, or this run's own)."""


def rejects_file(output: Path) -> Path:
    """`labels.parquet` -> `labels.rejects.jsonl`."""
    return Path(output).with_name(Path(output).name.removesuffix(".parquet") + ".rejects.jsonl")


def record_file(output: Path) -> Path:
    """`labels.parquet` -> `labels.run.json`, beside the output and its rejects file."""
    return Path(output).with_name(Path(output).name.removesuffix(".parquet") + RECORD_SUFFIX)


def merge_shards(
    plan: ShardPlan, results: list[ShardResult], names: dict[str, str], repaired: list[str] = ()
) -> LabelCounts:
    """Concatenate finished shards in row order into the output and its rejects file, published together with
    the run's record, checking each shard holds each of its rows exactly once and was labelled by the model;
    then empty the parts folder (the output and the record now say all its shards did).

    names: the record's `model` and `parser` (and `input`); repaired: what the run found damaged and redid."""
    missing = sorted({*range(plan.shards)} - {result.index for result in results})
    if missing:
        raise PartsFolderError(f"{plan.parts}: shards {missing[:10]} are not finished; rerun to complete them")
    output = Path(plan.output)
    rejects = []
    predicted = PredictionCounts()
    with atomic_paths(output, rejects_file(output), record_file(output)) as (written, rejects_written, record):
        writer = pq.ParquetWriter(written, OUTPUT_SCHEMA)
        try:
            for index in range(plan.shards):
                table = pq.read_table(plan.labels(index), schema=OUTPUT_SCHEMA)
                shard_rejects = read_records(plan.input_rejects(index)) + read_records(plan.label_rejects(index))
                _check_shard(plan, index, table, shard_rejects, names["model"])
                writer.write_table(table)
                predicted.add(table)
                rejects += shard_rejects
        finally:
            writer.close()
        rejects_written.write_text(jsonl(sorted(rejects, key=lambda reject: reject["row"])), encoding="utf-8")
        counts = _merged_counts(plan, results, rejects, predicted, tuple(repaired))
        record.write_text(_record_text(counts, plan.fingerprint, names, written, rejects_written), encoding="utf-8")
    clear_parts(Path(plan.parts))
    warn_if_mostly_unknown(plan.input, counts.unknown_tokens / counts.tokens if counts.tokens else None)
    return counts


def _check_shard(plan: ShardPlan, index: int, table, rejects: list[dict], model: str) -> None:
    """A shard that went wrong while this run held the output (the resume checked those it kept) stops the
    merge before anything is published; a rerun labels it again."""
    problems = shard_problems(plan, index, table, rejects, model)
    if problems:
        raise PartsFolderError(f"{problems}; rerun the same command to label it again")


def _merged_counts(
    plan: ShardPlan, results: list[ShardResult], rejects: list[dict], predicted: PredictionCounts, repaired: tuple
) -> LabelCounts:
    ran = [result for result in results if not result.reused]
    return LabelCounts(
        rows=plan.rows,
        labelled=sum(r.labelled for r in results),
        rejected=len(rejects),
        shards=plan.shards,
        shards_reused=sum(r.reused for r in results),
        reasons=dict(Counter(reject["reason"] for reject in rejects)),
        parse_seconds=sum(r.parse_seconds for r in results),
        model_seconds=sum(r.model_seconds for r in results),
        tokens=sum(r.tokens for r in results),
        unknown_tokens=sum(r.unknown_tokens for r in results),
        predicted=predicted,
        parser_workers=max((r.parser_workers for r in ran if r.parser_workers), default=None),
        model_threads=max((r.model_threads for r in ran if r.model_threads), default=None),
        repaired=repaired,
    )


def _record_text(counts: LabelCounts, fingerprint: dict, names: dict[str, str], written: Path, rejects: Path) -> str:
    """The record of a merge whose output and rejects file are `written` and `rejects` (their temporaries,
    complete and about to be published with this record)."""
    record = {
        "version": RECORD_VERSION,
        "fingerprint": fingerprint,
        "output_sha256": file_digest(written),
        "rejects_sha256": file_digest(rejects),
        **names,
        "input_sha256": fingerprint["input_sha256"],
        **{name: getattr(counts, name) for name in _KEPT_AS_IS},
        "labels": dict(counts.predicted.labels),
        "top_probability_sum": counts.predicted.top_probability_sum,
        "gold": [[gold, label, rows] for (gold, label), rows in sorted(counts.predicted.gold.items())],
    }
    return json.dumps(record, indent=2) + "\n"


class PublishedRun(NamedTuple):
    """What the record of a published output says: its counts, and the model and parser its rows name."""

    counts: LabelCounts
    model: str
    parser: str


def published_run(output: Path, fingerprint: dict, *, replace: bool = False) -> PublishedRun | None:
    """The record's run when `output` is the published result of a run with these arguments; None when
    there is no record or it is stale (the output or its rejects file deleted or changed since), or (with
    `replace`) when it is another run's."""
    record = _read(record_file(output))
    if record is None or not _still_published(record, output, rejects_file(output)):
        return None
    different = changed_arguments(record["fingerprint"], fingerprint)
    if different and replace:
        return None
    if different:
        raise SpinnError(
            f"{output}: holds the labels of another run (different {', '.join(different)}, see "
            f"{record_file(output)}); rerun with that run's arguments, or delete it or choose another output"
        )
    gold = Counter({(gold, label): rows for gold, label, rows in record.get("gold", [])})
    predicted = PredictionCounts(Counter(record["labels"]), record["top_probability_sum"], gold)
    kept = {name: record[name] for name in _KEPT_AS_IS}
    counts = LabelCounts(
        **kept, shards_reused=record["shards"], parse_seconds=0.0, model_seconds=0.0, predicted=predicted
    )
    return PublishedRun(counts, record["model"], record["parser"])


def _read(path: Path) -> dict | None:
    """The record, or None when there is none or it is not one of this version (then the run labels anew)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("version") == RECORD_VERSION else None


def _still_published(record: dict, output: Path, rejects: Path) -> bool:
    return all(
        path.is_file() and file_digest(path) == record[key]
        for path, key in ((output, "output_sha256"), (rejects, "rejects_sha256"))
    )
