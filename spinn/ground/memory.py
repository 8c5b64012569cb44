"""What the machine can hold: the memory this process may use, and the bounds settings derive from it.

A setting that sizes memory (a sentence's token limit, a model's width) has an
upper limit from this machine, so a value no run here could hold is one line
naming the option before any work, not an allocator traceback or the kernel's
out-of-memory kill hours later. The memory is the machine's, capped by the
process's cgroup limit (a container on a big machine sees all of its memory).
It is the total, not what is free now, so a bound does not move with the load.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_V2_MAX = "memory.max"  # bytes, or "max": no limit
CGROUP_V1_LIMIT = "memory/memory.limit_in_bytes"  # a huge number when there is no limit
GIB = 2**30


@cache
def usable_memory(cgroup_root: Path = CGROUP_ROOT) -> int:
    """Bytes of memory this process may use: the machine's, capped by its cgroup's limit."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit(cgroup_root)
    return min(physical, limit) if limit else physical


def _cgroup_limit(cgroup_root: Path) -> int | None:
    for name in (CGROUP_V2_MAX, CGROUP_V1_LIMIT):
        try:
            text = (cgroup_root / name).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and int(text) > 0:
            return int(text)
    return None


def gib(size: int) -> str:
    """`23.4 GiB`: a size as the messages say it."""
    return f"{size / GIB:,.1f} GiB"
