"""The table of sampled completions a researcher reads beside the curves: one row per prompt (different prompts,
not one prompt's group), with the completion, its reward, the gold answer where the data has one and the advantage
the update gave it. The prompt is shown as the model read it (its token ids decoded): a character the tokenizer does not
know shows as its unknown token, not as the data's text. Printed to the console and written to TensorBoard as text."""

from __future__ import annotations

from typing import Callable

import torch

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.ops import masked_mean

MAX_CHARS = 200  # a cell longer than this is cut: the table is for reading at a glance


def sample_rows(batch: RolloutBatch, n: int, decode: Callable[[list[int]], str] | None = None) -> list[dict[str, str]]:
    """Up to ``n`` rows, the first sampled completion of each of the first ``n`` groups (greedy baseline rows skipped),
    from the batch's ``columns`` (prompts, completions or an agent's transcripts, the gold answer) and numbers;
    ``decode`` turns a prompt's token ids into the text shown (None: the data's text)."""
    columns = batch.columns or {}
    mask = batch.action_tokens  # (B, R): a multi-turn transcript's observations carry no advantage
    advantages = None
    if batch.advantages is not None:  # the sequence's mean advantage over the model's tokens (GRPO: the one scalar)
        advantages = masked_mean(batch.advantages.float(), mask, dim=1)  # (B,)
    greedy = batch.is_greedy if batch.is_greedy is not None else torch.zeros(batch.batch_size)
    rows, seen = [], set()
    for i, (group, is_greedy) in enumerate(zip(batch.group_ids.tolist(), greedy.tolist())):
        if len(rows) == n:
            break
        if is_greedy or group in seen:
            continue
        seen.add(group)
        completion = columns["transcripts"][i] if "transcripts" in columns else columns["completions"][i]  # multi-turn: observations marked
        prompt = columns["prompts"][i]
        if decode is not None and batch.prompt_ids is not None:
            prompt = decode(batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist())
        row = {"prompt": prompt, "completion": completion, "reward": f"{float(batch.scores[i]):.3f}"}
        if "answer" in columns:
            row["gold"] = str(columns["answer"][i])
        if advantages is not None:
            row["advantage"] = f"{float(advantages[i]):+.3f}"
        rows.append({k: _cell(v) for k, v in row.items()})
    return rows


def _cell(text) -> str:
    text = str(text).replace("\n", " ")
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 1] + "…"


def markdown(rows: list[dict[str, str]]) -> str:
    """The rows as a Markdown table (TensorBoard's text tab renders it)."""
    if not rows:
        return ""
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row[c].replace("|", "\\|") for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def print_rows(rows: list[dict[str, str]], title: str, console=None) -> None:
    """The rows as a rich table on ``console`` (the progress bar's, so the bar stays below it)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if not rows:
        return
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in rows[0]:
        numeric = column in ("reward", "advantage")
        table.add_column(column, justify="right" if numeric else "left", overflow="fold", ratio=None if numeric else 1)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row.values()))  # plain text: "[[env: ...]]" is not console markup
    (console or Console()).print(table)
