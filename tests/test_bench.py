"""Tests for spinn.bench: run_bench measures what it says, on tiny corpora and tiny models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spinn.bench import BenchSettings, run_bench
from spinn.ground.cores import FREE_CORES_VARIABLE
from spinn.ground.errors import SpinnError
from spinn.trees.transitions import read_binary_parse
from tests.helpers import TINY_EMBED, TINY_MODEL

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "d_hidden": TINY_MODEL["d_hidden"],
    "d_tracker": TINY_MODEL["d_tracker"],
    "d_embed": TINY_EMBED,
    "batch_size": 5,
    "steps": 2,
    "warmup": 1,
}
"""The tiny model's widths, a batch of the whole corpus."""
PARSES = [
    ("( ( A dog ) ( runs . ) )", "( ( An animal ) moves )", "entailment"),
    ("( ( Two cats ) ( sleep ( on ( a mat ) ) ) )", "( Cats sleep )", "neutral"),
    ("( A ( man ( eats food ) ) )", "( Nobody eats )", "contradiction"),
    ("( ( The kids ) play )", "Kids", "entailment"),
    ("( ( A woman ) ( ( is singing ) . ) )", "( ( A person ) sings )", "entailment"),
]
SETTINGS_ECHOED = (
    "variant",
    "mode",
    "batch_size",
    "d_hidden",
    "d_tracker",
    "d_embed",
    "steps",
    "warmup",
    "device",
    "impl",
    "amp",
    "seed",
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A five-pair SNLI-format file written by hand (binary parses and plain sentences)."""
    path = tmp_path / "snli_1.0_dev.jsonl"
    lines = []
    for number, (premise, hypothesis, label) in enumerate(PARSES):
        lines.append(
            json.dumps(
                {
                    "gold_label": label,
                    "pairID": f"pair{number}",
                    "sentence1": " ".join(read_binary_parse(premise)[0]),
                    "sentence1_binary_parse": premise,
                    "sentence2": " ".join(read_binary_parse(hypothesis)[0]),
                    "sentence2_binary_parse": hypothesis,
                }
            )
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def bench(corpus: Path, **settings) -> dict:
    """run_bench on settings validated as the CLI validates them (a problem is a SpinnError)."""
    return run_bench(BenchSettings.build({"corpus": corpus, **settings}))


def test_reports_measurements_and_echoes_settings(corpus, monkeypatch):
    monkeypatch.setenv(FREE_CORES_VARIABLE, "1")  # auto on one free core
    result = bench(corpus, **TINY)
    assert result["pairs_per_second"] > 0 and result["seconds"] > 0
    assert result["peak_memory_bytes"] > 10_000_000 and result["peak_memory_kind"] == "process_peak_rss"
    assert result["timed_pairs"] == TINY["steps"] * TINY["batch_size"]
    assert result["pairs_per_second"] == pytest.approx(result["timed_pairs"] / result["seconds"])
    assert result["pairs"] == len(PARSES)
    assert result["threads"] == result["threads_at_end"] == 1
    assert result["transitions"] == "gold"
    for name in SETTINGS_ECHOED:
        assert (
            result[name]
            == {
                **TINY,
                "variant": "pi",
                "mode": "train",
                "device": "cpu",
                "impl": "fast",
                "amp": False,
                "seed": 0,
            }[name]
        ), name
    json.dumps(result)


@pytest.mark.parametrize("variant", ["pi-nt", "pi", "spinn"])
@pytest.mark.parametrize("mode", ["train", "infer", "loop"])
@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_every_combination_runs(corpus, variant, mode, impl):
    if mode == "loop" and impl == "reference":
        pytest.skip("the loop runs the fast implementation only")
    result = bench(corpus, variant=variant, mode=mode, impl=impl, **TINY)
    assert result["pairs_per_second"] > 0
    predicted = variant == "spinn" and mode == "infer" and impl == "fast"
    assert result["transitions"] == ("predicted" if predicted else "gold")


@pytest.mark.parametrize("variant", ["spinn", "rl"])
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_the_spec_encoder_times_on_the_sources_of_the_fused_one(corpus, variant, mode):
    result = bench(corpus, variant=variant, mode=mode, encoder="spec", **TINY)
    assert result["pairs_per_second"] > 0 and result["encoder"] == "spec"
    expected = {"infer": "predicted", "train": "sampled" if variant == "rl" else "gold"}[mode]
    assert result["transitions"] == expected


def test_resamples_to_the_requested_number_of_pairs(corpus):
    result = bench(corpus, pairs=40, **{**TINY, "batch_size": 8, "steps": 6})
    assert result["pairs"] == 40
    assert result["timed_pairs"] == 48  # 5 batches per epoch; the steps cycle into the next one


def test_threads_option_is_reported_and_restored(corpus):
    before = torch.get_num_threads()
    assert bench(corpus, threads=2, **TINY)["threads"] == 2
    assert torch.get_num_threads() == before


def test_amp_is_accepted_on_the_cpu(corpus):
    """--amp on the CPU runs (in fp32 there: spinn.model.precision) and is reported as asked."""
    assert bench(corpus, amp=True, **TINY)["amp"] is True


def test_reads_a_prepared_parquet_split(corpus, tmp_path):
    from spinn.data.prepare import prepare

    prepared = prepare(corpus, tmp_path / "prepared").output
    assert bench(prepared, **TINY)["pairs"] == len(PARSES)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"mode": "fit"}, "mode: must be 'train', 'infer' or 'loop'"),
        ({"mode": "loop", "impl": "reference"}, "the loop mode runs the training loop"),
        ({"profile": True}, "profile: measures GPU kernels, so it needs device cuda"),
        ({"impl": "slow"}, "impl: must be 'fast' or 'reference'"),
        ({"device": "tpu"}, "device: must be 'cpu' or 'cuda'"),
        ({"steps": 0}, "steps: must be at least 1"),
        ({"pairs": 0}, "pairs: must be at least 1"),
        ({"threads": 0}, "threads: must be at least 1"),
        ({"variant": "rnn"}, "variant: must be"),
        ({"variant": "rl", "impl": "reference"}, "variant rl has no reference implementation"),
    ],
)
def test_bad_options_are_user_errors(corpus, options, message):
    with pytest.raises(SpinnError, match=message):
        bench(corpus, **{**TINY, **options})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_cuda_without_a_gpu_is_a_user_error(corpus):
    with pytest.raises(SpinnError, match="no CUDA"):
        bench(corpus, device="cuda", **TINY)


def test_missing_corpus_is_a_user_error(tmp_path):
    with pytest.raises(SpinnError, match="no such file"):
        bench(tmp_path / "nothing.jsonl", **TINY)


def test_real_dev_trees(snli_dev, tmp_path):
    result = bench(snli_dev, **{**TINY, "batch_size": 32})
    assert result["pairs"] == 10_000 - 158
    assert 0 < result["mean_padding_fraction"] < 0.5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_run_reports_cuda_memory(corpus):
    result = bench(corpus, device="cuda", amp=True, **TINY)
    assert result["peak_memory_kind"] == "cuda_max_memory_allocated" and result["peak_memory_bytes"] > 0


def test_counts_ops_and_syncs_per_step(corpus):
    """The CPU-measurable proxy for GPU speed, printed by the bench on any machine."""
    result = bench(corpus, variant="spinn", count_ops=True, **TINY)
    assert result["syncs_per_step"] == 0 and result["sync_ops"] == {}
    assert 0 < result["ops_per_transition_step"] < result["ops_per_step"]
    assert result["ops_per_step"] == pytest.approx(result["ops_per_transition_step"] * result["mean_transition_steps"])
    assert [name for name, _ in result["top_ops"]]
    json.dumps(result)


def test_cli_count_ops_line(corpus):
    from click.testing import CliRunner

    from spinn.cli import main

    options = [f"--{key.replace('_', '-')}={value}" for key, value in TINY.items()]
    result = CliRunner().invoke(main, ["bench", "--corpus", str(corpus), "--count-ops", *options])
    assert result.exit_code == 0, result.output
    assert "aten ops per transition step" in result.output and "host syncs per step" in result.output


# ----------------------------------------------------------------------------- bench-label

RELEASE = ROOT / "tests" / "fixtures" / "release-0.1.0"


def test_label_bench_reports_parse_model_and_end_to_end_speeds(monkeypatch):
    """The model builds its own trees here (no Stanza): the stage runs and every speed is a number."""
    from spinn.bench import run_label_bench
    from spinn.ground.cores import FREE_CORES_VARIABLE, usable_cores
    from spinn.labeling.label_settings import LabelSettings

    monkeypatch.setenv(FREE_CORES_VARIABLE, str(usable_cores()))  # idle cores
    settings = LabelSettings(parser="model", device="cpu").replace(parsing={"cache_path": None})
    result = run_label_bench(RELEASE / "pairs.parquet", RELEASE / "checkpoint.pt", settings)
    assert result["rows"] == result["labelled"] == 24 and result["parser"] == "model"
    for key in ("parse_pairs_per_second", "model_pairs_per_second", "pairs_per_second"):
        assert result[key] > 0
    assert result["pairs_per_second"] == pytest.approx(24 / result["seconds"])
    assert result["parsing"]["workers"] == 1 and result["int8"] is False
    assert result["threads"] == usable_cores()  # auto on idle cores: nothing else parses beside the model
    assert 0 < result["cpu_seconds"] and result["peak_rss_bytes"] > 2**20  # the process's own, start-up included


def test_bench_label_command_prints_one_line_or_json():
    from click.testing import CliRunner

    from spinn.cli import main

    arguments = ["bench-label", str(RELEASE / "pairs.parquet"), "--model", str(RELEASE / "checkpoint.pt")]
    arguments += ["--parser", "model", "--device", "cpu"]
    line = CliRunner().invoke(main, arguments)
    assert line.exit_code == 0, line.output
    assert "24 pairs (24 labelled)" in line.output and "end to end" in line.output and "peak RSS" in line.output
    as_json = CliRunner().invoke(main, [*arguments, "--json"])
    assert json.loads(as_json.output.strip().splitlines()[-1])["parsing"]["cache_path"] is None


def test_the_benchmark_module_loads_no_stanza_mlflow_or_prefect():
    heavy = "{'stanza', 'mlflow', 'prefect'}"
    code = f"import sys, spinn.bench, spinn.cli.benchmark; print(sorted({heavy} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
