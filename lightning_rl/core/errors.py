"""Errors that teach: a setting that cannot work is one line naming its config key, what is wrong and the fix, with
"did you mean" where a name is close (a function or class in a dotted path, a data column, a folder of a path).

`ConfigError` is what the command line prints as one line (``error: <message>``; exit status 2 when it is raised while
the config is built, 1 at set-up); the CLI's parser errors (lightning_rl.cli.suggest) use the same `closest_name` and
`import_error`.
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A setting that cannot work, named with its config key and the fix (the command line prints it as one line)."""


def closest_name(name: str, names) -> str | None:
    """The name in ``names`` a person most likely meant by ``name``: initials (learning_rate -> lr, lr -> learning_rate)
    first, then spelling (difflib, ratio >= 0.6), then the one name that abbreviates it or that it abbreviates
    (function -> fn, temp -> temperature: the same first letter, the shorter's letters in order in the longer)."""
    names = sorted(set(names) - {name})
    for other in names:
        if _initials(name) == other or _initials(other) == name:
            return other
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if close:
        return close[0]
    shortened = [other for other in names if _abbreviates(name, other) or _abbreviates(other, name)]
    return shortened[0] if len(shortened) == 1 else None


def _abbreviates(short: str, long: str) -> bool:
    """``short`` is ``long`` with letters left out, from the same first letter (fn of function)."""
    if len(short) < 2 or len(short) >= len(long) or short[0] != long[0]:
        return False
    rest = iter(long)
    return all(char in rest for char in short)


def _initials(name: str) -> str:
    parts = [p for p in name.split("_") if p]
    return "".join(p[0] for p in parts) if len(parts) > 1 else ""


# ---------------------------------------------------------------------------------------------- dotted paths


def _members(module) -> list[str]:
    """The public attributes of ``module`` and, for a package, its submodules (imported or not)."""
    names = [n for n in dir(module) if not n.startswith("_")]
    if hasattr(module, "__path__"):
        names += [m.name for m in pkgutil.iter_modules(module.__path__)]
    return names


def _top_level_modules() -> list[str]:
    return [m.name for m in pkgutil.iter_modules() if not m.name.startswith("_")]


def _resolve(parts: list[str]) -> tuple[Any, int]:
    """The object the longest resolvable prefix of ``parts`` names, and how many parts it took (0: not even the first)."""
    obj, taken = None, 0
    for i in range(len(parts), 0, -1):  # the longest importable module first
        try:
            obj, taken = importlib.import_module(".".join(parts[:i])), i
            break
        except ImportError:
            continue
    if obj is None:
        return None, 0
    for part in parts[taken:]:
        if not hasattr(obj, part):
            break
        obj, taken = getattr(obj, part), taken + 1
    return obj, taken


def resolves(path: str) -> bool:
    """Whether dotted ``path`` names something importable."""
    parts = path.split(".")
    return _resolve(parts)[1] == len(parts)


def unresolved(path: str) -> str:
    """Why dotted ``path`` does not import, in a few words: ``no module 'my_rewards'``, ``'my_rewards' has no 'scor'``."""
    parts = path.split(".")
    _, taken = _resolve(parts)
    if taken == 0:
        return f"no module {parts[0]!r}"
    return f"{'.'.join(parts[:taken])!r} has no {parts[taken]!r}" if taken < len(parts) else "it imports"


def closest_dotted(path: str) -> str | None:
    """The importable dotted path closest to ``path``, correcting each name that does not resolve by the closest
    member of what its prefix names (``components.env.ToolEnvironmnt`` -> ``components.env.ToolEnvironment``); None
    when a name has no close member."""
    parts = path.split(".")
    for _ in range(len(parts)):
        obj, taken = _resolve(parts)
        if taken == len(parts):
            return ".".join(parts)
        names = _top_level_modules() if taken == 0 else _members(obj)
        fix = closest_name(parts[taken], names)
        if fix is None:
            return None
        parts[taken] = fix
    return None


def import_error(path: str, key: str, expects: str) -> ConfigError:
    """The one line for dotted ``path`` (set at ``key``) that does not import: why, the closest path that does, and
    ``expects`` (what to give instead)."""
    fix = closest_dotted(path)
    hint = f" (did you mean {fix}?)" if fix else ""
    return ConfigError(f"{key}: cannot import {path}: {unresolved(path)}{hint}; give {expects}")


def import_object(path: str, key: str, expects: str) -> Any:
    """The object at dotted ``path`` (``my_project.agents.solve``), imported as a config names it; otherwise the
    `ConfigError` of `import_error`. An error raised inside the module (its own bug, or a module it imports that is
    missing) is left as it is: its trace says where."""
    module_name, _, name = path.rpartition(".")
    if not module_name or not name:
        raise ConfigError(f"{key}: {path!r} is not a dotted path (module.name); give {expects}")
    try:
        return getattr(importlib.import_module(module_name), name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if not (module_name == missing or module_name.startswith(f"{missing}.")):
            raise
    except AttributeError:
        pass
    raise import_error(path, key, expects) from None


# ---------------------------------------------------------------------------------------------- file paths


def closest_path(path: str) -> str | None:
    """The existing path closest to ``path``, correcting each folder or file name that does not exist by the closest
    entry of its parent (``lightning_rl/assets/tiny-arth`` -> ``lightning_rl/assets/tiny-arith``); None when a name
    has no close entry. Written as ``path`` was (relative stays relative)."""
    expanded = Path(os.path.expanduser(path))
    parts = list(expanded.parts)
    for i, part in enumerate(parts):
        here = Path(*parts[: i + 1])
        if here.exists():
            continue
        parent = Path(*parts[:i]) if i else Path(".")
        try:
            entries = [p.name for p in parent.iterdir()]
        except OSError:
            return None
        fix = closest_name(part, entries)
        if fix is None:
            return None
        parts[i] = fix
    found = str(Path(*parts)) if parts else None
    if found is not None and path.startswith("~") and found.startswith(os.path.expanduser("~")):
        found = "~" + found[len(os.path.expanduser("~")) :]
    return found


class RewardError(RuntimeError):
    """A reward that raised (or returned no finite number) on a row, named with the reward, the exception, the row and
    the option that scores such rows instead (the command line prints it as one line; the trace goes to the run's log)."""


class NonFiniteTrainingError(RuntimeError):
    """Training produced a non-finite loss, gradient or weight (the loop's health checks, or a checkpoint refused)."""
