"""spinn.ground.io.atomic_path: published files get the mode open() would give them, without touching the umask.

Reading the umask means setting it, and the umask is per process: a write that
sets it to 0 for a moment makes files that other threads (Dask workers,
Prefect's) create meanwhile world-writable. So atomic_path reads it never,
only spinn.ground.io's import does, once.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys

import pytest

from spinn.ground.io import atomic_path

DEFAULT_MODE = 0o666
"""What open() gives a new file before the umask."""
STRICT_UMASK = 0o027
"""Not the usual 0o022, so a mode computed from the wrong mask shows."""
PUBLISH_ONE_FILE = """
import stat, sys
from pathlib import Path
from spinn.ground.io import atomic_path
final = Path(sys.argv[1])
with atomic_path(final) as temporary:
    temporary.write_text("published")
print(oct(stat.S_IMODE(final.stat().st_mode)))
"""
SUBPROCESS_TIMEOUT_S = 60


def test_a_published_file_gets_the_default_mode_minus_the_umask(tmp_path):
    final = tmp_path / "out.txt"
    done = subprocess.run(
        [sys.executable, "-c", PUBLISH_ONE_FILE, str(final)],
        preexec_fn=lambda: os.umask(STRICT_UMASK),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=True,
    )
    assert done.stdout.strip() == oct(DEFAULT_MODE & ~STRICT_UMASK)
    assert final.read_text() == "published"


def test_atomic_path_never_touches_the_umask(tmp_path, monkeypatch):
    def refuse(mask: int) -> int:
        raise AssertionError(f"os.umask({mask:#o}) called during a write")

    monkeypatch.setattr(os, "umask", refuse)
    final = tmp_path / "out.txt"
    with atomic_path(final) as temporary:
        temporary.write_text("published")
    assert final.read_text() == "published"
    assert stat.S_IMODE(final.stat().st_mode) & ~DEFAULT_MODE == 0


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    final = tmp_path / "out.txt"
    final.write_text("previous")
    with pytest.raises(RuntimeError), atomic_path(final) as temporary:
        temporary.write_text("half")
        raise RuntimeError("writer crashed")
    assert final.read_text() == "previous"
    assert [path.name for path in tmp_path.iterdir()] == ["out.txt"]


def temporary_name(final: str, writer: str = "") -> str:
    """What atomic_path names the temporary of `final`; `writer`: `PID-HOSTTAG.`, or empty as before 0.2."""
    return f".{final}.{writer}ab12cd34.tmp"


def test_a_temporary_names_its_writer(tmp_path):
    from spinn.ground.io import atomic_path

    with atomic_path(tmp_path / "out.txt") as temporary:
        assert temporary.name.startswith(f".out.txt.{os.getpid()}-") and temporary.name.endswith(".tmp")


def test_temporaries_of_dead_writers_go_and_live_writers_keep_theirs(tmp_path):
    import time

    from spinn.ground.io import _HOST_TAG, STALE_TEMPORARY_SECONDS, tidy_folder

    finished = subprocess.Popen(["true"])
    finished.wait()
    old = time.time() - STALE_TEMPORARY_SECONDS - 60
    files = {
        "dead writer": temporary_name("last.pt", f"{finished.pid}-{_HOST_TAG}."),
        "live writer": temporary_name("last.pt", f"{os.getpid()}-{_HOST_TAG}."),
        "old, no writer": temporary_name("best.pt"),
        "new, no writer": temporary_name("report.json"),
        "old, other host": temporary_name("out.parquet", f"{finished.pid}-0000ffff."),
        "new, other host": temporary_name("out.parquet", f"{finished.pid}-ffff0000."),
        "not ours": "notes.tmp",
    }
    for key, name in files.items():
        (tmp_path / name).write_text(key)
        if key.startswith("old") or key == "not ours":
            os.utime(tmp_path / name, (old, old))
    removed = {path.name for path in tidy_folder(tmp_path)}
    assert removed == {files["dead writer"], files["old, no writer"], files["old, other host"]}
    assert {path.name for path in tmp_path.iterdir()} == set(files.values()) - removed


# ----------------------------------------------------------------------------- files published together

PUBLISH_AND_DIE_BETWEEN = """
import os, sys
from pathlib import Path
from spinn.ground.io import atomic_paths
folder = Path(sys.argv[1])
finals = (folder / "out.parquet", folder / "out.rejects.jsonl")
replace = os.replace
def die_after_the_first(source, destination):
    replace(source, destination)
    if Path(destination) in finals:
        os._exit(9)  # killed: no finally runs
