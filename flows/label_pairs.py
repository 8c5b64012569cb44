"""label-pairs: label every new file in an inbox folder, once, with shards spread over a Dask cluster.

Each run lists the inbox, skips files the index says are done (same name and
same content digest), dot-files and files still being written (modified
within `settle_seconds`), and labels the rest, `files_at_once` of them side
by side (flows/threads.py), each as its own label-file subflow. A file is
labelled by `spinn label`'s own orchestration (spinn.labeling.label.label:
the same checks, plan, resume, merge, published record and summary), which
this flow hands a way to run the shards: each a Prefect task on a Dask
cluster (a local one by default, or an existing cluster by address). Only
the flow's own thread writes the index, as each file ends, so a killed run
loses no finished file's entry and a rerun labels the others again (their
sound shards reused, a published output answered from its record): every
file's rows end up in its output exactly once. A file that fails (a run
that labelled no row included) is recorded as failed, reported, and tried
again on the next run; the files beside it go on. A file with more rows
rejected than `max_rejected` allows fails for its content: it is recorded as
refused (its digest, the threshold, the reason), reported once, and listed
as still refused by later runs, which leave it alone until its content or
the threshold changes. A labelled file's figures
(counts, label shares, confidence, OOV share, drift) go to the Prefect run's
table artifact and to an MLflow run per file (spinn/labeling/track.py).

The Dask workers are the parallelism: each worker process parses in itself
(`spinn label`'s parser `workers` do not apply here) with the settings' torch
threads, so `dask_workers` about the number of free cores keeps them busy
without oversubscribing them; a file gives each worker work when it has at
least that many shards (spinn.labeling.shard_plan.spread_over), and files side by side fill
the gaps between one file's shards and the next's (its plan, merge and MLflow
run, a last shard that leaves the others idle). A file's shards and labels do
not depend on what runs beside it. On Prefect's default SQLite server,
subflows that start together are often refused once ("database is locked",
503) and Prefect's client retries about 2 s later, so files side by side pay
off for files that take longer than that. A shard logs its progress every
REPORT_EVERY_S seconds (spinn.ground.progress), as training and evaluation do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.states import Failed, State
from prefect_dask import DaskTaskRunner
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flows.artifacts import labelled_file_rows
from flows.threads import side_by_side
from spinn.data.sentence_pairs import readable_suffixes
from spinn.ground import children
from spinn.ground.cores import child_environment, usable_cores
from spinn.ground.errors import SpinnError, one_line
from spinn.ground.io import atomic_path, file_digest
from spinn.ground.settings import AUTO, count_or_auto
from spinn.labeling.label_settings import LabelSettings
from spinn.labeling.shard_plan import spread_over
from spinn.labeling.summary import TooManyRejected
from spinn.labeling.track import label_metrics, log_label_run

INDEX_NAME = "index.json"
LABELS_SUFFIX = ".labels.parquet"
"""Ends every output's name: the input's whole name, then this (see output_name)."""
INPUT_SUFFIXES = readable_suffixes()
"""The inbox takes every file the sentence-pair readers can read (matched case-blind, as they do)."""
DONE, FAILED, REFUSED = "done", "failed", "refused"
"""An index entry's status: labelled; failed for a reason retried next run; refused for the file's content (too
many rows rejected), not taken again until the file or max_rejected changes."""
LOOPBACK = "127.0.0.1"
LABELLING_RUN_KEY = "spinn-labeling-run"
FLOW_MAX_REJECTED = 0.1
"""A scheduled file with more of its rows rejected ends its label-file run Failed, with the reasons: nobody
reads a scheduled run's summary, so a file that is mostly refused must not pass as done."""
NS_PER_S = 1e9  # _looks gives modification times in ns, as index.json keeps them
DEFAULT_SETTLE_S = 5.0
"""How long an inbox file must go unmodified before a run takes it (a run waits that long at most, once): a
file an uploader was still writing was labelled with the rows it had so far."""


