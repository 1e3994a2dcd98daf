"""Data sources by prefix: ``data.train_data: <prefix>:<rest>`` names rows a registered function builds.

    @row_source("verifiers")
    def verifiers_rows(source: str, split: str) -> list[dict]: ...   # source: the whole string, "verifiers:my_env.load"

The data layer registers its own (``builtin``, ``reasoning_gym``: lightning_rl.data); a component registers the
sources it brings when its module is imported (``verifiers``: components.rollout.endpoint.verifiers_env), so the
data layer names no component and a project's component can add a source the same way. It lives in the core because
components may import only the core.
"""

from __future__ import annotations

import re
from typing import Callable

RowSource = Callable[[str, str], list[dict]]
"""(the whole source string, the split: "train" or "test") -> the rows, one dict per prompt."""

_SOURCES: dict[str, RowSource] = {}
PREFIXED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):(?!//)")  # a prefix, not a URL's scheme (hf://, s3://)


def row_source(prefix: str) -> Callable[[RowSource], RowSource]:
    """Register the decorated function as the source of ``<prefix>:...`` rows; a prefix registered twice by two
    different functions is an error naming both."""

    def register(rows: RowSource) -> RowSource:
        held = _SOURCES.get(prefix)
        if held is not None and held is not rows and _name(held) != _name(rows):
            raise ValueError(f"data source prefix {prefix!r} is registered twice: {_name(held)} and {_name(rows)}")
        _SOURCES[prefix] = rows
        return rows

    return register


def find_source(source: str) -> RowSource | None:
    """The registered function for ``source``'s prefix; None when ``source`` has no ``<prefix>:`` (a file, a folder,
    a hub id). A prefix nobody registered is an error listing the registered ones."""
    match = PREFIXED.match(source)
    if match is None or len(match.group(1)) == 1:  # C:\\data on Windows is a path
        return None
    prefix = match.group(1)
    if prefix not in _SOURCES:
        raise ValueError(
            f"data source {source!r}: no source is registered for {prefix + ':'!r}; registered: "
            f"{', '.join(p + ':' for p in registered_prefixes())} (a component registers its own with "
            "lightning_rl.core.sources.row_source when its module is imported, e.g. the verifiers: source with "
            "components.rollout.VerifiersAgent as model.agent)"
        )
    return _SOURCES[prefix]


def registered_prefixes() -> list[str]:
    return sorted(_SOURCES)


def _name(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
