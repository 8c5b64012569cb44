"""The label stage: a new sentence-pair corpus + a trained model -> predictions Parquet, in resumable shards.

`label` is the one orchestration of a label run, for `spinn label` and the
label-pairs flow alike: it checks the output, takes its lock, fingerprints
the run once (the input's and the checkpoint's digests, how it is read, cut
and parsed), answers a finished job from its published record before any
model loads, plans the shards or resumes them (spinn/labeling/shard_plan.py:
cut once, every kept shard checked, a damaged one labelled again), has
`run_shards` label the rest, merges and publishes them with the run's record
(spinn/labeling/published.py), and builds the summary once. A killed job
rerun with the same arguments reuses the plan and every sound shard, so the
output has exactly one row per input row: labelled rows in the Parquet file,
rejected rows (with the reason) in the rejects file, never both, never twice.

How the shards run is the caller's: `in_this_process` (the default) labels
them one after another here; the flow passes a runner that submits each as a
Prefect task on its Dask cluster and gathers the results. Every worker reads
its shard from the parts folder beside the output (a shared filesystem when
the cluster spans machines).

Throughput: the parser is most of the time. Each distinct sentence is parsed
once per run (the parse cache, or the parser's own temporary one), Stanza and
the model run with few torch threads (`threads`, the parser's `threads`:
threads that wait on each other on shared cores cost several times the work),
and with parser `workers` the model labels shard k while the workers parse
shard k+1 (spinn/labeling/shard_job.py).

The summary carries the run's figures (label shares, confidence, OOV share,
drift from the model's dev predictions); `spinn label --track` and the flow
log them to MLflow (spinn/labeling/track.py).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from spinn.data.column_sidecar import over_sidecar
from spinn.ground.collector import gc_paused
from spinn.ground.errors import SpinnWarning
from spinn.ground.io import publishing
from spinn.labeling.label_progress import LabelProgress
from spinn.labeling.label_settings import LabelSettings
from spinn.labeling.labeller import ModelSource
from spinn.labeling.published import merge_shards, published_run, record_file, rejects_file
from spinn.labeling.shard_job import ShardJob
from spinn.labeling.shard_plan import (
    ShardPlan,
    check_output,
    clear_parts,
    hold_output,
    kept_shards,
    parts_folder,
    plan_shards,
    run_fingerprint,
    shard_rows,
)
from spinn.labeling.summary import (
    LabelCounts,
    LabelSummary,
    ShardResult,
    check_rejected_share,
    check_some_labelled,
    dev_label_shares,
)

ShardRunner = Callable[[ShardJob, Sequence[int]], list[ShardResult]]
"""Maps the shard function over shard indices, returning their results in that order."""


def in_this_process(job: ShardJob, indices: Sequence[int]) -> list[ShardResult]:
    """The shards one after another, here."""
    return [job(index) for index in indices]


def label(
    input_path: Path,
    model_reference: str | Path,
    output: Path,
    settings: LabelSettings | None = None,
    *,
    progress: bool = False,
    run_shards: ShardRunner = in_this_process,
    replace: bool = False,
) -> LabelSummary:
    """Label every row of `input_path` with the model; resumable (see the module docstring).

    progress: bars on stderr with pairs/s for the parse and model phases (shards run in this process).
    replace: an output or parts folder that another run's arguments made is labelled anew instead of refused
    (the inbox flow's: an inbox file that comes back changed is a new version of the same input)."""
    started_at, started = time.time(), time.perf_counter()  # the clock the UI shows; the one durations take
    settings = settings or LabelSettings()
    input_path, output = Path(input_path), Path(output)
    source = ModelSource(model_reference)  # an alias resolved once: the version every output row names
    reads = _files_read(input_path, source, settings)
    check_output(output, reads)
    with publishing((output, rejects_file(output), record_file(output)), inputs=reads.values()), hold_output(output):
        source.check(settings)  # what the model cannot run: refused before any shard is planned
        fingerprint = run_fingerprint(input_path, settings, source.fingerprint(settings))
        names = {"model": source.model_name, "parser": source.parser_name(settings), "input": str(input_path)}
        published = published_run(output, fingerprint, replace=replace)
        if published is None:
            with gc_paused():  # reading and cutting the input: objects by the row, no cycles
                plan, repaired = plan_shards(input_path, output, settings, fingerprint, replace=replace)
            counts = _label_plan(plan, source, settings, names, repaired, progress, run_shards)
        else:
            clear_parts(parts_folder(output))  # what a run killed just after its publish left
            counts, names["model"], names["parser"] = published
    summary = LabelSummary.of(
        counts,
        output=output,
        rejects=rejects_file(output),
        model=names["model"],
        parser=names["parser"],
        input=input_path,
        input_sha256=fingerprint["input_sha256"],
        dev_shares=dev_label_shares(source.saved),
        published_before=published is not None,
        label_scheme=over_sidecar(input_path, settings.columns).label_scheme,  # the sidecar's, unless named
        max_tokens=settings.parsing.max_tokens,
        seconds=time.perf_counter() - started,
        started_at=started_at,
    )
    check_some_labelled(summary)
    if (unscored := summary.gold_warning()) is not None:
        warnings.warn(SpinnWarning(unscored), stacklevel=2)
    check_rejected_share(summary, settings.max_rejected)
    return summary


def _label_plan(
    plan: ShardPlan,
    source: ModelSource,
    settings: LabelSettings,
    names: dict[str, str],
    repaired: list[str],
    progress: bool,
    run_shards: ShardRunner,
) -> LabelCounts:
    """Keep the sound finished shards, have `run_shards` label the others, and publish the merged output."""
    kept, damaged = kept_shards(plan, names["model"])
    todo = [index for index in range(plan.shards) if index not in kept]
    bars = LabelProgress(plan.rows) if progress else None
    job = ShardJob(plan, source, settings, todo, bars)
    try:
        if bars is not None:
            bars.skipped(sum(len(shard_rows(plan, index)) for index in kept))
        results = {**kept, **dict(zip(todo, run_shards(job, todo), strict=True))}
    finally:
        job.close()
        if bars is not None:
            bars.close()
    return merge_shards(plan, [results[index] for index in range(plan.shards)], names, [*repaired, *damaged])


def _files_read(input_path: Path, source: ModelSource, settings: LabelSettings) -> dict[str, Path]:
    """What the run reads, by what it is to the run (for check_output's message)."""
    reads = {"the input": Path(input_path)}
    if not source.is_registered:
        reads["the model"] = Path(source.reference)
    if settings.parsing.cache_path is not None:
        reads["the parse cache"] = Path(settings.parsing.cache_path)
    return reads
