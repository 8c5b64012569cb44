"""One clear line per failure: what a user can fix is said in one `error: ...` line naming the file, exit 1.

Each case runs the `spinn` command: as a real subprocess where the failure can
be made real (a read-only folder, a damaged file), and in-process with
click's runner where it has to be simulated (a full disk: the writer is made
to raise ENOSPC) or is a refusal of the arguments alone (an output over an
input: a child process would only add seconds of imports).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from spinn.cli import main
from spinn.labeling.shard_plan import parts_folder
from tests.helpers import CLI_TIMEOUT_S, one_error_line, smoke_pairs, snli_line, tiny_train_arguments, write_rows

pytestmark = pytest.mark.integration

READ_ONLY = 0o555
FAILING_RUN_SHARDS = 6
NO_OVERRIDE_CAPABILITIES = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
"""Root writes into any folder: the command runs without the capabilities that let it, so modes count."""


def spinn(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`spinn ARGS` as a user runs it; as root, without the power to ignore a folder's mode."""
    command = [str(Path(sys.executable).with_name("spinn")), *args]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: a read-only folder cannot be made")
        command = NO_OVERRIDE_CAPABILITIES + command
    environment = {**os.environ, **(env or {})}
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=environment, timeout=CLI_TIMEOUT_S)


@pytest.fixture
def read_only(tmp_path) -> Path:
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(READ_ONLY)
    yield folder
    folder.chmod(0o755)


# ----------------------------------------------------------------------------- folders we may not write


def test_prepare_into_a_read_only_folder(tmp_path, read_only):
    source = tmp_path / "train.jsonl"
    source.write_text(snli_line("p1") + "\n")
    result = spinn("prepare", str(source), "--output-dir", str(read_only))
    assert result.returncode == 1
    assert f"{read_only}/train." in one_error_line(result.stderr) and "Permission denied" in result.stderr


def test_label_into_a_read_only_folder(smoke_model, tmp_path, read_only):
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 3))
    output = read_only / "out.parquet"
    result = spinn("label", str(source), "--model", str(smoke_model.checkpoint), "--output", str(output))
    assert result.returncode == 1
    assert str(output) in one_error_line(result.stderr) and "Permission denied" in result.stderr


def test_train_with_a_read_only_mlflow_store(smoke_model, tmp_path):
    store = tmp_path / "mlflow.db"
    shutil.copyfile(smoke_model.tracking_uri.removeprefix("sqlite:///"), store)
    store.chmod(0o444)
    prepared = smoke_model.prepared
    result = spinn(
        "train",
        "--train",
        str(prepared / "train.parquet"),
        "--dev",
        str(prepared / "dev.parquet"),
        "--embeddings-dir",
        str(prepared.parent / "embeddings"),
        "--output-dir",
        str(tmp_path / "models"),
        "--set",
        "max_steps=1",
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{store}"},
    )
    assert result.returncode == 1
    assert one_error_line(result.stderr).startswith(f"error: {store}: the MLflow store is read-only here")


# ----------------------------------------------------------------------------- a full disk


def disk_full(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_label_on_a_full_disk(smoke_model, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setattr(pq, "write_table", disk_full)
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 3))
    output = tmp_path / "out.parquet"
    arguments = ["label", str(source), "--model", str(smoke_model.checkpoint), "--output", str(output)]
    result = CliRunner().invoke(main, [*arguments, "--parser", "model"])
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert line.startswith("error: no space left on ") and f"writing {parts_folder(output)}/input-00000.parquet" in line


def test_train_on_a_full_disk(smoke_model, tmp_path, monkeypatch, mlflow_store):
    import torch

    earlier = tmp_path / "models"
    earlier.mkdir()
    monkeypatch.setattr(torch, "save", disk_full)
    result = CliRunner().invoke(main, tiny_train_arguments(smoke_model.prepared, earlier, "max_steps=2"))
    assert result.exit_code == 1, result.output
    line = one_error_line(result.stderr)
    assert line.startswith("error: no space left on ") and re.search(rf"writing {earlier}/(last|best)\.pt$", line)
    assert not list(earlier.glob("*.pt")) and not list(earlier.glob(".*.tmp"))


# ----------------------------------------------------------------------------- outputs that would destroy inputs


def label_args(source: Path, smoke_model, output: str) -> list[str]:
    return ["label", str(source), "--model", str(smoke_model.checkpoint), "--output", output, "--parser", "model"]


