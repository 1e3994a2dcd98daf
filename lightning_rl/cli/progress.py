"""The console's progress bar: RL iterations (not epochs of an endless prompt stream) and what a researcher watches."""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar

SHOWN = {  # metric -> (label, format): the training signal first, then health, then cost
    "reward/mean": ("reward", "{:.3f}"),
    "val/reward": ("val acc", "{:.3f}"),
    "kl/ref": ("KL", "{:.4f} nats"),
    "policy/entropy": ("entropy", "{:.3f} nats"),
    "policy/clipfrac": ("clip", "{:.1%}"),
    "response_length/mean": ("length", "{:.1f} tok"),
    "throughput/samples_per_s": ("speed", "{:,.1f} samples/s"),  # tokens/s is in TensorBoard (throughput/tokens_per_s)
}


class RLProgressBar(RichProgressBar):
    """Counts RL iterations against ``trainer.max_steps`` (the total is right for dynamic sampling, which reads
    several prompt batches per iteration, and for a resumed run) and shows the metrics in ``SHOWN`` with units."""

    @property
    def total_train_batches(self) -> int | float:
        max_steps = self.trainer.max_steps
        return max_steps if max_steps and max_steps > 0 else super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        return "RL iterations"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._update(self.train_progress_bar_id, trainer.global_step)  # iterations done, resumed ones included
        self.refresh()

    def get_metrics(self, trainer, pl_module) -> dict[str, str]:
        metrics = trainer.callback_metrics
        return {label: fmt.format(float(metrics[key])) for key, (label, fmt) in SHOWN.items() if key in metrics}
