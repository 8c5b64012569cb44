"""`spinn bench`: time SPINN training or inference steps on real trees, and count what decides GPU speed.

Batches come from a real SNLI-format file (binary parses) or a prepared
Parquet split, length-bucketed and width-bucketed like training batches,
optionally resampled to a given number of pairs (e.g. 550,152 to time a full
SNLI training epoch from the dev trees). Word vectors are random: speed does
not depend on their values.

Modes: `train` times the training step that `spinn train` runs (forward,
backward, clipping, RMSprop, metric sums; replayed from CUDA graphs on a GPU)
on batches already on the device; `infer` the inference step of `spinn
evaluate` and `spinn label`; `loop` the training loop itself, with batches
made by the loader thread as they are needed and the metrics read every
LOG_EVERY steps. `steps` steps are timed after `warmup` untimed ones (on a GPU
each batch shape is captured after its first warm-up steps: give enough). The
clock is read after torch.cuda.synchronize(). Peak memory is
torch.cuda.max_memory_allocated on CUDA and the process's peak resident set
size on CPU. `--count-ops` adds aten ops and host syncs per step and per
transition step (spinn/opcount.py); `--profile` (CUDA) adds kernels per step
and the share of wall time the GPU is busy. No MLflow, Prefect, Stanza or DVC
is imported here at load time: the benchmark runs on a bare GPU image.

`run_label_bench` (`spinn bench-label`) times the label stage itself on a file
of sentence pairs: parse, model and end-to-end pairs/s for a given model and
parser, so any machine can measure where labelling spends its time. It
imports the labelling code (and with it Stanza) only when called.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import sys
import time
from collections.abc import Callable
from itertools import cycle, islice
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from spinn.bench.reference import ReferenceSPINN
from spinn.data.example import Example
from spinn.data.pairs import corpus_vocabulary, encode_pairs, read_raw_pairs
from spinn.ground.cores import recheck, torch_threads, usable_cores
from spinn.ground.errors import SpinnError
from spinn.ground.settings import AUTO, Conflict, Settings, ThreadCount
from spinn.inference.infer_step import InferStep
from spinn.model.batch import WIDTH_STEP, Batch, bucket_batches, make_batch, padding_fraction
from spinn.model.config import EncoderKind, EncoderLoop, SPINNConfig, TransitionSource
from spinn.model.loading import resolve_device
from spinn.model.parser_choice import auto_source
from spinn.model.precision import autocast
from spinn.model.spinn import SPINN, random_vectors, spinn_loss
from spinn.opcount import counting
from spinn.training.loader import prefetch
from spinn.training.train_config import check_trainable
from spinn.training.train_step import Schedule, StepOptions, TrainStep, make_optimizer, training_loop

Mode = Literal["train", "infer", "loop"]
Implementation = Literal["fast", "reference"]
LEARNING_RATE = 1e-3  # RMSprop, as the paper; the value does not change the speed
CLIP_NORM = 5.0
LOG_EVERY = 50
"""The loop mode reads its metrics as often as `spinn train` logs them by default."""
COUNTED_STEPS = 2
PROFILED_STEPS = 5
SPEED_VARIANT = "pi"
"""The variant timed unless asked: the one the paper's and the seed article's speed figures are of (the model's
own default, spinn, is PI with the transition classifier on top)."""
TOP_OPS = 8
RSS_UNIT_BYTES = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is KiB on Linux, bytes on macOS


class BenchSettings(Settings):
    """What to time: the model, the batches, the mode and where."""

    corpus: Path
    """SNLI-format .jsonl(.gz) with binary parses, or a prepared .parquet split."""
    pairs: int | None = Field(None, ge=1)
    """Resample the corpus to this many pairs (e.g. 550152 for an SNLI epoch)."""
    variant: Literal["pi-nt", "pi", "spinn", "rl"] = SPEED_VARIANT
    """The model variant."""
    mode: Mode = "train"
    """train: the training step; infer: the inference step; loop: the training loop with its loader."""
    impl: Implementation = "fast"
    """reference: the seed article's per-example stacks, kept only for comparison."""
    encoder: EncoderKind = "fused"
    """The fast model's encoder: fused (the thin stack) or spec, the readable loop it equals (spinn/model/spec.py)."""
    batch_size: int = Field(128, ge=1)
    """Pairs per step."""
    d_hidden: int = Field(300, ge=1)
    """Hidden size."""
    d_tracker: int = Field(64, ge=1)
    """Tracker size."""
    d_embed: int = Field(300, ge=1)
    """Word vector size."""
    steps: int = Field(20, ge=1)
    """Timed steps."""
    warmup: int = Field(3, ge=0)
    """Untimed steps first."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where to run."""
    amp: bool = False
    """bf16 autocast on CUDA, the cells' state in fp32 (spinn.model.precision); the CPU computes in fp32."""
    graphs: bool = True
    """On CUDA, replay each batch shape's step from a CUDA graph."""
    count_ops: bool = False
    """Also count aten ops and host syncs per step of the step as a GPU runs it (any device)."""
    profile: bool = False
    """Also profile kernels per step and the GPU's busy share (CUDA)."""
    threads: ThreadCount = AUTO
    """torch intra-op threads; auto: the rule every command follows (spinn/ground/cores.py: the cores other work leaves
    free, looked at again every second of timing)."""
    seed: int = 0
    """Seeds the weights, the resampling and the batch order."""

    @model_validator(mode="after")
    def _reference_can_run(self) -> BenchSettings:
        """Each conflict blames the option that asks for what cannot run (`--profile`, not `--device`)."""
        if self.impl == "reference" and self.variant == "rl":
            raise Conflict("variant rl has no reference implementation; use the fast one", "impl", "variant")
        if self.impl == "reference" and self.mode == "loop":
            raise Conflict(
                "the loop mode runs the training loop, which has the fast implementation only", "impl", "mode"
            )
        if self.profile and self.device != "cuda":
            raise Conflict(
                "measures GPU kernels, so it needs device cuda (count_ops works anywhere)", "profile", "device"
            )
        return self

    @model_validator(mode="after")
    def _model_fits_in_memory(self) -> BenchSettings:
        """The model's sizes are bounded by the rule `spinn train` follows, before any corpus is read."""
        check_trainable(self.spinn_config(), ("d_hidden", "d_tracker", "d_embed"))
        return self

    def spinn_config(self) -> SPINNConfig:
        """The model the benchmark builds."""
        return SPINNConfig(
            variant=self.variant,
            encoder=self.encoder,
            d_embed=self.d_embed,
            d_hidden=self.d_hidden,
            d_tracker=self.d_tracker,
        )


