"""One test per Lightning internal lightning_rl touches (lightning_rl.lightning_compat), each against the installed
Lightning: a release that moves one fails here with the compat module's message, which names the internal."""

from __future__ import annotations

import lightning
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_rl.lightning_compat import LightningChanged, count_iteration, run_validation, validation_results

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


class Tiny(lightning.LightningModule):
    """Manual optimization with ``steps`` optimizer steps per training step; records what ran, in order."""

    def __init__(self, steps: int = 3):
        super().__init__()
        self.automatic_optimization = False
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.steps, self.ran = steps, []

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        for _ in range(self.steps):
            opt.zero_grad()
            self.manual_backward((self.weight - 1).pow(2).sum())
            opt.step()
        self.ran.append(("train", self.trainer.global_step))
        count_iteration(self.trainer, self.steps)

    def validation_step(self, batch, batch_idx):
        self.ran.append(("validate", self.trainer.global_step))
        self.log("score", 0.5)

    def on_validation_epoch_end(self):
        if self.trainer.state.fn == "validate":
            for results in validation_results(self.trainer):
                results["added"] = 2.0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data(n: int = 4):
    return DataLoader(torch.zeros(n, 1), batch_size=1)


class ValidateFirst(lightning.Callback):
    def on_train_start(self, trainer, pl_module):
        run_validation(trainer)


def _message(err: Exception) -> str:
    return f"lightning {lightning.__version__}: {err}"


def test_count_iteration_moves_the_counter_global_step_reads():
    """A skipped iteration (no optimizer step) still counts one; one step counts one: the counter rewritten is the
    one ``trainer.global_step`` reads."""
    trainer = lightning.Trainer(**QUIET)
    trainer.strategy.connect(Tiny())  # global_step reads the manual loop's counter only for a manual module
    try:
        count_iteration(trainer, 0)
        assert trainer.global_step == 1
        count_iteration(trainer, 1)
        assert trainer.global_step == 1
    except Exception as err:  # the compat module's message names the internal that moved
        pytest.fail(_message(err))


def test_validation_results_are_what_validate_returns():
    """What the module adds to `validation_results` at the end of the epoch is in `trainer.validate`'s return."""
    trainer = lightning.Trainer(limit_val_batches=2, **QUIET)
    try:
        results = trainer.validate(Tiny(), dataloaders=_data(), verbose=False)
    except Exception as err:
        pytest.fail(_message(err))
    assert results == [{"score": 0.5, "added": 2.0}]


@pytest.mark.slow
def test_run_validation_inside_fit_and_count_iteration_make_max_steps_count_training_steps():
    """Validation run at the start of fit comes before the first training step; with 3 optimizer steps per training
    step and ``count_iteration``, ``max_steps=2`` is 2 training steps and ``global_step`` ends at 2 (else 6 steps would
    be counted after the first training step)."""
    module = Tiny(steps=3)
    trainer = lightning.Trainer(
        max_steps=2, limit_val_batches=1, num_sanity_val_steps=0, callbacks=[ValidateFirst()], **QUIET
    )
    try:
        trainer.fit(module, train_dataloaders=_data(), val_dataloaders=_data(1))
    except Exception as err:
        pytest.fail(_message(err))
    assert module.ran == [("validate", 0), ("train", 3), ("train", 4)]
    assert trainer.global_step == 2
    assert module.weight.item() == pytest.approx(1 - 0.8**6)  # six SGD steps on (w - 1)^2 at lr 0.1: w <- 0.8 w + 0.2


@pytest.mark.parametrize(
    "touch, named",
    [
        (
            lambda t: count_iteration(t, 2),
            "trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress.{total,current}.{ready,completed}",
        ),
        (validation_results, "trainer.validate_loop._logged_outputs"),
        (run_validation, "trainer.fit_loop.epoch_loop.val_loop"),
    ],
)
def test_a_moved_internal_is_named_in_one_line(touch, named):
    """What a Lightning release that moved an internal shows: the internal's path, the version, the fix."""

    class Moved:  # a Trainer whose loops hold none of the internals
        fit_loop = validate_loop = object()

    with pytest.raises(LightningChanged) as raised:
        touch(Moved())
    assert str(raised.value).startswith(f"lightning {lightning.__version__} has no {named} (")
    assert "\n" not in str(raised.value) and "install a Lightning release the pyproject allows" in str(raised.value)
