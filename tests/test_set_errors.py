"""A mistake in a `--set KEY=VALUE` is one `error:` line naming `--set` and the key, in plain words,
exit status 1, on every command that takes --set; a mistake in params.yaml still names params.yaml.

The commands run in-process with click's runner; their inputs exist but are never read, since each case fails
while the settings are read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from flows.main import QUIET_AND_OFFLINE
from flows.main import main as pipeline
from spinn.cli import EXIT_USER_ERROR
from spinn.cli import main as spinn

SPLITS = ("train.parquet", "dev.parquet")


def train(folder: Path, arguments: list[str]):
    for name in SPLITS:
        (folder / name).write_bytes(b"")
    data = ["--train", str(folder / SPLITS[0]), "--dev", str(folder / SPLITS[1])]
    return CliRunner().invoke(spinn, ["train", *data, *arguments])


def spinn_pipeline(folder: Path, arguments: list[str]):
    return CliRunner().invoke(pipeline, arguments)


COMMANDS = {"spinn train": train, "spinn-pipeline": spinn_pipeline}
"""Every command that takes --set, run in a folder."""
SET_MISTAKES = [
    pytest.param("max_steps=-1", "--set max_steps: must be at least 1 (got -1)", id="out-of-range"),
    pytest.param("learning_rate=.nan", "--set learning_rate: must be a finite number", id="not-finite"),
    pytest.param("model.variant=lstm", "--set model.variant: must be 'pi-nt', 'pi', 'spinn'", id="not-a-choice"),
    pytest.param("max_step=5", "--set max_step: unknown setting; did you mean max_steps?", id="misspelt-key"),
    pytest.param("model.depth=3", "--set model.depth: unknown setting", id="unknown-nested-key"),
    pytest.param("model=3", "--set model: must be a section of settings", id="a-value-for-a-section"),
    pytest.param("=3", "--set '=3': expected KEY=VALUE", id="no-key"),
    pytest.param("max_steps=[1", "--set max_steps: the value '[1' is not valid YAML", id="not-yaml"),
]
PYDANTIC_WORDS = ("Value error", "Input should", "pydantic", "errors.pydantic.dev", "Extra inputs")


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """The working folder; the pipeline's environment defaults undone after the test."""
    monkeypatch.chdir(tmp_path)  # a command that went on would write its data folders here
    for name, value in QUIET_AND_OFFLINE.items():
        monkeypatch.setenv(name, value)
    return tmp_path


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == EXIT_USER_ERROR, (result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("setting", "expected"), SET_MISTAKES)
def test_a_set_mistake_names_set_and_its_key_in_plain_words(command, setting, expected, folder):
    line = one_error_line(COMMANDS[command](folder, ["--set", setting]))
    assert line.startswith(f"error: {expected}"), line
    assert "params.yaml" not in line and not [words for words in PYDANTIC_WORDS if words in line]
    assert not (folder / "data").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_params_mistake_names_the_file_even_beside_a_set(command, folder):
    params = folder / "params.yaml"
    params.write_text("train:\n  max_steps: 0\n", encoding="utf-8")
    line = one_error_line(COMMANDS[command](folder, ["--config", str(params), "--set", "patience=3"]))
    assert line == f"error: {params}: train: max_steps: must be at least 1 (got 0)"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_set_value_over_a_bad_params_value_is_the_one_named(command, folder):
    """The value that failed is the one that won: --set over params.yaml."""
    params = folder / "params.yaml"
    params.write_text("train:\n  max_steps: 10\n", encoding="utf-8")
    line = one_error_line(COMMANDS[command](folder, ["--config", str(params), "--set", "max_steps=0"]))
    assert line == "error: --set max_steps: must be at least 1 (got 0)"
