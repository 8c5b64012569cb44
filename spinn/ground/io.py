"""File output and identity: atomic publishing, folder locks and content digests, the ground every stage stands on.

Stages write to a temporary name in the destination folder (same filesystem,
so the final `os.replace` is atomic) and publish only when the writer finished
without an exception; a crash leaves the previous output untouched. Files
that belong together are published as one (`atomic_paths`). A temporary's
name carries its writer's pid and host, so the next start of a stage can
remove the ones a killed writer left without touching a live writer's
(`tidy_folder`). A full disk or a folder the user may not write becomes one
`SpinnError` line naming the file. A folder lock (`lock_folder`) keeps a
second run out of an output folder while one works there; `publishing` is the
one way a stage starts writing its outputs: it refuses, before any work, an
output that would destroy an input, then holds a lock per output. Digests identify
files by content: downloads are verified with them, registered models and
cached stages are keyed on them.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from spinn.ground.errors import DISK_FULL, SpinnError, device_of, redact
from spinn.ground.paths import plain_file_name, refuse_special_file

_DEFAULT_MODE = 0o666  # what open() would give a new file, before the umask
OWNER_ONLY = 0o600
"""Lock files record their holder's command line, which may carry a secret: only their owner reads them."""
TEMPORARY_SUFFIX = ".tmp"
STALE_TEMPORARY_SECONDS = 24 * 60 * 60
"""A temporary whose writer we cannot ask about (another host, or a name without a pid) is left alone
until it has not been written for this long: no writer pauses a day between two writes."""
HOST = socket.gethostname()
_HOST_TAG = hashlib.sha256(HOST.encode()).hexdigest()[:8]
"""The host in temporary names: host names may hold dots, the tag never does."""
_TEMPORARY_NAME = re.compile(
    r"^\..+?\.(?:(?P<pid>\d+)-(?P<host>[0-9a-f]{8})\.)?[a-z0-9_]{8}" + re.escape(TEMPORARY_SUFFIX) + "$"
)
"""`.last.pt.4242-1a2b3c4d.x7k2m9q0.tmp`: final name, writer pid and host tag, mkstemp's random part.
Names without the pid and host (written before they were added) match too."""
_MKSTEMP_CHARS = 8
"""The random part tempfile.mkstemp puts between its prefix and suffix."""
JOURNAL_SUFFIX = ".publishing"
_JOURNAL_NAME = re.compile(r"^\..+\.(?P<pid>\d+)-(?P<host>[0-9a-f]{8})" + re.escape(JOURNAL_SUFFIX) + "$")
"""`.out.parquet.4242-1a2b3c4d.publishing`: the first final name, the writer's pid and host tag."""
_NOT_WRITABLE = {
    errno.EACCES: "check the folder's permissions",
    errno.EPERM: "check the folder's permissions",
    errno.EROFS: "the filesystem is mounted read-only",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a part of the path is a file, not a folder",
    errno.EISDIR: "it is a folder; name a file",
}
"""Why a file cannot be created, by errno, as the user can act on it."""


NAME_MAX = 255
"""Bytes in one file name on the filesystems we run on (ext4, xfs, btrfs, tmpfs, overlay)."""
NAME_DIGEST_CHARS = 16


def _short_enough(name: str, extra: int) -> str:
    """`name`, or when it and the `extra` bytes a lock or temporary adds would pass NAME_MAX, its start and a
    digest of the whole: a legal output name (up to NAME_MAX) never makes its companion files' names too long."""
    if len(name.encode()) + extra <= NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:NAME_DIGEST_CHARS]
    start = name.encode()[: NAME_MAX - extra - len(digest) - 1].decode("utf-8", "ignore")
    return f"{start}-{digest}"


def _read_umask() -> int:
    """The process umask. Reading it means setting it, which races with other threads (Dask workers,
    Prefect's) that create files meanwhile, so it is read once, at import, before they start."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()
_interrupted: set[Path] = set()
"""Journals of this process's publications whose moves broke off (an error, not a kill): finished by the
next tidy_folder or settle here, though their writer (this process) still runs."""


@contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside `final`; move it into place if the block succeeds."""
    final = Path(final)
    temporary = _new_temporary(final)
    try:
        with write_errors(final, while_writing=True):
            yield temporary
        publish(temporary, final)
    finally:
        temporary.unlink(missing_ok=True)


