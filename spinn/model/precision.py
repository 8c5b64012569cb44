"""The numbers a step computes in, decided once here: fp32, bf16 autocast (`amp`), or int8 GEMMs (`int8`).

amp is bf16 autocast of the matmuls on CUDA; the cells keep h and c in fp32
(the fused encoder casts its inputs back, SPINN.state_dtype). On the CPU a
step computes in fp32 whatever amp says. int8 packs the composition's GEMMs
for the CPU inference loop, for labelling.
"""

from __future__ import annotations

import contextlib

import torch

from spinn.ground.errors import SpinnError
from spinn.model.config import EncoderLoop, SPINNConfig

AMP_DTYPE = torch.bfloat16
"""What amp computes the matmuls in: bf16 keeps fp32's range, so no loss scaling is needed."""


def autocast_dtype(device: torch.device, amp: bool) -> torch.dtype | None:
    """The dtype autocast runs in on `device` when amp is asked (CUDA only), else None: fp32."""
    return AMP_DTYPE if amp and device.type == "cuda" else None


def autocast(device: torch.device, amp: bool, graphed: bool = False) -> contextlib.AbstractContextManager:
    """The autocast a step runs under; its weight cache is off under CUDA graphs (a replay must not reuse it)."""
    dtype = autocast_dtype(device, amp)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=not graphed)


def check_int8(device: torch.device | None = None, config: SPINNConfig | None = None) -> None:
    """int8's GEMMs are fbgemm's (the CPU's), packed for the fused encoder's CPU inference loop (a spec model's
    loop has none): anything else is refused, never run in fp32 instead."""
    if device is not None and device.type != "cpu":
        raise SpinnError(f"int8 runs on the CPU only; this model is on {device.type}")
    if config is not None and config.loop is not EncoderLoop.FUSED:
        encoder = config.encoder
        raise SpinnError(f"int8 runs in the fused encoder's CPU inference loop; this model's encoder is {encoder}")
