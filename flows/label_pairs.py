"""label-pairs: label every new file in an inbox folder, once, with shards spread over a Dask cluster.

Each run lists the inbox, skips files the index says are done (same name and
same content digest), and labels the rest, `files_at_once` of them side by side
(flows/threads.py), each as its own label-file subflow. A file is cut
into shards (spinn.labeling.shards), the shards run as Prefect tasks on a Dask cluster
(a local one by default, or an existing cluster by address) and are merged.
Only the flow's own thread writes the index, as each file ends, so a killed
run loses no finished file's entry and a rerun labels the others again (their
finished shards reused): every file's rows end up in its output exactly once.
A file that fails is recorded as failed, reported, and tried again on the next
run; the files beside it go on. A labelled file's figures
(counts, label shares, confidence, OOV share, drift) go to the Prefect run's
table artifact and to an MLflow run per file (spinn/labeling/track.py).

The Dask workers are the parallelism: each worker process parses in itself
(`spinn label`'s parser `workers` do not apply here) with the settings' torch
threads, so `dask_workers` about the number of free cores keeps them busy
without oversubscribing them; a file gives each worker work when it has at
least that many shards (spinn.labeling.spread), and files side by side fill
the gaps between one file's shards and the next's (its plan, merge and MLflow
run, a last shard that leaves the others idle). A file's shards and labels do
not depend on what runs beside it. On Prefect's default SQLite server,
subflows that start together are often refused once ("database is locked",
503) and Prefect's client retries about 2 s later, so files side by side pay
off for files that take longer than that. A shard logs its progress every
PROGRESS_EVERY_S seconds.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.states import Failed, State
from prefect_dask import DaskTaskRunner
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flows.artifacts import labelled_file_rows
from flows.threads import side_by_side
from spinn.cores import child_environment, usable_cores
from spinn.data.sentence_pairs import readable_suffixes
from spinn.errors import SpinnError, one_line
from spinn.io import atomic_path, file_digest
from spinn.labeling.settings import LabelSettings
from spinn.labeling.shards import hold_output
from spinn.labeling.spread import spread_over
from spinn.labeling.track import label_metrics, log_label_run
from spinn.settings import AUTO, count_or_auto

INDEX_NAME = "index.json"
LABELS_SUFFIX = ".labels.parquet"
"""Ends every output's name: the input's whole name, then this (see output_name)."""
INPUT_SUFFIXES = readable_suffixes()
"""The inbox takes every file the sentence-pair readers can read (matched case-blind, as they do)."""
DONE, FAILED = "done", "failed"
LOOPBACK = "127.0.0.1"
LABELLING_RUN_KEY = "spinn-labeling-run"
PROGRESS_EVERY_S = 30.0


LabelOverrides = LabelSettings.overrides()


class FilesFailed(SpinnError):
    """A label-pairs run in which some files failed: it ends Failed, so alerts fire; `entries` holds this
    run's entries of the index (the failed files and the labelled ones), as a Completed run returns them."""

    def __init__(self, entries: dict[str, dict[str, Any]], failed: list[str]):
        self.entries, self.failed = entries, failed
        super().__init__(f"{len(failed)} of {len(entries)} files failed (retried on the next run): {', '.join(failed)}")


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

    @model_validator(mode="after")
    def _settings_resolve(self) -> LabelRequest:
        self.label_settings()
        return self

    def label_settings(self) -> LabelSettings:
        try:
            return LabelSettings.build(self.settings.model_dump(exclude_none=True))
        except SpinnError as error:
            raise ValueError(str(error)) from None

    def worker_settings(self) -> LabelSettings:
        """The label settings the Dask workers run: an auto `threads` is decided in each worker by the rule of
        spinn/cores.py, within the worker's share of its machine's cores (OMP_NUM_THREADS: on the local cluster
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


# ----------------------------------------------------------------------------- tasks (run on Dask workers)

_LABELLERS: dict[tuple, Any] = {}
"""One loaded model and parser per worker process, shared by the shards that worker labels."""
_LABELLERS_LOCK = threading.Lock()
"""plan-shards runs in the flow's own process, where files side by side would otherwise load the
same model and parser twice at once."""


def _labeller(model: str, settings) -> Any:
    """Parsing in this worker process: a Dask worker is daemonic (no children) and is itself the parallelism."""
    from spinn.labeling.labeller import Labeller

    settings = settings.replace(parsing={"workers": 1})
    key = (model, repr(settings))
    with _LABELLERS_LOCK:
        if key not in _LABELLERS:
            _LABELLERS[key] = Labeller(model, settings)
        return _LABELLERS[key]


class PlannedFile(NamedTuple):
    """A file's shard plan and what the labeller resolved: the model (an alias resolved once), the parser, and
    the model's label shares on dev (the reference of drift)."""

    plan: Any
    model: str
    model_name: str
    parser: str
    dev_shares: dict[str, float] | None


@task(name="plan-shards", task_run_name="plan-{input_path.name}")
def plan_task(input_path: Path, output: Path, model: str, settings) -> PlannedFile:
    """Cut the file into shards; the parser is the labeller's (`auto` becomes `model` or `stanza` there)."""
    from spinn.labeling.drift import dev_label_shares
    from spinn.labeling.shards import plan_shards

    labeller = _labeller(model, settings)
    plan = plan_shards(input_path, output, settings, labeller.fingerprint())
    shares = dev_label_shares(labeller.loaded.saved)
    return PlannedFile(plan, labeller.reference, labeller.model_name, labeller.parser_name, shares)


