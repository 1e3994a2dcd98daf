"""`ValidateBeforeAndAfter`: every run has a validation point before its first iteration and after its last."""

from __future__ import annotations

from lightning import Callback

from lightning_rl.lightning_compat import run_validation


class ValidateBeforeAndAfter(Callback):
    """Validation before the first iteration and after the last, so every run has a before / after point
    (``trainer.val_check_interval`` adds the points in between). A resumed run skips the "before" (its first
    run logged it), and the "after" is skipped when the last iteration was just validated."""

    def __init__(self) -> None:
        self.validated_at: int | None = None

    def on_validation_end(self, trainer, pl_module) -> None:
        self.validated_at = trainer.global_step

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_step == 0:
            self._validate(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.validated_at != trainer.global_step:
            self._validate(trainer)

    @staticmethod
    def _validate(trainer) -> None:
        if trainer.limit_val_batches == 0:
            return
        run_validation(trainer)
