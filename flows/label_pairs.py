"""label-pairs: label every new file in an inbox folder, once, with shards spread over a Dask cluster.

Each run lists the inbox, skips files the index says are done (same name and
same content digest), and labels the rest one file at a time. A file is cut
into shards (spinn.labeling.shards), the shards run as Prefect tasks on a Dask cluster
(a local one by default, or an existing cluster by address) and are merged.
A file that fails is recorded as failed, reported, and tried again on the next
run; finished shards of a killed run are reused. Counts go to the Prefect
run's artifacts and to an MLflow run per labelled file.

The Dask workers are the parallelism: each worker process parses in itself
(`spinn label`'s parser `workers` do not apply here) with the settings' torch
threads, so `dask_workers` about the number of free cores keeps them busy
without oversubscribing them; a file gives each worker work when it has at
least that many shards (`shard_size`). A shard logs its progress every
PROGRESS_EVERY_S seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.states import Failed, State
from prefect_dask import DaskTaskRunner
from pydantic import BaseModel, ConfigDict, Field, model_validator

from spinn.data.sentence_pairs import readable_suffixes
from spinn.errors import SpinnError, one_line
from spinn.io import atomic_path, file_digest
from spinn.labeling.settings import LabelSettings
from spinn.labeling.shards import hold_output
from spinn.labeling.spread import spread_over

INDEX_NAME = "index.json"
INPUT_SUFFIXES = readable_suffixes()
"""The inbox takes every file the sentence-pair readers can read (matched case-blind, as they do)."""
DONE, FAILED = "done", "failed"
LABELING_EXPERIMENT = "spinn-labeling"
LOOPBACK = "127.0.0.1"
LABELLING_RUN_KEY = "spinn-labeling-run"
PROGRESS_EVERY_S = 30.0
FILE_COLUMNS = ("status", "rows", "labelled", "rejected", "oov_share", "parser", "output", "error")
"""The labelling run's table: a labelled file fills the counts, a failed one the error."""


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

    @model_validator(mode="after")
    def _settings_resolve(self) -> LabelRequest:
        self.label_settings()
        return self

    def label_settings(self) -> LabelSettings:
        try:
            return LabelSettings.build(self.settings.model_dump(exclude_none=True))
        except SpinnError as error:
            raise ValueError(str(error)) from None


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
        n_workers=request.dask_workers, threads_per_worker=1, processes=True, host=LOOPBACK, dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


# ----------------------------------------------------------------------------- tasks (run on Dask workers)

_LABELLERS: dict[tuple, Any] = {}
"""One loaded model and parser per worker process, shared by the shards that worker labels."""


def _labeller(model: str, settings) -> Any:
    """Parsing in this worker process: a Dask worker is daemonic (no children) and is itself the parallelism."""
    from spinn.labeling.labeller import Labeller

    settings = settings.replace(parsing={"workers": 1})
    key = (model, repr(settings))
    if key not in _LABELLERS:
        _LABELLERS[key] = Labeller(model, settings)
    return _LABELLERS[key]


class PlannedFile(NamedTuple):
    """A file's shard plan and what the labeller resolved: the model (an alias resolved once) and the parser."""

    plan: Any
    model: str
    model_name: str
    parser: str


@task(name="plan-shards", task_run_name="plan-{input_path.name}")
def plan_task(input_path: Path, output: Path, model: str, settings) -> PlannedFile:
    """Cut the file into shards; the parser is the labeller's (`auto` becomes `model` or `stanza` there)."""
    from spinn.labeling.shards import plan_shards

    labeller = _labeller(model, settings)
    plan = plan_shards(input_path, output, settings, labeller.fingerprint())
    return PlannedFile(plan, labeller.reference, labeller.model_name, labeller.parser_name)


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
    """One file: plan, then every shard as a task on the Dask cluster, then merge; the output is this
    run's alone meanwhile (`hold_output`: a `spinn label` on it is refused, and this run is if one holds it)."""
    settings = spread_over(request.label_settings(), input_path, request.dask_workers)
    output = request.outbox / f"{_stem(input_path)}.labels.parquet"
    with hold_output(output):
        planned = plan_task(input_path, output, request.model, settings)
        plan = planned.plan
        futures = [shard_task.submit(plan, index, planned.model, settings) for index in range(plan.shards)]
        results = [future.result() for future in futures]
        summary = merge_task(plan, results, planned.model_name, planned.parser)
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
        "parse_pairs_per_second": summary.parse_pairs_per_second,
        "model_pairs_per_second": summary.model_pairs_per_second,
        "oov_share": summary.oov_share,
    }


@flow(name="label-pairs", log_prints=True)
def label_pairs(request: LabelRequest | None = None) -> dict[str, dict[str, Any]] | State:
    """Label the inbox's new and previously failed files; returns this run's entries of the index, or,
    when any file failed, ends Failed with a FilesFailed that holds them (the artifact lists every file)."""
    request = request or LabelRequest()
    request.outbox.mkdir(parents=True, exist_ok=True)
    index = read_index(request.outbox)
    entries = {}
    pending = pending_files(request.inbox, index)
    if pending:
        with dask_cluster(request) as address:
            for path in pending:
                entries[path.name] = _label_one(path, request, address)
                index[path.name] = entries[path.name]
                write_index(request.outbox, index)
    create_table_artifact(
        file_rows(entries), key=LABELLING_RUN_KEY, description=f"{len(entries)} inbox files labelled or retried"
    )
    failed = [name for name, entry in entries.items() if entry["status"] == FAILED]
    if failed:
        error = FilesFailed(entries, failed)
        return Failed(message=str(error), data=error)
    return entries


def _label_one(path: Path, request: LabelRequest, address: str) -> dict[str, Any]:
    """Label one file under its own Dask-backed subflow; a failure is recorded, not raised."""
    entry = {"sha256": file_digest(path, "sha256"), "started_at": _now()}
    start = time.perf_counter()
    runner = DaskTaskRunner(address=address)
    state = label_file.with_options(task_runner=runner, flow_run_name=f"label-{path.name}")(
        path, request, return_state=True
    )
    entry["seconds"] = round(time.perf_counter() - start, 3)
    if state.is_completed():
        entry.update(status=DONE, **state.result())
        _log_to_mlflow(path, entry)
    else:
        error = state.result(raise_on_failure=False)
        entry.update(status=FAILED, error=f"{type(error).__name__}: {one_line(error)}")
    return entry


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


def _stem(path: Path) -> str:
    """`pairs.jsonl.gz` -> `pairs`: the name of the file's outputs."""
    suffix = _input_suffix(path)
    return path.name[: -len(suffix)] if suffix else path.stem


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _log_to_mlflow(path: Path, entry: dict[str, Any]) -> None:
    """One MLflow run per labelled file: what was labelled with which model, and the counts."""
    from spinn.tracking import store as tracking

    with tracking.run(LABELING_EXPERIMENT, run_name=f"label {path.name}"):
        tracking.log_params(
            {
                "input": str(path),
                "input_sha256": entry["sha256"],
                "model": entry["model"],
                "parser": entry["parser"],
                "output": entry["output"],
            }
        )
        metrics = {
            "rows": entry["rows"],
            "labelled": entry["labelled"],
            "rejected": entry["rejected"],
            "seconds": entry["seconds"],
        }
        metrics.update({f"rejected_{reason}": count for reason, count in entry["reasons"].items()})
        tracking.log_metrics(metrics, step=0)


def file_rows(entries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per file of this run, every row with every column (empty where it does not apply)."""
    return [{"file": name, **{column: entry.get(column) for column in FILE_COLUMNS}} for name, entry in entries.items()]
