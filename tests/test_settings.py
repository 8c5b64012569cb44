"""One source for every setting: params.yaml, the CLI and the Prefect flows all read the stages' settings models.

Every params.yaml key must be a field of its section's model; every field of a
stage's model must be an option of the stage's command (with the model's
choices, never a copy) and a field of the flow parameter that runs the stage,
unless the model or this file says why not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, get_args, get_origin

import click
import pytest
import yaml
from click.testing import CliRunner

from spinn.bench import BenchSettings
from spinn.cli import COMMANDS, main
from spinn.data.download import DownloadSettings
from spinn.data.embeddings import EmbeddingSettings
from spinn.data.prepare import PrepareSettings
from spinn.data.vocab import VocabSettings
from spinn.evaluation.evaluate import EvaluateSettings
from spinn.ground.settings import Settings, settings_type
from spinn.labeling.induced_trees import TreesSettings
from spinn.labeling.label_settings import LabelSettings
from spinn.options import SEPARATOR
from spinn.parsing.parse import ParseSettings
from spinn.training.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"
COMMAND_OF: dict[type[Settings], str] = {
    DownloadSettings: "download",
    PrepareSettings: "prepare",
    VocabSettings: "vocab",
    EmbeddingSettings: "embeddings",
    TrainConfig: "train",
    EvaluateSettings: "evaluate",
    ParseSettings: "parse",
    LabelSettings: "label",
    TreesSettings: "trees",
    BenchSettings: "bench",
}
SPLITS = {"train": "a.jsonl", "dev": "b.jsonl", "test": "c.jsonl"}
POSITIONAL = {(DownloadSettings, "corpus")}
"""Fields the command takes as its argument rather than an option (`spinn download snli`)."""
NOT_IN_FLOWS = {
    ParseSettings: "`spinn parse` prepares one new file by hand; the label-pairs flow parses as part of labelling",
    TreesSettings: "`spinn trees` is for looking at a model's trees, not a pipeline stage",
    BenchSettings: "`spinn bench` measures speed; it is no stage of the pipeline",
}


def leaf_fields(model: type[Settings], prefix: tuple[str, ...] = ()):
    """(path, annotation) of every leaf field, nested settings flattened."""
    for name, info in model.model_fields.items():
        nested = settings_type(info.annotation)
        if nested is not None:
            yield from leaf_fields(nested, (*prefix, name))
        else:
            yield (*prefix, name), info.annotation


def flatten(data: dict, prefix: tuple[str, ...] = ()):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from flatten(value, (*prefix, key))
        else:
            yield (*prefix, key)


def command(name: str) -> click.Command:
    return main.get_command(click.Context(main), name)


def literal_choices(annotation) -> list[str] | None:
    """A Literal field's values (also `Literal | None`); a union of kinds is read by the model, not a choice."""
    kinds = [candidate for candidate in get_args(annotation) if candidate is not type(None)]
    for candidate in (annotation, *(kinds if len(kinds) == 1 else [])):
        if get_origin(candidate) is Literal:
            return [str(value) for value in get_args(candidate)]
    return None


@pytest.mark.parametrize("section", sorted(yaml.safe_load(PARAMS.read_text())))
def test_every_params_key_is_a_field_of_its_section(section):
    owners = [model for model in COMMAND_OF if model.section == section]
    assert len(owners) == 1, f"params.yaml section {section!r} belongs to no stage's settings model"
    (model,) = owners
    fields = [path for path, _ in leaf_fields(model)]
    for key in flatten(yaml.safe_load(PARAMS.read_text())[section]):  # a dict field's keys sit below it
        assert any(key[: len(path)] == path for path in fields), f"params.yaml {section}.{'.'.join(key)}"
    model.from_params(PARAMS)  # and the whole section validates


def left_off(model: type[Settings], path: tuple[str, ...]) -> bool:
    """Whether the model's not_on_cli names the field or a section above it."""
    return any(".".join(path[:depth]) in model.not_on_cli for depth in range(1, len(path) + 1))


