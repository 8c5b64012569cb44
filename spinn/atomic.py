"""Atomic file output: a reader sees the old file or the whole new one, never half.

Stages write to a temporary name in the destination folder (same filesystem,
so the final `os.replace` is atomic) and publish only when the writer finished
without an exception; a crash leaves the previous output untouched.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_DEFAULT_MODE = 0o666  # what open() would give a new file, before the umask


@contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside `final`; move it into place if the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(handle)
    temporary = Path(name)
    os.chmod(temporary, _DEFAULT_MODE & ~_current_umask())
    try:
        yield temporary
        _fsync(temporary)
        os.replace(temporary, final)
    finally:
        temporary.unlink(missing_ok=True)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync(path: Path) -> None:
    with open(path, "rb") as stream:
        os.fsync(stream.fileno())
