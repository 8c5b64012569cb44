"""Training on several processes with torch.distributed: who is who, how a batch is shared, what is exchanged.

`spinn train` runs unchanged under `torchrun --nproc-per-node N -m spinn.cli train ...`
(or starts torchrun itself when `processes` > 1). Every rank makes the same
global batches from the same seed, epoch and order, and takes its own
contiguous share of each one, so N ranks see exactly the data one process
sees at each step and an epoch means the same at any world size. Each rank's
losses are scaled so that DistributedDataParallel's gradient average equals
the gradient of the global batch's mean loss (`loss_scale`, worked out on the
host: every rank knows the whole global batch). Only rank 0 talks to MLflow,
evaluates on dev, writes checkpoints and registers; the others wait for it at
barriers. Batch norm statistics are summed over all ranks (spinn/model/cells.py),
so the model learns what one process would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from spinn.data.example import Example
from spinn.ground.cores import child_environment
from spinn.ground.errors import SpinnError
from spinn.model.batch import WIDTH_STEP, Batch, make_batch

TIMEOUT = timedelta(minutes=10)
"""How long a rank waits for the others at a collective before the job fails instead of hanging."""
MAIN_RANK = 0


@dataclass(frozen=True)
class Topology:
    """This process's place in the job: one process is rank 0 of a world of 1."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == MAIN_RANK

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @classmethod
    def from_environment(cls) -> Topology:
        """torchrun's RANK, WORLD_SIZE and LOCAL_RANK, or a single process."""
        if "WORLD_SIZE" not in os.environ:
            return cls()
        return cls(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))


SINGLE = Topology()
"""One process: rank 0 of 1."""


def setup(topology: Topology, device_kind: str) -> torch.device:
    """Join the process group (nccl on CUDA, gloo on CPU) and pick this rank's device."""
    if device_kind == "cuda":
        torch.cuda.set_device(topology.local_rank)
        device = torch.device("cuda", topology.local_rank)
    else:
        device = torch.device("cpu")
    if topology.distributed and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=TIMEOUT)
        _fail_loudly_on_termination()
    return device


def backend() -> str | None:
    return dist.get_backend() if dist.is_initialized() else None


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _fail_loudly_on_termination() -> None:
    """torchrun stops the other ranks with SIGTERM when one dies: make that an exception, so rank 0 can
    mark its MLflow run failed on the way out instead of vanishing."""

    def stop(signum, frame):  # noqa: ARG001
        raise SystemExit(f"stopped by signal {signum}: another rank of the job failed")

    signal.signal(signal.SIGTERM, stop)


# ----------------------------------------------------------------------------- sharing batches


def share(indices: Sequence[int], topology: Topology) -> list[int]:
    """This rank's contiguous share of a global batch (sizes differ by at most one pair)."""
    bounds = np.linspace(0, len(indices), topology.world + 1).round().astype(int)
    return list(indices[bounds[topology.rank] : bounds[topology.rank + 1]])


def make_share(examples: Sequence[Example], indices: Sequence[int], topology: Topology) -> Batch:
    """This rank's batch, with the loss scale that turns its mean losses into its part of the global mean.

    The gradient DDP averages over ranks is then the gradient of the mean over the global batch: each
    rank's mean classification loss is weighted by its share of the pairs, its mean transition loss by
    its share of the real transition steps (times the world size, which the average divides away)."""
    local = share(indices, topology)
    batch = make_batch([examples[i] for i in local], width_step=WIDTH_STEP)
    if not topology.distributed:
        return batch
    pairs = np.array([len(indices), len(local)], dtype=np.float64)
    steps = np.array([_real_steps(examples, indices), _real_steps(examples, local)], dtype=np.float64)
    scale = topology.world * np.array([pairs[1] / pairs[0], steps[1] / steps[0]])
    return Batch(batch.tokens, batch.lengths, batch.transitions, batch.labels, batch.plan, torch.tensor(scale))


def _real_steps(examples: Sequence[Example], indices: Sequence[int]) -> int:
    return sum(2 * (len(examples[i].premise) + len(examples[i].hypothesis)) - 2 for i in indices)


# ----------------------------------------------------------------------------- exchanges


def summed(values: torch.Tensor) -> torch.Tensor:
    """The element-wise sum over ranks (in place; a single process gets its own values)."""
    if dist.is_initialized():
        dist.all_reduce(values)
    return values


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast(value, topology: Topology):
    """Rank 0's value on every rank (decisions only rank 0 can take, such as early stopping)."""
    if not topology.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=MAIN_RANK)
    return box[0]


def gathered(value, topology: Topology) -> list:
    """Every rank's value, on every rank, in rank order (each rank's RNG state for a checkpoint)."""
    if not topology.distributed:
        return [value]
    boxes = [None] * topology.world
    dist.all_gather_object(boxes, value)
    return boxes


# ----------------------------------------------------------------------------- launching


def launch(processes: int, arguments: Sequence[str]) -> None:
    """Run `spinn train` with these arguments under torchrun on `processes` local ranks; wait for it."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={processes}",
        "-m",
        "spinn.cli",
        "train",
        *arguments,
    ]
    environment = {**os.environ, **child_environment(processes)}  # each rank's share of the cores
    finished = subprocess.run(command, env=environment, check=False)
    if finished.returncode != 0:
        raise SpinnError(f"distributed training on {processes} processes failed (torchrun exit {finished.returncode})")