def write_json(final: Path, data: dict) -> None:
    """`data` as indented JSON with a final newline, published atomically (metrics and reports people and
    DVC read)."""
    with atomic_path(final) as temporary:
        temporary.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _new_temporary(final: Path) -> Path:
    """An empty file beside `final`, named for it, this process and this host, with the mode open() gives."""
    final = Path(final)
    with write_errors(final):
        final.parent.mkdir(parents=True, exist_ok=True)
        writer = f".{os.getpid()}-{_HOST_TAG}."
        stem = _short_enough(final.name, 1 + len(writer) + _MKSTEMP_CHARS + len(TEMPORARY_SUFFIX))
        handle, name = tempfile.mkstemp(prefix=f".{stem}{writer}", suffix=TEMPORARY_SUFFIX, dir=final.parent)
    os.close(handle)
    os.chmod(name, _DEFAULT_MODE & ~_UMASK)
    return Path(name)


def publish(temporary: Path, final: Path) -> None:
    """Flush a finished temporary to the disk, then move it over `final` in one step."""
    with write_errors(final):
        _fsync(temporary)
        os.replace(temporary, final)


@contextmanager
def write_errors(path: Path, *, while_writing: bool = False) -> Iterator[None]:
    """A full disk, or a folder we may not write, becomes one line naming `path`; other errors pass through.

    `while_writing`: the block is a writer's own code, which may read other files too, so there only a
    full disk (which no read raises) is translated; a permission error there may concern its input."""
    try:
        yield
    except OSError as error:
        if error.errno in DISK_FULL:
            raise SpinnError(f"no space left on {device_of(Path(path))} writing {path}") from None
        if not while_writing and error.errno in _NOT_WRITABLE:
            raise SpinnError(f"{path}: cannot write it ({error.strerror}: {_NOT_WRITABLE[error.errno]})") from None
        raise


@contextmanager
def atomic_paths(*finals: Path) -> Iterator[tuple[Path, ...]]:
    """Yield temporaries beside `finals` (one folder); if the block succeeds, they replace the finals as one.

    Files that belong together (a Parquet output and its rejects file) keep
    their fixed names, which DVC and other tools read, so no single rename
    can publish both. Instead a journal listing every (temporary, final) move
    is written once all temporaries are complete and flushed, then the moves
    run, then the journal goes. A writer killed between two moves leaves the
    journal; `tidy_folder` (at the next start of a stage writing there) and
    `settle` (before a reader opens a file it names) finish the moves, so
    what they see is the earlier set or the new one, never a mix. A versioned
    folder behind one switched link would need no journal, but would turn the
    published files into links that DVC and copies do not keep.
    """
    finals = tuple(Path(final) for final in finals)
    folder = finals[0].parent
    if any(final.parent != folder for final in finals):
        raise ValueError(f"files published together must share a folder: {finals}")
    temporaries = tuple(_new_temporary(final) for final in finals)
    journal = None
    try:
        with write_errors(finals[0], while_writing=True):
            yield temporaries
        journal = _write_journal(temporaries, finals)
        _run_moves(journal)
        journal = None
    finally:
        if journal is None:
            for temporary in temporaries:
                temporary.unlink(missing_ok=True)
        else:  # the moves broke off: the journal and its temporaries stay for whoever comes next
            _interrupted.add(journal)


def _write_journal(temporaries: tuple[Path, ...], finals: tuple[Path, ...]) -> Path:
    folder = finals[0].parent
    moves = [[temporary.name, final.name] for temporary, final in zip(temporaries, finals, strict=True)]
    writer = f".{os.getpid()}-{_HOST_TAG}{JOURNAL_SUFFIX}"
    journal = folder / f".{_short_enough(finals[0].name, 1 + len(writer))}{writer}"
    with write_errors(finals[0]):
        for temporary in temporaries:
            _fsync(temporary)
        temporary_journal = _new_temporary(journal)
        temporary_journal.write_text(json.dumps({"moves": moves}), encoding="utf-8")
        publish(temporary_journal, journal)
    return journal


def _run_moves(journal: Path) -> None:
    """Move every temporary the journal lists that is still there over its final name, then drop the journal."""
    for temporary, final in json.loads(journal.read_text(encoding="utf-8"))["moves"]:
        if (journal.parent / temporary).exists():
            with write_errors(journal.parent / final):
                os.replace(journal.parent / temporary, journal.parent / final)
    journal.unlink()
    _interrupted.discard(journal)


def settle(path: Path) -> None:
    """Finish a publication of `path` that a killed writer left half done, before reading it."""
    for journal in _journals(Path(path).parent):
        if any(final == Path(path).name for _, final in _moves(journal)):
            _run_moves(journal)


