"""One optimizer step that never waits for the device, replayed from a CUDA graph where it can be.

`spinn train` and `spinn bench` run this same step. Once a batch is on the
device nothing in it reads a value back: the loss, the correct count and the
rl statistics are added to device accumulators, read once per log interval;
gradient clipping and RMSprop run as foreach kernels; the learning rate is a
device tensor the schedule fills in place between steps.

On CUDA, with graphs on, every batch shape (bucketed widths make shapes repeat)
runs its first WARMUP_STEPS steps eagerly on a side stream, is then captured
once (forward, backward, clipping, optimizer, accumulators) and replayed for
every later batch of that shape, its inputs copied into the graph's static
buffers. If capture fails, that shape runs eagerly from then on, and the
reason is logged once. Everything but the capture itself runs on a CPU too.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from spinn.model.batch import Batch
from spinn.model.config import TransitionSource
from spinn.model.spinn import SPINN, Loss, SPINNOutput, spinn_loss
from spinn.training.distributed import summed

LOG = logging.getLogger(__name__)
WARMUP_STEPS = 2
"""Eager steps of a shape before it is captured (lazy state: optimizer buffers, library workspaces)."""
DDP_WARMUP_STEPS = 11
"""Under DistributedDataParallel: PyTorch asks for 11 eager iterations before capturing a DDP step."""
MAX_GRAPHS = 64
"""Shapes captured at most; further shapes run eagerly (each graph holds its own activations)."""
METRICS = ("loss", "correct", "pairs", "steps", "rl_reward", "rl_baseline", "policy_entropy", "reduce_fraction")
"""What a step adds up on the device: sums over the steps since the last read."""


@dataclass(frozen=True)
class Schedule:
    """The learning rate at each step: linear warmup, then a step decay (Bowman et al.: 0.75 every 10k)."""

    base: float
    decay: float
    decay_steps: int
    warmup_steps: int = 0

    def rate(self, step: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        return self.base * warm * self.decay ** (step // self.decay_steps)


def make_optimizer(
    model: SPINN, schedule: Schedule, weight_decay: float, device: torch.device
) -> torch.optim.Optimizer:
    """RMSprop (the paper's) as foreach kernels. On CUDA it is capturable, with the learning rate a device
    tensor that a captured graph reads afresh at every replay; on a CPU the rate is a plain number (a tensor
    rate would be read back with .item() at every step there)."""
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    capturable = device.type == "cuda"
    rate = torch.tensor(schedule.rate(0), device=device) if capturable else schedule.rate(0)
    return torch.optim.RMSprop(trainable, lr=rate, weight_decay=weight_decay, foreach=True, capturable=capturable)


def set_rate(optimizer: torch.optim.Optimizer, rate: float) -> None:
    """Set the learning rate: in place in a capturable optimizer's tensor (a state restored from a
    checkpoint may have put a number there: it becomes a tensor again), else as a number."""
    for group in optimizer.param_groups:
        if not group.get("capturable"):
            group["lr"] = rate
        elif isinstance(group["lr"], Tensor):
            group["lr"].fill_(rate)
        else:
            group["lr"] = torch.tensor(rate, device=group["params"][0].device)


class Accumulators:
    """Device sums of the step metrics; `read` brings them to the host in one copy and starts again."""

    def __init__(self, device: torch.device):
        self.sums = torch.zeros(len(METRICS), dtype=torch.float64, device=device)
        self.index = {name: position for position, name in enumerate(METRICS)}

    def add(self, loss: Loss, logits: Tensor, labels: Tensor) -> None:
        count = labels.new_full((), labels.shape[0])  # a fill kernel, not a host copy (graph capture allows it)
        values = [loss.total.detach(), (logits.argmax(1) == labels).sum(), count, labels.new_ones(())]
        if loss.policy is not None:
            terms = loss.policy
            values += [terms.rewards.mean(), terms.baseline, terms.entropy.detach(), terms.reduce_fraction]
        self.sums[: len(values)].add_(torch.stack([value.to(self.sums.dtype) for value in values]))

    def read(self) -> dict[str, float]:
        """Means per step (loss, rl terms) and totals (correct, pairs, steps) over every rank; one host sync."""
        values = dict(zip(METRICS, summed(self.sums.clone()).tolist(), strict=True))
        self.sums.zero_()
        steps = max(values["steps"], 1.0)
        means = {name: values[name] / steps for name in ("loss", *METRICS[4:])}
        return {**values, **means}


@dataclass
class StepOptions:
    clip_norm: float
    amp: bool = False
    graphs: bool = True


class TrainStep:
    """Call with a device batch: one optimizer step, eager or replayed from the shape's CUDA graph."""

    def __init__(
        self,
        model: SPINN,
        optimizer: torch.optim.Optimizer,
        schedule: Schedule,
        options: StepOptions,
        network: torch.nn.Module | None = None,
    ):
        """network: what the step calls for the forward pass (the model, or the model in
        DistributedDataParallel, whose backward averages the gradients over the ranks)."""
        self.model, self.optimizer, self.schedule, self.options = model, optimizer, schedule, options
        self.network = network or model
        self.device = next(model.parameters()).device
        self.metrics = Accumulators(self.device)
        warmup = DDP_WARMUP_STEPS if self.network is not model else WARMUP_STEPS
        graphed = options.graphs and self.device.type == "cuda"
        self.graphs = _Graphs(self._run, self.device, warmup) if graphed else None
        self._rate: float | None = None

    def __call__(self, batch: Batch, step: int) -> None:
        """Optimizer step number `step` (0-based; it sets the learning rate) on `batch`."""
        rate = self.schedule.rate(step)
        if rate != self._rate:
            set_rate(self.optimizer, rate)
            self._rate = rate
        self.model.train()
        if self.graphs is None:
            self._run(batch)
        else:
            self.graphs.run(batch)

    def _run(self, batch: Batch) -> None:
        """The step itself: what a graph captures."""
        self.optimizer.zero_grad(set_to_none=True)
        with _autocast(self.device, self.options.amp, self.graphs is not None):
            output = self.network(batch, source=self.model.config.training_source)
            loss = spinn_loss(output, batch, self.model.config)
        loss.total.backward()
        torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], self.options.clip_norm, foreach=True)
        self.optimizer.step()
        if loss.policy is not None:
            self.model.observe_rewards(loss.policy.rewards)
        self.metrics.add(loss, output.logits, batch.labels)


