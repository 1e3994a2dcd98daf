"""The layers, read from the imports: components import only the core; the core imports no component and nothing
above it; no module imports a private name of another of ours."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("lightning_rl", "components")


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names, line) of every import in ``path``, relative imports resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.append((base, [alias.name for alias in node.names], node.lineno))
    return out


def _files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_components_import_only_the_core():
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _files("components")
        for module, _, line in _imports(path)
        if module.startswith("lightning_rl")
        and not (module == "lightning_rl.core" or module.startswith("lightning_rl.core."))
    ]
    assert not bad, "\n".join(bad)


def test_the_core_imports_no_component_and_nothing_above_it():
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _files("lightning_rl/core")
        for module, _, line in _imports(path)
        if module.startswith(OURS) and not module.startswith("lightning_rl.core")
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("folder", ["lightning_rl", "components", "examples", "scripts", "benchmarks"])
def test_no_module_imports_a_private_name_of_another(folder):
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name} from {module}"
        for path in _files(folder)
        for module, names, line in _imports(path)
        if module.startswith(OURS)
        for name in names
        if name.startswith("_")
    ]
    assert not bad, "\n".join(bad)


def test_no_test_file_imports_another():
    """Tests share fixtures through conftest.py and helpers through tests/support/, never through each other's files."""
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _files("tests", "benchmarks")
        for module, _, line in _imports(path)
        if module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_")
    ]
    assert not bad, "\n".join(bad)
