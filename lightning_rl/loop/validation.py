"""Sampled validation: ``n`` responses per held-out prompt at a set temperature, beside the greedy accuracy.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
eq. 1): with ``c`` of ``n`` samples correct, pass@k = 1 - C(n - c, k) / C(n, k), the probability that at
least one of ``k`` samples drawn without replacement from the ``n`` is correct, averaged over prompts.
A sample is correct when its score is >= 1 (a 0/1 reward's success). mean@n is the mean score of the
n samples (any reward), so for a 0/1 reward pass@1 == mean@n.

Every validation score is the reward's raw score (`lightning_rl.core.contracts.raw_scores`): a `Shaped`
reward's or a `RewardModel`'s normalisation and clipping shape what training sees, not what is reported.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
from torch import Tensor, nn

from lightning_rl.core.batch import Prompts, RolloutBatch
from lightning_rl.core.config import LoopConfig
from lightning_rl.core.contracts import Reward, raw_scores
from lightning_rl.lightning_compat import validation_results
from lightning_rl.loop.collect import Collector


def pass_at_k(correct: Tensor, k: int) -> Tensor:
    """Mean over prompts of the unbiased pass@k. ``correct``: (P_n, n) booleans, n >= k >= 1 -> scalar."""
    n = correct.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n samples per prompt; got k={k}, n={n}")
    wrong = (~correct.bool()).sum(1).double()  # (P_n,) n - c
    total = torch.full_like(wrong, float(n))
    # C(n - c, k) / C(n, k) through log-gamma (exact for these sizes, no overflow); 0 when fewer than k are wrong
    log_ratio = (
        torch.lgamma(wrong + 1) - torch.lgamma(wrong - k + 1) - torch.lgamma(total + 1) + torch.lgamma(total - k + 1)
    )
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


class Validator:
    """Validation of `RLModule`: greedy accuracy (``val/reward``), and with ``loop.val_samples`` = n > 0 also
    ``val/pass@k`` and ``val/mean@n`` from n samples per prompt at ``loop.val_temperature``. With several
    validation sets (``data.val_data`` as a name -> source mapping) each is logged under ``val/<name>/``.

    The samples come from the training sampler with settings of their own (`SamplingParams`, passed per call), from
    a seeded random stream of their own: validation neither perturbs training's random state nor varies between runs."""

    def __init__(self, collector: Collector, reward: Reward, loop: LoopConfig):
        self.collector, self.reward, self.loop = collector, reward, loop
        self.results: list[dict] = []

    @torch.no_grad()
    def step(
        self, prompts: Prompts, policy: nn.Module, prefix: str, log: Callable, step: int, rank: int, progress_bar: bool
    ) -> None:
        """One validation batch: the greedy responses' score and length, and the sampled metrics; ``log`` is
        `LightningModule.log` (reduced over batches and ranks; `end` writes them at the step of the weights)."""
        params = self.collector.rollout.params

        def scored(batch: RolloutBatch) -> Tensor:
            with raw_scores():  # the reward's own scale, whatever shaping training uses
                return self.collector.score(batch, self.reward)[0].scores

        greedy, _ = self.collector.sample(
            prompts, policy, replace(params, greedy=True)
        )  # with an agent, whole episodes
        n_prompts = greedy.batch_size
        # logger=False: `end` writes them at the step of the weights validated, without Lightning's `epoch`
        kw = dict(on_epoch=True, sync_dist=True, batch_size=n_prompts, add_dataloader_idx=False, logger=False)
        log(f"{prefix}reward", scored(greedy).mean(), prog_bar=progress_bar, **kw)
        log(f"{prefix}response_length", greedy.action_tokens.sum(-1).mean(), **kw)  # the model's tokens
        n = self.loop.val_samples
        if n:
            devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(step * 7919 + rank)
                sampled, _ = self.collector.sample(
                    prompts,
                    policy,
                    replace(params, group_size=n, temperature=self.loop.val_temperature, greedy_baseline=False),
                )
            for key, value in sampled_metrics(scored(sampled).reshape(n_prompts, n)).items():  # (P_n, n)
                log(f"{prefix}{key}", value, **kw)

    def epoch_end(self, trainer) -> None:
        # `trainer.validate` returns (and prints) one dict per set of what Lightning logged itself: keep those dicts, to
        # add the scalars logged with logger=False to them in `end`, after Lightning has sent its own to the loggers
        self.results = validation_results(trainer) if trainer.state.fn == "validate" else []

    def end(self, trainer, step: int, names: list[str] | None) -> None:
        """The validation scalars (reduced over batches and ranks) to the loggers at ``step``, the step of the weights
        they measure: the iterations done in ``fit`` (0 before training), the checkpoint's step in ``validate``."""
        if trainer.sanity_checking:
            return
        scalars = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=step)
        for index, results in enumerate(self.results):  # `validate` only: its return value
            prefix = f"val/{names[index]}/" if names else "val/"
            results.update({k: v for k, v in scalars.items() if k.startswith(prefix)})
