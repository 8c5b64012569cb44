"""The test suite's own rules, read from its source: a newcomer finds each shared builder in one place.

No test module imports another (shared builders live in tests/helpers.py, fixtures in
tests/conftest.py), ../shared, where the real SNLI files and Stanza models are, is spelled once, and tiers
are marked on the tests, not chosen by file name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TEST_SOURCES = sorted(TESTS.glob("*.py"))
TEST_FILE = re.compile(r"test_\w+\.py")
SHARED_PART = "".join(("sha", "red"))  # built, so that this file does not spell it


def is_test_module(module: str) -> bool:
    """tests.test_x, test_x, tests.conftest or conftest: a module that pytest collects or loads by itself."""
    name = module.removeprefix("tests.")
    return name.startswith("test_") or name == "conftest"


def imports_of_test_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a test module or conftest in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.module in (None, "tests"):  # from tests import test_x, from . import test_x: names are modules
                found += [(node.lineno, alias.name) for alias in node.names if is_test_module(alias.name)]
            elif is_test_module(node.module):
                found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("path", TEST_SOURCES, ids=lambda path: path.name)
def test_no_test_module_imports_another(path):
    imports = [f"{path.name}:{line} imports {module}" for line, module in imports_of_test_modules(path)]
    assert not imports, "\n".join(imports) + "\n(move what they share to tests/helpers.py or a conftest fixture)"


@pytest.mark.parametrize(
    "source",
    [
        "from tests.test_cli import spinn",
        "import tests.test_docs",
        "from tests import test_train",
        "from .conftest import x",
        "from . import test_y",
    ],
)
def test_the_check_sees_an_import_of_a_test_module(tmp_path, source):
    module = tmp_path / "test_example.py"
    module.write_text(f"def f():\n    {source}\n", encoding="utf-8")
    assert [line for line, _ in imports_of_test_modules(module)] == [2]


def spells_the_shared_folder(path: Path) -> bool:
    """Whether the file names ../shared itself (the string SHARED_PART as a path part)."""
    return any(
        isinstance(node, ast.Constant) and node.value == SHARED_PART
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
    )


def test_the_shared_folder_is_spelled_once():
    """The real SNLI files and Stanza models are found in one place (tests/helpers.py, SHARED); a test asks for
    them through conftest's snli_* fixtures or helpers' stanza_dir(), which skip, saying why, where they are
    absent."""
    assert [path.name for path in TEST_SOURCES if spells_the_shared_folder(path)] == ["helpers.py"]


def test_tiers_come_from_the_tests_not_from_file_names():
    """conftest names no test file: a test's tier is its own marker, its file's pytestmark or the fixtures it
    uses, so a test moved to another file keeps its tier."""
    conftest = ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8"))
    named = [
        node.value
        for node in ast.walk(conftest)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and TEST_FILE.fullmatch(node.value)
    ]
    assert not named, f"tests/conftest.py picks tests by file name: {named}"
