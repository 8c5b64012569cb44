"""The label-pairs flow's plain parts (request settings, the inbox listing), without a Prefect server.

The flow and `spinn label` are two doors to one stage: they must read the same
files and fill the same parse cache.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.label_pairs import LabelRequest
from spinn.parsing.parser_settings import DEFAULT_CACHE_PATH

CLUSTER = SimpleNamespace(scheduler_address="tcp://127.0.0.1:8786")
"""What a local cluster gives the flow, for tests that only look at how it was started."""


def test_the_flow_and_spinn_label_share_one_parse_cache(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from spinn.cli import main

    monkeypatch.chdir(tmp_path)
    request = LabelRequest(inbox=tmp_path / "inbox", outbox=tmp_path / "labelled")
    flow_cache = request.label_settings().parsing.cache_path
    help_text = " ".join(CliRunner().invoke(main, ["label", "--help"]).output.split())
    assert f"[default: {DEFAULT_CACHE_PATH}]" in help_text.replace(f"{DEFAULT_CACHE_PATH.parent}/ ", "")
    assert Path(flow_cache) == DEFAULT_CACHE_PATH


def candidate_names() -> list[str]:
    """File names with every suffix the reader knows, gzipped or not, in both cases, and some it does not."""
    from spinn.data.sentence_pairs import GZIP_SUFFIX, SUFFIX_FORMATS

    suffixes = [*SUFFIX_FORMATS, ".txt", ".json", ".zip"]
    names = [f"pairs{suffix}{gz}" for suffix in suffixes for gz in ("", GZIP_SUFFIX)]
    return names + [name.upper() for name in names]


def reader_accepts(path: Path) -> bool:
    from spinn.data.sentence_pairs import detect_format
    from spinn.ground.errors import SpinnError

    try:
        detect_format(path)
    except SpinnError:
        return False
    return True


def pending(inbox: Path, index: dict, settle_seconds: float = 0.0, max_rejected: float = 0.1) -> list[str]:
    """The names of the files a label-pairs run would label, as the flow works them out."""
    from flows.label_pairs import inbox_state, settled

    return [path.name for path in settled(inbox_state(inbox, index, max_rejected)[0], settle_seconds)]


def test_the_inbox_picks_up_every_file_the_reader_accepts_and_no_other(tmp_path):
    for name in candidate_names():
        (tmp_path / name).write_bytes(b"")
    picked = set(pending(tmp_path, {}))
    assert picked == {name for name in candidate_names() if reader_accepts(tmp_path / name)}
    assert {"pairs.ndjson", "pairs.tab", "pairs.ndjson.gz", "pairs.tab.gz"} <= picked


def test_every_inbox_file_has_an_output_of_its_own():
    """`pairs.csv` and `pairs.jsonl` once shared `pairs.labels.parquet`, so the second always failed."""
    from flows.label_pairs import output_name

    names = ("pairs.csv", "pairs.jsonl", "pairs.jsonl.gz", "PAIRS.NDJSON", "a.b.tsv.gz", "pairs.tab")
    outputs = [output_name(Path(name)) for name in names]
    assert len(set(outputs)) == len(names) and all(output.endswith(".labels.parquet") for output in outputs)
    assert output_name(Path("a.b.tsv.gz")) == "a.b.tsv.gz.labels.parquet"


def test_dask_workers_parse_in_their_own_process_with_one_labeller_for_every_shard():
    """A Dask worker is daemonic (no child processes) and is itself the parallelism: its labeller parses in
    it; and a file's shard size (spread over the workers) or columns load no second model."""
    from spinn.labeling import labeller as labeller_module
    from spinn.labeling.label_settings import LabelSettings
    from spinn.labeling.labeller import ModelSource, worker_labeller

    checkpoint = Path(__file__).parent / "fixtures" / "release-0.1.0" / "checkpoint.pt"
    settings = LabelSettings(parser="model", device="cpu").replace(parsing={"workers": 4, "cache_path": None})
    try:
        labeller = worker_labeller(ModelSource(checkpoint), settings)
        assert labeller.settings.parsing.workers == 1 and labeller.settings.threads == settings.threads
        other_file = settings.replace(shard_size=7, columns={"premise": "sentence1"})
        assert worker_labeller(ModelSource(checkpoint), other_file) is labeller
        assert worker_labeller(ModelSource(checkpoint), settings.replace(int8=True)) is not labeller
    finally:
        labeller_module._WORKER_LABELLERS.clear()


