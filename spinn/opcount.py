"""Counting what decides GPU speed, on any machine: aten ops and host syncs per training step.

On a GPU every aten op is at least one kernel launch (a few microseconds of GPU
work and tens of microseconds of Python and dispatch when eager), and every read
of a device value on the host stalls the stream and breaks CUDA graph capture.
Both can be counted on a CPU: a TorchDispatchMode sees every aten op, and the
syncs are the ops that must read a tensor's data to know their result's shape
or value (`_local_scalar_dense` behind .item() and int(), `nonzero`, ...), plus
the Tensor methods that copy values out (.tolist(), .numpy()).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",
        "nonzero",
        "masked_select",
        "unique",
        "_unique2",
        "unique_consecutive",
        "repeat_interleave",
        "bincount",
        "histc",
        "item",
    }
)
"""Ops whose result's shape or host value depends on the data: each waits for the device."""
READ_METHODS = ("tolist", "numpy")
"""Tensor methods that copy values to Python (their aten op, if any, is not dispatched)."""


@dataclass
class OpCount:
    """Ops seen, by name, and the host reads among them."""

    ops: Counter[str] = field(default_factory=Counter)
    reads: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def syncs(self) -> int:
        return sum(count for name, count in self.ops.items() if name in SYNC_OPS) + sum(self.reads.values())

    def sync_ops(self) -> dict[str, int]:
        found = {name: count for name, count in self.ops.items() if name in SYNC_OPS}
        return {**found, **{f".{name}()": count for name, count in self.reads.items()}}


class _Counting(TorchDispatchMode):
    def __init__(self, count: OpCount):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def counting() -> Iterator[OpCount]:
    """Count every aten op and host read inside the block (one thread; not reentrant)."""
    count = OpCount()
    originals = {name: getattr(torch.Tensor, name) for name in READ_METHODS}

    def reading(name: str) -> Callable[..., Any]:
        def read(self, *args, **kwargs):
            count.reads[name] += 1
            return originals[name](self, *args, **kwargs)

        return read

    for name in READ_METHODS:
        setattr(torch.Tensor, name, reading(name))
    try:
        with _Counting(count):
            yield count
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