class InferStep:
    """Call with a device batch: the model's output without gradients, eager or replayed from a CUDA graph.

    What it returns is the caller's to keep (a replayed graph's outputs are copied out)."""

    def __init__(self, model: SPINN, *, source: TransitionSource, amp: bool = False, graphs: bool = True):
        self.model, self.source, self.amp = model, source, amp
        self.device = next(model.parameters()).device
        self.graphs = _Graphs(self._run, self.device) if graphs and self.device.type == "cuda" else None

    def __call__(self, batch: Batch) -> SPINNOutput:
        self.model.eval()
        if self.graphs is None:
            return self._run(batch)
        output = self.graphs.run(batch)
        return SPINNOutput(*(None if value is None else value.clone() for value in output))

    def _run(self, batch: Batch) -> SPINNOutput:
        with torch.no_grad(), _autocast(self.device, self.amp, self.graphs is not None):
            return self.model(batch, source=self.source)


def _autocast(device: torch.device, amp: bool, graphed: bool) -> contextlib.AbstractContextManager:
    if device.type == "cuda" and amp:
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16, cache_enabled=not graphed)
    return contextlib.nullcontext()


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
    from spinn.model.addressing import StepPlan

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


class _Graphs:
    """Per-shape CUDA graphs of one function of a batch: warm up, capture, replay; eager where capture fails.

    `run` returns what the function returns; for a replayed graph that is the captured
    output, which the next replay of that shape overwrites."""

    def __init__(self, function: Callable[[Batch], Any], device: torch.device, warmup: int = WARMUP_STEPS):
        self.function, self.device, self.warmup = function, device, warmup
        self.seen: Counter[tuple] = Counter()
        self.captured: dict[tuple, tuple[torch.cuda.CUDAGraph, Batch, Any]] = {}
        self.refused: set[tuple] = set()
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
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                output = self.function(static)
        except Exception as error:  # an op that cannot be captured: say so once, run this shape eagerly
            LOG.warning("CUDA graph capture failed for batch shape %s (%s); running it eagerly", key[0], error)
            self.refused.add(key)
            torch.cuda.synchronize(self.device)
            return self.function(batch)
        self.captured[key] = (graph, static, output)
        graph.replay()
        return output

    @contextlib.contextmanager
    def _on_side_stream(self) -> Iterator[None]:
        """Warm-up steps run on a side stream, as capture requires of the work before it."""
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            yield
        torch.cuda.current_stream(self.device).wait_stream(self.side)