@pytest.mark.parametrize("model", list(COMMAND_OF), ids=lambda model: model.__name__)
def test_every_field_is_an_option_with_the_models_choices(model):
    """Every field is an option, and one the model leaves off is not (`spinn trees` offered --label-column,
    which trees never reads)."""
    params = {param.name: param for param in command(COMMAND_OF[model]).params}
    for path, annotation in leaf_fields(model):
        name = SEPARATOR.join(path)
        if left_off(model, path):
            assert name not in params, f"{name} is on `spinn {COMMAND_OF[model]}` though not_on_cli leaves it off"
            continue
        if (model, path[0]) in POSITIONAL:
            continue
        assert name in params, (
            f"{model.__name__}.{'.'.join(path)} has no option on `spinn {COMMAND_OF[model]}` "
            "(list it in the model's not_on_cli with the reason)"
        )
        choices = literal_choices(annotation)
        if choices is not None:
            assert list(params[name].type.choices) == choices, f"{name}: choices not the model's"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_required_option_says_so_once_in_help(name):
    """`spinn bench --help` showed `[required] [required]` for --corpus: the field's help and click both said it."""
    result = CliRunner().invoke(main, [name, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "[required] [required]" not in " ".join(result.output.split())


def test_every_field_left_off_the_cli_says_why():
    fields = {
        model: {".".join(path[:depth]) for path, _ in leaf_fields(model) for depth in range(1, len(path) + 1)}
        for model in COMMAND_OF
    }
    for model in COMMAND_OF:
        for name, reason in model.not_on_cli.items():
            assert name in fields[model] and len(reason) > 20


@pytest.mark.parametrize(
    ("name", "offered"), [("trees", False), ("label", True), ("parse", True), ("bench-label", True)]
)
def test_help_offers_a_label_column_only_where_labels_are_read(name, offered):
    """`spinn trees --help` listed --label-column, which trees never reads; the commands that read gold
    labels keep it."""
    result = CliRunner().invoke(main, [name, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert ("--label-column" in result.output) is offered


def test_every_stage_runs_from_a_flow_with_all_its_fields():
    from flows.flow_requests import CorpusRequest, EvaluateRequest, TrainRequest
    from flows.label_pairs import LabelRequest

    carried = {
        DownloadSettings: CorpusRequest.model_fields["download"].annotation,
        PrepareSettings: CorpusRequest.model_fields["prepare"].annotation,
        VocabSettings: CorpusRequest.model_fields["vocab"].annotation,
        EmbeddingSettings: CorpusRequest.model_fields["embeddings"].annotation,
        TrainConfig: TrainRequest.model_fields["settings"].annotation,
        EvaluateSettings: EvaluateRequest.model_fields["settings"].annotation,
        LabelSettings: LabelRequest.model_fields["settings"].annotation,
    }
    assert set(carried) | set(NOT_IN_FLOWS) == set(COMMAND_OF)
    for model, overrides in carried.items():
        assert overrides is model.overrides()
        assert set(overrides.model_fields) == set(model.model_fields), model.__name__
        assert all(field.default is None for field in overrides.model_fields.values())


def test_the_prefect_form_offers_the_models_choices():
    """The flow parameter's JSON schema (what Prefect's UI renders) carries the Literal choices."""
    from flows.flow_requests import TrainRequest

    schema = json.dumps(TrainRequest.model_json_schema())
    assert '"enum": ["pi-nt", "pi", "spinn", "rl", "cbow"]' in schema
    assert "Pairs per optimizer step;" in schema


def test_options_win_over_params_which_win_over_defaults(tmp_path, snli_train_sample):
    from spinn.data.prepare import prepare

    prepared = prepare(snli_train_sample, tmp_path).output
    (tmp_path / "params.yaml").write_text("vocab:\n  lowercase: false\n  min_freq: 2\n")
    runner = CliRunner()
    from_params = runner.invoke(main, ["vocab", str(prepared), "--config", str(tmp_path / "params.yaml")])
    assert from_params.exit_code == 0 and "(lowercase=False, min_freq=2)" in from_params.output
    from_option = runner.invoke(
        main, ["vocab", str(prepared), "--config", str(tmp_path / "params.yaml"), "--min-freq", "3", "--lowercase"]
    )
    assert from_option.exit_code == 0 and "(lowercase=True, min_freq=3)" in from_option.output


def test_a_bad_setting_is_named_where_it_was_given(tmp_path):
    """An option's value by the option; a `--set` value by --set and its key (tests/test_set_errors.py)."""
    splits = [tmp_path / "train.parquet", tmp_path / "dev.parquet"]
    for split in splits:
        split.write_bytes(b"")  # never read: the settings are refused first
    data = ["--train", str(splits[0]), "--dev", str(splits[1])]
    result = CliRunner().invoke(main, ["train", *data, "--batch-size", "0", "--set", "model.variant=lstm"])
    assert result.exit_code == 1
    assert "--batch-size: must be at least 1 (got " in result.output
    assert "--set model.variant: must be 'pi-nt'" in result.output


def test_every_command_loads_from_its_module():
    for name in COMMANDS:
        assert command(name).name == name


def test_a_request_for_another_corpus_takes_that_corpus_s_archive_and_split_files():
    """params.yaml's archive and splits name SNLI's files: `spinn-pipeline --corpus multinli` (a flow request
    for multinli) fetched MultiNLI into snli_1.0.zip and looked in it for snli_1.0_train.jsonl.
    What the request gives itself still wins, and the params file's own corpus keeps its files."""
    from flows.flow_requests import CorpusRequest
    from spinn.data.download import CORPORA

    switched = CorpusRequest(params=PARAMS, download={"corpus": "multinli"})
    stages = switched.stages()
    assert stages.download.archive_name == CORPORA["multinli"].filename
    assert switched.split_files(stages) == CORPORA["multinli"].splits
    named = CorpusRequest(
        params=PARAMS, download={"corpus": "multinli", "archive": "mnli.zip"}, prepare={"splits": SPLITS}
    )
    assert named.stages().download.archive_name == "mnli.zip" and named.split_files(named.stages()) == SPLITS
    kept = CorpusRequest(params=PARAMS)
    written = yaml.safe_load(PARAMS.read_text())
    assert kept.stages().download.archive_name == written["download"]["archive"]
    assert kept.split_files(kept.stages()) == written["prepare"]["splits"]


def test_spinn_download_of_another_corpus_than_params_saves_it_under_its_own_name(tmp_path):
    """`spinn download multinli --config params.yaml` wrote MultiNLI's archive as params.yaml's snli_1.0.zip."""
    import hashlib
    import zipfile

    archive = tmp_path / "copy.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("multinli_1.0/multinli_1.0_train.jsonl", "{}\n")
    checksum = f"sha256:{hashlib.sha256(archive.read_bytes()).hexdigest()}"
    raw = tmp_path / "raw"
    arguments = ["download", "multinli", "--config", str(PARAMS), "--raw-dir", str(raw), "--no-extract"]
    result = CliRunner().invoke(main, [*arguments, "--file", str(archive), "--checksum", checksum])
    assert result.exit_code == 0, result.output
    assert sorted(path.name for path in raw.iterdir() if not path.name.startswith(".")) == ["multinli_1.0.zip"]
