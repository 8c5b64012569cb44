"""Builders and checks that several test modules share."""

from __future__ import annotations

import json
import os
from pathlib import Path

from spinn import cores

FREE_CORES_SEEN = 1.0
"""The free-core reading the thread-rule checks stub: auto then runs one thread on any machine."""


def thread_rule_env(trace: Path) -> dict[str, str]:
    """The variables that make every spinn process write its thread decisions to `trace`, under a stubbed
    free-core reading (spinn/cores.py)."""
    return {cores.TRACE_VARIABLE: str(trace), cores.FREE_CORES_VARIABLE: str(FREE_CORES_SEEN)}


def thread_decisions(trace: Path, where: str) -> list[dict]:
    """The decisions the trace holds for `where` (a stage: train, evaluate, label, ...), in order."""
    lines = trace.read_text(encoding="utf-8").splitlines() if trace.exists() else []
    return [decision for decision in map(json.loads, lines) if decision["where"] == where]


def assert_the_thread_rule_ran(decision: dict, *, in_child: bool = True) -> None:
    """One traced decision is the rule's for an auto setting under the stubbed reading: the free cores rounded,
    within the process's share, and OpenMP's wait as this test process has it (every child inherits it; a
    child that loaded spinn before torch had it in place for torch's OpenMP runtime)."""
    assert decision["asked"] == cores.AUTO, decision
    assert decision["free"] == FREE_CORES_SEEN, decision
    assert decision["threads"] == min(decision["share"], round(FREE_CORES_SEEN)) == 1, decision
    assert decision["openmp"] == {name: os.environ.get(name) for name in cores.OPENMP_WAIT_VARIABLES}, decision
    if in_child:
        assert decision["pid"] != os.getpid() and decision["torch_loaded_first"] is False, decision