LabelOverrides = LabelSettings.overrides()


class FilesFailed(SpinnError):
    """A label-pairs run in which some files failed or were refused: it ends Failed, so alerts fire; `entries`
    holds this run's entries of the index (those files and the labelled ones), as a Completed run returns them."""

    def __init__(self, entries: dict[str, dict[str, Any]], failed: list[str], refused: list[str]):
        self.entries, self.failed, self.refused = entries, failed, refused
        told = [
            f"{len(names)} of {len(entries)} files {what}: {', '.join(names)}"
            for names, what in (
                (failed, "failed (retried on the next run)"),
                (refused, "refused for too many rejected rows (until the file or max_rejected changes)"),
            )
            if names
        ]
        super().__init__("; ".join(told))


class LabelRequest(BaseModel):
    """What to label, with what, and where the work runs; `settings` are `spinn label`'s own options."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    inbox: Path = Field(Path("data/inbox"), description="New sentence-pair files land here.")
    outbox: Path = Field(Path("data/labelled"), description="Predictions, rejects and index.json go here.")
    model: str = Field("models:/spinn@champion", description="Checkpoint path or MLflow model URI.")
    settings: LabelOverrides = Field(default_factory=LabelOverrides)  # type: ignore[valid-type]
    dask_address: str | None = Field(None, description="An existing Dask scheduler, e.g. tcp://10.0.0.5:8786.")
    dask_workers: int = Field(2, ge=1, description="Workers of the local cluster when no address is given.")
    files_at_once: count_or_auto("files") = Field(  # type: ignore[valid-type]
        AUTO,
        description=(
            "Inbox files labelled side by side, each a label-file subflow sharing the cluster; auto: "
            "dask_workers (with dask_address: this machine's usable cores), at most this machine's usable cores."
        ),
    )
    track: bool = Field(True, description="Log each labelled file to an MLflow run (experiment spinn-labeling).")
    settle_seconds: float = Field(
        DEFAULT_SETTLE_S,
        ge=0,
        description=(
            "An inbox file that changes within this many seconds of its last change is still being written: "
            "it waits for a later run."
        ),
    )

    @model_validator(mode="after")
    def _settings_resolve(self) -> LabelRequest:
        self.label_settings()
        return self

    def label_settings(self) -> LabelSettings:
        """`spinn label`'s settings, with this flow's own default share of rejected rows (FLOW_MAX_REJECTED)."""
        try:
            return LabelSettings.build({"max_rejected": FLOW_MAX_REJECTED}, self.settings.model_dump(exclude_none=True))
        except SpinnError as error:
            raise ValueError(str(error)) from None

    def worker_settings(self) -> LabelSettings:
        """The label settings the Dask workers run: an auto `threads` is decided in each worker by the rule of
        spinn/ground/cores.py, within the worker's share of its machine's cores (OMP_NUM_THREADS: on the local cluster
        this machine's usable cores split among its workers, see dask_cluster; Dask's own default is 1)."""
        return self.label_settings()

    def file_threads(self) -> int:
        """How many files run side by side. More than the workers would only queue shards, and each file
        also costs this process a thread that reads the file to plan it and logs its MLflow run: auto is
        bounded by both."""
        if self.files_at_once != AUTO:
            return self.files_at_once
        cores = usable_cores()
        return cores if self.dask_address else min(cores, self.dask_workers)


@contextmanager
def dask_cluster(request: LabelRequest) -> Iterator[str]:
    """The scheduler address: the given cluster, or a local one (127.0.0.1) that lives for this run only.

    One cluster serves every file of a run, so workers load the model and the
    parser once, not once per file.
    """
    if request.dask_address:
        yield request.dask_address
        return
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=request.dask_workers,
        threads_per_worker=1,
        processes=True,
        host=LOOPBACK,
        dashboard_address=None,
        env=child_environment(request.dask_workers),  # each worker's share of the cores (Dask would say 1)
    ) as cluster:
        yield cluster.scheduler_address


# ----------------------------------------------------------------------------- the shards, on Dask workers


@task(name="label-shard", task_run_name="label-shard-{index}")
def shard_task(job, index: int):
    """One shard, with the worker's own labeller (spinn.labeling.shard_job); its parse and model progress,
    with pairs/s, in the task's log every REPORT_EVERY_S seconds (LabelProgress's own interval)."""
    from spinn.labeling.label_progress import LabelProgress
    from spinn.labeling.shard_plan import shard_rows

    logger = get_run_logger()
    progress = LabelProgress(
        len(shard_rows(job.plan, index)),
        bars=False,
        log=lambda line: logger.info(f"shard {index}: {line}"),
    )
    try:
        return job(index, progress)
    finally:
        progress.close()


def on_dask(job, indices: list[int]) -> list:
    """label()'s shard runner for this flow: every shard a task on the subflow's Dask cluster, at once."""
    futures = [shard_task.submit(job, index) for index in indices]
    return [future.result() for future in futures]


# ----------------------------------------------------------------------------- flows


@flow(name="label-file")
def label_file(input_path: Path, request: LabelRequest) -> dict[str, Any]:
    """One file through `spinn label`'s own orchestration (every check, the plan, the merge, the published
    record, the summary), its shards as tasks on the Dask cluster; then its MLflow run. An output of another
    version of the file is replaced: the inbox's outputs are its files' own."""
    from spinn.labeling.label import label

    children.stop_when_orphaned()  # a worker's flow run ends with its worker, as a command with its starter
    settings = spread_over(request.worker_settings(), input_path, request.dask_workers)
    output = request.outbox / output_name(input_path)
    try:
        summary = label(input_path, request.model, output, settings, run_shards=on_dask, replace=True)
    except TooManyRejected as error:  # labelled and published: its figures and MLflow run, then the failure
        error.figures = _figures(error.summary, settings, request)
        raise
    if file_digest(input_path, "sha256") != summary.input_sha256:
        raise SpinnError(f"{input_path}: changed while it was labelled; it is labelled again on the next run")
    return _figures(summary, settings, request)


def _figures(summary, settings: LabelSettings, request: LabelRequest) -> dict[str, Any]:
    """A labelled file's index entry: its counts, accuracy against its gold labels, and MLflow run (logged
    here); what the run repaired goes to the subflow's log too."""
    for what in summary.repaired:
        get_run_logger().warning(f"repaired: {what}")
    found = summary.agreement
    tracked = log_label_run(summary, settings) if request.track else None
    return {
        "sha256": summary.input_sha256,
        "output": str(summary.output),
        "rejects": str(summary.rejects),
        "rows": summary.rows,
        "labelled": summary.labelled,
        "rejected": summary.rejected,
        "reasons": summary.reasons,
        "shards": summary.shards,
        "shards_reused": summary.shards_reused,
        "repaired": list(summary.repaired),
        "published_before": summary.published_before,
        "model": summary.model,
        "parser": summary.parser,
        "accuracy": None if found is None else found.accuracy,
        "label_scheme": None if found is None else found.scheme.name,
        "metrics": label_metrics(summary),
        "mlflow_run": None if tracked is None else tracked.url,
    }