def run_bench(settings: BenchSettings) -> dict[str, Any]:
    """Run the benchmark and return one flat JSON-ready dict (settings and measurements)."""
    resolve_device(settings.device)
    with torch_threads(settings.threads, where="bench") as decision:
        return {**_run(settings), "threads": decision.threads, "threads_at_end": torch.get_num_threads()}


def _run(settings: BenchSettings) -> dict[str, Any]:
    """run_bench with its threads set."""
    torch.manual_seed(settings.seed)
    examples, vocab_size = load_examples(settings.corpus, settings.pairs, settings.seed, settings.mode != "infer")
    config = settings.spinn_config()
    model = SPINN(config, random_vectors(vocab_size, settings.d_embed, settings.seed)).to(settings.device)
    source = _source(settings, config)
    count = settings.warmup + settings.steps
    host_batches = take_batches(examples, settings.batch_size, count, settings.seed)
    step, batches = _stepper(settings, model, source, examples, host_batches)
    seconds, peak = _time(step, batches, settings.warmup, settings.device)
    timed = host_batches[settings.warmup :]
    timed_pairs = sum(batch.pairs for batch in timed)
    mean_steps = sum(batch.transitions.shape[1] for batch in timed) / len(timed)
    result = {
        "pairs_per_second": timed_pairs / seconds,
        "seconds": seconds,
        "seconds_per_step": seconds / settings.steps,
        "peak_memory_bytes": peak,
        "peak_memory_kind": "cuda_max_memory_allocated" if settings.device == "cuda" else "process_peak_rss",
        "timed_pairs": timed_pairs,
        "mean_transition_steps": mean_steps,
        "mean_padding_fraction": sum(padding_fraction(batch) for batch in timed) / len(timed),
        "transitions": "predicted" if source is TransitionSource.GREEDY else source.value,
        **settings.to_dict(),
        "pairs": len(examples),
        "mlp_layers": config.mlp_layers,
        "mlp_dim": config.mlp_dim,
        "device_name": _device_name(settings.device),
        "torch": torch.__version__,
    }
    again = _repeat(settings, model, source, host_batches[settings.warmup :])
    if settings.count_ops:
        result.update(_count(again, mean_steps))
    if settings.profile:
        result.update(_profile(again, settings.device))
    return result


