"""The contracts live in lightning_rl.core.contracts; their old import paths still work for one release, with a warning
naming the new one, and nothing of ours uses an old path."""

from __future__ import annotations

import ast
import importlib
import inspect
import warnings
from pathlib import Path

import pytest

from lightning_rl.core import contracts

ROOT = Path(__file__).resolve().parents[3]

OLD_PATHS = {
    "components.advantage": ["AdvantageEstimator", "Advantages"],
    "components.advantage.base": ["AdvantageEstimator", "Advantages", "Whiten"],
    "components.aggregator": ["Aggregator"],
    "components.loss_terms": ["LossTerm"],
    "components.reward": ["Reward", "RewardInputs", "as_scores"],
    "components.reward.base": ["Reward", "RewardInputs", "Scores", "as_scores", "columns", "column", "failure_line"],
    "components.reward.shaping": ["raw_scores"],
    "components.rollout": ["Agent", "Rollout"],
    "components.rollout.base": ["Rollout"],
    "components.rollout.agent": ["Agent"],
    "components.surrogate": ["Surrogate"],
    "components.surrogate.base": ["Surrogate"],
    "components.teacher": ["Teacher", "TeacherScores"],
    "components.teacher.base": ["Teacher", "TeacherScores"],
    "components.env": ["Environment", "Step", "Turn"],
    "components.env.base": ["Environment", "Step", "Turn", "checked_step"],
}
"""Every name that moved to lightning_rl.core.contracts, by the module it was imported from before."""


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_old_import_path_gives_the_contract_with_a_warning_naming_the_new_one(old):
    module = importlib.import_module(old)
    for name in OLD_PATHS[old]:
        with pytest.warns(
            DeprecationWarning, match=rf"{old}\.{name} moved: import it from lightning_rl\.core\.contracts"
        ):
            found = getattr(module, name)
        new = getattr(contracts, name, None) or getattr(
            importlib.import_module("lightning_rl.core.contracts.reward"), name
        )
        assert found is new
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        module.NoSuchName  # noqa: B018


def test_the_package_paths_keep_their_components_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from components.advantage import GroupNormalized
        from components.kl import KLRegularizer
        from components.rollout import HFRollout

    assert issubclass(GroupNormalized, contracts.AdvantageEstimator)
    assert issubclass(HFRollout, contracts.Rollout)
    assert issubclass(KLRegularizer, contracts.KLPenalty)


def test_every_concrete_component_implements_its_contract():
    from lightning_rl.cli.catalog import catalog

    for key, entries in catalog().items():
        assert entries, f"model.{key}: no component implements its contract"
        for class_path, _ in entries:
            module, _, name = class_path.rpartition(".")
            assert not inspect.isabstract(getattr(importlib.import_module(module), name)), class_path


def _uses_of_old_paths(path: Path) -> list[str]:
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join(parts + ([module] if module else []))
        moved = set(OLD_PATHS.get(module, ())) & {alias.name for alias in node.names}
        found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name} from {module}" for name in sorted(moved)]
    return found


def test_nothing_of_ours_imports_a_contract_from_its_old_path():
    shims = {ROOT / "components" / f for f in ("reward/base.py", "env/base.py", "rollout/agent.py")}
    files = [
        p
        for folder in ("lightning_rl", "components", "examples", "scripts", "benchmarks", "tests")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p not in shims and p != Path(__file__).resolve()
    ]
    bad = [line for path in files for line in _uses_of_old_paths(path)]
    assert not bad, "import these from lightning_rl.core.contracts:\n" + "\n".join(bad)
