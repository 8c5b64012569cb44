"""One optimizer step that never waits for the device, replayed from a CUDA graph where it can be.

`spinn train` and `spinn bench` run this same step. Once a batch is on the
device nothing in it reads a value back: the loss, the correct count and the
rl statistics are added to device accumulators, read once per log interval;
gradient clipping and RMSprop run as foreach kernels; the learning rate is a
device tensor the schedule fills in place between steps.

On CUDA, with graphs on, the whole step (forward, backward, clipping,
optimizer, accumulators) is captured per batch shape and replayed by the
graph machinery it shares with inference (spinn/inference/graphs.py).
Everything but the capture itself runs on a CPU too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from spinn.inference.graphs import WARMUP_STEPS, Graphs
from spinn.model.batch import Batch
from spinn.model.config import EncoderLoop, SPINNConfig, TransitionSource
from spinn.model.precision import autocast
from spinn.model.spinn import SPINN, Loss, spinn_loss
from spinn.training.distributed import summed

DDP_WARMUP_STEPS = 11
"""Under DistributedDataParallel: PyTorch asks for 11 eager iterations before capturing a DDP step."""
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
    rate = rate_tensor(schedule.rate(0), device) if capturable else schedule.rate(0)
    return torch.optim.RMSprop(trainable, lr=rate, weight_decay=weight_decay, foreach=True, capturable=capturable)


def rate_tensor(rate: float, device: torch.device) -> Tensor:
    """A capturable optimizer's learning rate: a float32 scalar on its parameters' device."""
    return torch.tensor(rate, dtype=torch.float32, device=device)


def set_rate(optimizer: torch.optim.Optimizer, rate: float) -> None:
    """Set the learning rate: in place in a capturable optimizer's tensor, else as a number. A state restored
    from a checkpoint (loaded on the CPU) puts a number or a CPU tensor there: it becomes a tensor on the
    parameters' device again, as in an uninterrupted run (a graph captured with a CPU rate keeps the value it
    read at capture, so the schedule's later rates would never reach it)."""
    for group in optimizer.param_groups:
        device = group["params"][0].device
        if not group.get("capturable"):
            group["lr"] = rate
        elif isinstance(group["lr"], Tensor) and group["lr"].device == device:
            group["lr"].fill_(rate)
        else:
            group["lr"] = rate_tensor(rate, device)


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
    loop: EncoderLoop | None = None
    """The encoder loop, where the caller names one; else `training_loop`'s choice for the device."""


def training_loop(config: SPINNConfig, device: torch.device) -> EncoderLoop:
    """The encoder loop a training step runs: a spec model its spec; on a CPU, gold transitions compose only
    their REDUCEs (about a third of the rows a fixed shape composes; nothing there needs fixed shapes); else
    the fused loop, every sentence at every step (the shapes a CUDA graph replays)."""
    if config.loop is EncoderLoop.FUSED and device.type == "cpu" and config.training_source is TransitionSource.GOLD:
        return EncoderLoop.FUSED_COMPACT
    return config.loop


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
        self.network = model if network is None else network  # a compiled module refuses bool() (it has len())
        self.device = next(model.parameters()).device
        self.loop = options.loop or training_loop(model.config, self.device)
        self.metrics = Accumulators(self.device)
        warmup = DDP_WARMUP_STEPS if self.network is not model else WARMUP_STEPS
        graphed = options.graphs and self.device.type == "cuda"
        self.graphs = Graphs(self._run, self.device, warmup) if graphed else None
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
        with autocast(self.device, self.options.amp, self.graphs is not None):
            config = self.model.config
            output = self.network(batch, source=config.training_source, loop=self.loop)
            loss = spinn_loss(output, batch, config)
        loss.total.backward()
        torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], self.options.clip_norm, foreach=True)
        self.optimizer.step()
        if loss.policy is not None:
            self.model.observe_rewards(loss.policy.rewards)
        self.metrics.add(loss, output.logits, batch.labels)