@pytest.mark.parametrize(("suffix", "refused"), [(".csv", "--output writes .parquet"), (".parquet", "is the input")])
def test_label_refuses_to_write_over_its_input(smoke_model, tmp_path, suffix, refused):
    """A CSV input never gets that far: label's output is Parquet, so its name must end .parquet."""
    source = write_rows(tmp_path / f"pairs{suffix}", smoke_pairs(smoke_model, 3))
    before = source.read_bytes()
    result = CliRunner().invoke(main, label_args(source, smoke_model, str(source)))
    assert result.exit_code == 1
    assert f"{source}: {refused}" in one_error_line(result.stderr)
    assert source.read_bytes() == before and not parts_folder(source).exists()


def test_label_refuses_a_rejects_file_over_its_input(smoke_model, tmp_path):
    """`--output pairs.parquet` writes pairs.rejects.jsonl beside it, which here is the input."""
    source = write_rows(tmp_path / "pairs.rejects.jsonl", smoke_pairs(smoke_model, 3))
    before = source.read_bytes()
    result = CliRunner().invoke(main, label_args(source, smoke_model, str(tmp_path / "pairs.parquet")))
    assert result.exit_code == 1
    assert f"{source}: is the input" in one_error_line(result.stderr) and source.read_bytes() == before


def test_label_refuses_to_write_over_its_model_or_parse_cache(smoke_model, tmp_path):
    """Files named as label's output is (.parquet), so that the name alone does not refuse them."""
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 3))
    model = tmp_path / "model.parquet"
    shutil.copyfile(smoke_model.checkpoint, model)
    result = CliRunner().invoke(
        main, ["label", str(source), "--model", str(model), "--output", str(model), "--parser", "model"]
    )
    assert result.exit_code == 1 and f"{model}: is the input" in one_error_line(result.stderr)
    cache = tmp_path / "parses.parquet"
    cache.write_bytes(b"")
    result = CliRunner().invoke(main, [*label_args(source, smoke_model, str(cache)), "--parse-cache", str(cache)])
    assert result.exit_code == 1 and f"{cache}: is the input" in one_error_line(result.stderr)


@pytest.mark.parametrize("spelling", ["existing folder", "trailing slash"])
def test_label_refuses_a_folder_as_output_before_any_work(smoke_model, tmp_path, spelling):
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 3))
    folder = tmp_path / "labelled"
    if spelling == "existing folder":
        folder.mkdir()
    output = str(folder) + ("/" if spelling == "trailing slash" else "")
    result = CliRunner().invoke(main, label_args(source, smoke_model, output))
    assert result.exit_code == 1
    assert f"{output}: names a folder; --output is the predictions file" in one_error_line(result.stderr)
    assert not parts_folder(folder).exists()


# ----------------------------------------------------------------------------- what a failed run leaves


def test_a_failed_label_run_says_what_it_left_in_the_parts_folder(smoke_model, tmp_path, monkeypatch):
    """The disk fills while the third shard's labels are written: two finished shards stay for a rerun."""
    import pyarrow.parquet as pq

    write_table, label_files = pq.write_table, []

    def fills_up(table, where, *args, **kwargs):
        label_files.append(where)
        if len(label_files) > FAILING_RUN_SHARDS + 2:  # the plan writes every shard's input, then the labels come
            disk_full()
        write_table(table, where, *args, **kwargs)

    monkeypatch.setattr(pq, "write_table", fills_up)
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 2 * FAILING_RUN_SHARDS))
    output = tmp_path / "out.parquet"
    result = CliRunner().invoke(main, [*label_args(source, smoke_model, str(output)), "--shard-size", "2"])
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert line.startswith("error: no space left on ")
    assert line.endswith(
        f"; {parts_folder(output)} keeps the plan and 2 of {FAILING_RUN_SHARDS} labelled shards: "
        "rerun the same command to go on from there, or delete the folder"
    )


def test_a_label_run_that_fails_before_its_plan_leaves_no_parts_folder(smoke_model, tmp_path):
    source = tmp_path / "pairs.csv"
    source.write_text("id,text\n1,A dog runs.\n", encoding="utf-8")
    output = tmp_path / "out.parquet"
    result = CliRunner().invoke(main, label_args(source, smoke_model, str(output)))
    assert result.exit_code == 1 and "premise" in one_error_line(result.stderr)
    assert not parts_folder(output).exists()


# ----------------------------------------------------------------------------- inputs that are not what they say


