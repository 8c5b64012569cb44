"""amp and int8: one rule says what a step computes in, on each device."""

from __future__ import annotations

import pytest
import torch

from spinn.ground.errors import SpinnError
from spinn.model.precision import AMP_DTYPE, autocast, autocast_dtype, check_int8

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_amp_is_bf16_on_cuda_and_fp32_everywhere_else():
    assert autocast_dtype(CUDA, amp=True) is AMP_DTYPE is torch.bfloat16
    assert autocast_dtype(CUDA, amp=False) is None and autocast_dtype(CPU, amp=True) is None


def test_amp_on_the_cpu_computes_in_fp32():
    """The benchmark's reference step autocast to bf16 on the CPU while the fast steps it is compared with
    ran fp32; both now take this rule."""
    with autocast(CPU, amp=True):
        assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == torch.float32


def test_int8_is_refused_off_the_cpu():
    check_int8(CPU)
    with pytest.raises(SpinnError, match="int8 runs on the CPU only; this model is on cuda"):
        check_int8(CUDA)
