"""The cores a process may use and the torch threads it runs on them: one rule for every command.

Every process that runs the model (`spinn train | evaluate | label | trees |
parse | bench`, `dvc repro`'s stages, the Prefect flows' tasks, the Dask
workers, the torchrun ranks, the MLflow pyfunc) decides its torch threads here:

- usable cores: the process's CPU affinity, capped by its cgroup's CPU quota;
- its share: the usable cores split among the processes that work on them
  together (torchrun's ranks, a local Dask cluster's workers, parser workers
  beside the model). A launcher tells its children their share in
  OMP_NUM_THREADS, the variable torchrun and Dask use for it, and `auto` never
  goes above the OMP_NUM_THREADS a process started with;
- free cores: the idle time of the CPUs in the affinity (and of the cgroup's
  quota), plus this process's own CPU time, since the last look; the first look
  covers the time since `import spinn`, most of it importing torch;
- the rule: `threads: auto` runs on the free cores, rounded, within the share,
  at least one thread; a compute loop looks again every RECHECK_S
  (`recheck()`) and follows the cores as other work comes and goes. A number
  is run as given, up to MOST_THREADS_PER_CORE per usable core;
- OpenMP's wait: torch's OpenMP threads spin while they wait for each other,
  which pays on idle cores, and when a core they wait for is taken each wait
  lasts the neighbour's whole time slice (README's labelling measurements);
  so `auto` takes no core another process keeps busy, and `import spinn` sets
  a short spin (OPENMP_WAIT) for the OpenMP runtime torch loads after it,
  unless the user set OpenMP's wait.

SPINN_THREADS_TRACE=FILE appends one JSON line per decision (process, what was
asked, usable, share, free cores, threads, the OpenMP wait torch loaded with):
where a run's threads came from. SPINN_FREE_CORES=N takes N as the free-core
reading instead of looking (tests, and machines whose /proc/stat does not show
what this process gets).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

AUTO = "auto"
OPENMP_WAIT = {"GOMP_SPINCOUNT": "10000"}
"""Set at `import spinn` unless the user set OpenMP's wait (OPENMP_WAIT_VARIABLES): libgomp's spin before a waiting
thread sleeps, about 0.1 ms against its default 3 ms, long enough for the waits between torch's operations on
idle cores, short enough that a thread whose partner lost its core gives the core back."""
OPENMP_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
THREADS_VARIABLE = "OMP_NUM_THREADS"
"""The threads a launcher allows each of its processes: `auto` stays within it."""
TRACE_VARIABLE = "SPINN_THREADS_TRACE"
FREE_CORES_VARIABLE = "SPINN_FREE_CORES"

MOST_THREADS_PER_CORE = 4
"""A thread count beyond this many per usable core is refused: more threads than cores only wait on each other,
and libgomp fails to start tens of thousands (`Out of memory`)."""
RECHECK_S = 1.0
"""How often a compute loop looks at the free cores again: a neighbour that takes a core costs at most this long."""
MIN_WINDOW_S = 0.05
"""A look shorter than this reads too few clock ticks (100 a second per CPU): the last reading stands."""
ROUND_UP_FROM = 0.75
"""A fraction of a free core counts as a core from here: a second thread beside a neighbour that keeps a core a
third busy would wait on it."""

PROC_STAT = Path("/proc/stat")
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_V2_MAX = "cpu.max"  # "<quota> <period>" in microseconds, or "max <period>": no quota
CGROUP_V2_STAT, CGROUP_V2_USAGE = "cpu.stat", "usage_usec"  # the cgroup's CPU time so far
CGROUP_V1_FOLDERS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")  # where v1 mounts the cpu controller
CGROUP_V1_QUOTA, CGROUP_V1_PERIOD = "cpu.cfs_quota_us", "cpu.cfs_period_us"  # quota -1: none
NO_QUOTA = "max"
IDLE_FIELDS = (3, 4)  # a /proc/stat cpuN line's idle and iowait, after the name
COUNTED_FIELDS = 8  # user nice system idle iowait irq softirq steal (guest time is inside user)
MICROSECONDS = 1e-6


# ----------------------------------------------------------------------------- usable cores and shares


def usable_cores(cgroup_root: Path = CGROUP_ROOT) -> int:
    """The cores this process may really use: its affinity, capped by its cgroup's CPU quota.

    A container on a big machine sees every core in os.cpu_count() (and often in its affinity too) while its
    quota allows two; threads sized to the machine then wait on each other and the work runs several times
    slower. Training, labelling, parsing and prepare size their threads and processes by this."""
    allowed = len(_affinity()) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_quota_cores(cgroup_root)
    return max(1, min(allowed, quota)) if quota is not None else max(1, allowed)


def cgroup_quota_cores(cgroup_root: Path = CGROUP_ROOT) -> int | None:
    """Cores the cgroup's CPU quota allows, rounded up (v2 cpu.max, else v1 cfs quota / period); None: no quota
    or no cgroup files to read."""
    v2 = _read(cgroup_root / CGROUP_V2_MAX)
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        return None if quota == NO_QUOTA else _cores(quota, period)
    for folder in CGROUP_V1_FOLDERS:
        quota, period = _read(cgroup_root / folder / CGROUP_V1_QUOTA), _read(cgroup_root / folder / CGROUP_V1_PERIOD)
        if quota is not None and period is not None:
            return _cores(quota, period)
    return None


def share(processes: int = 1) -> int:
    """The usable cores each of `processes` working side by side on this machine gets, at least one."""
    return max(1, usable_cores() // max(1, processes))


def child_environment(processes: int) -> dict[str, str]:
    """What a launcher adds to the environment of `processes` children that share this machine: each one's
    share in OMP_NUM_THREADS (torchrun and Dask would say 1), unless the user set it when this process started."""
    given = _STARTED_WITH.threads
    return {THREADS_VARIABLE: str(given if given is not None else share(processes))}


def most_threads() -> int:
    """The largest thread count a setting may ask for on this machine."""
    return MOST_THREADS_PER_CORE * usable_cores()


def process_count(processes: int | str) -> int:
    """Worker processes: a number as given; auto: one per usable core (processes do not wait on each other, so a
    busy neighbour costs them its share only)."""
    return usable_cores() if processes == AUTO else int(processes)


# ----------------------------------------------------------------------------- free cores


@dataclass(frozen=True)
class Reading:
    """What the machine's counters said at one moment: enough to tell the cores nobody else used since another."""

    seconds: float  # time.monotonic()
    own: float  # this process's CPU seconds, all its threads
    idle: int  # idle and iowait clock ticks of the CPUs in the affinity
    ticks: int  # all clock ticks of those CPUs
    cpus: int  # the CPUs counted
    cgroup: float | None  # CPU seconds the cgroup used, when it has a quota


