"""The layers, read from the imports. `LAYERS` is the order (docs/layout.md explains it): a module imports only modules
of its own layer or of the layers before it, and no import cycle joins two modules. Also: components import only
the core; the core imports no component; no module imports a private name of another of ours."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("lightning_rl", "components")

LAYERS: list[tuple[str, list[str]]] = [
    ("core", ["lightning_rl.core"]),  # what components may import: batch, sampling params, ops, models, data sources
    ("components", ["components"]),  # the swappable parts
    ("defaults", ["lightning_rl.defaults"]),  # the parts a run gets where its config names none
    ("data", ["lightning_rl.data"]),  # prompts, tasks, row sources, preference pairs
    (
        "state",  # what a run holds and writes: the model roster, random streams, the checkpoint format, the
        # strategies, run folders, Hugging Face export, rollout records, and the one module that touches Lightning's
        # internals
        [
            "lightning_rl.roster",
            "lightning_rl.rng",
            "lightning_rl.digests",
            "lightning_rl.checkpoint",
            "lightning_rl.distributed",
            "lightning_rl.runs",
            "lightning_rl.export",
            "lightning_rl.lightning_compat",
            "lightning_rl.rollouts",
        ],
    ),
    ("callbacks", ["lightning_rl.callbacks"]),  # every Lightning callback we give (RLModule adds most)
    ("loop", ["lightning_rl.loop"]),  # RLModule and its phases
    (
        "run",  # a run in Python: the set-up every run gets, the Trainer, the console, the package's own names
        ["lightning_rl.console", "lightning_rl.run_setup", "lightning_rl.trainer", "lightning_rl"],
    ),
    # the Tinker API service (`lightning-rl serve`): beside the loop, on the same core, components and state
    ("service", ["lightning_rl.service"]),
    ("cli", ["lightning_rl.cli"]),  # lightning-rl; the library never imports it
    ("recipes", ["lightning_rl.recipes"]),  # programs with a command line of their own (sft, reward model)
    # `lightning-rl` (and `python -m lightning_rl.cli`): a subcommand per job, over the CLI and the recipes
    ("command", ["lightning_rl.command", "lightning_rl.cli.__main__"]),
]
"""The order of layers, first to last."""


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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[tuple[str, int]]]:
    """Each module of ours -> the modules of ours it imports (at any depth of its code), with the line. ``from p import
    m`` imports the module ``p.m`` when there is one, else the package ``p``."""
    modules = {_module_name(path): path for path in _files(*OURS)}

    def ours(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        edges = set()
        for module, names, line in _imports(path):
            targets = [f"{module}.{n}" if f"{module}.{n}" in modules else module for n in names] or [module]
            edges |= {(target, line) for t in targets if (target := ours(t)) is not None and target != name}
        graph[name] = edges
    return graph


def layer_of(module: str) -> int | None:
    """The index in `LAYERS` of the longest entry that is ``module`` or a package holding it (``lightning_rl`` holds
    only its own ``__init__``)."""
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "lightning_rl" and module.startswith(prefix + ".")):
                if best is None or len(prefix) > len(best[1]):
                    best = (index, prefix)
    return None if best is None else best[0]


def test_every_module_has_a_layer():
    missing = sorted(m for m in _graph() if layer_of(m) is None)
    assert not missing, f"modules in no layer of tests/test_layers.py LAYERS (add them where they belong): {missing}"


def test_each_module_imports_only_its_layer_and_the_layers_before_it():
    bad = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]}), line {line}"
        for module, edges in sorted(_graph().items())
        for target, line in sorted(edges)
        if layer_of(module) is not None and layer_of(target) is not None and layer_of(target) > layer_of(module)
    ]
    assert not bad, "imports against the order of LAYERS:\n" + "\n".join(bad)


def test_the_library_never_imports_the_cli():
    cli = [i for i, (name, _) in enumerate(LAYERS) if name == "cli"][0]
    # above the CLI only programs: the recipes' and `lightning-rl` itself
    assert [name for name, _ in LAYERS[cli + 1 :]] == ["recipes", "command"]
    bad = [
        f"{module} imports {target}"
        for module, edges in _graph().items()
        for target, _ in edges
        if target.startswith("lightning_rl.cli")
        and not module.startswith(("lightning_rl.cli", "lightning_rl.recipes", "lightning_rl.command"))
    ]
    assert not bad, "\n".join(bad)


def test_no_import_cycle_between_modules():
    graph = {m: {t for t, _ in edges} for m, edges in _graph().items()}
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "modules that import each other (directly or through others): " + "; ".join(map(str, cycles))


def test_the_order_is_the_one_docs_layout_md_writes():
    text = (ROOT / "docs" / "layout.md").read_text()
    written = [name for name in (line.split("|")[1].strip(" `") for line in text.splitlines() if line.startswith("| "))]
    assert [name for name, _ in LAYERS] == [w for w in written if w in {n for n, _ in LAYERS}]


def test_components_import_only_the_core():
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _files("components")
        for module, _, line in _imports(path)
        if module.startswith("lightning_rl")
        and not (module == "lightning_rl.core" or module.startswith("lightning_rl.core."))
    ]
    assert not bad, "\n".join(bad)


def test_the_loop_knows_components_only_by_their_contracts():
    """The loop imports the contracts (lightning_rl.core.contracts) and the defaults (lightning_rl.defaults), never a
    component module."""
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _files("lightning_rl/loop")
        for module, _, line in _imports(path)
        if module == "components" or module.startswith("components.")
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