def test_files_side_by_side_are_bounded_by_the_workers_and_this_machines_cores(tmp_path, monkeypatch):
    """auto: as many files as the local cluster has workers, at most this machine's usable cores; with an
    existing cluster (its size unknown here) the cores alone; a number is taken as it is."""
    import flows.label_pairs as label_flow

    monkeypatch.setattr(label_flow, "usable_cores", lambda: 3)

    def threads(**fields) -> int:
        return LabelRequest(inbox=tmp_path, outbox=tmp_path, **fields).file_threads()

    assert [threads(dask_workers=workers) for workers in (1, 2, 3, 8)] == [1, 2, 3, 3]
    assert threads(dask_workers=1, dask_address="tcp://10.0.0.5:8786") == 3
    assert threads(dask_workers=8, files_at_once=5) == 5
    for wrong in (0, "many"):
        with pytest.raises(ValueError, match="files_at_once"):
            threads(files_at_once=wrong)


def test_the_local_clusters_workers_get_their_share_of_this_machines_cores(tmp_path, monkeypatch):
    """auto threads stay auto for the workers, each deciding by the rule of spinn/ground/cores.py within its share: on
    the local cluster this machine's usable cores split among its workers, said in OMP_NUM_THREADS (Dask would
    say 1), at least one each; a number is kept."""
    import flows.label_pairs as label_flow
    from spinn.ground import cores

    monkeypatch.setattr(cores, "usable_cores", lambda: 8)
    monkeypatch.setattr(cores, "_STARTED_WITH", dataclasses.replace(cores._STARTED_WITH, threads=None))
    clusters = []
    monkeypatch.setattr("distributed.LocalCluster", lambda **options: clusters.append(options) or nullcontext(CLUSTER))

    def share(workers: int) -> str:
        with label_flow.dask_cluster(LabelRequest(inbox=tmp_path, outbox=tmp_path, dask_workers=workers)):
            return clusters[-1]["env"]["OMP_NUM_THREADS"]

    assert [share(workers) for workers in (1, 2, 3, 8, 16)] == ["8", "4", "2", "1", "1"]
    settings = LabelRequest(inbox=tmp_path, outbox=tmp_path, dask_workers=2).worker_settings()
    assert settings.threads == "auto"
    assert LabelRequest(inbox=tmp_path, outbox=tmp_path, settings={"threads": 3}).worker_settings().threads == 3


def test_the_inbox_leaves_dot_files_and_files_still_being_written_for_a_later_run(tmp_path):
    """An uploader's temporary (a dot-file) is never taken; a file that grows while the run looks waits, and
    is taken once it stops; a complete file written a moment ago is taken at once."""
    import threading
    import time

    header = "premise,hypothesis\n"
    for name in (".pairs.csv.part", ".~lock.pairs.csv", "done.csv"):
        (tmp_path / name).write_text(header + "A dog runs.,An animal moves.\n", encoding="utf-8")
    growing = tmp_path / "growing.csv"
    growing.write_text(header, encoding="utf-8")
    stop = threading.Event()

    def upload():
        while not stop.wait(0.05):
            with growing.open("a", encoding="utf-8") as handle:
                handle.write("A dog runs.,An animal moves.\n")

    writer = threading.Thread(target=upload)
    writer.start()
    try:
        assert pending(tmp_path, {}, settle_seconds=0.5) == ["done.csv"]
    finally:
        stop.set()
        writer.join()
    time.sleep(0.01)
    assert pending(tmp_path, {}, settle_seconds=0.5) == ["done.csv", "growing.csv"]


@pytest.mark.parametrize("index", ['{"pairs.csv": {"status": ', "[]", '{"pairs.csv": "done"}'])
def test_a_damaged_inbox_index_is_named_with_its_fix(tmp_path, index):
    from flows.label_pairs import INDEX_NAME, label_pairs
    from spinn.ground.errors import SpinnError

    (tmp_path / "labelled").mkdir()
    (tmp_path / "labelled" / INDEX_NAME).write_text(index, encoding="utf-8")
    request = LabelRequest(inbox=tmp_path / "inbox", outbox=tmp_path / "labelled")
    with pytest.raises(
        SpinnError, match=f"^{tmp_path / 'labelled' / INDEX_NAME}: not a label-pairs index .*move it aside"
    ):
        label_pairs.fn(request)