def _stepper(
    settings: BenchSettings, model: SPINN, source: TransitionSource, examples: list[Example], host_batches: list[Batch]
) -> tuple[Callable[[Any], None], list]:
    """The step to time and what it is called with: device batches, or (loop) index lists for the loader."""
    device = torch.device(settings.device)
    if settings.mode == "loop":
        order = bucket_batches(examples, settings.batch_size, shuffle=True, seed=settings.seed)
        indices = list(islice(cycle(order), settings.warmup + settings.steps))
        return _LoopStep(_train_step(settings, model, settings.graphs), examples, indices, device), indices
    batches = [batch.to(device) for batch in host_batches]
    return _step_of(settings, model, source, settings.graphs), batches


def _step_of(
    settings: BenchSettings, model: SPINN, source: TransitionSource, graphs: bool, loop: EncoderLoop | None = None
) -> Callable[[Batch], Any]:
    """The step of the bench's mode; loop: the training step's encoder loop (None: the device's own)."""
    if settings.impl == "reference":
        return _reference_step(settings, model)
    if settings.mode == "infer":
        return InferStep(model, source=source, amp=settings.amp, graphs=graphs)
    return _train_step(settings, model, graphs, loop)


class _TrainCalls:
    """spinn train's step, numbered as it goes (the schedule needs the step number)."""

    def __init__(self, train: TrainStep):
        self.train, self.count = train, 0

    def __call__(self, batch: Batch) -> None:
        self.train(batch, self.count)
        self.count += 1


def _train_step(settings: BenchSettings, model: SPINN, graphs: bool, loop: EncoderLoop | None = None) -> _TrainCalls:
    device = torch.device(settings.device)
    schedule = Schedule(base=LEARNING_RATE, decay=1.0, decay_steps=1)
    optimizer = make_optimizer(model, schedule, 0.0, device)
    return _TrainCalls(TrainStep(model, optimizer, schedule, StepOptions(CLIP_NORM, settings.amp, graphs, loop)))


class _LoopStep:
    """The training loop as `spinn train` runs it: the loader thread makes each batch as it falls due, and
    the metrics are read (the loop's one sync) every LOG_EVERY steps. One call per index list, in order."""

    def __init__(self, calls: _TrainCalls, examples: list[Example], order: list, device: torch.device):
        self.calls = calls
        self.batches = prefetch(examples, order, device)

    def __call__(self, _indices: list[int]) -> None:
        self.calls(next(self.batches))
        if self.calls.count % LOG_EVERY == 0:
            self.calls.train.metrics.read()


def _repeat(
    settings: BenchSettings, model: SPINN, source: TransitionSource, host_batches: list[Batch]
) -> Callable[[int], None]:
    """Run n more steps of the timed kind, eagerly (ops are counted, kernels profiled, as launched), training as
    on a GPU (its encoder loop): the count is what a GPU launches, whichever device counts it."""
    batches = [batch.to(settings.device) for batch in host_batches]
    loop = training_loop(model.config, torch.device("cuda"))
    step = _step_of(settings, model, source, graphs=settings.graphs and settings.profile, loop=loop)

    def run(count: int) -> None:
        for batch in islice(cycle(batches), count):
            step(batch)
        _synchronize(settings.device)

    run(1)  # lazy state first: optimizer buffers, a graph's capture
    return run


def _count(run: Callable[[int], None], mean_steps: float) -> dict[str, Any]:
    with counting() as count:
        run(COUNTED_STEPS)
    per_step = count.total / COUNTED_STEPS
    return {
        "ops_per_step": per_step,
        "ops_per_transition_step": per_step / mean_steps,
        "syncs_per_step": count.syncs / COUNTED_STEPS,
        "sync_ops": count.sync_ops(),
        "top_ops": count.ops.most_common(TOP_OPS),
    }


