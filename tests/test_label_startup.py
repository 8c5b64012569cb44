"""Labelling with the model's own trees starts small: `spinn label --parser model` (and --int8) never imports
MLflow, Prefect or Stanza, whose imports alone take seconds that a 10,000-pair run at model speed cannot spare.

The command runs in a fresh interpreter, on a checkpoint written here, and reports what it imported.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spinn.model.checkpoint import save_checkpoint
from spinn.model.config import SPINNConfig
from tests.helpers import TINY, untrained_checkpoint

HEAVY = ("mlflow", "prefect", "stanza")
RUN = """
import json, sys
from spinn.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    config = SPINNConfig(variant="spinn", **{**TINY, "use_batch_norm": False})
    return save_checkpoint(tmp_path / "model.pt", untrained_checkpoint(config))


@pytest.mark.parametrize("options", [[], ["--int8"]], ids=["fp32", "int8"])
def test_labelling_with_the_models_own_trees_imports_no_mlflow_prefect_or_stanza(checkpoint, tmp_path, options):
    source = tmp_path / "pairs.csv"
    with source.open("w", newline="") as out:
        csv.writer(out).writerows([["premise", "hypothesis"], ["A dog runs.", "A cat sleeps."]])
    arguments = ["label", str(source), "--model", str(checkpoint), "--output", str(tmp_path / "out.parquet")]
    arguments += ["--parser", "model", "--device", "cpu", "--no-progress", *options]
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", RUN, *arguments], capture_output=True, text=True, env=environment, check=False
    )
    assert done.returncode == 0, done.stderr
    imported = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "torch" in imported and "spinn" in imported
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    assert (tmp_path / "out.parquet").is_file()