@flow(name="label-pairs", log_prints=True)
def label_pairs(request: LabelRequest | None = None) -> dict[str, dict[str, Any]] | State:
    """Label the inbox's new and previously failed files, `request.files_at_once` side by side (each a
    label-file subflow); returns this run's entries of the index, or, when any file failed, ends Failed with a
    FilesFailed that holds them (the artifact lists every file)."""
    children.stop_when_orphaned()  # a worker's flow run ends with its worker, as a command with its starter
    request = request or LabelRequest()
    request.outbox.mkdir(parents=True, exist_ok=True)
    index = read_index(request.outbox)
    max_rejected = request.label_settings().max_rejected
    waiting, refused = inbox_state(request.inbox, index, max_rejected)
    pending = settled(waiting, request.settle_seconds)
    entries = _label_pending(pending, request, index) if pending else {}
    described = f"{len(entries)} inbox files labelled or retried, {len(refused)} still refused"
    still = {name: _still_refused(entry) for name, entry in refused.items()}
    create_table_artifact(labelled_file_rows({**entries, **still}), key=LABELLING_RUN_KEY, description=described)
    failed, refused_now = (
        [name for name, entry in entries.items() if entry["status"] == end] for end in (FAILED, REFUSED)
    )
    if failed or refused_now:
        error = FilesFailed(entries, failed, refused_now)
        return Failed(message=str(error), data=error)
    return entries