def test_prepare_a_gzip_file_that_is_not_gzip(tmp_path):
    source = tmp_path / "dev.jsonl.gz"
    source.write_bytes(b"this was never compressed\n")
    result = spinn("prepare", str(source), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 1 and one_error_line(result.stderr).startswith(f"error: {source}: damaged gzip data")


def test_prepare_a_truncated_gzip_file(tmp_path):
    import gzip

    whole = gzip.compress("".join(snli_line(f"p{i}") + "\n" for i in range(200)).encode())
    source = tmp_path / "dev.jsonl.gz"
    source.write_bytes(whole[: len(whole) // 2])
    result = spinn("prepare", str(source), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 1
    assert one_error_line(result.stderr).startswith(f"error: {source}: the gzip data ends early (a truncated file?)")
    assert not (tmp_path / "out" / "dev.parquet").exists()


def test_prepare_a_folder(tmp_path):
    folder = tmp_path / "dev.jsonl"
    folder.mkdir()
    result = spinn("prepare", str(folder), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 1
    assert one_error_line(result.stderr) == f"error: {folder}: is a folder, not a corpus file"


# ----------------------------------------------------------------------------- corpora the model cannot read

NONSENSE = "Zorbly quaxes frindle gloop ."
"""Words no vocabulary built from English captions holds (the final stop is in every one)."""


def one_warning_line(stderr: str) -> str:
    warnings = [line for line in stderr.strip().splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "Traceback" not in stderr, stderr
    return warnings[0]


def test_label_warns_of_a_corpus_mostly_out_of_vocabulary_and_reports_the_share(smoke_model, tmp_path):
    rows = [{"id": f"n{i}", "premise": NONSENSE, "hypothesis": NONSENSE} for i in range(4)]
    source = write_rows(tmp_path / "pairs.csv", rows)
    result = CliRunner().invoke(main, label_args(source, smoke_model, str(tmp_path / "out.parquet")))
    assert result.exit_code == 0, result.output
    assert one_warning_line(result.stderr).startswith(f"warning: {source}: 80% of its tokens are not in the model")
    assert "out of the model's vocabulary: 80.0% of tokens" in result.stdout


def test_label_of_a_known_corpus_reports_its_share_without_warning(smoke_model, tmp_path):
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, 4))
    result = CliRunner().invoke(main, label_args(source, smoke_model, str(tmp_path / "out.parquet")))
    assert result.exit_code == 0 and "warning" not in result.stderr
    assert "out of the model's vocabulary: 0.0% of tokens" in result.stdout


def test_evaluate_warns_of_a_corpus_mostly_out_of_vocabulary_and_reports_the_share(smoke_model, tmp_path):
    line = json.loads(snli_line("n1"))
    words = NONSENSE.split()
    line.update(
        sentence1=NONSENSE,
        sentence2=NONSENSE,
        sentence1_binary_parse=f"( {words[0]} ( ( {words[1]} ( {words[2]} {words[3]} ) ) {words[4]} ) )",
        sentence2_binary_parse=f"( {words[0]} ( ( {words[1]} ( {words[2]} {words[3]} ) ) {words[4]} ) )",
    )
    source = tmp_path / "test.jsonl"
    source.write_text(json.dumps(line) + "\n")
    arguments = ["evaluate", "--model", str(smoke_model.checkpoint), "--data", str(source), "--no-track"]
    result = CliRunner().invoke(main, [*arguments, "--output", str(tmp_path / "metrics.json")])
    assert result.exit_code == 0, result.output
    assert one_warning_line(result.stderr).startswith(f"warning: {source}: 80% of its tokens are not in the model")
    assert "80.0% of tokens out of the model's vocabulary" in result.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["oov_share"] == pytest.approx(0.8)


def test_prepare_rejects_a_repeated_pair_id_and_says_so(tmp_path):
    source = tmp_path / "dev.jsonl"
    source.write_text("".join(snli_line(pair_id) + "\n" for pair_id in ("p1", "p2", "p1")))
    result = spinn("prepare", str(source), "--output-dir", str(tmp_path / "out"), "--max-reject-ratio", "1")
    assert result.returncode == 0, result.stderr
    assert "rejected duplicate_id: 1" in result.stdout
    (reject,) = [json.loads(line) for line in (tmp_path / "out" / "dev.rejects.jsonl").read_text().splitlines()]
    assert (reject["file"], reject["line"], reject["reason"]) == (str(source), 3, "duplicate_id")