def test_a_file_refused_for_its_content_waits_until_it_or_the_threshold_changes(tmp_path):
    """A refused entry holds back its own content under its own max_rejected only; a failed one never does."""
    from flows.label_pairs import DONE, FAILED, REFUSED, inbox_state
    from spinn.ground.io import file_digest

    for name in ("refused.csv", "edited.csv", "failed.csv", "done.csv"):
        (tmp_path / name).write_text(f"premise,hypothesis\nA dog runs.,{name}\n", encoding="utf-8")
    digest = {name: file_digest(tmp_path / name, "sha256") for name in ("refused.csv", "failed.csv", "done.csv")}
    index = {
        "refused.csv": {"status": REFUSED, "sha256": digest["refused.csv"], "max_rejected": 0.1, "error": "why"},
        "edited.csv": {"status": REFUSED, "sha256": digest["refused.csv"], "max_rejected": 0.1, "error": "why"},
        "failed.csv": {"status": FAILED, "sha256": digest["failed.csv"], "error": "model not found"},
        "done.csv": {"status": DONE, "sha256": digest["done.csv"]},
    }

    assert pending(tmp_path, index, max_rejected=0.1) == ["edited.csv", "failed.csv"]
    assert inbox_state(tmp_path, index, max_rejected=0.1)[1] == {"refused.csv": index["refused.csv"]}
    assert pending(tmp_path, index, max_rejected=0.2) == ["edited.csv", "failed.csv", "refused.csv"]
    assert inbox_state(tmp_path, index, max_rejected=0.2)[1] == {}


def test_a_run_reads_each_inbox_file_once_and_an_unchanged_one_not_at_all(tmp_path, monkeypatch):
    """The digest the index recorded with a file's size and modification time stands while both do; any
    other file is read once per run, whatever it is checked for (done, refused)."""
    import os

    from flows import label_pairs
    from flows.label_pairs import DONE, REFUSED, inbox_state
    from spinn.ground.io import file_digest

    for name in ("done.csv", "refused.csv", "old_index.csv", "new.csv"):
        (tmp_path / name).write_text(f"premise,hypothesis\nA dog runs.,{name}\n", encoding="utf-8")
    index_named = ("done.csv", "refused.csv")  # the index's "stat": [size, modification time in ns]
    recorded = {name: [(tmp_path / name).stat().st_size, (tmp_path / name).stat().st_mtime_ns] for name in index_named}
    digest = {name: file_digest(tmp_path / name, "sha256") for name in ("done.csv", "refused.csv", "old_index.csv")}
    index = {
        "done.csv": {"status": DONE, "sha256": digest["done.csv"], "stat": recorded["done.csv"]},
        "refused.csv": {"status": REFUSED, "sha256": digest["refused.csv"], "stat": recorded["refused.csv"]}
        | {"max_rejected": 0.1, "error": "why"},
        "old_index.csv": {"status": DONE, "sha256": digest["old_index.csv"]},  # written before stats were kept
    }
    read = []

    def counted(path: Path, algorithm: str) -> str:
        read.append(path.name)
        return file_digest(path, algorithm)

    monkeypatch.setattr(label_pairs, "file_digest", counted)

    waiting, refused = inbox_state(tmp_path, index, 0.1)
    assert [path.name for path in waiting] == ["new.csv"] and list(refused) == ["refused.csv"]
    assert sorted(read) == ["new.csv", "old_index.csv"]

    read.clear()
    done = tmp_path / "done.csv"
    done.write_text("premise,hypothesis\nA cat sleeps.,done.csv\n", encoding="utf-8")  # same size, new content
    os.utime(done, ns=(recorded["done.csv"][1] + 1, recorded["done.csv"][1] + 1))
    waiting, _ = inbox_state(tmp_path, index, 0.1)
    assert [path.name for path in waiting] == ["done.csv", "new.csv"]
    assert sorted(read) == ["done.csv", "new.csv", "old_index.csv"]