def _profile(run: Callable[[int], None], device: str) -> dict[str, Any]:
    """Kernels launched per step, and the share of the steps' wall time some kernel was running."""
    from torch.profiler import ProfilerActivity, profile

    run(PROFILED_STEPS)  # graphs captured and warm before the profile
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        run(PROFILED_STEPS)
    wall_us = (time.perf_counter() - start) * 1e6
    kernels = [event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = _union_length([(event.time_range.start, event.time_range.end) for event in kernels])
    return {
        "kernels_per_step": len(kernels) / PROFILED_STEPS,
        "gpu_busy_us_per_step": busy_us / PROFILED_STEPS,
        "gpu_busy_share": busy_us / wall_us,
        "profiled_device": torch.cuda.get_device_name(torch.device(device)),
    }


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by intervals (overlapping kernels on several streams count once)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def _reference_step(settings: BenchSettings, model: SPINN) -> Callable[[Batch], None]:
    """The seed article's algorithm with the same weights: a plain eager step."""
    runner = ReferenceSPINN(model)
    if settings.mode == "infer":
        model.eval()

        def infer(batch: Batch) -> None:
            with torch.no_grad(), autocast(torch.device(settings.device), settings.amp):
                runner(batch, source=TransitionSource.GOLD)

        return infer
    model.train()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=LEARNING_RATE)

    def train(batch: Batch) -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(torch.device(settings.device), settings.amp):
            loss = spinn_loss(runner(batch, source=TransitionSource.GOLD), batch, model.config).total
        loss.backward()
        optimizer.step()

    return train


def _source(settings: BenchSettings, config: SPINNConfig) -> TransitionSource:
    """What the timed steps run on: the reference only knows gold; inference by spinn and rl takes their
    own best trees, as labelling without a parser does; training is the training step's."""
    if settings.impl == "reference":
        return TransitionSource.GOLD
    if settings.mode == "infer":
        return auto_source(config)
    return config.training_source


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
    """The first `count` length-bucketed batches as training makes them, cycling through the epoch."""
    order = bucket_batches(examples, batch_size, shuffle=True, seed=seed)
    return [
        make_batch([examples[i] for i in indices], width_step=WIDTH_STEP) for indices in islice(cycle(order), count)
    ]


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
        recheck()  # auto threads follow the free cores, as in `spinn train`
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


# ----------------------------------------------------------------------------- the label stage


def run_label_bench(input_path: Path, model: str | Path, settings: Any = None) -> dict[str, Any]:
    """Label `input_path` with `spinn label`'s own stage into a temporary folder and return its speeds:
    parse, model and end-to-end pairs/s (end to end: from before the model and the parser load to the
    merged output, in this process). `settings`: LabelSettings; without a parse cache unless it names
    one, so the parser really runs. The labelling code, Stanza and MLflow load only here."""
    import tempfile

    from spinn.labeling.label import label
    from spinn.labeling.label_settings import LabelSettings
    from spinn.parsing.parser_settings import decided

    settings = settings or LabelSettings().replace(parsing={"cache_path": None})
    with tempfile.TemporaryDirectory(prefix="spinn-bench-label-") as folder:
        summary = label(Path(input_path), model, Path(folder) / "labels.parquet", settings)
    parsing = decided(settings.parsing).replace(workers=summary.parser_workers)  # what ran, auto decided
    used = settings.replace(parsing=parsing.to_dict(), threads=summary.model_threads)
    return {
        "parse_pairs_per_second": summary.parse_pairs_per_second,
        "model_pairs_per_second": summary.model_pairs_per_second,
        "pairs_per_second": summary.pairs_per_second,
        "seconds": summary.seconds,
        "cpu_seconds": _cpu_seconds(),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * RSS_UNIT_BYTES,
        "parse_seconds": summary.parse_seconds,
        "model_seconds": summary.model_seconds,
        "rows": summary.rows,
        "labelled": summary.labelled,
        "rejected": summary.rejected,
        "shards": summary.shards,
        "input": str(input_path),
        "model": summary.model,
        "parser": summary.parser,
        **used.to_dict(),
        "device_name": _device_name("cuda" if torch.cuda.is_available() and settings.device != "cpu" else "cpu"),
        "cpus": usable_cores(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
    }


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process so far: on a shared machine, steadier than wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