os.replace = die_after_the_first
with atomic_paths(*finals) as temporaries:
    for temporary, final in zip(temporaries, finals):
        temporary.write_text("new " + final.name)
"""


def old_pair(folder):
    finals = (folder / "out.parquet", folder / "out.rejects.jsonl")
    for final in finals:
        final.write_text("old " + final.name)
    return finals


def contents(finals) -> list[str]:
    return [final.read_text() for final in finals]


def test_files_published_together_replace_the_old_ones_together(tmp_path):
    from spinn.ground.io import atomic_paths

    finals = old_pair(tmp_path)
    with atomic_paths(*finals) as temporaries:
        for temporary, final in zip(temporaries, finals, strict=True):
            temporary.write_text("new " + final.name)
    assert contents(finals) == ["new out.parquet", "new out.rejects.jsonl"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.parquet", "out.rejects.jsonl"]


def test_a_writer_failing_before_publishing_leaves_the_old_pair(tmp_path):
    from spinn.ground.io import atomic_paths

    finals = old_pair(tmp_path)
    with pytest.raises(RuntimeError), atomic_paths(*finals) as temporaries:
        temporaries[0].write_text("half")
        raise RuntimeError("writer crashed")
    assert contents(finals) == ["old out.parquet", "old out.rejects.jsonl"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.parquet", "out.rejects.jsonl"]


def test_a_writer_killed_between_the_renames_is_finished_by_the_next_tidy(tmp_path):
    from spinn.ground.io import tidy_folder

    finals = old_pair(tmp_path)
    killed = subprocess.run([sys.executable, "-c", PUBLISH_AND_DIE_BETWEEN, str(tmp_path)], timeout=60, check=False)
    assert killed.returncode == 9
    assert contents(finals) == ["new out.parquet", "old out.rejects.jsonl"]  # what a kill there leaves on disk
    tidy_folder(tmp_path)
    assert contents(finals) == ["new out.parquet", "new out.rejects.jsonl"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.parquet", "out.rejects.jsonl"]


def test_a_live_writer_s_publication_is_left_to_it(tmp_path):
    import json

    from spinn.ground.io import _HOST_TAG, JOURNAL_SUFFIX, settle, tidy_folder

    finals = old_pair(tmp_path)
    temporary = tmp_path / f".out.rejects.jsonl.{os.getpid()}-{_HOST_TAG}.ab12cd34.tmp"
    temporary.write_text("new out.rejects.jsonl")
    journal = tmp_path / f".out.parquet.{os.getpid()}-{_HOST_TAG}{JOURNAL_SUFFIX}"
    journal.write_text(json.dumps({"moves": [[temporary.name, "out.rejects.jsonl"]]}))
    tidy_folder(tmp_path)
    settle(finals[1])
    assert journal.exists() and temporary.exists() and contents(finals)[1] == "old out.rejects.jsonl"


HOLD_AND_FORK = """
import os, sys, time
from spinn.ground.io import lock_folder

with lock_folder(sys.argv[1]):
    if os.fork() == 0:  # a child that outlives its parent, as a parser worker does for up to half a second
        os.write(1, b"child\\n")  # its at-fork hooks have run by now; one write, so lines never interleave
        time.sleep(120)
        os._exit(0)
    os.write(1, b"held\\n")
    time.sleep(120)
"""


def test_a_killed_holders_forked_child_does_not_keep_its_folder_lock(tmp_path):
    """A flock belongs to the open file description, which fork shares: the child closes its copy."""
    import psutil

    from spinn.ground.io import FolderBusy, lock_folder

    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_FORK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    children: list[psutil.Process] = []
    try:
        # both started: the parent holds the lock and the child ran its at-fork hooks (it could lag the parent)
        assert {holder.stdout.readline(), holder.stdout.readline()} == {"held\n", "child\n"}
        children = psutil.Process(holder.pid).children()
        assert len(children) == 1
        with pytest.raises(FolderBusy, match=f"pid {holder.pid}"), lock_folder(tmp_path):
            pass
        holder.kill()
        holder.wait()
        assert children[0].is_running()
        with lock_folder(tmp_path) as lock:  # taken at once, though the child still runs
            assert lock.previous["pid"] == str(holder.pid)
    finally:  # only these two: this process's other children (the session's Prefect server) live on
        holder.kill()
        holder.wait()
        holder.stdout.close()
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
