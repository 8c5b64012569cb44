"""The thread rule (spinn/ground/cores.py): free cores read from /proc/stat, auto within each process's share, a number
within what the machine can run, a loop that follows the cores, and OpenMP's short wait set before torch loads.

The readings are hand-written counters; the one subprocess is `spinn evaluate` on the release fixture, the CLI
entry point of the rule (the DVC stage, the flow task, the Dask worker, the torchrun rank and the MLflow pyfunc
are checked in the end-to-end tests that already run them: test_dvc, test_flows, test_label_flow,
test_distributed, test_mlflow_model).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spinn.ground import cores
from spinn.ground.settings import SettingsError
from spinn.labeling.label_settings import LabelSettings
from tests.helpers import assert_the_thread_rule_ran, thread_decisions, thread_rule_env

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / "tests" / "fixtures" / "release-0.1.0"
SPINN = Path(sys.executable).parent / "spinn"
CLI_TIMEOUT_S = 300
STAT = """cpu  900 0 100 1000 0 0 0 0 0 0
cpu0 400 0 50 500 0 0 0 0 0 0
cpu1 500 0 50 500 0 0 0 0 0 0
cpu2 0 0 0 9000 0 0 0 0 0 0
intr 1 2 3
"""
"""Three CPUs; this process may use cpu0 and cpu1 (the `two_cpus` fixture)."""


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(cores, "cgroup_quota_cores", lambda root=cores.CGROUP_ROOT: None)


def started_with(monkeypatch, threads: int | None) -> None:
    """This process as if it had started with OMP_NUM_THREADS=threads (None: unset)."""
    monkeypatch.setattr(cores, "_STARTED_WITH", dataclasses.replace(cores._STARTED_WITH, threads=threads))


def reading(seconds: float, own: float, idle: int, ticks: int, cpus: int = 2, cgroup: float | None = None):
    return cores.Reading(seconds, own, idle, ticks, cpus, cgroup)


def test_only_the_cpus_of_the_affinity_are_read(tmp_path, two_cpus):
    stat = tmp_path / "stat"
    stat.write_text(STAT, encoding="ascii")
    counted = cores.read_counters(stat, tmp_path)
    assert (counted.idle, counted.ticks, counted.cpus, counted.cgroup) == (1000, 2000, 2, None)


def test_no_proc_stat_reads_as_nothing(tmp_path):
    assert cores.read_counters(tmp_path / "absent", tmp_path) is None


@pytest.mark.parametrize(
    ("idle_share", "own_cores", "free"),
    [
        (0.5, 1.0, 2.0),  # idle cores: one idle, one ours (importing torch)
        (0.0, 2 / 3, 2 / 3),  # one busy process per core beside our one thread
        (0.0, 0.4, 0.4),  # two per core
        (0.25, 1.0, 1.5),  # a neighbour keeping one core half busy
    ],
)
def test_free_cores_are_the_idle_ones_and_our_own(tmp_path, two_cpus, idle_share, own_cores, free):
    before = reading(10.0, 5.0, 1000, 2000)
    after = reading(12.0, 5.0 + 2 * own_cores, 1000 + round(400 * idle_share), 2400)
    assert cores.free_cores(before, after, tmp_path) == pytest.approx(free)


def test_a_cgroup_quota_used_by_its_other_processes_is_not_free(tmp_path):
    (tmp_path / "cpu.max").write_text("200000 100000\n")  # two cores' worth
    before = reading(0.0, 0.0, 0, 0, cpus=8, cgroup=0.0)
    after = reading(1.0, 0.5, 600, 800, cpus=8, cgroup=1.5)  # six idle host cores; the cgroup used 1.5, we 0.5
    assert cores.free_cores(before, after, tmp_path) == pytest.approx(1.0)


def test_a_window_too_short_tells_nothing(tmp_path):
    assert cores.free_cores(reading(1.0, 0, 0, 0), reading(1.01, 0, 0, 2), tmp_path) is None


@pytest.mark.parametrize(
    ("free", "sharing", "usable", "omp_num_threads", "threads"),
    [
        (2.0, 1, 2, None, 2),  # idle cores: all of them
        (1.8, 1, 2, None, 2),  # a little noise still rounds up
        (1.7, 1, 2, None, 1),  # a neighbour that keeps a core a third busy: not a second thread
        (0.67, 1, 2, None, 1),  # one busy process per core
        (0.0, 1, 2, None, 1),  # never fewer than one
        (8.0, 2, 8, None, 4),  # two processes split eight cores
        (8.0, 3, 2, None, 1),  # two parser workers beside the model on two cores
        (8.0, 1, 8, 3, 3),  # a launcher's OMP_NUM_THREADS caps it
        (None, 1, 4, None, 4),  # no reading (not Linux): the share
    ],
)
def test_auto_runs_on_the_free_cores_within_the_share(monkeypatch, free, sharing, usable, omp_num_threads, threads):
    monkeypatch.setattr(cores, "usable_cores", lambda: usable)
    started_with(monkeypatch, omp_num_threads)
    monkeypatch.setattr(cores._LOOKS, "look", lambda: free)
    assert cores.decide(cores.AUTO, sharing).threads == threads


def test_a_number_is_run_as_given(monkeypatch):
    monkeypatch.setattr(cores._LOOKS, "look", lambda: pytest.fail("a number needs no look at the machine"))
    assert cores.decide(3, 5).threads == 3


@pytest.mark.parametrize("threads", [cores.MOST_THREADS_PER_CORE * 2 + 1, 100_000])
def test_more_threads_than_the_machine_can_run_are_refused(monkeypatch, threads):
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    with pytest.raises(SettingsError, match=f"threads: must be at most {cores.MOST_THREADS_PER_CORE * 2}"):
        LabelSettings.build({"threads": threads})
    assert LabelSettings.build({"threads": cores.MOST_THREADS_PER_CORE * 2}).threads == 8


def test_an_auto_block_follows_the_free_cores_and_gives_the_callers_threads_back(monkeypatch, tmp_path):
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    started_with(monkeypatch, None)
    monkeypatch.setattr(cores, "RECHECK_S", 0.0)
    monkeypatch.setenv(cores.TRACE_VARIABLE, str(tmp_path / "trace.jsonl"))
    monkeypatch.setenv(cores.FREE_CORES_VARIABLE, "2")
    before = torch.get_num_threads()
    with cores.torch_threads(cores.AUTO, where="loop") as decision:
        assert decision.threads == torch.get_num_threads() == 2
        monkeypatch.setenv(cores.FREE_CORES_VARIABLE, "0.5")  # a neighbour took a core
        cores.recheck()
        assert torch.get_num_threads() == 1
        with cores.torch_threads(2, where="inner"):
            cores.recheck()  # a number stays as given
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    assert [line["threads"] for line in thread_decisions(tmp_path / "trace.jsonl", "loop")] == [2, 1]


def test_openmp_waits_briefly_unless_the_user_said_otherwise(monkeypatch):
    for name in cores.OPENMP_WAIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "torch")  # as at `import spinn` in a fresh process
    assert cores.set_openmp_wait().openmp == {**dict.fromkeys(cores.OPENMP_WAIT_VARIABLES), **cores.OPENMP_WAIT}
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert cores.set_openmp_wait().openmp == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}


def test_a_launcher_gives_its_children_their_share_or_the_users_omp_num_threads(monkeypatch):
    monkeypatch.setattr(cores, "usable_cores", lambda: 8)
    started_with(monkeypatch, None)
    assert cores.child_environment(2) == {cores.THREADS_VARIABLE: "4"}
    assert cores.child_environment(16) == {cores.THREADS_VARIABLE: "1"}
    started_with(monkeypatch, 3)
    assert cores.child_environment(2) == {cores.THREADS_VARIABLE: "3"}


def test_the_cli_runs_the_rule_with_openmp_set_before_torch(tmp_path):
    """`spinn evaluate` (any command: `import spinn` comes first in each) decides its threads by the rule."""
    trace = tmp_path / "trace.jsonl"
    command = [str(SPINN), "evaluate", "--model", str(RELEASE / "checkpoint.pt"), "--data"]
    command += [str(RELEASE / "pairs.parquet"), "--output", str(tmp_path / "metrics.json"), "--no-track"]
    env = {**os.environ, **thread_rule_env(trace)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=CLI_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    (decision,) = thread_decisions(trace, "evaluate")
    assert decision["argv"][1] == "evaluate"
    assert_the_thread_rule_ran(decision)
