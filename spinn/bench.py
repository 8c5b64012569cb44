"""`spinn bench`: time SPINN training or inference steps on real trees.

Batches come from a real SNLI-format file (binary parses) or a prepared
Parquet split, length-bucketed like training batches, optionally resampled to
a given number of pairs (e.g. 550,152 to time a full SNLI training epoch from
the dev trees). Word vectors are random: speed does not depend on their values.

What is timed: `steps` model steps after `warmup` untimed ones; a train step
is forward, backward and an RMSprop update, an infer step is a forward under
inference_mode. Batches are built and placed on the device before timing, as
a data loader running ahead of the model would. On CUDA the clock is read
after torch.cuda.synchronize(). Peak memory is torch.cuda.max_memory_allocated
on CUDA and the process's peak resident set size on CPU.
"""

from __future__ import annotations

import contextlib
import random
import resource
import sys
import time
from collections.abc import Iterator
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import torch

from spinn.batching import (Batch, Example, bucket_batches, corpus_vocabulary, encode_pairs, make_batch,
                            padding_fraction, read_raw_pairs)
from spinn.errors import SpinnError
from spinn.evaluate import resolve_device
from spinn.model import COMPOSE_STRATEGIES, SPINN, TREE_VARIANTS, SPINNConfig, random_vectors, spinn_loss
from spinn.reference import ReferenceSPINN

MODES = ("train", "infer")
IMPLEMENTATIONS = ("fast", "reference")
DEVICES = ("cpu", "cuda")
LEARNING_RATE = 1e-3  # RMSprop, as the paper; the value does not change the speed
RSS_UNIT_BYTES = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is KiB on Linux, bytes on macOS


