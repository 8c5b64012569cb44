"""Tests for spinn.bench: run_bench measures what it says, on tiny corpora and tiny models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spinn.bench import run_bench
from spinn.errors import SpinnError
from spinn.transitions import read_binary_parse

ROOT = Path(__file__).resolve().parents[1]
SNLI_DEV = ROOT.parent / "shared" / "data" / "snli" / "snli_1.0_dev.jsonl.gz"
GPU_SCRIPT = ROOT / "scripts" / "gpu_bench.sh"
TINY = dict(d_hidden=8, d_tracker=4, d_embed=6, batch_size=5, steps=2, warmup=1)  # batch = the whole corpus
PARSES = [
    ("( ( A dog ) ( runs . ) )", "( ( An animal ) moves )", "entailment"),
    ("( ( Two cats ) ( sleep ( on ( a mat ) ) ) )", "( Cats sleep )", "neutral"),
    ("( A ( man ( eats food ) ) )", "( Nobody eats )", "contradiction"),
    ("( ( The kids ) play )", "Kids", "entailment"),
    ("( ( A woman ) ( ( is singing ) . ) )", "( ( A person ) sings )", "entailment"),
]
SETTINGS_ECHOED = ("variant", "mode", "batch_size", "d_hidden", "d_tracker", "d_embed", "steps", "warmup", "device",
                   "impl", "compose", "amp", "compile", "seed")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A five-pair SNLI-format file written by hand (binary parses and plain sentences)."""
    path = tmp_path / "snli_1.0_dev.jsonl"
    lines = []
    for number, (premise, hypothesis, label) in enumerate(PARSES):
        lines.append(json.dumps({
            "gold_label": label, "pairID": f"pair{number}",
            "sentence1": " ".join(read_binary_parse(premise)[0]), "sentence1_binary_parse": premise,
            "sentence2": " ".join(read_binary_parse(hypothesis)[0]), "sentence2_binary_parse": hypothesis,
        }))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_reports_measurements_and_echoes_settings(corpus):
    result = run_bench(corpus, **TINY)
    assert result["pairs_per_second"] > 0 and result["seconds"] > 0
    assert result["peak_memory_bytes"] > 10_000_000 and result["peak_memory_kind"] == "process_peak_rss"
    assert result["timed_pairs"] == TINY["steps"] * TINY["batch_size"]
    assert result["pairs_per_second"] == pytest.approx(result["timed_pairs"] / result["seconds"])
    assert result["pairs"] == len(PARSES)
    assert result["threads"] == torch.get_num_threads()
    assert result["transitions"] == "gold"
    for name in SETTINGS_ECHOED:
        assert result[name] == {**TINY, "variant": "pi", "mode": "train", "device": "cpu", "impl": "fast",
                                "compose": "needed", "amp": False, "compile": False, "seed": 0}[name], name
    json.dumps(result)


@pytest.mark.parametrize("variant", ["pi-nt", "pi", "spinn"])
@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("impl, compose", [("fast", "needed"), ("fast", "all"), ("reference", "needed")])
def test_every_combination_runs(corpus, variant, mode, impl, compose):
    result = run_bench(corpus, variant=variant, mode=mode, impl=impl, compose=compose, **TINY)
    assert result["pairs_per_second"] > 0
    predicted = variant == "spinn" and mode == "infer" and impl == "fast"
    assert result["transitions"] == ("predicted" if predicted else "gold")


def test_resamples_to_the_requested_number_of_pairs(corpus):
    result = run_bench(corpus, pairs=40, **{**TINY, "batch_size": 8, "steps": 6})
    assert result["pairs"] == 40
    assert result["timed_pairs"] == 48  # 5 batches per epoch; the steps cycle into the next one


def test_threads_option_is_reported_and_restored(corpus):
    before = torch.get_num_threads()
    assert run_bench(corpus, threads=2, **TINY)["threads"] == 2
    assert torch.get_num_threads() == before


def test_bf16_autocast_runs_on_cpu(corpus):
    assert run_bench(corpus, amp=True, **TINY)["amp"] is True


def test_reads_a_prepared_parquet_split(corpus, tmp_path):
    from spinn.prepare import prepare

    prepared = prepare(corpus, tmp_path / "prepared").output
    assert run_bench(prepared, **TINY)["pairs"] == len(PARSES)


@pytest.mark.parametrize("options, message", [
    ({"mode": "fit"}, "--mode"), ({"impl": "slow"}, "--impl"), ({"device": "tpu"}, "--device"),
    ({"steps": 0}, "--steps"), ({"pairs": 0}, "--pairs"), ({"threads": 0}, "--threads"),
    ({"variant": "rnn"}, "variant"), ({"variant": "rl", "impl": "reference"}, "reference"),
    ({"compose": "some"}, "compose"),
    ({"impl": "reference", "compose": "all"}, "--compose all applies to --impl fast"),
])
def test_bad_options_are_user_errors(corpus, options, message):
    with pytest.raises(SpinnError, match=message):
        run_bench(corpus, **{**TINY, **options})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_cuda_without_a_gpu_is_a_user_error(corpus):
    with pytest.raises(SpinnError, match="no CUDA"):
        run_bench(corpus, device="cuda", **TINY)


def test_missing_corpus_is_a_user_error(tmp_path):
    with pytest.raises(SpinnError, match="no such file"):
        run_bench(tmp_path / "nothing.jsonl", **TINY)


@pytest.mark.skipif(not SNLI_DEV.exists(), reason=f"real SNLI dev split not found at {SNLI_DEV}")
def test_real_dev_trees(tmp_path):
    result = run_bench(SNLI_DEV, **{**TINY, "batch_size": 32})
    assert result["pairs"] == 10_000 - 158
    assert 0 < result["mean_padding_fraction"] < 0.5


def test_gpu_script_is_one_runnable_command():
    assert os.access(GPU_SCRIPT, os.X_OK)
    assert subprocess.run(["bash", "-n", str(GPU_SCRIPT)], check=False).returncode == 0
    text = GPU_SCRIPT.read_text()
    for setting in ("550152", "BATCH:-256", 'variant="pi"', "d_hidden=300", '"reference"', '"infer"', '"train"'):
        assert setting in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_gpu_script_says_why_it_stops_without_cuda(tmp_path):
    environment = {**os.environ, "PYTHON": sys.executable}
    finished = subprocess.run([str(GPU_SCRIPT)], capture_output=True, text=True, env=environment, check=False)
    assert finished.returncode != 0
    assert "no CUDA device" in finished.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_run_reports_cuda_memory(corpus):
    result = run_bench(corpus, device="cuda", amp=True, **TINY)
    assert result["peak_memory_kind"] == "cuda_max_memory_allocated" and result["peak_memory_bytes"] > 0
