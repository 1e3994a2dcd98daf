"""The table of sampled completions a researcher reads beside the curves: one row per prompt (different prompts,
not one prompt's group), with the completion, its reward, the gold answer where the data has one, the advantage
the update gave it and, when a teacher scored it (distillation), the teacher's log-prob of each sampled token. The prompt is shown as the model read it (its token ids decoded): a character the tokenizer does not
know shows as its unknown token, not as the data's text. Printed to the console and written to TensorBoard as text;
a prompt's images are listed in the table (count and sizes) and drawn, beside the completion, as TensorBoard images."""

from __future__ import annotations

from typing import Callable

import torch

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.ops import masked_mean
from lightning_rl.core.vision import image_summary

MAX_CHARS = 200  # a cell longer than this is cut: the table is for reading at a glance


def sample_indices(batch: RolloutBatch, n: int) -> list[int]:
    """The rows shown: the first sampled completion of each of the first ``n`` groups (greedy baseline rows skipped)."""
    greedy = batch.is_greedy if batch.is_greedy is not None else torch.zeros(batch.batch_size)
    indices, seen = [], set()
    for i, (group, is_greedy) in enumerate(zip(batch.group_ids.tolist(), greedy.tolist())):
        if len(indices) == n:
            break
        if not is_greedy and group not in seen:
            seen.add(group)
            indices.append(i)
    return indices


def sample_rows(batch: RolloutBatch, n: int, decode: Callable[[list[int]], str] | None = None) -> list[dict[str, str]]:
    """Up to ``n`` rows (`sample_indices`) from the batch's ``columns`` (prompts, completions or an agent's transcripts,
    the gold answer), its images and numbers; ``decode`` turns a prompt's token ids into the text shown (None: the data's text)."""
    columns = batch.columns or {}
    mask = batch.action_tokens  # (B, R): a multi-turn transcript's observations carry no advantage
    advantages = None
    if batch.advantages is not None:  # the sequence's mean advantage over the model's tokens (GRPO: the one scalar)
        advantages = masked_mean(batch.advantages.float(), mask, dim=1)  # (B,)
    rows = []
    for i in sample_indices(batch, n):
        completion = (
            columns["transcripts"][i] if "transcripts" in columns else columns["completions"][i]
        )  # multi-turn: observations marked
        prompt = columns["prompts"][i]
        if decode is not None and batch.prompt_ids is not None:
            prompt = decode(batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist())
        row = {"prompt": prompt, "completion": completion, "reward": f"{float(batch.scores[i]):.3f}"}
        if batch.images is not None:
            row = {"images": image_summary(batch.images[i]), **row}
        if "answer" in columns:
            row["gold"] = str(columns["answer"][i])
        if advantages is not None:
            row["advantage"] = f"{float(advantages[i]):+.3f}"
        if batch.teacher_logprobs is not None:  # distillation: how the teacher scored each token the model sampled
            row["teacher logprobs"] = " ".join(f"{v:.2f}" for v in batch.teacher_logprobs[i][mask[i] != 0].tolist())
        rows.append({k: _cell(v) for k, v in row.items()})
    return rows


def picture(images: list, row: dict[str, str], height: int = 112):
    """A prompt's images side by side (scaled to ``height`` pixels, so a small picture can be seen) above a caption with
    the completion, its reward and the gold answer: what a TensorBoard image summary shows for one sample."""
    from PIL import Image, ImageDraw

    scaled = [
        im.convert("RGB").resize((max(1, round(im.width * height / im.height)), height), Image.NEAREST) for im in images
    ]
    caption = [
        f"completion: {row['completion']}",
        f"reward {row['reward']}" + (f"   gold {row['gold']}" if "gold" in row else ""),
    ]
    width = max([sum(im.width for im in scaled) + 4 * max(0, len(scaled) - 1), 6 * max(map(len, caption)) + 8, 64])
    canvas = Image.new("RGB", (width, height + 14 * len(caption) + 8), (255, 255, 255))
    x = 0
    for im in scaled:
        canvas.paste(im, (x, 0))
        x += im.width + 4
    draw = ImageDraw.Draw(canvas)
    for k, line in enumerate(caption):
        draw.text((4, height + 4 + 14 * k), line, fill=(0, 0, 0))
    return canvas


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
