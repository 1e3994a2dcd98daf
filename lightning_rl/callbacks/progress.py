"""The console's progress: RL iterations (not epochs of an endless prompt stream), their wall clock, and what a
researcher watches. On a terminal a redrawn bar (`RLProgressBar`); in a log file or a pipe, plain lines
(`LineProgress`): rich draws a bar only on a terminal, and a log file got the last frame, wrapped over seven lines."""

from __future__ import annotations

import math
import time
from collections import deque
from datetime import timedelta
from typing import Callable

from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import CustomTimeColumn, ProcessingSpeedColumn
from lightning.pytorch.trainer.states import TrainerFn
from rich.console import Console
from rich.progress import ProgressColumn
from rich.text import Text

SHOWN = {  # metric -> (label, format): the training signal first, then health, then cost
    "reward/mean": ("reward", "{:.3f}"),
    "val/reward": ("val reward", "{:.3f}"),  # the reward's score: accuracy for an exact-match reward only
    "kl/ref": ("KL", "{:.4f} nats"),
    "policy/entropy": ("entropy", "{:.3f} nats"),
    "policy/clipfrac": ("clip", "{:.1%}"),
    "response_length/mean": ("length", "{:.1f} tok"),
    # over the last iterations (`MovingRate`); each iteration's own, and tokens/s, are in TensorBoard (throughput/*)
    "throughput/samples_per_s": ("speed", "{:,.1f} samples/s"),
    "train/loss": ("loss", "{:.3f}"),  # supervised fine-tuning (lightning_rl.recipes.sft)
    "val/accuracy": ("val accuracy", "{:.3f}"),
}


def shown_metrics(metrics: dict, prefix: str = "") -> dict[str, str]:
    """The metrics of ``SHOWN`` that ``metrics`` holds (only those starting with ``prefix``), label -> text with units."""
    return {
        label: fmt.format(float(metrics[key]))
        for key, (label, fmt) in SHOWN.items()
        if key in metrics and key.startswith(prefix)
    }


class IterationClock:
    """The wall clock of the iterations this process runs: ``elapsed`` since training started (validation and
    checkpoints included, as a wall clock reads), and the seconds each iteration took, from its start to its end.

    Rich's own rate counts every change of the bar's count as work done: an iteration counted after a resume (the
    bar jumps from 0 to the checkpoint's step) or a count set back and forth (Lightning sets it to the prompt batches
    read, which dynamic sampling makes several per iteration) made it read 2534 and 981 it/s."""

    def __init__(self, now: Callable[[], float] = time.monotonic):
        self.now = now
        self.started: float | None = None
        self.iterations = 0
        self.seconds = 0.0  # summed over this process's iterations
        self._iteration_started: float | None = None

    def start(self) -> None:
        self.started, self.iterations, self.seconds, self._iteration_started = self.now(), 0, 0.0, None

    def begin_iteration(self) -> None:
        self._iteration_started = self.now()

    def end_iteration(self) -> float | None:
        """The seconds the iteration took (None when none was begun)."""
        if self._iteration_started is None:
            return None
        took = self.now() - self._iteration_started
        self.seconds += took
        self.iterations += 1
        self._iteration_started = None
        return took

    @property
    def elapsed(self) -> float | None:
        return None if self.started is None else self.now() - self.started

    @property
    def seconds_per_iteration(self) -> float | None:
        return self.seconds / self.iterations if self.iterations else None

    def remaining(self, iterations_left: float) -> float | None:
        per = self.seconds_per_iteration
        return None if per is None or iterations_left == float("inf") else per * max(iterations_left, 0)

    def rate(self) -> str:
        """``2.41 it/s``, or ``3.20 s/it`` for iterations longer than a second (an RL iteration often is)."""
        per = self.seconds_per_iteration
        if per is None:
            return "-.-- s/it"
        return f"{per:.2f} s/it" if per >= 1 else f"{1 / max(per, 1e-9):.2f} it/s"


class MovingRate:
    """Samples per second over the last ``window`` iterations: the samples they produced (``total/samples`` before and
    after each) over the seconds they took. One iteration's own rate jumped between 12 and 2,374 samples/s from one
    iteration to the next (a validation or a checkpoint inside one, rounds sampled ahead); this one moves slowly."""

    def __init__(self, window: int = 10):
        self.done: deque[tuple[float, float]] = deque(maxlen=window)  # (samples, seconds) per iteration
        self._before: float | None = None

    def begin(self, metrics: dict) -> None:
        self._before = float(metrics["total/samples"]) if "total/samples" in metrics else None

    def end(self, metrics: dict, seconds: float | None) -> None:
        if seconds is None or seconds <= 0:
            return
        if self._before is not None and "total/samples" in metrics:
            self.done.append((float(metrics["total/samples"]) - self._before, seconds))
        elif "throughput/samples_per_s" in metrics:  # the first iteration of this process: its own rate
            self.done.append((float(metrics["throughput/samples_per_s"]) * seconds, seconds))

    @property
    def samples_per_s(self) -> float | None:
        seconds = sum(s for _, s in self.done)
        return sum(n for n, _ in self.done) / seconds if seconds > 0 else None

    def shown(self, metrics: dict) -> dict:
        """``metrics`` with ``throughput/samples_per_s`` replaced by the moving average (where there is one)."""
        rate = self.samples_per_s
        return metrics if rate is None else {**metrics, "throughput/samples_per_s": rate}


def _clock_text(seconds: float | None) -> str:
    return "-:--:--" if seconds is None else str(timedelta(seconds=int(seconds)))


