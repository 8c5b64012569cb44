"""Per-shape CUDA graphs of a step over a batch: warm up, capture once, replay; eager where capture fails.

The inference step and the training step both run through this. Bucketed
batch widths make shapes repeat, so each shape runs its first WARMUP_STEPS
calls eagerly on a side stream, is then captured once and replayed for every
later batch of that shape, its inputs copied into the graph's static buffers.
If capture fails, that shape runs eagerly from then on, and the reason is
logged once and kept for `report`, which says what became of every shape.
Graphs exist only on CUDA; callers on any other device call their step
function directly.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields
from typing import Any

import torch
from torch import Tensor

from spinn.model.addressing import StepPlan
from spinn.model.batch import Batch

LOG = logging.getLogger(__name__)
WARMUP_STEPS = 2
"""Eager steps of a shape before it is captured (lazy state: optimizer buffers, library workspaces)."""
MAX_GRAPHS = 64
"""Shapes captured at most; further shapes run eagerly (each graph holds its own activations)."""
CAPTURING = threading.Lock()
"""Held while a graph is captured. The loader thread takes it around its pins, allocations and copies: a CUDA
call of another thread during a capture invalidates that capture."""
REASON_CHARS = 300
"""A refused capture's reason is the start of its error's first line."""


def batch_tensors(batch: Batch) -> list[Tensor]:
    """Every tensor of a batch, in a fixed order (the graph's static inputs)."""
    tensors = [getattr(batch, item.name) for item in fields(batch) if item.name != "plan"]
    if batch.plan is not None:
        tensors += list(batch.plan.tensors())
    return [tensor for tensor in tensors if tensor is not None]


def shape_key(batch: Batch) -> tuple:
    """Batches with equal keys can share a graph: same shapes, same optional parts."""
    return tuple((tuple(tensor.shape), tensor.dtype) for tensor in batch_tensors(batch)) + (batch.plan is not None,)


def copy_into(static: Batch, batch: Batch) -> None:
    """Copy a batch's values into a captured graph's input buffers (same shapes: same key)."""
    for target, source in zip(batch_tensors(static), batch_tensors(batch), strict=True):
        target.copy_(source, non_blocking=True)


def clone_batch(batch: Batch) -> Batch:
    """Fresh device buffers holding the batch: a graph's static inputs."""
    plan = None if batch.plan is None else StepPlan(*(tensor.clone() for tensor in batch.plan.tensors()))

    def clone(tensor: Tensor | None) -> Tensor | None:
        return None if tensor is None else tensor.clone()

    return Batch(
        batch.tokens.clone(),
        batch.lengths.clone(),
        batch.transitions.clone(),
        clone(batch.labels),
        plan,
        clone(batch.loss_scale),
    )


class Graphs:
    """Per-shape CUDA graphs of one function of a batch: warm up, capture, replay; eager where capture fails.

    `run` returns what the function returns; for a replayed graph that is the captured
    output, which the next replay of that shape overwrites."""

    def __init__(self, function: Callable[[Batch], Any], device: torch.device, warmup: int = WARMUP_STEPS):
        self.function, self.device, self.warmup = function, device, warmup
        self.seen: Counter[tuple] = Counter()
        self.captured: dict[tuple, tuple[torch.cuda.CUDAGraph, Batch, Any]] = {}
        self.refused: dict[tuple, str] = {}
        """Shapes whose capture failed, and why."""
        self.capture_seconds = 0.0
        self.pool = torch.cuda.graph_pool_handle()
        self.side = torch.cuda.Stream(device)

    def run(self, batch: Batch) -> Any:
        key = shape_key(batch)
        if key in self.captured:
            graph, static, output = self.captured[key]
            copy_into(static, batch)
            graph.replay()
            return output
        self.seen[key] += 1
        if key in self.refused or self.seen[key] <= self.warmup or len(self.captured) >= MAX_GRAPHS:
            with self._on_side_stream():
                return self.function(batch)
        return self._capture(key, batch)

    def _capture(self, key: tuple, batch: Batch) -> Any:
        static = clone_batch(batch)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream(self.device)
        started = time.perf_counter()
        try:
            with CAPTURING, torch.cuda.graph(graph, pool=self.pool):
                output = self.function(static)
        except Exception as error:  # an op that cannot be captured: say so once, run this shape eagerly
            self.capture_seconds += time.perf_counter() - started
            LOG.warning("CUDA graph capture failed for batch shape %s (%s); running it eagerly", key[0], error)
            self.refused[key] = refusal(error)
            self._end_failed_capture(stream)
            return self.function(batch)
        self.capture_seconds += time.perf_counter() - started
        self.captured[key] = (graph, static, output)
        graph.replay()
        return output

    def _end_failed_capture(self, stream: torch.cuda.Stream) -> None:
        """Undo what a failed capture leaves behind: torch ends a capture only when it succeeds, so the capture's
        side stream stays current, the memory pool stays open to it (a later capture into that pool is refused)
        and the CUDA random generators stay in capture mode (the next eager dropout then fails with "Offset
        increment outside graph capture"). Later captures go to a new pool, and a capture of one small op that
        succeeds ends the generators' capture mode."""
        torch.cuda.set_stream(stream)
        torch.cuda.synchronize(self.device)
        self.pool = torch.cuda.graph_pool_handle()
        closing = torch.cuda.CUDAGraph()
        with CAPTURING, torch.cuda.graph(closing, pool=self.pool):
            torch.zeros(1, device=self.device)

    def report(self) -> dict[str, Any]:
        """What became of the shapes run so far (shape_report)."""
        return shape_report(self.seen, self.captured, self.refused, self.warmup, self.capture_seconds)

    @contextlib.contextmanager
    def _on_side_stream(self) -> Iterator[None]:
        """Warm-up steps run on a side stream, as capture requires of the work before it."""
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            yield
        torch.cuda.current_stream(self.device).wait_stream(self.side)


def refusal(error: BaseException) -> str:
    """Why a capture failed, in one short line: the error's type and the start of its first line."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:REASON_CHARS]}" if lines else type(error).__name__


def shape_report(
    seen: Counter[tuple], captured: Iterable[tuple], refused: dict[tuple, str], warmup: int, capture_seconds: float
) -> dict[str, Any]:
    """Shapes run, captured, refused (each with its reason), still warming up (run `warmup` times or fewer), and
    run eagerly because MAX_GRAPHS were already captured; the seconds spent capturing. `seen` counts each
    shape's calls before it was captured."""
    captured = set(captured)
    eager = [key for key in seen if key not in captured and key not in refused]
    return {
        "shapes": len(seen),
        "captured": len(captured),
        "refused": [{"shape": list(key[0][0]), "reason": reason} for key, reason in refused.items()],
        "warming_up": sum(1 for key in eager if seen[key] <= warmup),
        "over_limit": sum(1 for key in eager if seen[key] > warmup),
        "capture_seconds": capture_seconds,
    }
