"""The label stage: a new sentence-pair corpus + a trained model -> predictions Parquet, in resumable shards.

`label` plans the shards (spinn/labeling/shards.py: cut once, fingerprinted,
locked), labels each one (spinn/labeling/shard.py: parse or tokenize, then
the model through spinn/inference's predict) and merges them. A killed job
rerun with the same arguments reuses the plan and every finished shard, so the
output has exactly one row per input row: labelled rows in the Parquet file,
rejected rows (with the reason) in the rejects file, never both, never twice.
Once the output is published the shards go, and a record of the run stays
beside it (spinn/labeling/published.py): rerun as it was, a finished job does
nothing and reports what the record says.

Shards are independent, so the Prefect flow runs them as tasks on a Dask
cluster; every worker reads its shard from the parts folder beside the
output (a shared filesystem when the cluster spans machines).

Throughput: the parser is most of the time. Each distinct sentence is parsed
once per run (the parse cache, or the parser's own temporary one), Stanza and
the model run with few torch threads (`threads`, the parser's `threads`:
threads that wait on each other on shared cores cost several times the work),
and with parser `workers` the model labels shard k while the workers parse
shard k+1.

The summary carries the run's figures (label shares, confidence, OOV share,
drift from the model's dev predictions); `spinn label --track` and the flow
log them to MLflow (spinn/labeling/track.py).
"""

from __future__ import annotations

import time
from pathlib import Path

from spinn.io import publishing
from spinn.labeling.drift import dev_label_shares
from spinn.labeling.labeller import Labeller
from spinn.labeling.progress import LabelProgress
from spinn.labeling.published import published_summary, record_file
from spinn.labeling.settings import LabelSettings
from spinn.labeling.shard import ShardParse, label_shard, start_parse
from spinn.labeling.shards import (
    ShardPlan,
    check_output,
    clear_parts,
    hold_output,
    merge_shards,
    parts_folder,
    plan_shards,
    rejects_file,
    run_fingerprint,
)
from spinn.labeling.summary import LabelSummary, ShardResult, check_some_labelled


def label(
    input_path: Path,
    model_reference: str | Path,
    output: Path,
    settings: LabelSettings | None = None,
    *,
    progress: bool = False,
) -> LabelSummary:
    """Label every row of `input_path` with the model; resumable (see the module docstring).

    progress: bars on stderr with pairs/s for the parse and model phases."""
    started = time.perf_counter()
    settings = settings or LabelSettings()
    reads = _files_read(input_path, model_reference, settings)
    check_output(output, reads)
    outputs = (output, rejects_file(output), record_file(output))
    with publishing(outputs, inputs=reads.values()), hold_output(output):
        labeller = Labeller(model_reference, settings)
        try:
            fingerprint = run_fingerprint(input_path, settings, labeller.fingerprint())
            summary = published_summary(output, rejects_file(output), fingerprint)
            if summary is None:
                summary = _label_and_merge(input_path, output, settings, labeller, progress)
            else:
                clear_parts(parts_folder(output))  # what a run killed just after its publish left
            summary.parser_workers = labeller.parser.workers
            summary.model_threads = labeller.threads
            summary.dev_shares = dev_label_shares(labeller.loaded.saved)
        finally:
            labeller.close()
    summary.seconds = time.perf_counter() - started
    check_some_labelled(summary)
    return summary


def _label_and_merge(
    input_path: Path, output: Path, settings: LabelSettings, labeller: Labeller, progress: bool
) -> LabelSummary:
    """Plan (or resume) the shards, label those not finished, and publish the merged output."""
    plan = plan_shards(input_path, output, settings, labeller.fingerprint())
    bars = LabelProgress(plan.rows) if progress else None
    try:
        results = label_shards(plan, labeller, bars)
    finally:
        if bars is not None:
            bars.close()
    return merge_shards(plan, results, labeller.model_name, labeller.parser_name)


def label_shards(plan: ShardPlan, labeller: Labeller, progress: LabelProgress | None = None) -> list[ShardResult]:
    """Every shard in order; with parser workers, the next unfinished shard's parse starts before the model
    labels this one, so the workers parse while the model runs (a sentence in both is parsed once)."""
    ahead = labeller.parser.workers > 1
    todo = [index for index in range(plan.shards) if not plan.labels(index).is_file()]
    started: dict[int, ShardParse] = {}
    results = []
    busy_until = 0.0
    for index in range(plan.shards):
        if ahead and index in todo:
            for upcoming in todo[todo.index(index) : todo.index(index) + 2]:
                if upcoming not in started:
                    started[upcoming] = start_parse(plan, upcoming, labeller, progress)
        parse = started.pop(index, None)
        results.append(label_shard(plan, index, labeller, parse, progress))
        if parse is not None:  # parses run back to back in the workers: count each second once
            results[-1].parse_seconds = parse.pending.seconds_after(busy_until)
            busy_until = parse.pending.finished_at
    return results


def _files_read(input_path: Path, model_reference: str | Path, settings: LabelSettings) -> dict[str, Path]:
    """What the run reads, by what it is to the run (for check_output's message)."""
    from spinn.tracking.store import is_model_uri

    reads = {"the input": Path(input_path)}
    if not is_model_uri(str(model_reference)):
        reads["the model"] = Path(model_reference)
    if settings.parsing.cache_path is not None:
        reads["the parse cache"] = Path(settings.parsing.cache_path)
    return reads
