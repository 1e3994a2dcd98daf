"""`RunSummary`: what a ``fit`` says about itself. At the start, the run's folder (before any model loads); at the end,
a few lines: the held-out score before -> after, the iterations and the wall time, where the checkpoint is and the
command that validates it; and in TensorBoard (*Images*) a small plot of the held-out score per iteration."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Callable

from lightning import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_rl.runs import run_folder, shown_path, tensorboard

CURVE_TAG = "val/curve"
"""The TensorBoard image of the held-out score per iteration, written at the end of fit."""


def held_out_scores(metrics: dict) -> dict[str, float]:
    """The held-out scores among ``metrics``: ``val/reward`` and, with several sets, ``val/<set>/reward``."""
    return {k: float(v) for k, v in metrics.items() if k.startswith("val/") and k.endswith("/reward")}


class RunSummary(Callback):
    """The run folder when ``fit`` sets up; the summary when it ends (only where it ends: an error says its own line)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started: float | None = None
        self.first_step = 0
        self.points: list[tuple[int, dict[str, float]]] = []
        """(iteration, held-out scores) of each validation in this fit."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero:
            return
        folder = run_folder(trainer)
        if folder is not None:
            rank_zero_info(
                f"run folder: {shown_path(folder)} (tensorboard --logdir {shown_path(folder.parent.parent)})"
            )

    def on_fit_start(self, trainer, pl_module) -> None:
        self.started, self.first_step, self.points = self.clock(), trainer.global_step, []

    def on_validation_end(self, trainer, pl_module) -> None:
        scores = held_out_scores(trainer.callback_metrics)
        if trainer.state.fn == "fit" and not trainer.sanity_checking and scores:
            self.points.append((trainer.global_step, scores))

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or self.started is None:
            return
        rank_zero_info("\n".join(self.lines(trainer)))
        experiment = tensorboard(trainer)
        if self.points and experiment is not None:
            import numpy as np

            picture = curve_picture(self.points)
            experiment.add_image(CURVE_TAG, np.asarray(picture), trainer.global_step, dataformats="HWC")

    def lines(self, trainer) -> list[str]:
        """The summary: iterations and time, the held-out score before -> after, the checkpoint."""
        done = trainer.global_step - self.first_step
        resumed = f", from iteration {self.first_step} to {trainer.global_step}" if self.first_step else ""
        elapsed = timedelta(seconds=round(self.clock() - self.started))
        folder = run_folder(trainer)
        where = f" ({shown_path(folder)})" if folder is not None else ""
        lines = [f"fit done: {done} RL iterations in {elapsed}{resumed}{where}"]
        if self.points:
            (first_step, first), (last_step, last) = self.points[0], self.points[-1]
            for key in last:
                before = f"{first[key]:.3g}" if key in first else "-"
                lines.append(f"  held-out {key}: {before} -> {last[key]:.3g} (iteration {first_step} -> {last_step})")
        checkpoint = last_checkpoint(trainer)
        if checkpoint is not None:
            lines.append(f"  checkpoint: {checkpoint} (--ckpt_path continues the run from it)")
        return lines


def last_checkpoint(trainer) -> str | None:
    """Where the last checkpoint of this fit is, as a command line would name it; None when nothing was saved."""
    for callback in trainer.checkpoint_callbacks:
        path = (callback.last_model_path or callback.best_model_path) if isinstance(callback, ModelCheckpoint) else ""
        if path:
            return shown_path(path)
    return None


def curve_picture(points: list[tuple[int, dict[str, float]]], width: int = 360, height: int = 220):
    """A line chart of each held-out score (y) against the iteration (x), one colour per score, for TensorBoard."""
    from PIL import Image, ImageDraw

    colours = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189)]
    keys = list(dict.fromkeys(k for _, scores in points for k in scores))
    values = [v for _, scores in points for v in scores.values()]
    low, high = min(0.0, min(values)), max(1.0, max(values))
    steps = [s for s, _ in points]
    first, last = min(steps), max(steps)
    left, right, top, bottom = 40, width - 12, 24, height - 28 - 12 * len(keys)
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)

    def x(step: int) -> float:
        return left + (right - left) * ((step - first) / (last - first) if last > first else 0.5)

    def y(value: float) -> float:
        return bottom - (bottom - top) * (value - low) / (high - low)

    draw.text((left, 4), "held-out score per iteration", fill=(0, 0, 0))
    draw.rectangle((left, top, right, bottom), outline=(160, 160, 160))
    for value in (low, (low + high) / 2, high):
        draw.line((left - 3, y(value), left, y(value)), fill=(0, 0, 0))
        draw.text((4, y(value) - 6), f"{value:.2g}", fill=(0, 0, 0))
    draw.text((left, bottom + 4), str(first), fill=(0, 0, 0))
    draw.text((right - 6 * len(str(last)), bottom + 4), str(last), fill=(0, 0, 0))
    for k, key in enumerate(keys):
        colour = colours[k % len(colours)]
        line = [(x(s), y(scores[key])) for s, scores in points if key in scores]
        if len(line) > 1:
            draw.line(line, fill=colour, width=2)
        for px, py in line:
            draw.ellipse((px - 3, py - 3, px + 3, py + 3), fill=colour)
        final = [scores[key] for _, scores in points if key in scores][-1]
        draw.text((left, bottom + 16 + 12 * k), f"{key}: {final:.3g} at iteration {last}", fill=colour)
    return canvas
