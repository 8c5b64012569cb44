"""What a path the user gives may name: an input is a regular file (not a pipe or a device, which block or
never end), and a name that becomes a file name (a split, an archive) is a plain one, in its folder.

Both are checked before any work: every reader's input by `refuse_special_file` (the CLI's input check and
each reader's own door, which the flows call too), every name by `plain_file_name` (spinn.ground.io's output check).
"""

from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path

from spinn.ground.errors import SpinnError

_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def refuse_special_file(path: Path) -> Path:
    """`path`, unless it is there and is neither a regular file nor a folder: that is one line naming it, for
    every reader, since a named pipe blocks its reader until something writes to it and a device may never
    end. A missing path or a folder is left to the reader, which says what it expected there."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return Path(path)
    for special, kind in _SPECIAL_FILES:
        if special(mode):
            raise SpinnError(f"{path}: is {kind}, not a regular file")
    return Path(path)


def plain_file_name(name: str, what: str = "split") -> str:
    """`name` when it can be a file name in a folder: no folder part, not `.` or `..`, nothing hidden, no
    control character (a newline in a file name breaks every listing and log line that shows it)."""
    if not name or name in (".", "..") or "/" in name or os.sep in name or name.startswith("."):
        raise SpinnError(f"{what} {name!r}: not a plain file name (no folders, no leading dot)")
    if any(unicodedata.category(character) == _CONTROL for character in name):
        raise SpinnError(f"{what} {name!r}: not a plain file name (it holds a control character)")
    return name


_CONTROL = "Cc"
"""Unicode's category of control characters: NUL, tab, newline, escape and the rest."""
