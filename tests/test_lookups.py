"""No object of ours is looked up by name. ``getattr(x, "name", default)`` or ``hasattr(x, "name")`` on an attribute that
our own classes define means some contract does not declare what another layer reads: the reader then silently takes
the default when a refactor renames the attribute (the roster once looked for a reward model's ``path`` on the reward
at the top level only, and a critic starting from a reward model inside a `Composite` failed). Third-party objects
(transformers configs and tokenizers, peft models, Lightning loggers) are duck-typed where their attributes vary by
version or family; those lookups are few, and counted."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("lightning_rl", "components")

ALLOWED = {
    "__module__": "a user's callable (functools.partial has none of its own): FunctionTool's pickling check",
    "__name__": "a user's callable (functools.partial has none): FunctionTool's default tool name",
    "lora_base_fingerprint": "set by apply_lora on a transformers model; a LoRA model from elsewhere has none",
}
"""Attribute names our classes also define that may still be looked up by name, each on a third-party object (why)."""

THIRD_PARTY_LOOKUPS = 20
"""The most ``getattr(x, "name", default)`` calls in lightning_rl/ and components/ (duck typing of others' objects)."""


def _files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def _ours() -> set[str]:
    """Every attribute name our classes define: methods, class attributes, annotations, and ``self.<name> =``."""
    names = set()
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names |= {
                        sub.attr
                        for sub in ast.walk(target)
                        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self"
                    }
    return names - {"__init__", "__call__"}


def _lookups() -> list[tuple[Path, int, str, str, bool]]:
    """(file, line, getattr or hasattr, the attribute, with a default) of every lookup by a literal name."""
    found = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                found.append((path, node.lineno, node.func.id, node.args[1].value, len(node.args) == 3))
    return found


def test_no_attribute_of_ours_is_looked_up_by_name():
    ours = _ours()
    bad = [
        f"{path.relative_to(ROOT)}:{line} {call}(..., {name!r}): declare it on the contract (or class) and read it"
        for path, line, call, name, default in _lookups()
        if (call == "hasattr" or default) and name in ours and name not in ALLOWED
    ]
    assert not bad, "\n".join(bad)


def test_the_allow_list_is_short_and_each_entry_is_needed():
    assert len(ALLOWED) <= 10
    used = {name for _, _, call, name, default in _lookups() if call == "hasattr" or default}
    assert set(ALLOWED) <= used, f"no longer looked up, drop them: {sorted(set(ALLOWED) - used)}"


def test_duck_typing_of_third_party_objects_stays_rare():
    found = [
        f"{p.relative_to(ROOT)}:{line} {name}"
        for p, line, call, name, default in _lookups()
        if call == "getattr" and default
    ]
    assert len(found) <= THIRD_PARTY_LOOKUPS, f"{len(found)} getattr(x, name, default) lookups:\n" + "\n".join(found)
