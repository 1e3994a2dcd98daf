"""Where prompt rows come from: jsonl / parquet files, `datasets` folders and hub ids, and sources registered by prefix
(lightning_rl.core.sources: ``builtin:<task>`` here, ``reasoning_gym:<task>``, a component's own such as
``verifiers:``), each checked for the columns a run maps."""

from __future__ import annotations

import os

import lightning_rl.data.reasoning_gym  # noqa: F401 (registers reasoning_gym:)
from lightning_rl.core.errors import closest_name, closest_path
from lightning_rl.core.sources import find_source, row_source
from lightning_rl.data.checks import DataError
from lightning_rl.data.json_files import as_written, check_utf8, read_json_list, read_jsonl
from lightning_rl.data.tasks import BUILTIN_TASKS


@row_source("builtin")
def builtin_rows(source: str, split: str) -> list[dict]:
    """``builtin:<task>``: a task shipped with lightning_rl (lightning_rl.data.tasks)."""
    name = source.split(":", 1)[1]
    if name not in BUILTIN_TASKS:
        raise ValueError(f"unknown built-in task {source!r}; available: {[f'builtin:{k}' for k in BUILTIN_TASKS]}")
    return BUILTIN_TASKS[name](split)


def load_rows(source: str, split: str):
    """A `datasets.Dataset` from a registered ``<prefix>:`` source, a data file, a ``save_to_disk`` folder or a hub id."""
    import datasets

    rows = find_source(source)
    if rows is not None:
        return datasets.Dataset.from_list(rows(source, split))
    path = os.path.expanduser(source)
    suffix = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
    ext = os.path.splitext(path)[1]
    if ext in suffix:
        if not os.path.exists(path):
            raise FileNotFoundError(f"data file {source!r} does not exist{_closest_hint(source)}")
        if ext == ".jsonl":  # read as written (lightning_rl.data.json_files), not by datasets' Json type
            return as_written(read_jsonl(path))
        listed = read_json_list(path) if ext == ".json" else None
        if listed is not None:
            return as_written(listed)
        try:
            rows = datasets.load_dataset(suffix[ext], data_files=path, split="train")
        except Exception as err:
            if ext != ".parquet":
                check_utf8(path)  # names the file and the line
            if os.path.getsize(path) == 0:
                raise ValueError(f"data file {source!r} is empty; it needs one prompt per row") from None
            raise ValueError(
                f"could not read data file {source!r} as {suffix[ext]} ({type(err).__name__}: {err})"
            ) from err
        if len(rows) == 0:
            raise ValueError(f"data file {source!r} has no rows; it needs one prompt per row")
        return rows
    if os.path.isdir(path):
        loaded = datasets.load_from_disk(path)
        return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
    if source.startswith((".", "/", "~")):
        raise FileNotFoundError(f"data path {source!r} does not exist{_closest_hint(source)}")
    try:
        return datasets.load_dataset(source, split=split)
    except Exception as err:  # the hub raises many types; the cause is kept
        raise OSError(
            f"could not load dataset {source!r} split {split!r} from the hub ({err}); on an offline machine pass a local file"
        ) from err


def _closest_hint(source: str) -> str:
    """`` (did you mean 'data/train.jsonl'?)`` for the existing path closest to ``source``; nothing when none is close."""
    close = closest_path(source)
    return f" (did you mean {close!r}?)" if close and close != source else ""


def check_jsonl(path: str) -> None:
    """Fail naming the file, the line and the fix when a .jsonl file is empty, not UTF-8, or a line is not one JSON
    object (lightning_rl.data.json_files)."""
    read_jsonl(path)


def check_columns(rows, mapping: dict[str, str], source: str, key: str = "data.columns") -> None:
    """Fail in one line (a `DataError`) naming every column ``source`` does not have, the config key that maps it
    (``key.<ours>``), the closest column it has and the fix; the columns it has are listed."""
    have = list(rows.column_names)
    missing = [(ours, theirs, closest_name(theirs, have)) for ours, theirs in mapping.items() if theirs not in have]
    if not missing:
        return
    named = ", ".join(
        f"{theirs!r} ({key}.{ours}{f'; did you mean {close!r}?' if close else ''})"
        if key == "data.columns"
        else f"{theirs!r}{f' (did you mean {close!r}?)' if close else ''}"
        for ours, theirs, close in missing
    )
    fix = (
        f"map {'it' if len(missing) == 1 else 'them'} with data.columns: "
        + "{"
        + ", ".join(f"{ours}: {close or '<column>'}" for ours, _, close in missing)
        + "}"
        if key == "data.columns"
        else f"set {key} to columns it has"
    )
    raise DataError(f"{source} has no column {named}; its columns are {have}: {fix}")
