"""Labelling with no parser: `parser: auto` gives spinn and rl models their own trees, and Stanza never loads.

The proof runs `spinn label` in a subprocess where `import stanza` raises (a
sys.meta_path blocker that also writes down every attempt) and no Stanza model
folder exists: a run that touched Stanza anywhere would fail or leave a mark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers import smoke_pairs, write_rows

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / "tests" / "fixtures" / "release-0.1.0"
LABEL_TIMEOUT_S = 300
PAIRS = 12
BLOCKER = """
import importlib.abc, json, sys
marks_file, commands = sys.argv[1], json.loads(sys.argv[2])
class NoStanza(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "stanza" or name.startswith("stanza."):
            with open(marks_file, "a") as marks:
                marks.write(name + "\\n")
            raise ImportError("stanza is blocked in this test")
        return None
sys.meta_path.insert(0, NoStanza())
from spinn.cli import main
for command in commands:
    main(command, standalone_mode=False)
"""
"""Run as `python -c BLOCKER MARKS_FILE COMMANDS_JSON`: each command (`label ...`) in turn, in one process."""


@pytest.mark.slow
def test_auto_labels_spinn_and_rl_on_their_own_trees_without_stanza(smoke_model, rl_checkpoint, tmp_path):
    """Both variants in one child process: a fresh process is what proves Stanza never loads, and a second
    start would only add seconds of imports."""
    source = write_rows(tmp_path / "pairs.csv", smoke_pairs(smoke_model, PAIRS))
    marks = tmp_path / "stanza_imports.txt"
    checkpoints = {"spinn": smoke_model.checkpoint, "rl": rl_checkpoint}
    outputs = {variant: tmp_path / f"{variant}.parquet" for variant in checkpoints}
    commands = [
        ["label", str(source), "--model", str(checkpoints[variant]), "--output", str(output), "--device", "cpu"]
        for variant, output in outputs.items()
    ]
    env = {key: value for key, value in os.environ.items() if key != "SPINN_STANZA_DIR"}
    env["STANZA_RESOURCES_DIR"] = str(tmp_path / "no-stanza-models")  # absent: nothing to load from
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    command = [sys.executable, "-c", BLOCKER, str(marks), json.dumps(commands)]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=LABEL_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert not marks.exists(), f"stanza was imported: {marks.read_text()}"
    assert not (tmp_path / "no-stanza-models").exists()
    for variant, output in outputs.items():
        labelled = pq.read_table(output).to_pylist()
        assert len(labelled) == PAIRS, variant
        assert {row["parser"] for row in labelled} == {"model"}, variant


def test_auto_resolves_to_the_models_own_trees_only_for_variants_that_predict_them():
    from spinn.model.config import SPINNConfig
    from spinn.model.parser_choice import resolve_parser

    variants = ("pi", "pi-nt", "spinn", "rl")
    assert {variant: resolve_parser("auto", SPINNConfig(variant=variant)) for variant in variants} == {
        "pi": "stanza",
        "pi-nt": "stanza",
        "spinn": "model",
        "rl": "model",
    }
    assert resolve_parser("stanza", SPINNConfig(variant="spinn")) == "stanza"


@pytest.mark.parametrize("variant", ["cbow", "pi-nt", "pi", "spinn", "rl"])
def test_every_door_takes_auto_from_the_one_rule(variant):
    """Labelling, the logged model's parser settings, evaluation's and the benchmark's `auto` all read
    spinn.model.parser_choice, so a model reads the same trees through each."""
    from spinn.bench.timing import BenchSettings, _source
    from spinn.evaluation.evaluate import transition_source
    from spinn.model.config import TransitionSource
    from spinn.model.parser_choice import auto_source, needs_parser, resolve_parser, trees_source
    from spinn.model.presets import PRESETS

    config = PRESETS[variant].model
    parser = resolve_parser("auto", config)
    own = parser == "model"
    assert own == config.predicts_transitions and needs_parser(config) is not own
    expected = TransitionSource.GREEDY if own else TransitionSource.GOLD
    assert auto_source(config) is trees_source(parser) is transition_source("auto", config) is expected
    if variant != "cbow":  # the benchmark times tree models only
        bench = BenchSettings(corpus=RELEASE / "pairs.parquet", mode="infer", variant=variant)
        assert _source(bench, config) is expected


def test_label_runs_on_the_cores_this_process_may_use(tmp_path):
    """Under an affinity of one CPU the auto thread count is one, whatever the machine's core count: a child
    process pinned to CPU 0 labels and reports the threads its model ran with."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    output = tmp_path / "labels.parquet"
    code = (
        "import os, sys; os.sched_setaffinity(0, {0});"
        "from spinn.labeling.label import label; from spinn.labeling.label_settings import LabelSettings;"
        f"s = label({str(RELEASE / 'pairs.parquet')!r}, {str(RELEASE / 'checkpoint.pt')!r}, {str(output)!r},"
        " LabelSettings(parser='model', device='cpu'));"
        "print(s.model_threads)"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, timeout=LABEL_TIMEOUT_S
    )
    assert found.stdout.split()[-1] == "1"
