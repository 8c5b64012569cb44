"""What a training run works with, built once: vocabulary, vectors, model, optimizer, steps and examples.

Every rank builds the same model from the same seed; under torchrun the model
is wrapped in DistributedDataParallel, and rank 0 aligns the word vectors
before the others read its cache, so only one process downloads or writes.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from spinn.data.embeddings import load_settings_embeddings
from spinn.data.example import Example
from spinn.data.vocab import VOCAB_FILENAME, Vocabulary
from spinn.evaluation.evaluate import read_examples
from spinn.ground.errors import SpinnError
from spinn.ground.io import file_digest
from spinn.inference.infer_step import InferStep
from spinn.model.config import SPINNConfig
from spinn.model.loading import resolve_device
from spinn.model.spinn import SPINN
from spinn.training import distributed
from spinn.training.distributed import Topology
from spinn.training.train_config import TrainConfig
from spinn.training.train_step import StepOptions, TrainStep, make_optimizer


@dataclass
class TrainingRun:
    """What one training run works with (built once, shared by the loop, checkpoints and publishing)."""

    config: TrainConfig
    model: SPINN
    optimizer: torch.optim.Optimizer
    step: TrainStep
    dev_infer: InferStep
    vocabulary: Vocabulary
    train: list[Example]
    dev: list[Example]
    device: torch.device
    output_dir: Path
    data_hashes: dict[str, str]
    topology: Topology
    train_path: Path
    dev_path: Path
    rng_ranks: list[dict] = field(default_factory=list)  # every rank's RNG states at the last checkpoint
    report_every_s: float | None = None


def build_run(
    train_path: Path,
    dev_path: Path,
    config: TrainConfig,
    output_dir: Path,
    vocab_path: Path | None,
    embeddings_dir: Path,
    progress: bool,
) -> TrainingRun:
    """The run's model and data on this rank's device, the config's autos decided for it."""
    vocab_path = vocab_path or train_path.parent / VOCAB_FILENAME
    if not vocab_path.exists():
        raise SpinnError(
            f"{vocab_path}: no vocabulary; build it from the training split first (`spinn vocab`), or name another"
        )
    vocabulary = Vocabulary.load(vocab_path)
    topology = Topology.from_environment()
    device = distributed.setup(topology, resolve_device(config.device).type)
    vectors, report = _vectors(config, vocabulary, embeddings_dir, progress, topology)
    model_config = _fit_embedding_size(config.model, vectors.shape[1])
    train = read_examples(train_path, vocabulary)
    config = config.replace(model=model_config).resolved(device.type, len(train))
    random.seed(config.seed)
    torch.manual_seed(config.seed)  # every rank starts from the same weights
    model = SPINN(model_config, torch.from_numpy(vectors)).to(device)
    schedule = config.schedule()
    optimizer = make_optimizer(model, schedule, config.weight_decay, device)
    network = _network(model, device, topology)
    options = StepOptions(config.clip_norm, config.amp, config.graphs)
    step = TrainStep(model, optimizer, schedule, options, network=network)
    hashes = {
        "train_sha256": file_digest(train_path, "sha256"),
        "dev_sha256": file_digest(dev_path, "sha256"),
        "vocab_sha256": hashlib.sha256("\n".join(vocabulary.tokens).encode()).hexdigest(),
        "embeddings_coverage": f"{report.coverage:.4f}",
    }
    return TrainingRun(
        config,
        model,
        optimizer,
        step,
        InferStep(model, source=model_config.evaluation_source, graphs=config.graphs),
        vocabulary,
        train,
        read_examples(dev_path, vocabulary),
        device,
        output_dir,
        hashes,
        topology,
        train_path,
        dev_path,
    )


def _vectors(config: TrainConfig, vocabulary: Vocabulary, embeddings_dir: Path, progress: bool, topology: Topology):
    """The aligned word vectors: rank 0 aligns (and caches) them first, the other ranks then read its cache,
    so only one process downloads or writes."""
    if not topology.is_main:
        distributed.barrier()
    found = load_settings_embeddings(config.embeddings, vocabulary, cache_dir=embeddings_dir, progress=progress)
    if topology.is_main:
        distributed.barrier()
    return found


def _network(model: SPINN, device: torch.device, topology: Topology) -> torch.nn.Module:
    """What a training step calls: the model, or under torchrun the model in DistributedDataParallel,
    which averages the gradients over the ranks as backward produces them."""
    if not topology.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def _fit_embedding_size(model: SPINNConfig, dim: int) -> SPINNConfig:
    """The model takes its embedding size from the vectors; a preset's 300 yields to GloVe 50d."""
    return model if model.d_embed == dim else model.replace(d_embed=dim)
