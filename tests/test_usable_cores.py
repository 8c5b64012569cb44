"""usable_cores: the CPUs a process may really use, affinity capped by the cgroup CPU quota (fake cgroup files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spinn.data import prepare
from spinn.ground.cores import cgroup_quota_cores, usable_cores
from spinn.parsing.parser_settings import TOKENIZERS_BESIDE_A_GPU, resolve_tokenizers, resolve_workers

MANY_CORES = set(range(16))


@pytest.fixture
def sixteen_cores(monkeypatch):
    """A process allowed on 16 cores by its affinity."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: MANY_CORES, raising=False)


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="ascii")


@pytest.mark.parametrize(
    ("files", "cores"),
    [
        ({"cpu.max": "200000 100000"}, 2),  # v2: two cores' worth
        ({"cpu.max": "150000 100000"}, 2),  # 1.5 cores: rounded up
        ({"cpu.max": "50000 100000"}, 1),  # half a core: still one thread
        ({"cpu.max": "max 100000"}, None),  # v2 without a quota
        ({"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"}, 3),  # v1
        ({"cpu,cpuacct/cpu.cfs_quota_us": "400000", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 4),
        ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),  # v1 without a quota
        ({"cpu.max": "garbage"}, None),
        ({}, None),  # no cgroup files at all
    ],
)
def test_quota_is_read_from_cgroup_v2_or_v1_files(tmp_path, files, cores):
    for relative, text in files.items():
        write(tmp_path, relative, text)
    assert cgroup_quota_cores(tmp_path) == cores


def test_a_quota_caps_the_affinity(tmp_path, sixteen_cores):
    write(tmp_path, "cpu.max", "200000 100000")
    assert usable_cores(tmp_path) == 2


def test_without_a_quota_the_affinity_counts(tmp_path, sixteen_cores):
    write(tmp_path, "cpu.max", "max 100000")
    assert usable_cores(tmp_path) == len(MANY_CORES)


def test_a_quota_above_the_affinity_does_not_raise_it(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    write(tmp_path, "cpu.max", "800000 100000")
    assert usable_cores(tmp_path) == 2


def test_prepare_and_parser_workers_follow_usable_cores(monkeypatch):
    monkeypatch.setattr(prepare, "usable_cores", lambda: 3)
    assert prepare.default_workers() == min(3, prepare.MAX_DEFAULT_WORKERS)
    monkeypatch.setattr("spinn.ground.cores.usable_cores", lambda: 3)
    assert resolve_workers("auto", use_gpu=False) == 3


@pytest.mark.parametrize(
    ("cores", "model_on_gpu", "tokenizers"), [(16, True, TOKENIZERS_BESIDE_A_GPU), (2, True, 1), (16, False, 1)]
)
def test_tokenizer_workers_start_beside_a_gpu_model_where_cores_allow(monkeypatch, cores, model_on_gpu, tokenizers):
    """A CPU model's threads take every core: tokenizing stays in its process unless workers are asked for."""
    monkeypatch.setattr("spinn.ground.cores.usable_cores", lambda: cores)
    assert resolve_tokenizers("auto", model_on_gpu) == tokenizers
    assert resolve_tokenizers(3, model_on_gpu) == 3