def run_bench(
    corpus: Path,
    *,
    pairs: int | None = None,
    variant: str = "pi",
    mode: str = "train",
    batch_size: int = 128,
    d_hidden: int = 300,
    d_tracker: int = 64,
    d_embed: int = 300,
    steps: int = 20,
    warmup: int = 3,
    device: str = "cpu",
    impl: str = "fast",
    compose: str = "needed",
    amp: bool = False,
    compile: bool = False,
    threads: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Run the benchmark and return one flat JSON-ready dict (settings and measurements)."""
    _check_options(mode, impl, device, steps, warmup, pairs, threads)
    if impl == "reference" and compose != "needed":
        raise SpinnError("--compose all applies to --impl fast; the reference composes only the rows that reduce")
    if impl == "reference" and variant == "rl":
        raise SpinnError("--variant rl has no reference implementation; use --impl fast")
    with _torch_threads(threads):
        return _run(Path(corpus), pairs, variant, mode, batch_size, d_hidden, d_tracker, d_embed, steps, warmup,
                    device, impl, compose, amp, compile, seed)


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Use that many intra-op threads inside, and give the caller its own setting back."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _run(corpus: Path, pairs: int | None, variant: str, mode: str, batch_size: int, d_hidden: int, d_tracker: int,
         d_embed: int, steps: int, warmup: int, device: str, impl: str, compose: str, amp: bool, compile: bool,
         seed: int) -> dict[str, Any]:
    """run_bench after its options are checked."""
    torch.manual_seed(seed)
    examples, vocab_size = load_examples(corpus, pairs, seed, labelled=mode == "train")
    config = SPINNConfig(variant=variant, d_embed=d_embed, d_hidden=d_hidden, d_tracker=d_tracker, compose=compose)
    model = SPINN(config, random_vectors(vocab_size, d_embed, seed)).to(device)
    if compile:
        model.compile_cells()
    runner = model if impl == "fast" else ReferenceSPINN(model)
    batches = [batch.to(device) for batch in take_batches(examples, batch_size, warmup + steps, seed)]
    predict = mode == "infer" and config.predicts_transitions and impl == "fast"
    step = _train_step(model, runner, config, device, amp) if mode == "train" else \
        _infer_step(model, runner, device, amp, predict)
    seconds, peak = _time(step, batches, warmup, device)
    timed = batches[warmup:]
    timed_pairs = sum(batch.pairs for batch in timed)
    return {
        "pairs_per_second": timed_pairs / seconds,
        "seconds": seconds,
        "seconds_per_step": seconds / steps,
        "peak_memory_bytes": peak,
        "peak_memory_kind": "cuda_max_memory_allocated" if device == "cuda" else "process_peak_rss",
        "timed_pairs": timed_pairs,
        "mean_transition_steps": sum(batch.transitions.shape[1] for batch in timed) / len(timed),
        "mean_padding_fraction": sum(padding_fraction(batch) for batch in timed) / len(timed),
        "transitions": "predicted" if predict else "sampled" if mode == "train" and config.samples_transitions
        else "gold",
        "corpus": str(corpus), "pairs": len(examples), "variant": variant, "mode": mode,
        "batch_size": batch_size, "d_hidden": d_hidden, "d_tracker": d_tracker, "d_embed": d_embed,
        "mlp_layers": config.mlp_layers, "mlp_dim": config.mlp_dim, "steps": steps, "warmup": warmup,
        "device": device, "device_name": _device_name(device), "impl": impl, "compose": compose, "amp": amp,
        "compile": compile, "threads": torch.get_num_threads(), "seed": seed, "torch": torch.__version__,
    }


def _check_options(mode: str, impl: str, device: str, steps: int, warmup: int, pairs: int | None,
                   threads: int | None) -> None:
    for name, value, allowed in (("mode", mode, MODES), ("impl", impl, IMPLEMENTATIONS), ("device", device, DEVICES)):
        if value not in allowed:
            raise SpinnError(f"--{name} must be one of {allowed}, got {value!r}")
    if steps < 1 or warmup < 0:
        raise SpinnError(f"need --steps >= 1 and --warmup >= 0, got {steps} and {warmup}")
    if pairs is not None and pairs < 1:
        raise SpinnError(f"--pairs must be at least 1, got {pairs}")
    if threads is not None and threads < 1:
        raise SpinnError(f"--threads must be at least 1, got {threads}")
    resolve_device(device)


def load_examples(corpus: Path, pairs: int | None, seed: int, labelled: bool) -> tuple[list[Example], int]:
    """Id-encoded pairs of the corpus (resampled to `pairs` if given) and the vocabulary size."""
    raw = read_raw_pairs(corpus)
    if labelled:
        raw = [pair for pair in raw if pair.label is not None]
    if not raw:
        raise SpinnError(f"{corpus}: no {'labelled ' if labelled else ''}pairs to benchmark on")
    vocabulary = corpus_vocabulary(raw)
    examples = encode_pairs(raw, vocabulary)
    if pairs is not None:
        rng = random.Random(seed)
        examples = rng.sample(examples, pairs) if pairs <= len(examples) else rng.choices(examples, k=pairs)
    return examples, len(vocabulary)


def take_batches(examples: list[Example], batch_size: int, count: int, seed: int) -> list[Batch]:
    """The first `count` length-bucketed batches, cycling through the epoch if it has fewer."""
    order = bucket_batches(examples, batch_size, shuffle=True, seed=seed)
    return [make_batch([examples[i] for i in indices]) for indices in islice(cycle(order), count)]


def _autocast(device: str, amp: bool) -> contextlib.AbstractContextManager:
    return torch.autocast(device_type=device, dtype=torch.bfloat16) if amp else contextlib.nullcontext()


def _train_step(model: SPINN, runner: torch.nn.Module, config: SPINNConfig, device: str, amp: bool):
    model.train()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=LEARNING_RATE)

    def step(batch: Batch) -> None:
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device, amp):
            loss = spinn_loss(runner(batch), batch, config).total
        loss.backward()
        optimizer.step()

    return step


def _infer_step(model: SPINN, runner: torch.nn.Module, device: str, amp: bool, predict: bool):
    model.eval()

    def step(batch: Batch) -> None:
        with torch.inference_mode(), _autocast(device, amp):
            runner(batch, predict_transitions=predict)

    return step


def _time(step, batches: list[Batch], warmup: int, device: str) -> tuple[float, int]:
    """Seconds for the steps after the warm-up ones, and the peak memory in bytes."""
    for batch in batches[:warmup]:
        step(batch)
    _synchronize(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for batch in batches[warmup:]:
        step(batch)
    _synchronize(device)
    seconds = time.perf_counter() - start
    if device == "cuda":
        return seconds, torch.cuda.max_memory_allocated()
    return seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * RSS_UNIT_BYTES


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return _cpu_name()


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "cpu"


__all__ = ["COMPOSE_STRATEGIES", "DEVICES", "IMPLEMENTATIONS", "MODES", "TREE_VARIANTS", "run_bench"]
