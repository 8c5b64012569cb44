"""dvc.yaml declares every spinn file a stage runs: a code change can never leave `dvc repro` with a stale output.

Each stage's command is `.venv/bin/spinn <command> ...`. What runs is the `spinn` CLI
package, the module holding that command, and, transitively, every spinn
module those import (at module level or lazily inside a function: either may
run). Every file of that closure must sit under one of the stage's deps.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SPINN = ".venv/bin/spinn"
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def module_file(module: str) -> Path | None:
    """spinn.data.vocab -> spinn/data/vocab.py, a package -> its __init__.py; None outside spinn."""
    if module.split(".")[0] != "spinn":
        return None
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise AssertionError(f"import of {module}, which is not in the package")


def imported_modules(nodes: list[ast.AST]) -> set[str]:
    """Modules named by the imports in these nodes, with `from pkg import submodule` resolved."""
    found = set()
    for tree in nodes:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if _exists(name)}


def _exists(module: str) -> bool:
    if module.split(".")[0] != "spinn":
        return False
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def with_parents(module: str) -> set[str]:
    """Importing spinn.data.vocab runs spinn/__init__.py and spinn/data/__init__.py too."""
    parts = module.split(".")
    return {".".join(parts[:end]) for end in range(1, len(parts) + 1)}


def closure(start: set[str]) -> set[Path]:
    """The files of `start` and of everything they import."""
    seen: set[str] = set()
    pending = set().union(*(with_parents(name) for name in start))
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        tree = ast.parse(module_file(module).read_text(encoding="utf-8"))
        for name in imported_modules([tree]):
            pending |= with_parents(name) - seen
    return {module_file(name) for name in seen}


def stage_closure(cmd: str) -> set[Path]:
    """The files `spinn <command> ...` runs: the CLI package and the module holding the command (spinn.cli
    loads only that one), with everything they import."""
    from spinn.cli import COMMANDS

    words = cmd.split()
    assert words[0] == SPINN, f"stage command {cmd!r} does not run {SPINN} (README's install; no PATH needed)"
    module, _ = COMMANDS[words[1]]
    return closure({"spinn.cli", module})


def covered(path: Path, deps: list[str]) -> bool:
    relative = path.relative_to(ROOT)
    return any(relative == Path(dep) or Path(dep) in relative.parents for dep in deps)


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_file_a_stage_runs_is_a_declared_dep(name):
    stage = STAGES[name]
    body = stage.get("do", stage)
    missing = sorted(
        str(path.relative_to(ROOT)) for path in stage_closure(body["cmd"]) if not covered(path, body.get("deps", []))
    )
    assert not missing, f"stage {name} runs these files but does not declare them as deps: {missing}"


def test_the_closure_follows_lazy_imports_through_modules():
    """train's command imports the train stage lazily; the stage imports the policy only through the model."""
    files = {str(path.relative_to(ROOT)) for path in stage_closure(f"{SPINN} train --config params.yaml")}
    expected = {"spinn/cli/training.py", "spinn/training/train.py", "spinn/model/policy.py", "spinn/tracking/store.py"}
    assert expected <= files
    assert "spinn/labeling/label.py" not in files
