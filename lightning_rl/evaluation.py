"""Sampled validation: ``n`` responses per held-out prompt at a set temperature, beside the greedy accuracy.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
eq. 1): with ``c`` of ``n`` samples correct, pass@k = 1 - C(n - c, k) / C(n, k), the probability that at
least one of ``k`` samples drawn without replacement from the ``n`` is correct, averaged over prompts.
A sample is correct when its score is >= 1 (a 0/1 reward's success). mean@n is the mean score of the
n samples (any reward), so for a 0/1 reward pass@1 == mean@n.

Every validation score is the reward's raw score (`components.reward.shaping.raw_scores`): a `Shaped`
reward's or a `RewardModel`'s normalisation and clipping shape what training sees, not what is reported.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from lightning import Callback
from torch import Tensor

from components.reward import as_scores
from components.reward.shaping import raw_scores


def pass_at_k(correct: Tensor, k: int) -> Tensor:
    """Mean over prompts of the unbiased pass@k. ``correct``: (P_n, n) booleans, n >= k >= 1 -> scalar."""
    n = correct.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n samples per prompt; got k={k}, n={n}")
    wrong = (~correct.bool()).sum(1).double()  # (P_n,) n - c
    total = torch.full_like(wrong, float(n))
    # C(n - c, k) / C(n, k) through log-gamma (exact for these sizes, no overflow); 0 when fewer than k are wrong
    log_ratio = torch.lgamma(wrong + 1) - torch.lgamma(wrong - k + 1) - torch.lgamma(total + 1) + torch.lgamma(total - k + 1)
    none_correct = torch.where(wrong >= k, log_ratio.exp(), torch.zeros_like(wrong))
    return (1 - none_correct).mean().float()


def ks(n: int) -> list[int]:
    """The k reported for ``n`` samples per prompt: 1, 2, 4, ... and n itself."""
    return sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})


def sampled_metrics(scores: Tensor) -> dict[str, Tensor]:
    """``scores``: (P_n, n) of n samples per prompt -> ``pass@k`` for every k in ``ks(n)`` and ``mean@n``."""
    n = scores.shape[1]
    correct = scores >= 1
    return {**{f"pass@{k}": pass_at_k(correct, k) for k in ks(n)}, f"mean@{n}": scores.float().mean()}


@contextmanager
def sampling_as(rollout, group_size: int, temperature: float, seed: int):
    """The rollout samples ``group_size`` responses per prompt at ``temperature`` (no greedy baseline), from
    its own seeded random stream: validation neither perturbs training's random state nor varies between runs."""
    saved = {name: getattr(rollout, name) for name in ("group_size", "temperature", "greedy_baseline") if hasattr(rollout, name)}
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        rollout.group_size, rollout.temperature = group_size, temperature
        if "greedy_baseline" in saved:
            rollout.greedy_baseline = False
        try:
            yield rollout
        finally:
            for name, value in saved.items():
                setattr(rollout, name, value)


class Validation:
    """Validation for `RLModule`: greedy accuracy (``val/reward``), and with ``loop.val_samples`` = n > 0 also
    ``val/pass@k`` and ``val/mean@n`` from n samples per prompt at ``loop.val_temperature``. With several
    validation sets (``data.val_data`` as a name -> source mapping) each is logged under ``val/<name>/``."""

    @torch.no_grad()
    def _validate(self, batch: dict, dataloader_idx: int) -> None:
        names = getattr(getattr(self._trainer, "datamodule", None), "val_names", None)
        prefix = f"val/{names[dataloader_idx]}/" if names else "val/"
        prompt_ids, prompt_mask = batch["prompt_ids"], batch["prompt_mask"]
        name = getattr(self.val_reward, "name", type(self.val_reward).__name__)

        def score(rollout, texts: dict, repeats: int) -> Tensor:
            meta = {k: [v for v in vals for _ in range(repeats)] for k, vals in batch["meta"].items()}
            meta = {**meta, **texts}
            meta["prompts"] = meta.get("prompt", [])
            with raw_scores():
                return as_scores(self.val_reward(rollout, meta), rollout.batch_size, name, meta).to(self.device)

        rollout, texts = self._sample(prompt_ids, prompt_mask, batch["meta"], greedy=True)  # with an agent, whole episodes
        n_prompts = rollout.batch_size
        # logger=False: on_validation_end writes them at the step of the weights validated, without Lightning's `epoch`
        log = dict(on_epoch=True, sync_dist=True, batch_size=n_prompts, add_dataloader_idx=False, logger=False)
        self.log(f"{prefix}reward", score(rollout, texts, 1).mean(), prog_bar=not names, **log)
        self.log(f"{prefix}response_length", rollout.action_tokens.sum(-1).mean(), **log)  # the model's tokens
        n = self.loop.val_samples
        if n:
            with sampling_as(self.rollout, n, self.loop.val_temperature, seed=self.global_step * 7919 + self.global_rank):
                sampled, texts = self._sample(prompt_ids, prompt_mask, batch["meta"])
            for key, value in sampled_metrics(score(sampled, texts, n).reshape(n_prompts, n)).items():  # (P_n, n)
                self.log(f"{prefix}{key}", value, **log)

    def on_validation_epoch_end(self) -> None:
        # `trainer.validate` returns (and prints) one dict per set of what Lightning logged itself: keep those dicts, to
        # add the scalars logged with logger=False to them in on_validation_end, after Lightning has sent its own to the loggers
        loop = self.trainer.validate_loop
        self._validate_results = list(getattr(loop, "_logged_outputs", [])) if self.trainer.state.fn == "validate" else []

    def on_validation_end(self) -> None:
        """The validation scalars (reduced over batches and ranks) to the loggers at the step of the weights they
        measure: the iterations done in ``fit`` (0 before training), the checkpoint's step in ``validate``."""
        trainer = self.trainer
        if trainer.sanity_checking:
            return
        scalars = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        step = self.global_step if trainer.state.fn == "fit" else getattr(self, "restored_step", 0)
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=step)
        names = getattr(getattr(trainer, "datamodule", None), "val_names", None)
        for index, results in enumerate(getattr(self, "_validate_results", [])):  # `validate` only: its return value
            prefix = f"val/{names[index]}/" if names else "val/"
            results.update({k: v for k, v in scalars.items() if k.startswith(prefix)})


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
        trainer.validating = True  # as Lightning's training loop runs its periodic validation
        trainer.fit_loop.epoch_loop.val_loop.run()
        trainer.training = True
