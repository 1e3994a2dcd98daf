""" "Did you mean" for a mistyped option or config key, on the command line or in a YAML file.

A name is compared with its siblings (the options under the same parent), by the last name: ``learning_rate``
is closer to ``lr`` (its initials) than to ``min_lr_ratio``, whatever the full dotted strings look like.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re

# LightningCLI's own flags for Lightning's optimizer / scheduler, which optimize nothing here: where their settings live
ROUTED = {"optimizer": "model.optimizer", "lr_scheduler": "model.optimizer.schedule"}
CLASS_KEYS = ("class_path", "init_args", "dict_kwargs")


def closest_name(name: str, names: list[str]) -> str | None:
    """The name in ``names`` a person most likely meant by ``name``: initials (learning_rate -> lr, lr -> learning_rate)
    first, then spelling (difflib, ratio >= 0.6)."""
    names = sorted(set(names) - {name})
    for other in names:
        if _initials(name) == other or _initials(other) == name:
            return other
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return close[0] if close else None


def _initials(name: str) -> str:
    parts = [p for p in name.split("_") if p]
    return "".join(p[0] for p in parts) if len(parts) > 1 else ""


def closest_key(key: str, known: set[str]) -> str | None:
    """For a dotted ``key`` (``model.optimizer.learning_rate``) that is not in ``known`` (every option's dotted key),
    the known key it most likely meant, corrected at its first unknown name (``model.optimizer.lr``); None if no name is close."""
    if key in ROUTED:
        return ROUTED[key]
    prefixes = {".".join(k.split(".")[:i]) for k in known for i in range(1, k.count(".") + 2)}
    parts = key.split(".")
    for i, part in enumerate(parts):
        parent = ".".join(parts[:i])
        here = f"{parent}.{part}" if parent else part
        if here in prefixes:
            continue
        siblings = [p.rsplit(".", 1)[-1] for p in prefixes if (p.rsplit(".", 1)[0] if "." in p else "") == parent]
        fix = closest_name(part, siblings)
        if fix is None:
            return None
        corrected = ".".join([*parts[:i], fix, *parts[i + 1 :]])
        return corrected if corrected in prefixes else ".".join([*parts[:i], fix])
    return None


def hint(message: str, known: set[str]) -> str | None:
    """A "did you mean" for a jsonargparse error ``message``, given every option's dotted key; None when there is none."""
    hints = []
    unknown = re.search(r"unrecognized arguments: (.*)", message)
    if unknown:
        for option in (a.split("=", 1)[0] for a in unknown.group(1).split() if a.startswith("--")):
            fix = closest_key(option[2:], known)
            hints += [f"{option} -> did you mean --{fix}?"] if fix else []
    group = re.search(r"(Group|Subcommand) '([\w.]+)' does not accept option '([\w.]+)'", message)
    if group:
        key = f"{group.group(2)}.{group.group(3)}" if group.group(1) == "Group" else group.group(3)
        fix = closest_key(key, known)
        hints += [f"{key} -> did you mean {fix}?"] if fix else []
    given = re.search(r"Problem with given class_path '([\w.]+)':\s*Option '([\w.]+)' is not accepted", message)
    if given:
        option = given.group(2).split(".")[0]
        fix = closest_name(option, [*CLASS_KEYS, *_init_parameters(given.group(1))])
        hints += [f"{option} -> did you mean {fix}?"] if fix else []
    value = re.search(r"Not a valid subclass of .*?Got value: \{(.*)\}", message, flags=re.S)
    if value:
        for name in re.findall(r"'(\w+)': ", value.group(1)):
            fix = closest_name(name, list(CLASS_KEYS)) if name not in CLASS_KEYS else None
            hints += [f"{name} -> did you mean {fix}?"] if fix else []
    return "; ".join(hints) or None


def _init_parameters(class_path: str) -> list[str]:
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        return [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    except (ImportError, AttributeError, TypeError, ValueError):
        return []
