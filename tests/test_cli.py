"""The `spinn` console command, run as a user runs it: a real subprocess."""

from __future__ import annotations

import json

import pytest

from tests.helpers import spinn

pytestmark = pytest.mark.integration


def test_help_lists_the_stages():
    result = spinn("--help")
    assert result.returncode == 0
    for stage in ("download", "prepare", "vocab", "check-binarization", "bench"):
        assert stage in result.stdout


def test_check_binarization_last_line(snli_dev):
    result = spinn("check-binarization", str(snli_dev))
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last == "agreement 1.0000 (20000/20000)"


def test_prepare_then_vocab(snli_train_sample, tmp_path):
    result = spinn("prepare", str(snli_train_sample), "--output-dir", str(tmp_path), "--split", "train")
    assert result.returncode == 0, result.stderr
    assert "read 1024  written" in result.stdout
    result = spinn("vocab", str(tmp_path / "train.parquet"), "--min-freq", "2")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "vocab.json").read_text())["min_freq"] == 2


def test_user_errors_are_one_line_with_exit_status_1(tmp_path):
    result = spinn("prepare", str(tmp_path / "missing.jsonl"), "--output-dir", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: {tmp_path / 'missing.jsonl'}: no such file"


def test_too_many_rejects_prints_the_summary_then_fails(tmp_path):
    bad = tmp_path / "dev.jsonl"
    bad.write_text("not json\n")
    result = spinn("prepare", str(bad), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "rejected malformed_json: 1" in result.stdout
    assert "more than max_reject_ratio" in result.stderr


def test_download_from_a_local_file_with_checksum_override(tmp_path):
    import hashlib
    import zipfile

    archive = tmp_path / "copy.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("snli_1.0/snli_1.0_dev.jsonl", "{}\n")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    raw = tmp_path / "raw"
    result = spinn("download", "snli", "--raw-dir", str(raw), "--file", str(archive), "--checksum", f"sha256:{digest}")
    assert result.returncode == 0, result.stderr
    assert (raw / "snli_1.0" / "snli_1.0_dev.jsonl").read_text() == "{}\n"
    result = spinn("download", "snli", "--raw-dir", str(raw / "again"), "--file", str(archive))
    assert result.returncode == 1
    assert "sha256 mismatch: expected afb3d70a" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.strip().endswith(f"not the official one), give --checksum sha256:{digest}")


@pytest.mark.parametrize("command", ["label", "parse"])
def test_a_missing_input_is_reported_before_any_model_or_parser_is_fetched(command, tmp_path):
    """No --stanza-dir and a model URI no store holds: the misspelt INPUT is still what the user hears about."""
    options = ["--model", "models:/spinn@champion", "--output", "o.parquet"] if command == "label" else []
    result = spinn(command, "nope.csv", *options, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr == "error: nope.csv: no such file\n"


@pytest.mark.slow
def test_prepare_real_test(snli_test, tmp_path):
    """The real test split through the command; dev's is test_prepare's test_real_snli_dev, in-process."""
    result = spinn("prepare", str(snli_test), "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == ["test.parquet"]


def test_bench_prints_one_json_line(snli_dev):
    result = spinn(
        "bench",
        "--corpus",
        str(snli_dev),
        "--variant",
        "spinn",
        "--mode",
        "infer",
        "--batch-size",
        "8",
        "--d-hidden",
        "16",
        "--d-tracker",
        "8",
        "--d-embed",
        "16",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.strip().splitlines()
    report = json.loads(line)
    assert report["pairs_per_second"] > 0 and report["peak_memory_bytes"] > 0
    assert (report["variant"], report["mode"], report["batch_size"], report["d_hidden"]) == ("spinn", "infer", 8, 16)


def test_old_option_spellings_still_work_with_a_warning(snli_train_sample, tmp_path):
    """--output for a folder became --output-dir, and `spinn trees --input` a positional INPUT: one release
    of grace, with a warning that names the new spelling."""
    result = spinn("prepare", str(snli_train_sample), "--output", str(tmp_path), "--split", "train")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "train.parquet").is_file()
    assert "warning: --output is deprecated and goes in 0.3; use --output-dir" in result.stderr
    missing = spinn("trees", "--input", str(tmp_path / "none.txt"), "--model", "m.pt", "--output", "t.txt")
    assert "warning: --input is deprecated" in missing.stderr and "error:" in missing.stderr
    neither = spinn("trees", "--model", "m.pt", "--output", "t.txt")
    assert neither.returncode == 2 and "error: missing argument 'INPUT'" in neither.stderr