def _still_refused(entry: dict[str, Any]) -> dict[str, Any]:
    """A refused file's entry as a later run's table shows it: the figures of the run that refused it, and in
    `error` why and how to have it taken again (a row each run, no failure: the first run alerted)."""
    how = f"to label it, change the file or raise max_rejected above {entry['max_rejected']:g}"
    return {**entry, "error": f"still refused since {entry['started_at']} ({how}): {entry['error']}"}


def _label_pending(pending: list[Path], request: LabelRequest, index: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """Label the files side by side on one cluster. Each file's entry goes into the index as it ends, written
    here in the flow's own thread, so a killed run keeps every finished file's entry; the entries come back in
    the inbox's order, not the finishing order."""
    entries = {}
    with dask_cluster(request) as address:
        label = partial(_label_one, request=request, address=address)
        for path, entry in side_by_side(label, pending, request.file_threads()):
            entries[path.name] = index[path.name] = entry
            write_index(request.outbox, index)
    return {path.name: entries[path.name] for path in pending}


def _label_one(path: Path, request: LabelRequest, address: str) -> dict[str, Any]:
    """Label one file (in a thread of its own, beside other files); a failure is recorded, not raised, so
    the files beside it go on: the subflow's, or one before it (a file gone from the inbox has no digest)."""
    entry = {"sha256": None, "started_at": _now()}
    start = time.perf_counter()
    try:
        entry["stat"] = _looks(path)  # before the digest: a file changed while it is read is read again
        entry["sha256"] = file_digest(path, "sha256")
        entry.update(status=DONE, **_label_subflow(path, request, address))
    except TooManyRejected as error:  # its content's fault: refused until the file or the threshold changes
        entry.update(error.figures, status=REFUSED, max_rejected=request.label_settings().max_rejected)
        entry["error"] = f"{type(error).__name__}: {one_line(error)}"
    except Exception as error:  # recorded in the index and the run's artifact; the file is retried next run
        entry.update(status=FAILED, error=f"{type(error).__name__}: {one_line(error)}")
    entry["seconds"] = round(time.perf_counter() - start, 3)
    return entry


def _label_subflow(path: Path, request: LabelRequest, address: str) -> dict[str, Any]:
    """label_file as a subflow of this run, its shards on the cluster at `address`; raises what it raised."""
    runner = DaskTaskRunner(address=address)
    return label_file.with_options(task_runner=runner, flow_run_name=f"label-{path.name}")(path, request)


def inbox_state(inbox: Path, index: dict[str, dict], max_rejected: float) -> tuple[list[Path], dict[str, dict]]:
    """The inbox's input files by name, each read at most once: those to label (new, changed, or failed last
    time; `settled` then leaves out those still being written) and the index entries of those refused for
    their present content under this `max_rejected`. Dot-files (editors' and uploaders' temporaries) are never
    taken."""
    waiting, refused = [], {}
    for path in _inbox_files(inbox):
        entry = index.get(path.name)
        digest = _digest(path, entry)
        if digest is None or _done(entry, digest):
            continue
        if _refused(entry, digest, max_rejected):
            refused[path.name] = entry
        else:
            waiting.append(path)
    return waiting, refused


def _inbox_files(inbox: Path) -> list[Path]:
    """The inbox's input files by name, dot-files left out."""
    if not inbox.is_dir():
        return []
    return sorted(
        path
        for path in inbox.iterdir()
        if path.is_file() and not path.name.startswith(".") and _input_suffix(path) is not None
    )


def settled(files: list[Path], settle_seconds: float) -> list[Path]:
    """The files nobody is writing: a file modified less than `settle_seconds` ago is watched until it is
    that old (one wait for all, at most `settle_seconds`); one that changed meanwhile is still being
    written and waits for a later run (named in the log)."""
    first = {path: _looks(path) for path in files}
    youngest = min((time.time() - look[1] / NS_PER_S for look in first.values() if look), default=settle_seconds)
    if youngest < settle_seconds:
        time.sleep(settle_seconds - max(youngest, 0.0))
    second = {path: _looks(path) for path in files}
    for path in files:
        if second[path] is not None and second[path] != first[path]:
            print(f"{path.name}: still being written (changed within {settle_seconds:g} s); it waits for a later run")
    return [path for path in files if second[path] is not None and second[path] == first[path]]


def _looks(path: Path) -> list[int] | None:
    """Size and modification time (ns), what says without reading the file that it is as it was (as JSON keeps
    it, in index.json); None for a file gone since the inbox was listed."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return [status.st_size, status.st_mtime_ns]


def _digest(path: Path, entry: dict | None) -> str | None:
    """The file's sha256: the index's own while the file's size and modification time are those recorded with
    it (a scheduled run reads no unchanged file again, however large), else read; None for a file gone since
    the inbox was listed."""
    looks = _looks(path)
    if looks is None:
        return None
    if entry is not None and entry.get("sha256") and entry.get("stat") == looks:
        return entry["sha256"]
    try:
        return file_digest(path, "sha256")
    except FileNotFoundError:  # gone between the look and the read
        return None


def _done(entry: dict | None, digest: str) -> bool:
    return entry is not None and entry.get("status") == DONE and entry.get("sha256") == digest


def _refused(entry: dict | None, digest: str, max_rejected: float) -> bool:
    """Refused for this very content under this very threshold: a new digest or threshold takes it again."""
    if entry is None or entry.get("status") != REFUSED or entry.get("max_rejected") != max_rejected:
        return False
    return entry.get("sha256") == digest


def read_index(outbox: Path) -> dict[str, dict]:
    """The index of what earlier runs did, by input name; a damaged one is named with its fix (without it, a
    run labels nothing twice: each published output's record says it is done)."""
    path = outbox / INDEX_NAME
    if not path.is_file():
        return {}
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        index = error
    if isinstance(index, dict) and all(isinstance(entry, dict) for entry in index.values()):
        return index
    problem = index if isinstance(index, BaseException) else "not an object of one entry per input file"
    raise SpinnError(
        f"{path}: not a label-pairs index ({problem}); move it aside and rerun: the run finds every file whose "
        "output is already published done, without labelling it again, and writes a new index"
    )


def write_index(outbox: Path, index: dict[str, dict]) -> None:
    with atomic_path(outbox / INDEX_NAME) as temporary:
        temporary.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _input_suffix(path: Path) -> str | None:
    """The longest of INPUT_SUFFIXES that ends the name, whatever its case; None when none does."""
    name = path.name.lower()
    return next((suffix for suffix in sorted(INPUT_SUFFIXES, key=len, reverse=True) if name.endswith(suffix)), None)


def output_name(path: Path) -> str:
    """`pairs.jsonl.gz` -> `pairs.jsonl.gz.labels.parquet`: the whole input name, so two inputs that differ
    only in their suffix (`pairs.csv` and `pairs.jsonl`) never share an output, which would fail the second
    on every run for good."""
    return f"{path.name}{LABELS_SUFFIX}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
