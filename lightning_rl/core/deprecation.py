"""Names that moved: the old import path keeps working for one release, with a warning naming the new one."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable


def moved(old: str, new: str, names: tuple[str, ...]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old`` that finds each of ``names`` in module ``new``, warning once per import
    site (`DeprecationWarning`); any other name is an AttributeError, as without it."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old}.{name} moved: import it from {new}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__
