"""The record a label run publishes with its output, so that the parts folder can go and a rerun still knows.

While a run works, its parts folder holds the plan and every finished shard:
what a killed run resumes from. Once the output is published those shards
are a second copy of every row, so the merge deletes them (see
`spinn.labeling.shards.merge_shards`) and publishes this small record in the
same step as the output and its rejects file (`out.parquet` ->
`out.run.json`): the run's fingerprint (the input's and the checkpoint's
digests, parser, columns, shard size: what the plan checks on a resume), the
digests of the two files it published, and the summary's counts.

A rerun of the same command then does nothing, and says so: it finds the
record, sees the output is still the one recorded, and reports the recorded
counts without loading a shard or labelling a row (a user rerunning a
finished job expects nothing to happen, as before, when the kept shards were
merged again). A rerun with other arguments is refused, as a resume with
other arguments is, rather than overwriting labels the user may still want.
An output deleted or changed since makes the record stale: the run labels
again from the start, which is what deleting an output asks for.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from spinn.errors import SpinnError
from spinn.io import file_digest
from spinn.labeling.summary import LabelSummary, PredictionCounts

RECORD_SUFFIX = ".run.json"
RECORD_VERSION = 1
_KEPT_AS_IS = ("rows", "labelled", "rejected", "shards", "reasons", "tokens", "unknown_tokens", "input_sha256")
"""The summary's fields the record keeps as they are (the rest are paths, names or the prediction counts)."""


def record_file(output: Path) -> Path:
    """`labels.parquet` -> `labels.run.json`, beside the output and its rejects file."""
    return Path(output).with_name(Path(output).name.removesuffix(".parquet") + RECORD_SUFFIX)


def record_text(summary: LabelSummary, fingerprint: dict, written: Path, rejects_written: Path) -> str:
    """The record of a merge whose output and rejects file are `written` and `rejects_written` (their
    temporaries, complete and about to be published with this record)."""
    record = {
        "version": RECORD_VERSION,
        "fingerprint": fingerprint,
        "output_sha256": file_digest(written),
        "rejects_sha256": file_digest(rejects_written),
        "model": summary.model,
        "parser": summary.parser,
        "input": None if summary.input is None else str(summary.input),
        **{name: getattr(summary, name) for name in _KEPT_AS_IS},
        "labels": dict(summary.predicted.labels),
        "top_probability_sum": summary.predicted.top_probability_sum,
    }
    return json.dumps(record, indent=2) + "\n"


def published_summary(output: Path, rejects: Path, fingerprint: dict) -> LabelSummary | None:
    """The recorded summary when `output` is the published result of a run with these arguments; None when
    there is no record or it is stale (the output or its rejects file deleted or changed since)."""
    record = _read(record_file(output))
    if record is None or not _still_published(record, output, rejects):
        return None
    different = changed_arguments(record["fingerprint"], fingerprint)
    if different:
        raise SpinnError(
            f"{output}: holds the labels of another run (different {', '.join(different)}, see "
            f"{record_file(output)}); rerun with that run's arguments, or delete it or choose another output"
        )
    return _summary(record, output, rejects)


def changed_arguments(recorded: dict, fingerprint: dict) -> list[str]:
    """The fingerprint's keys whose values differ: the arguments that make two runs' results differ."""
    return sorted(key for key in recorded.keys() | fingerprint.keys() if recorded.get(key) != fingerprint.get(key))


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


def _summary(record: dict, output: Path, rejects: Path) -> LabelSummary:
    """The first run's summary as this run reports it: every shard reused, no work done in this run."""
    kept = {name: record[name] for name in _KEPT_AS_IS}
    predicted = PredictionCounts(Counter(record["labels"]), record["top_probability_sum"])
    input_path = None if record["input"] is None else Path(record["input"])
    return LabelSummary(
        output=output,
        rejects=rejects,
        model=record["model"],
        parser=record["parser"],
        shards_reused=record["shards"],
        parse_seconds=0.0,
        model_seconds=0.0,
        input=input_path,
        predicted=predicted,
        published_before=True,
        **kept,
    )