class _TrainTaskColumn(ProgressColumn):
    """Renders the training task from the bar's `IterationClock`; every other task (validation) as Lightning does."""

    def __init__(
        self,
        bar: RLProgressBar,
        lightning_column: ProgressColumn,
        render: Callable[[IterationClock, object], str],
        style,
    ):
        super().__init__()
        self.bar, self.lightning_column, self._render, self.style = bar, lightning_column, render, style

    def render(self, task) -> Text:
        if task.id != self.bar.train_progress_bar_id:
            return self.lightning_column.render(task)
        return Text(self._render(self.bar.clock, task), style=self.style)


class RLProgressBar(RichProgressBar):
    """Counts RL iterations against ``trainer.max_steps`` (the total is right for dynamic sampling, which reads
    several prompt batches per iteration, and for a resumed run), times them with an `IterationClock` and shows the
    metrics in ``SHOWN`` with units."""

    def __init__(self, unit: str = "RL iterations"):
        """
        Args:
            unit: what the bar counts (its description).
        """
        super().__init__()
        self.unit = unit
        self.clock = IterationClock()
        self.speed = MovingRate()

    @property
    def total_train_batches(self) -> int | float:
        max_steps = self.trainer.max_steps
        return max_steps if max_steps and max_steps > 0 else super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        return self.unit

    def configure_columns(self, trainer) -> list:
        columns = super().configure_columns(trainer)
        theme = self.theme

        def clock(clock: IterationClock, task) -> str:
            return f"{_clock_text(clock.elapsed)} • {_clock_text(clock.remaining(task.total - task.completed))}"

        replaced = {
            CustomTimeColumn: lambda column: _TrainTaskColumn(self, column, clock, theme.time),
            ProcessingSpeedColumn: lambda column: _TrainTaskColumn(
                self, column, lambda c, _: c.rate(), theme.processing_speed
            ),
        }
        return [replaced[type(c)](c) if type(c) in replaced else c for c in columns]

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self.clock.start()

    def on_train_end(self, trainer, pl_module) -> None:
        # the bar's last frame stays; what fit says after training (its summary, `RunSummary`) goes below it, where a
        # redraw of the live bar would otherwise write over it
        self._stop_progress()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self.clock.begin_iteration()
        self.speed.begin(trainer.callback_metrics)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        # not Lightning's count (batch_idx + 1: the prompt batches read so far): the iterations done, resumed ones included
        self.speed.end(trainer.callback_metrics, self.clock.end_iteration())
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, trainer.global_step)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def get_metrics(self, trainer, pl_module) -> dict[str, str]:
        return shown_metrics(self.speed.shown(trainer.callback_metrics))


class LineProgress(ProgressBar):
    """Progress as plain lines, for a console that is not a terminal (a log file, a pipe): one per iteration, or one
    every ``ceil(max_steps / lines)`` iterations in a long run (and the last), each with the iteration count, the clock
    and the metrics of ``SHOWN``; and one after each validation with its metrics. Nothing is redrawn or wrapped."""

    def __init__(self, unit: str = "RL iterations", lines: int = 100):
        """
        Args:
            unit: what is counted (the start of each line).
            lines: about how many iteration lines a run prints at most.
        """
        super().__init__()
        self.unit, self.lines = unit, lines
        self.clock = IterationClock()
        self.speed = MovingRate()
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    @property
    def is_disabled(self) -> bool:
        return not self._enabled

    @property
    def total_train_batches(self) -> int | float:
        max_steps = self.trainer.max_steps
        return max_steps if max_steps and max_steps > 0 else super().total_train_batches

    def on_train_start(self, trainer, pl_module) -> None:
        self.clock.start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self.clock.begin_iteration()
        self.speed.begin(trainer.callback_metrics)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.speed.end(trainer.callback_metrics, self.clock.end_iteration())
        step, total = trainer.global_step, self.total_train_batches
        every = max(1, math.ceil(total / self.lines)) if math.isfinite(total) else 1
        if self.is_enabled and (step % every == 0 or step >= total):
            shown_total = int(total) if math.isfinite(total) else "?"
            timing = (
                f"{_clock_text(self.clock.elapsed)} elapsed, {_clock_text(self.clock.remaining(total - step))} left"
            )
            self._say(
                f"{self.unit} {step}/{shown_total} • {timing} • {self.clock.rate()}",
                self.get_metrics(trainer, pl_module),
            )

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.is_enabled and not trainer.sanity_checking:
            # `validate` restores the weights but not the loop's step: its iteration is not known here
            fitting = trainer.state.fn == TrainerFn.FITTING
            head = f"validation at iteration {trainer.global_step}" if fitting else "validation"
            self._say(head, shown_metrics(trainer.callback_metrics, "val/"))

    def get_metrics(self, trainer, pl_module) -> dict[str, str]:
        return shown_metrics(self.speed.shown(trainer.callback_metrics))

    @staticmethod
    def _say(head: str, metrics: dict[str, str]) -> None:
        print(" • ".join([head, *(f"{label} {text}" for label, text in metrics.items())]), flush=True)


def missing_progress_bar(callbacks: list, enabled: bool = True, unit: str = "RL iterations") -> list:
    """The progress callback to add to a Trainer's ``callbacks``: ``[RLProgressBar(unit)]`` on a terminal, else
    ``[LineProgress(unit)]`` (rich's own test: ``TTY_COMPATIBLE=1`` or ``FORCE_COLOR`` count as a terminal); none when
    the bar is off or they bring their own."""
    if not enabled or any(isinstance(c, ProgressBar) for c in callbacks):
        return []
    return [RLProgressBar(unit) if Console().is_terminal else LineProgress(unit)]