@task(name="label-shard", task_run_name="label-shard-{index}")
def shard_task(plan, index: int, model: str, settings):
    """One shard; its parse and model progress, with pairs/s, in the task's log every PROGRESS_EVERY_S seconds."""
    from prefect import get_run_logger

    from spinn.errors import SpinnError
    from spinn.labeling.progress import LabelProgress
    from spinn.labeling.shard import label_shard
    from spinn.labeling.shards import shard_rows

    labeller = _labeller(model, settings)
    if labeller.checkpoint_sha256 != plan.fingerprint["checkpoint_sha256"]:
        raise SpinnError(f"{model}: this worker loaded another checkpoint than the plan's")
    logger = get_run_logger()
    progress = LabelProgress(
        len(shard_rows(plan, index)),
        bars=False,
        log=lambda line: logger.info(f"shard {index}: {line}"),
        every_s=PROGRESS_EVERY_S,
    )
    try:
        return label_shard(plan, index, labeller, progress=progress)
    finally:
        progress.close()


@task(name="merge-shards", task_run_name="merge-{plan.shards}-shards")
def merge_task(plan, results: list, model_name: str, parser: str):
    from spinn.labeling.shards import merge_shards

    return merge_shards(plan, results, model_name, parser)


# ----------------------------------------------------------------------------- flows


@flow(name="label-file")
def label_file(input_path: Path, request: LabelRequest) -> dict[str, Any]:
    """One file: plan, then every shard as a task on the Dask cluster, then merge, then its MLflow run; the
    output is this run's alone meanwhile (`hold_output`: a `spinn label` on it is refused, and this run is if
    one holds it)."""
    started = time.perf_counter()
    settings = spread_over(request.worker_settings(), input_path, request.dask_workers)
    output = request.outbox / output_name(input_path)
    with hold_output(output):
        planned = plan_task(input_path, output, request.model, settings)
        plan = planned.plan
        futures = [shard_task.submit(plan, index, planned.model, settings) for index in range(plan.shards)]
        results = [future.result() for future in futures]
        summary = merge_task(plan, results, planned.model_name, planned.parser)
    summary.dev_shares, summary.seconds = planned.dev_shares, time.perf_counter() - started
    if settings.threads != AUTO:
        summary.model_threads = settings.threads
    tracked = log_label_run(summary, settings) if request.track else None
    return {
        "output": str(summary.output),
        "rejects": str(summary.rejects),
        "rows": summary.rows,
        "labelled": summary.labelled,
        "rejected": summary.rejected,
        "reasons": summary.reasons,
        "shards": summary.shards,
        "shards_reused": summary.shards_reused,
        "model": summary.model,
        "parser": summary.parser,
        "metrics": label_metrics(summary),
        "mlflow_run": None if tracked is None else tracked.url,
    }


@flow(name="label-pairs", log_prints=True)
def label_pairs(request: LabelRequest | None = None) -> dict[str, dict[str, Any]] | State:
    """Label the inbox's new and previously failed files, `request.files_at_once` side by side (each a
    label-file subflow); returns this run's entries of the index, or, when any file failed, ends Failed with a
    FilesFailed that holds them (the artifact lists every file)."""
    request = request or LabelRequest()
    request.outbox.mkdir(parents=True, exist_ok=True)
    index = read_index(request.outbox)
    pending = pending_files(request.inbox, index)
    entries = _label_pending(pending, request, index) if pending else {}
    described = f"{len(entries)} inbox files labelled or retried"
    create_table_artifact(labelled_file_rows(entries), key=LABELLING_RUN_KEY, description=described)
    failed = [name for name, entry in entries.items() if entry["status"] == FAILED]
    if failed:
        error = FilesFailed(entries, failed)
        return Failed(message=str(error), data=error)
    return entries


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
        entry["sha256"] = file_digest(path, "sha256")
        entry.update(status=DONE, **_label_subflow(path, request, address))
    except Exception as error:  # recorded in the index and the run's artifact; the file is retried next run
        entry.update(status=FAILED, error=f"{type(error).__name__}: {one_line(error)}")
    entry["seconds"] = round(time.perf_counter() - start, 3)
    return entry


def _label_subflow(path: Path, request: LabelRequest, address: str) -> dict[str, Any]:
    """label_file as a subflow of this run, its shards on the cluster at `address`; raises what it raised."""
    runner = DaskTaskRunner(address=address)
    return label_file.with_options(task_runner=runner, flow_run_name=f"label-{path.name}")(path, request)


def pending_files(inbox: Path, index: dict[str, dict]) -> list[Path]:
    """Input files not yet done with this content (new, changed, or failed last time), by name."""
    if not inbox.is_dir():
        return []
    files = sorted(path for path in inbox.iterdir() if path.is_file() and _input_suffix(path) is not None)
    return [path for path in files if not _done(index.get(path.name), path)]


def _done(entry: dict | None, path: Path) -> bool:
    return entry is not None and entry.get("status") == DONE and entry.get("sha256") == file_digest(path, "sha256")


def read_index(outbox: Path) -> dict[str, dict]:
    path = outbox / INDEX_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


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
