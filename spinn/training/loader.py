"""Batches made ahead of the model: a loader thread pads them, works out their step plans and moves them.

Making a batch is host work (padding in numpy, simulating the gold stacks for
the step plan). A thread does it for the next batches while the model runs the
current one, and on CUDA pins them and starts their copies on its own stream,
so the training step finds its batch on the device when it asks.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence

import torch

from spinn.data.example import Example
from spinn.inference.graphs import CAPTURING, batch_tensors
from spinn.model.batch import Batch
from spinn.training.distributed import SINGLE, Topology, make_share

AHEAD = 2
"""Batches made before the model asks for them: enough to hide the host work, little memory."""
_DONE = object()


def prefetch(
    examples: Sequence[Example],
    order: Sequence[Sequence[int]],
    device: torch.device,
    topology: Topology = SINGLE,
    ahead: int = AHEAD,
) -> Iterator[Batch]:
    """The batches of `order` (lists of example indices), in order, on `device`; under torchrun, this
    rank's share of each (spinn/training/distributed.py)."""
    ready: queue.Queue = queue.Queue(maxsize=ahead)
    stop = threading.Event()
    arguments = (examples, order, device, topology, ready, stop)
    worker = threading.Thread(target=_make, args=arguments, daemon=True)
    worker.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            batch, copied = item
            if copied is not None:
                _hand_over(batch, copied, torch.cuda.current_stream(device))
            yield batch
    finally:
        stop.set()
        _drain(ready)
        worker.join()


def _make(examples, order, device: torch.device, topology: Topology, ready: queue.Queue, stop: threading.Event):
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    try:
        for indices in order:
            if stop.is_set():
                return
            batch = make_share(examples, indices, topology)
            ready.put(_to_device(batch, device, stream))
    except BaseException as error:  # raised again in the consumer, where it belongs
        ready.put(error)
        return
    ready.put(_DONE)


def _to_device(batch: Batch, device: torch.device, stream) -> tuple[Batch, object]:
    if stream is None:
        return batch.to(device), None
    with CAPTURING, torch.cuda.stream(stream):  # not while the model's step is being captured
        moved = batch.pin_memory().to(device, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(stream)
    return moved, copied


def _hand_over(batch: Batch, copied, stream) -> None:
    """The model's stream waits for the copies, and the allocator learns the tensors are used there."""
    stream.wait_event(copied)
    for tensor in batch_tensors(batch):
        tensor.record_stream(stream)


def _drain(ready: queue.Queue) -> None:
    """Unblock a worker waiting to put, so it sees the stop flag."""
    while True:
        try:
            ready.get_nowait()
        except queue.Empty:
            return