def _journals(folder: Path) -> list[Path]:
    """Journals of publications nobody is finishing: their writer is gone (as for temporaries), or it is
    this process and its moves broke off."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob(f".*{JOURNAL_SUFFIX}"):
        match = _JOURNAL_NAME.match(path.name)
        if match is not None and (path in _interrupted or _abandoned(path, match)):
            found.append(path)
    return found


def _moves(journal: Path) -> list[tuple[str, str]]:
    try:
        return [tuple(move) for move in json.loads(journal.read_text(encoding="utf-8"))["moves"]]
    except (OSError, ValueError, KeyError):
        return []


def _fsync(path: Path) -> None:
    with open(path, "rb") as stream:
        os.fsync(stream.fileno())


def tidy_folder(folder: Path) -> list[Path]:
    """Clean up after writers killed in `folder`: finish their half-done publications (`atomic_paths`),
    then delete the temporaries they left; returns what was removed.

    A temporary of this host goes when its writer's pid is no longer running;
    one of another host, or one whose name has no pid, only when it has not
    been written for STALE_TEMPORARY_SECONDS. A live writer's file is never
    touched, so a stage may call this at its start while another one writes.
    """
    folder = Path(folder)
    for journal in _journals(folder):
        _run_moves(journal)
    if not folder.is_dir():
        return []
    pending = {temporary for journal in folder.glob(f".*{JOURNAL_SUFFIX}") for temporary, _ in _moves(journal)}
    removed = []
    for path in folder.iterdir():
        match = _TEMPORARY_NAME.match(path.name)
        if match is not None and path.name not in pending and path.is_file() and _abandoned(path, match):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _abandoned(path: Path, match: re.Match) -> bool:
    if match["pid"] is not None and match["host"] == _HOST_TAG:
        return not _pid_alive(int(match["pid"]))
    try:
        return time.time() - path.stat().st_mtime > STALE_TEMPORARY_SECONDS
    except FileNotFoundError:
        return False


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ----------------------------------------------------------------------------- folder locks


LOCK_NAME = ".spinn.lock"
MAX_LOCK_BYTES = 64 * 1024
MAX_COMMAND_CHARS = 300
_CONTENDED = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES})
"""What a non-blocking flock answers when another process holds it (EACCES on some filesystems)."""


_HELD_LOCKS: set[int] = set()
"""Descriptors of the folder locks this process holds (see _forget_held_locks)."""


def _forget_held_locks() -> None:
    """In a forked child, close its copies of the parent's lock descriptors. A flock belongs to the open file
    description, which fork shares: a child keeping a copy (a parser worker, say) would go on holding the
    parent's lock after the parent was killed, and a rerun would be refused until the child ended too.
    Closing a copy leaves the parent's lock as it is."""
    for fd in _HELD_LOCKS:
        with suppress(OSError):
            os.close(fd)
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_forget_held_locks)


class FolderBusy(SpinnError):
    """Another running process holds the folder's lock; the message names it."""


@dataclass
class FolderLock:
    """A held folder lock: what the previous holder wrote, and room for facts the next holder will read."""

    path: Path
    previous: dict
    """The last holder's record (pid, host, started, command and its facts); empty for a new folder."""
    _fd: int
    _record: dict = field(default_factory=dict)

    def record(self, **facts: str) -> None:
        """Add facts (an MLflow run id, say) to this holder's record; the next holder finds them in `previous`."""
        self._record.update(facts)
        data = json.dumps(self._record).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        os.fsync(self._fd)


@contextmanager
def lock_folder(folder: Path) -> Iterator[FolderLock]:
    """Hold `folder`'s lock file for the block, or raise FolderBusy naming the process that holds it.

    The lock is a flock on `folder/.spinn.lock`, which the kernel releases when
    its holder exits however it ends, so a killed run never leaves a lock that
    needs clearing: the next run takes it over and overwrites the dead holder's
    record (pid, host, start time, command), which is what a refused run quotes.
    """
    with _held(Path(folder), LOCK_NAME, f"{folder}: in use by") as lock:
        yield lock


@contextmanager
def lock_output_folder(folder: Path) -> Iterator[FolderLock]:
    """Hold the lock of an output folder, kept beside it (`.NAME.spinn.lock`), or raise FolderBusy naming
    its holder; the record stays between runs, so the next holder finds the last one's facts.

    Beside it, not inside: an orchestrator deletes a stage's output folder before it reruns the stage (DVC
    does), and a lock file deleted with it no longer keeps out the run still writing there."""
    folder = Path(folder)
    with _held(folder.parent, lock_name(folder), f"{folder}: in use by", named=folder) as lock:
        yield lock


def lock_name(output: Path) -> str:
    """`.NAME.spinn.lock`, the lock file beside `output`; a name too long for the filesystem once the lock's
    dot and suffix are added keeps its start and a digest of the whole."""
    return f".{_short_enough(Path(output).name, len(OUTPUT_LOCK_SUFFIX) + 1)}{OUTPUT_LOCK_SUFFIX}"


