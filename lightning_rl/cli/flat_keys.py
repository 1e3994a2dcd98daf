"""The flat keys a server rollout (`components.rollout.server.ServerRollout`) and a server teacher
(`components.teacher.ServerTeacher`) took before their settings became nested objects (``servers:``, ``weights:``,
``verify:``). For one release the command line translates each, on the command line and in a config file, to its
nested key before parsing, with one warning line per key naming the new key; in Python the settings objects are
passed, and the flat keyword arguments are gone.

A key is translated under ``model.rollout`` and ``model.teacher`` unless the class named there is known and is no
server rollout (teacher): another class may take a flat key of the same name as its own.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import yaml
from jsonargparse import get_loader
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from components.rollout.server.rollout import ServerRollout
from components.teacher.server import ServerTeacher

FLAT_SERVERS = (
    "launch",
    "launch_python",
    "launch_timeout_s",
    "timeout_s",
    "max_retries",
    "backoff",
    "max_concurrency",
    "deadline_s",
    "progress_every_s",
    "max_restarts",
    "server_wait_s",
    "health_deadline_s",
    "launch_servers",
)
FLAT_WEIGHTS = (
    "weight_sync",
    "weight_dir",
    "weight_update_urls",
    "bucket_mb",
    "master_address",
    "master_port",
    "group_backend",
    "group_per_server",
    "flush_cache",
    "release_memory",
    "sync_before_first_rollout",
    "lora_sync",
    "partial_rollouts",
)
NESTED: dict[str, str] = {
    "base_url": "servers.urls",
    **{key: f"servers.{key}" for key in FLAT_SERVERS},
    **{key: f"weights.{key}" for key in FLAT_WEIGHTS},
    "verify_every": "verify.every",
    "verify_tolerance": "verify.tolerance",
    "verify_checksums": "verify.checksums",
}
"""Each flat key of a server rollout -> its nested key under the rollout's ``init_args``. A server teacher took the
ones that go to ``servers``."""

OWNERS = ("rollout", "teacher")
FLAG = re.compile(r"--model\.(rollout|teacher)\.(init_args\.)?(\w+)(\.[^=]*)?(=.*)?", re.DOTALL)


def nested_key(owner: str, flat: str) -> str | None:
    """The nested key (under ``init_args``) of ``flat`` for ``model.<owner>``, or None when it is no flat key of it."""
    new = NESTED.get(flat)
    if new is None or (owner == "teacher" and not new.startswith("servers.")):
        return None
    return new


def warn(owner: str, flat: str, new: str) -> None:
    if rank_zero_only.rank == 0:  # every rank parses the same command line: one warning per run
        key = f"model.{owner}.init_args"
        print(f"warning: {key}.{flat} is now {key}.{new}; the flat key goes in the next release", file=sys.stderr)


def urls_value(value):
    """``base_url`` took one URL, a list of them or null; ``servers.urls`` takes a list."""
    return [] if value is None else [value] if isinstance(value, str) else value


def takes_flat_keys(owner: str, class_path: object) -> bool:
    """Whether ``model.<owner>``'s flat keys are translated: its class is a server rollout (teacher), or unknown here
    (named in another file, or not importable: the parser says so)."""
    if not isinstance(class_path, str) or not class_path:
        return True
    base = ServerRollout if owner == "rollout" else ServerTeacher
    if "." not in class_path:  # a short name, of a subclass imported already (as jsonargparse resolves it)
        return _subclass_named(base, class_path) is not None
    module, _, name = class_path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return True  # the parser names what does not import
    return isinstance(found, type) and issubclass(found, base)


def _subclass_named(base: type, name: str) -> type | None:
    for sub in base.__subclasses__():
        if sub.__name__ == name:
            return sub
        found = _subclass_named(sub, name)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------------------------------- config files
def translate_config_text(text: str) -> str:
    """A config file's text with the flat keys under ``model.rollout.init_args`` and ``model.teacher.init_args`` (also
    under a subcommand, ``fit.model...``) nested; the text itself when it has none."""
    try:
        config = get_loader("yaml")(text)
    except yaml.YAMLError:
        return text  # the parser reports it
    if not isinstance(config, dict) or not translate_config(config):
        return text
    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True)


def translate_config(config: dict) -> bool:
    """Nest the flat keys of ``config`` in place, warning for each; whether any was."""
    changed = False
    for owner, spec in _specs(config):
        init = spec.get("init_args")
        if not isinstance(init, dict) or not takes_flat_keys(owner, spec.get("class_path")):
            continue
        for flat in [key for key in init if nested_key(owner, key)]:
            new, value = nested_key(owner, flat), init.pop(flat)
            group, field = new.split(".")
            nested = init.setdefault(group, {})
            if not isinstance(nested, dict):
                init[group] = nested = {}
            nested.setdefault(field, urls_value(value) if flat == "base_url" else value)  # a nested key given wins
            warn(owner, flat, new)
            changed = True
    return changed


def _specs(config: dict):
    """(owner, its subclass spec) for ``model.rollout`` and ``model.teacher``, at the top or under a subcommand."""
    models = [config.get("model")] + [v.get("model") for v in config.values() if isinstance(v, dict)]
    for model in models:
        for owner in OWNERS:
            spec = model.get(owner) if isinstance(model, dict) else None
            if isinstance(spec, dict):
                yield owner, spec


# ---------------------------------------------------------------------------------------------- the command line
def translate_argv(args: list[str]) -> list[str]:
    """The command line with ``--model.rollout[.init_args].<flat key>`` (and ``model.teacher``'s) nested, warning for
    each; a ``base_url`` value becomes a list."""
    classes = _classes_named(args)
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        match = FLAG.fullmatch(arg)
        new = nested_key(match[1], match[3]) if match else None
        if new is None or not takes_flat_keys(match[1], classes.get(match[1])):
            out.append(arg)
            i += 1
            continue
        owner, init_args, flat, deeper, assigned = match.groups()
        key = f"--model.{owner}.{init_args or ''}{new}{deeper or ''}"
        warn(owner, flat, new)
        if assigned is not None:
            value = assigned[1:]
            out.append(f"{key}={_urls_flag(value)}" if flat == "base_url" and not deeper else f"{key}={value}")
            i += 1
        elif i + 1 < len(args):
            value = args[i + 1]
            out += [key, _urls_flag(value) if flat == "base_url" and not deeper else value]
            i += 2
        else:
            out.append(key)
            i += 1
    return out


def _urls_flag(value: str) -> str:
    try:
        loaded = get_loader("yaml")(value)
    except yaml.YAMLError:
        loaded = value
    if not (loaded is None or isinstance(loaded, str)):
        return value
    return json.dumps(urls_value(loaded))


def _classes_named(args: list[str]) -> dict[str, str]:
    """The class each owner's last mention names on the command line: in a ``--config`` file or a flag."""
    classes: dict[str, str] = {}
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if name == "--config":
            for owner, spec in _specs(_load_file(value)):
                if isinstance(spec.get("class_path"), str):
                    classes[owner] = spec["class_path"]
        for owner in OWNERS:
            if name in (f"--model.{owner}", f"--model.{owner}.class_path"):
                classes[owner] = _class_path_of(value)
    return classes


def _load_file(path: str) -> dict:
    try:
        loaded = get_loader("yaml")(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _class_path_of(value: str) -> str:
    """A flag's value: a class path, or a subclass spec (``{class_path: ...}``) as YAML or a file."""
    try:
        loaded = get_loader("yaml")(value)
    except yaml.YAMLError:
        return ""
    if isinstance(loaded, dict):
        return str(loaded.get("class_path") or "")
    if isinstance(loaded, str) and Path(loaded).is_file():
        return str(_load_file(loaded).get("class_path") or "")
    return loaded if isinstance(loaded, str) else ""
