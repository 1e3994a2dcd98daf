""" "Did you mean" for a mistyped option or config key, on the command line or in a YAML file, and one line for a
dotted path that does not import (a class_path, a reward function).

A name is compared with its siblings (the options under the same parent), by the last name: ``learning_rate``
is closer to ``lr`` (its initials) than to ``min_lr_ratio``, whatever the full dotted strings look like.
"""

from __future__ import annotations

import importlib
import inspect
import re
import typing

from lightning_rl.core.errors import closest_name, import_error, resolves

# LightningCLI's own flags for Lightning's optimizer / scheduler, which optimize nothing here: where their settings live
ROUTED = {"optimizer": "model.optimizer", "lr_scheduler": "model.optimizer.schedule"}
CLASS_KEYS = ("class_path", "init_args", "dict_kwargs")


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
        takes = arguments(given.group(1))
        hints += [takes] if takes else []
    value = re.search(r"Not a valid subclass of .*?Got value: \{(.*)\}", message, flags=re.S)
    if value:
        for name in re.findall(r"'(\w+)': ", value.group(1)):
            fix = closest_name(name, list(CLASS_KEYS)) if name not in CLASS_KEYS else None
            hints += [f"{name} -> did you mean {fix}?"] if fix else []
    return "; ".join(hints) or None


def arguments(class_path: str) -> str | None:
    """What the class at ``class_path`` accepts, as ``--help`` lists it: ``FunctionReward takes fn: Callable[..., Any]
    (required), kwargs: dict[str, Any] | None = None, ...``; None when it does not import."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        parameters = inspect.signature(cls).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # a name only imported for type checkers: the annotation as written
        hints = {}
    shown = []
    for parameter in parameters.values():
        if parameter.name in ("self", "args", "kwargs") and parameter.kind in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            continue
        annotation = hints.get(parameter.name, parameter.annotation)
        typed = "" if annotation is parameter.empty else f": {_type_text(annotation)}"
        default = " (required)" if parameter.default is parameter.empty else f" = {parameter.default!r}"
        shown.append(f"{parameter.name}{typed}{default}")
    return f"{name} takes {', '.join(shown)}" if shown else f"{name} takes no arguments"


def _type_text(annotation) -> str:
    """An annotation as written in a config's terms: ``float | None``, ``Literal['raise', 'score']``, ``Reward``."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    text = re.sub(r"<class '(?:[\w]+\.)*(\w+)'>", r"\1", str(annotation))
    return re.sub(r"\b(?:typing|collections\.abc|(?:[a-z_]\w*\.)+)(?=[A-Z]\w*)", "", text).replace("NoneType", "None")


def _init_parameters(class_path: str) -> list[str]:
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        return [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    except (ImportError, AttributeError, TypeError, ValueError):
        return []


def unimportable(message: str) -> str | None:
    """One line for a jsonargparse error about a dotted path that does not import (a ``class_path``, a function such as
    FunctionReward's ``fn``): its config key, the path, the name that does not resolve, the closest path that does and
    the fix; None for any other error. jsonargparse's own message nests every Union member it tried."""
    candidates = [
        *re.findall(r"Expected a path but ([\w.]+) either", message),
        *re.findall(r"class_path '([\w.]+)'", message),
        *re.findall(r"Got value: ([\w.]+)", message),
    ]
    failing = [c for c in candidates if "." in c and not resolves(c)]
    if not failing or not re.search(r"has no attribute|No module named", message):
        return None
    path = failing[-1]  # the innermost: an environment's class_path inside an agent's
    keys = re.findall(r'Parser key "([\w.]+)"', message)
    key = ".init_args.".join(keys) if keys else "class_path"
    expects = (
        "the dotted path of a function, importable from the folder you run in"
        if "expects a function" in message
        else "a class: `lightning-rl components` lists ours; yours import from the folder you run in"
    )
    return str(import_error(path, key, expects))
