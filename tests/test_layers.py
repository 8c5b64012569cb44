"""The package's layers: every import inside spinn/ points down (README, "Layout").

Imports are read from the source (module level and inside functions alike, since
a lazy import runs too), so the test needs nothing installed beyond the stdlib.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "spinn"
LAYERS: tuple[tuple[str, ...], ...] = (
    ("spinn", "spinn.ground"),  # ground: the package root and spinn/ground/
    ("spinn.trees",),
    ("spinn.data",),
    ("spinn.parsing",),
    ("spinn.tracking",),
    ("spinn.model",),
    ("spinn.inference",),  # the one predict(): evaluation, labelling and trees run on it
    ("spinn.evaluation",),  # the evaluate stage; training's dev evaluation scores with it
    ("spinn.training",),
    ("spinn.labeling",),
    ("spinn.serving",),  # the registered model as an MLflow pyfunc: labelling behind MLflow's interface
    ("spinn.cli", "spinn.bench", "spinn.opcount", "spinn.options"),  # entry points and measurement
)
"""Bottom to top. A module may import from its own layer and the ones below it, never above."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The layer of the longest prefix that names one (spinn.model.spinn -> spinn.model)."""
    best = None
    for rank, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (rank, name)
    if best is None:
        raise AssertionError(f"{module} belongs to no layer; add it to LAYERS (and README's layout map)")
    return best[0]


def spinn_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a spinn module in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "spinn"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "spinn":
            if node.module == "spinn":  # from spinn import tracking: each name is a module
                found += [(node.lineno, f"spinn.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    for path in SOURCES:
        layer_of(module_name(path))


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(PACKAGE.parent)))
def test_imports_point_down(path):
    here = module_name(path)
    upward = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target} (layer {layer_of(target)} > {layer_of(here)})"
        for line, target in spinn_imports(path)
        if layer_of(target) > layer_of(here)
    ]
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    """The walker must catch a lazy import inside a function, the kind that hides best."""
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from spinn.training.train import train\n    import spinn.cli\n")
    assert spinn_imports(source) == [(2, "spinn.training.train"), (3, "spinn.cli")]
    assert layer_of("spinn.training.train") > layer_of("spinn.model.spinn")


def test_inference_sits_between_the_model_and_its_users():
    """Training's dev evaluation and labelling call inference; inference needs only the model and below."""
    inference = layer_of("spinn.inference.predict")
    assert layer_of("spinn.model.spinn") < inference < layer_of("spinn.evaluation.evaluate")
    assert inference < layer_of("spinn.labeling.label")


def test_labelling_never_reaches_into_training():
    """Labelling runs a model through inference; it has no use for the training stage's code."""
    reached = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
        for path in sorted((PACKAGE / "labeling").rglob("*.py"))
        for line, target in spinn_imports(path)
        if target.startswith("spinn.training")
    ]
    assert not reached, "\n".join(reached)


def imported_closure(module: str) -> set[str]:
    """Every spinn module that importing `module` can reach, lazy imports included."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = PACKAGE.parent.joinpath(*name.split("."))
        source = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
        if source.is_file():
            todo += [target for _, target in spinn_imports(source)]
    return seen


def test_the_model_never_reaches_a_corpus_reader():
    """data/ turns files into examples, model/ turns examples into tensors (DESIGN.md)."""
    readers = {"spinn.data.corpus", "spinn.data.pairs", "spinn.data.sentence_pairs", "spinn.data.prepare"}
    for path in sorted((PACKAGE / "model").glob("*.py")):
        assert not imported_closure(module_name(path)) & readers, path.name
    assert "spinn.data.corpus" in imported_closure("spinn.data.pairs")  # the walk does follow imports


def imported_roots(path: Path) -> set[str]:
    """The top-level package of every import in the file, lazy ones included."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize(("package", "door"), [("stanza", "spinn/parsing/stanza_pipeline.py")])
def test_a_heavy_dependency_has_one_door(package, door):
    """DESIGN.md: heavy dependencies have one door each."""
    importers = [str(path.relative_to(PACKAGE.parent)) for path in SOURCES if package in imported_roots(path)]
    assert importers == [door]


PACKAGE_MARKERS = {"__init__.py", "__main__.py"}
"""File names every package may have: they name the package, not a concept."""


def test_no_two_modules_share_a_file_name():
    """A module's name says what it owns: two `settings.py` (or `step.py`) make a reader ask which one answers."""
    flows = PACKAGE.parent / "flows"
    by_name: dict[str, list[str]] = {}
    for path in [*SOURCES, *sorted(flows.rglob("*.py"))]:
        if path.name not in PACKAGE_MARKERS:
            by_name.setdefault(path.name, []).append(str(path.relative_to(PACKAGE.parent)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, shared


def test_no_flow_module_hides_an_installed_one():
    """Prefect runs a flow file with flows/ first on sys.path: a flows/requests.py was imported in place of the
    requests library (and failed, half-initialised, inside spinn.data.fetch)."""
    flows = PACKAGE.parent / "flows"
    hidden = [path.name for path in sorted(flows.glob("*.py")) if importlib.util.find_spec(path.stem) is not None]
    assert not hidden, hidden


LOWER_PRECISION = {"autocast", "bfloat16", "float16", "half"}
"""torch's names for computing in less than fp32."""


def torch_names(path: Path) -> set[str]:
    """Every `torch.<name>` the file reads (torch.autocast, torch.bfloat16, ...)."""
    return {
        node.attr
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch"
    }


def test_lower_precision_is_decided_in_one_module():
    """amp's autocast and its dtype are chosen in spinn/model/precision.py only; every step calls it."""
    deciders = [str(path.relative_to(PACKAGE.parent)) for path in SOURCES if torch_names(path) & LOWER_PRECISION]
    assert deciders == ["spinn/model/precision.py"]


MAX_MODULE_LINES = 500
"""A module longer than this holds more than one concept; split it along its seams."""


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(PACKAGE.parent)))
def test_a_module_holds_one_concept(path):
    name = str(path.relative_to(PACKAGE.parent))
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines"