def read_counters(stat: Path = PROC_STAT, cgroup_root: Path = CGROUP_ROOT) -> Reading | None:
    """The counters now; None where /proc/stat cannot be read (not Linux)."""
    try:
        lines = stat.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    mine = {f"cpu{cpu}" for cpu in _affinity()}
    idle = ticks = cpus = 0
    for line in lines:
        name, *fields = line.split()
        if name in mine and len(fields) >= COUNTED_FIELDS:
            counts = [int(field) for field in fields[:COUNTED_FIELDS]]
            idle += sum(counts[field] for field in IDLE_FIELDS)
            ticks += sum(counts)
            cpus += 1
    if cpus == 0:
        return None
    used = _cgroup_seconds(cgroup_root) if cgroup_quota_cores(cgroup_root) is not None else None
    return Reading(time.monotonic(), time.process_time(), idle, ticks, cpus, used)


def free_cores(earlier: Reading, later: Reading, cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """The cores this process could have had between two readings: the idle ones and those it used itself, within
    what the cgroup's quota left after its other processes; None for a window too short to tell."""
    elapsed, ticks = later.seconds - earlier.seconds, later.ticks - earlier.ticks
    if elapsed < MIN_WINDOW_S or ticks <= 0:
        return None
    own = (later.own - earlier.own) / elapsed
    free = later.cpus * (later.idle - earlier.idle) / ticks + own
    quota = cgroup_quota_cores(cgroup_root)
    if quota is not None and earlier.cgroup is not None and later.cgroup is not None:
        others = (later.cgroup - earlier.cgroup) / elapsed - own
        free = min(free, quota - others)
    return max(0.0, free)


class _Looks:
    """The last reading and what it told, per process: each look covers the time since the one before."""

    def __init__(self) -> None:
        self.reading = read_counters()
        self.free: float | None = None
        self.lock = threading.Lock()

    def look(self) -> float | None:
        """The free cores since the last look (a look too soon after it: the last answer; the first one after
        `import spinn` waits out MIN_WINDOW_S)."""
        stub = os.environ.get(FREE_CORES_VARIABLE)
        if stub is not None:
            return float(stub)
        with self.lock:
            now = read_counters()
            if now is None or self.reading is None:
                self.reading = now
                return None
            if self.free is None and now.seconds - self.reading.seconds < MIN_WINDOW_S:
                time.sleep(MIN_WINDOW_S - (now.seconds - self.reading.seconds))
                now = read_counters() or now
            free = free_cores(self.reading, now)
            if free is not None:
                self.reading, self.free = now, free
            return self.free


# ----------------------------------------------------------------------------- the rule


@dataclass(frozen=True)
class Decision:
    """The threads the rule gave, and what it weighed."""

    asked: int | str
    threads: int
    usable: int
    share: int
    free: float | None

    def record(self, where: str) -> None:
        """One JSON line in SPINN_THREADS_TRACE's file, when it is set."""
        path = os.environ.get(TRACE_VARIABLE)
        if not path:
            return
        line = {
            "where": where,
            "pid": os.getpid(),
            "argv": sys.argv[:2],
            "asked": self.asked,
            "threads": self.threads,
            "usable": self.usable,
            "share": self.share,
            "free": self.free,
            "omp_num_threads": _STARTED_WITH.threads,
            "openmp": _STARTED_WITH.openmp,
            "torch_loaded_first": _STARTED_WITH.torch_loaded,
        }
        with open(path, "a", encoding="utf-8") as trace:
            trace.write(json.dumps(line) + "\n")


def decide(threads: int | str, sharing: int = 1) -> Decision:
    """The torch threads to run: a number as given; auto: the free cores (a look at the machine), rounded, within
    this process's share of the usable cores (split among `sharing` processes, at most the OMP_NUM_THREADS it
    started with), at least one."""
    usable = usable_cores()
    most = share(sharing)
    if _STARTED_WITH.threads is not None:
        most = min(most, _STARTED_WITH.threads)
    if threads != AUTO:
        return Decision(threads, int(threads), usable, most, None)
    free = _LOOKS.look()
    count = most if free is None else max(1, min(most, math.floor(free + 1 - ROUND_UP_FROM)))
    return Decision(threads, count, usable, most, free)


class _Keeper:
    """The threads of one compute block: auto looks again every RECHECK_S."""

    def __init__(self, asked: int | str, sharing: int, where: str) -> None:
        self.asked, self.sharing, self.where = asked, sharing, where
        self.due = time.monotonic() + RECHECK_S

    def recheck(self) -> None:
        if self.asked != AUTO or time.monotonic() < self.due:
            return
        import torch

        decision = decide(self.asked, self.sharing)
        if decision.threads != torch.get_num_threads():
            torch.set_num_threads(decision.threads)
            decision.record(self.where)
        self.due = time.monotonic() + RECHECK_S


_KEEPERS = threading.local()
"""The innermost block's keeper, per thread: a thread's OpenMP settings are its own."""


@contextmanager
def torch_threads(threads: int | str, sharing: int = 1, *, where: str) -> Iterator[Decision]:
    """Run the block with the rule's torch threads (auto: followed by `recheck()` in its loops), recorded as
    `where`, and give the caller its own setting back."""
    import torch

    decision = decide(threads, sharing)
    decision.record(where)
    previous = torch.get_num_threads()
    if decision.threads != previous:
        torch.set_num_threads(decision.threads)
    outer = getattr(_KEEPERS, "keeper", None)
    _KEEPERS.keeper = _Keeper(threads, sharing, where)
    try:
        yield decision
    finally:
        _KEEPERS.keeper = outer
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


def use_threads(threads: int | str, sharing: int = 1, *, where: str) -> Decision:
    """The rule's torch threads for the rest of this process (a worker that does one thing until it ends)."""
    import torch

    decision = decide(threads, sharing)
    decision.record(where)
    torch.set_num_threads(decision.threads)
    return decision


def recheck() -> None:
    """Once per step of a compute loop: an auto block follows the free cores (cheap until RECHECK_S has passed)."""
    keeper = getattr(_KEEPERS, "keeper", None)
    if keeper is not None:
        keeper.recheck()


# ----------------------------------------------------------------------------- the process's start


@dataclass(frozen=True)
class _Start:
    """What this process's environment said when spinn was imported: launchers and Dask's nanny change
    OMP_NUM_THREADS in a parent's own environment when they start children."""

    threads: int | None
    openmp: dict[str, str | None]
    torch_loaded: bool


def set_openmp_wait() -> _Start:
    """At `import spinn`: OPENMP_WAIT for the OpenMP runtime torch will load, unless the user set OpenMP's wait
    (or torch is loaded already, when the runtime has read its environment); what the process started with."""
    torch_loaded = "torch" in sys.modules
    if not torch_loaded and not any(name in os.environ for name in OPENMP_WAIT_VARIABLES):
        os.environ.update(OPENMP_WAIT)
    openmp = {name: os.environ.get(name) for name in OPENMP_WAIT_VARIABLES}
    return _Start(_positive(os.environ.get(THREADS_VARIABLE)), openmp, torch_loaded)


def _affinity() -> set[int]:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def _positive(text: str | None) -> int | None:
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value >= 1 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cores(quota: str, period: str) -> int | None:
    """ceil(quota / period), at least 1; None for no quota (v1's -1) or text that is not two numbers."""
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return max(1, -(-quota_us // period_us))


def _cgroup_seconds(cgroup_root: Path) -> float | None:
    """The cgroup's CPU time so far (v2 cpu.stat usage_usec); None where it is not there to read."""
    text = _read(cgroup_root / CGROUP_V2_STAT) or ""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == CGROUP_V2_USAGE and value.strip().isdigit():
            return int(value) * MICROSECONDS
    return None


_STARTED_WITH = set_openmp_wait()
_LOOKS = _Looks()