@contextmanager
def _held(
    folder: Path, name: str, busy: str, *, remove: bool = False, named: Path | None = None
) -> Iterator[FolderLock]:
    """Hold the flock of `folder/name`, recording this holder; FolderBusy (`busy` and the holder) if taken.

    `remove`: delete the lock file before letting go, so it leaves nothing behind. That is safe because a
    process that opened the file before the delete and locks it after finds it no longer at its path
    (`_acquire`'s check) and starts over on a new file. `named`: the path a folder the user may not write
    is reported under (the output the lock guards, rather than its hidden lock file)."""
    with write_errors(folder):
        folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    fd = _acquire(path, busy, named or path)
    _HELD_LOCKS.add(fd)
    try:
        lock = FolderLock(path, _read_record(fd), fd)
        lock.record(pid=str(os.getpid()), host=HOST, started=time.strftime("%Y-%m-%d %H:%M:%S"), command=_command())
        yield lock
    finally:
        if remove:
            path.unlink(missing_ok=True)
        _HELD_LOCKS.discard(fd)
        os.close(fd)


def _acquire(path: Path, busy: str, named: Path) -> int:
    """An open descriptor of `path` holding its flock; retried when the file was replaced meanwhile."""
    while True:
        with write_errors(named):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, OWNER_ONLY)
            os.fchmod(fd, OWNER_ONLY)  # a lock file made before locks were private becomes private too
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _read_record(fd)
            os.close(fd)
            if error.errno in _CONTENDED:
                raise FolderBusy(f"{busy} {_describe(holder)}; wait for it to end") from None
            raise
        if _still_at(fd, path):
            return fd
        os.close(fd)  # removed or replaced between our open and our lock: lock the file now at the path


def _still_at(fd: int, path: Path) -> bool:
    try:
        named, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _read_record(fd: int) -> dict:
    try:
        record = json.loads(os.pread(fd, MAX_LOCK_BYTES, 0) or b"{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _describe(holder: dict) -> str:
    if not holder:
        return "another run (it is just starting)"
    return (
        f"another run: pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}: "
        f"{holder.get('command')}"
    )


def _command() -> str:
    words = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else ["python"]
    return redact(" ".join(words))[:MAX_COMMAND_CHARS]


# ----------------------------------------------------------------------------- publishing

OUTPUT_LOCK_SUFFIX = ".spinn.lock"


def check_outputs(outputs: Iterable[Path], *, inputs: Iterable[Path] = (), names: Iterable[str] = ()) -> None:
    """Refuse, in one line and before any work, a command whose outputs would destroy what it reads.

    `outputs` are every file (or folder) the command will write, all files of
    a paired publish included; `inputs` every file it reads, with the files
    that belong to them (a prepared split's rejects file): an output that is
    one of them, by name, link or hard link, is refused. `names` are names a
    user gave that become file names (a split): each must be a plain file name,
    so no output lands outside its folder."""
    for name in names:
        plain_file_name(name)
    read = {_identity(Path(path)): Path(path) for path in inputs}
    for output in outputs:
        source = read.get(_identity(Path(output)))
        if source is not None:
            same = "is the input" if Path(output) == source else f"is the input {source}"
            raise SpinnError(f"{output}: {same}; writing it would destroy what the command reads")


def _identity(path: Path) -> tuple[int, int] | str:
    """What makes two paths one file: device and inode when it exists, else its resolved name."""
    try:
        status = path.stat()
    except OSError:
        return os.path.realpath(path)
    return status.st_dev, status.st_ino


@contextmanager
def publishing(outputs: Iterable[Path], *, inputs: Iterable[Path] = (), names: Iterable[str] = ()) -> Iterator[None]:
    """The one way a stage starts writing its outputs: `check_outputs`, then hold each output's lock for the
    block, so a second run writing any of them is refused (FolderBusy naming the holder) instead of
    publishing one of its files beside the first run's other.

    Each output's lock is a private `.NAME.spinn.lock` beside it, taken like `lock_folder`'s and removed
    when the block ends: outputs of different runs in one folder (prepare's train, dev and test) do not
    wait on each other, and a folder DVC tracks as one output gets no lock file inside it."""
    outputs = [Path(output) for output in outputs]
    check_outputs(outputs, inputs=inputs, names=names)
    with ExitStack() as stack:
        for output in sorted(set(outputs)):
            busy = f"{output}: being written by"
            stack.enter_context(_held(output.parent, lock_name(output), busy, remove=True, named=output))
        yield


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """Hash a file in streaming fashion (archives and models are big); a named pipe would block: refused."""
    with refuse_special_file(Path(path)).open("rb") as handle:
        return hashlib.file_digest(handle, algorithm).hexdigest()
