"""Checks on prompt data that name what a person can fix: a row without prompt text (file, row, column), and prompt
tokens the tokenizer does not know (the policy reads its unknown token there, whatever the text said). Also the
prompt as the model reads it, for the samples table."""

from __future__ import annotations

import os
import warnings


class DataError(ValueError):
    """A data file or row that cannot be used, named with its file, row and the fix (the CLI prints it as one line)."""


def check_prompts(prompts: list, source: str, column: str) -> None:
    """Fail naming the file, the row and the column when a row has no prompt text (a .jsonl line without the key,
    a null, a number)."""
    bad = next((i for i, p in enumerate(prompts) if not isinstance(p, str)), None)
    if bad is None:
        return
    where = row_name(source, bad)
    what = "has no" if prompts[bad] is None else f"has a {type(prompts[bad]).__name__} ({prompts[bad]!r}) as"
    count = sum(not isinstance(p, str) for p in prompts)
    raise DataError(
        f"{source}, {where}: {what} prompt text in column {column!r} (data.columns.prompt); {count} of {len(prompts)} row(s) "
        "are like it. Give every row its prompt as a string, or map another column with data.columns: {prompt: <column>}"
    )


def row_name(source: str, row: int) -> str:
    """``row 12`` of a data source, with its line for a .jsonl file (``row 12 (line 14)``: blank lines are skipped)."""
    where = f"row {row}"
    path = os.path.expanduser(source)
    if path.endswith(".jsonl") and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            lines = [n for n, line in enumerate(f, start=1) if line.strip()]
        where += f" (line {lines[row]})" if row < len(lines) else ""
    return where


def count_unknown_tokens(
    tokenizer, token_ids: list[list[int]], texts: list[str], source: str, tokenizer_name: str
) -> int:
    """Prompt tokens that are the tokenizer's unknown token; warns once (for ``source``) with an example."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return 0
    counts = [ids.count(unk) for ids in token_ids]
    affected = [i for i, n in enumerate(counts) if n]
    if affected:
        i = affected[0]
        warnings.warn(
            f"{len(affected)} of {len(counts)} prompt(s) in {source!r} have tokens the tokenizer of {tokenizer_name!r} does not know "
            f"({sum(counts)} {tokenizer.unk_token} of {sum(map(len, token_ids))} tokens), e.g. row {i} {texts[i][:60]!r} is read as "
            f"{visible_text(tokenizer, token_ids[i])[:120]!r}. Use a policy whose tokenizer covers the data, or write the prompts in its vocabulary"
        )
    return sum(counts)


def visible_text(tokenizer, ids: list[int]) -> str:
    """``ids`` decoded as the model reads them: padding and markers (BOS, EOS) left out, unknown tokens shown."""
    hidden = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}
    return tokenizer.decode([i for i in ids if i not in hidden], skip_special_tokens=False)
