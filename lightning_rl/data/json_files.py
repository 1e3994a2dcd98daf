"""JSON data files read as written: a .jsonl file (one object per line) or a .json file holding a list of objects.

`datasets`' JSON reader gives a column whose rows mix types (``{"answer": 2}`` and ``{"answer": "4.50"}``) its
``Json`` type, which stores a string that parses as JSON as that JSON and decodes it back: "007" arrives as 7, "4.50" as
4.5, "true" as True, and an exact-match reward scores right answers 0. Its Arrow reader also keeps bytes that are not
UTF-8 until a row is read, then fails naming neither file nor line. So these files are read here, with Python's
``json``, line by line:

- a line that is not UTF-8 or not JSON, a row that is not an object, an empty file: one `DataError` naming the file,
  the line and the fix;
- a column whose values share one JSON type keeps it (strings, numbers, booleans, objects, lists, as Arrow holds them;
  numbers that mix 2 and 2.5 are floats, as in JSON they are one type);
- a column that mixes types (2 and "4.50"; an image column of a path or a list of paths), or that Arrow cannot hold (a
  list of a number and a string), is stored as each value's JSON behind a mark and read back by the dataset's
  transform: every value arrives as the file wrote it, through ``select``, ``rename_columns`` and ``map`` alike (read
  rows by index or iteration: ``to_list`` and ``to_pandas`` skip transforms and show the stored text).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from lightning_rl.data.checks import DataError

EXAMPLE = '{"prompt": "What is 2+3?", "answer": "5"}'


def first_bad_utf8(path: str) -> tuple[int, int, int] | None:
    """(line, column, byte) of the first byte of ``path`` that is not UTF-8 text; None when every line is."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                return number, err.start + 1, line[err.start]
    return None


def check_utf8(path: str) -> None:
    """`DataError` naming the file and line of the first byte that is not UTF-8."""
    bad = first_bad_utf8(path)
    if bad is not None:
        line, column, byte = bad
        raise DataError(
            f"{path}, line {line}: byte 0x{byte:02x} at column {column} is not UTF-8 text. Save the file as UTF-8 (e.g. "
            f"iconv -f latin1 -t utf-8), or fix that line"
        )


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Every row of a .jsonl file, each value as written; `DataError` naming the file, the line and the fix."""
    check_utf8(path)
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(
                    f"{path}, line {number}: not valid JSON ({err.msg} at column {err.colno}): {line.strip()[:80]!r}. "
                    f"Each line of a .jsonl file must be one complete JSON object, e.g. {EXAMPLE}"
                ) from None
            if not isinstance(row, dict):
                raise DataError(
                    f"{path}, line {number}: a JSON {type(row).__name__}, not an object. Each line must be one JSON "
                    f"object, e.g. {EXAMPLE}"
                )
            rows.append(row)
    if not rows:
        raise DataError(f"data file {path!r} is empty: a .jsonl file needs one JSON object per line, e.g. {EXAMPLE}")
    return rows


def read_json_list(path: str) -> list[dict[str, Any]] | None:
    """The rows of a .json file that holds a list of objects, each as written; None when it holds something else (a
    table of columns, JSON lines), which `datasets` reads."""
    check_utf8(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.lstrip().startswith("["):
        return None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(
            f"{path}, line {err.lineno}: not valid JSON ({err.msg} at column {err.colno}). A .json data file holds a "
            f"list of objects, e.g. [{EXAMPLE}]"
        ) from None
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise DataError(
            f"{path}: item {bad} of its list is a JSON {type(rows[bad]).__name__}, not an object, e.g. {EXAMPLE}"
        )
    if not rows:
        raise DataError(f"data file {path!r} has no rows; it needs one prompt per row")
    return rows


def json_type(value: Any) -> str:
    """JSON's name for the type of ``value`` (a bool is not a number)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), type(value).__name__)


TEXT_MARK = "\x00json:"
"""Marks a stored value that is the JSON of what the file wrote (a NUL, which no text a row holds begins with)."""


def as_written(rows: list[dict[str, Any]]):
    """The rows as a `datasets.Dataset` whose values are what the file wrote: a column of one JSON type as that type,
    one that mixes types (or that Arrow cannot hold) stored as JSON behind `TEXT_MARK` and decoded when read."""
    import datasets

    names = list(dict.fromkeys(key for row in rows for key in row))
    columns = {name: [row.get(name) for row in rows] for name in names}
    mixed = []
    for name, values in columns.items():
        present = [v for v in values if v is not None]
        if len({json_type(v) for v in present}) > 1 or not _arrow_holds(present):
            columns[name] = [None if v is None else TEXT_MARK + json.dumps(v, ensure_ascii=False) for v in values]
            mixed.append(name)
    dataset = datasets.Dataset.from_dict(columns)
    return dataset.with_transform(decoded) if mixed else dataset


def decoded(batch: dict[str, list]) -> dict[str, list]:
    """A batch of rows with every marked value as the file wrote it (the dataset's transform: it knows no column by
    name, so renamed columns are read back too)."""
    return {
        name: [json.loads(v[len(TEXT_MARK) :]) if isinstance(v, str) and v.startswith(TEXT_MARK) else v for v in values]
        for name, values in batch.items()
    }


def _arrow_holds(values: list) -> bool:
    try:
        pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return False
    return True
