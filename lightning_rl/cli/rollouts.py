"""`lightning-rl rollouts show DIR [--iteration N]`: a rollout record (lightning_rl.rollouts) as tables.

lightning-rl rollouts show runs/grpo/version_0/rollouts                  # one line per iteration
lightning-rl rollouts show runs/grpo/version_0/rollouts --iteration 42   # its samples: prompt, response, reward...
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from lightning_rl.rollouts import Record, RecordedIteration
from lightning_rl.rollouts.iteration import read_fields, read_meta

SUMMARY_FIELDS = ("scores", "response_mask", "truncated", "versions")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lightning-rl rollouts", description="Read a rollout record.")
    actions = parser.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="a record's iterations, or one iteration's samples")
    show.add_argument("path", help="a record's folder (runs/<name>/version_N/rollouts) or one of its files")
    show.add_argument("--iteration", type=int, default=None, help="show this iteration's samples")
    show.add_argument("--rank", type=int, default=0, help="the data-parallel rank whose batch to show")
    show.add_argument("--rows", type=int, default=32, help="samples shown of the iteration (0 = all)")
    args = parser.parse_args(argv)
    record = Record(args.path)
    console = Console()
    iteration = args.iteration
    if iteration is None and Path(args.path).is_file():
        iteration = read_meta(Path(args.path))["iteration"]
    if iteration is None:
        console.print(f"{record.folder}: {len(record)} iterations, {record.world_size} rank(s)")
        console.print(summary_table(record))
    else:
        recorded = record.read(iteration, args.rank)
        console.print(header(recorded))
        console.print(samples_table(recorded, args.rows))


def summary_table(record: Record) -> Table:
    """One row per iteration: samples, the trained version, staleness, reward, response length, the file's size."""
    table = Table()
    for name in ("iteration", "samples", "version", "staleness", "reward", "length", "truncated", "KiB"):
        table.add_column(name, justify="right")
    for iteration in record.iterations:
        path = record.path(iteration)
        meta, values = read_meta(path), read_fields(path, SUMMARY_FIELDS)
        lengths = values["response_mask"].sum(-1).float()
        staleness = meta["version"] - values["versions"] if "versions" in values else None
        table.add_row(
            str(iteration),
            str(len(lengths)),
            str(meta["version"]),
            "-" if staleness is None or not len(staleness) else f"{int(staleness.min())}..{int(staleness.max())}",
            _mean(values.get("scores")),
            _mean(lengths),
            _mean(values["truncated"].float() if "truncated" in values else None),
            f"{path.stat().st_size / 1024:.1f}",
        )
    return table


def header(recorded: RecordedIteration) -> str:
    batch = recorded.batch
    computed = [n for n, v in vars(batch).items() if v is not None and n not in recorded.collected]
    staleness = recorded.staleness
    stale = "" if staleness is None else f", staleness {int(staleness.min())}..{int(staleness.max())}"
    return (
        f"iteration {recorded.iteration} (rank {recorded.rank}): {batch.batch_size} samples trained by policy version "
        f"{recorded.version}{stale}\n  from the rollout and reward: {', '.join(recorded.collected)}\n"
        f"  computed by the trainer: {', '.join(computed) or 'nothing (on-policy: old log-probs in the update)'}"
    )


def samples_table(recorded: RecordedIteration, rows: int = 32) -> Table:
    """One row per sample: group, prompt, response, reward (and its parts), mean advantage, version, staleness."""
    batch = recorded.batch
    columns = batch.columns or {}
    prompts = columns.get("prompts") or columns.get("prompt") or [str(ids) for ids in batch.prompt_ids.tolist()]
    responses = (
        columns.get("transcripts") or columns.get("completions") or [str(r) for r in batch.response_ids.tolist()]
    )
    mask = batch.loss_mask
    advantage = None if batch.advantages is None else (batch.advantages * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    parts = batch.score_parts or {}
    shown = batch.batch_size if rows <= 0 else min(rows, batch.batch_size)
    more = f" ({batch.batch_size - shown} more: --rows 0 shows all)" if shown < batch.batch_size else ""
    table = Table(title=f"iteration {recorded.iteration}: samples 0..{shown - 1}{more}", show_lines=True)
    for name in ("#", "group", "prompt", "response", "reward", *parts, "advantage", "version", "stale"):
        wide = name in ("prompt", "response")
        table.add_column(name, overflow="fold", ratio=2 if wide else None, justify="left" if wide else "right")
    staleness = recorded.staleness
    for i in range(shown):
        table.add_row(
            str(i),
            _at(batch.group_ids, i),
            str(prompts[i]),
            str(responses[i]),
            _at(batch.scores, i),
            *(_at(part, i) for part in parts.values()),
            _at(advantage, i),
            _at(batch.versions, i),
            _at(staleness, i),
        )
    return table


def _at(values: torch.Tensor | None, i: int) -> str:
    if values is None:
        return "-"
    value = values[i].item()
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _mean(values: torch.Tensor | None) -> str:
    return "-" if values is None or not len(values) else f"{float(values.float().mean()):.4g}"


if __name__ == "__main__":
    main()
