"""The optimize phase of an RL iteration: epochs x mini-batches x micro-batches of surrogate + KL + loss terms
(+ critic), one optimizer step per mini-batch, and the adaptive KL step that follows it.

A mixin of `RLModule` (lightning_rl.loop.module): it reads the module's components and models.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.distributed import touch, uses_ddp, uses_deepspeed
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.loop.metrics import WeightedMeans
from lightning_rl.core.microbatch import micro_batches
from lightning_rl.core.ops import all_reduce_sum, masked_mean, sequence_kl, world_size


class UpdatePhase:
    """Phase 4 (optimize) and the KL controller of phase 5, for `RLModule`."""

    def _optimize(self, batch: RolloutBatch, metrics: WeightedMeans) -> int:
        opt, loop = self.optimizers(), self.loop
        train_policy = not self.critic_pretraining
        needs_entropy = any(term.needs_entropy for term in self.loss_terms)
        t = self.rollout.temperature or 1.0
        steps, skipped, ddp = 0, 0, uses_ddp(self._trainer)
        packed = loop.max_tokens_per_micro_batch is not None
        for epoch in range(loop.ppo_epochs):
            kl_before = metrics.running("policy/approx_kl")
            order = torch.randperm(batch.batch_size, generator=self._shuffle) if loop.num_mini_batches > 1 else torch.arange(batch.batch_size)
            for index in order.chunk(loop.num_mini_batches):
                mini = batch.select(index.to(self.device))
                # the normaliser of the whole mini-batch over all ranks, shared by every micro-batch; DDP then
                # averages gradients over ranks, hence the division by the world size
                total = all_reduce_sum(self.aggregator.denominator(mini.loss_mask)) / world_size()
                policy_loss = critic_loss = torch.zeros((), device=self.device)
                for micro in micro_batches(mini, loop.micro_batch_size, loop.max_tokens_per_micro_batch):
                    tokens = micro.loss_mask.sum()
                    loss = torch.zeros((), device=self.device)
                    if train_policy:
                        loss = loss + self._policy_loss(micro, total, tokens, t, needs_entropy, metrics)
                        policy_loss = policy_loss + loss.detach()
                    elif ddp:  # DDP's reducer needs a gradient for every parameter: zeros for the idle policy
                        loss = loss + touch(self.policy)
                    if self.critic is not None:
                        value_loss, value_metrics = self.critic.loss(self.critic(micro, packed=packed), micro)
                        value_loss = self.aggregator(value_loss, micro.loss_mask, total)
                        critic_loss = critic_loss + value_loss.detach()
                        loss = loss + value_loss
                        metrics.add_all(value_metrics, tokens)
                    self.manual_backward(loss)
                if train_policy and self.ptx is not None:  # PPO-ptx: gamma * NLL of this iteration's pretraining text
                    ptx_loss, ptx_metrics = self.ptx.loss(self.policy, *self._ptx_text)
                    self.manual_backward(ptx_loss)
                    metrics.add_all(ptx_metrics)
                    policy_loss = policy_loss + ptx_loss.detach()
                # each rank holds its share of the mini-batch loss; the mean over ranks is the loss itself
                metrics.add("policy/loss", policy_loss)
                if self.critic is not None:
                    metrics.add("critic/loss", critic_loss)
                if self._step(opt, train_policy, metrics, [policy_loss, critic_loss]):
                    steps += 1
                else:
                    skipped += 1
            if loop.target_kl is not None and train_policy and self._epoch_kl(metrics, kl_before) > loop.target_kl:
                break  # every rank sees the same all-reduced KL: all stop together
        metrics.add("policy/epochs_run", torch.tensor(float(epoch + 1), device=self.device))
        metrics.add("health/skipped_nonfinite", torch.tensor(float(skipped), device=self.device))
        return steps

    def _epoch_kl(self, metrics: WeightedMeans, before: Tensor) -> float:
        """The token-mean approx-KL of the epoch just finished, over all ranks (a host sync, once per epoch)."""
        total = all_reduce_sum((metrics.running("policy/approx_kl") - before).to(self.device))
        return float(total[0] / total[1].clamp_min(1e-12))

    def _policy_loss(self, micro: RolloutBatch, total: Tensor, tokens: Tensor, t: float, needs_entropy: bool, metrics: WeightedMeans) -> Tensor:
        logprobs, entropy = policy_logprobs(
            self.policy, micro, t, with_entropy=True, entropy_grad=needs_entropy, chunk_rows=self.loop.logprob_chunk_rows,
            packed=self.loop.max_tokens_per_micro_batch is not None,
        )
        if micro.old_logprobs is None:  # on-policy: pi_old is the current policy
            micro = micro.replace(old_logprobs=logprobs.detach())
            if micro.ref_logprobs is not None:
                counted = micro.counted
                metrics.add("kl/ref", masked_mean(sequence_kl(micro.old_logprobs, micro.ref_logprobs, micro.loss_mask), counted), counted.sum())
        if micro.rollout_logprobs is not None:
            # over the tokens that count: greedy baseline rows carry untempered sampler log-probs
            diff = (micro.old_logprobs - micro.rollout_logprobs).abs() * micro.loss_mask
            metrics.add("rollout/logprob_diff_mean", masked_mean(diff, micro.loss_mask), tokens)
            metrics.add("rollout/logprob_diff_max", diff.max())
        per_token, surrogate_metrics = self.surrogate(logprobs, micro)
        if self.kl is not None:
            per_token = per_token + self.kl.loss_term(logprobs, micro)
        for term in self.loss_terms:
            per_token = per_token + term(logprobs, entropy, micro)
        metrics.add("policy/entropy", masked_mean(entropy.detach(), micro.loss_mask), tokens)
        metrics.add_all(surrogate_metrics, tokens)
        return self.aggregator(per_token, micro.loss_mask, total)

    def _step(self, opt, train_policy: bool, metrics: WeightedMeans, losses: list[Tensor]) -> bool:
        """Clip each group's gradients on its own, set its scheduled LR, step; False when the step was skipped
        because a loss or gradient norm is NaN/inf (lightning_rl.loop.health: every rank agrees).

        Under DeepSpeed the engine clips (one global norm, ``gradient_clipping`` in its config)."""
        deepspeed = uses_deepspeed(self._trainer)
        norms, stepping = list(losses), []
        for group in opt.param_groups:
            name = group["name"]
            cfg = self.optimizer_cfg if name == "policy" else self.critic.optimizer
            if name == "policy" and not train_policy:
                for p in group["params"]:
                    p.grad = None  # no gradients (or DDP's zeros): AdamW skips these parameters, which stay bit-identical
                continue
            if not deepspeed:
                max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")  # inf: measure only
                norm = torch.nn.utils.clip_grad_norm_(group["params"], max_norm)
                norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
                norms.append(norm)
                if cfg.max_grad_norm is not None:
                    metrics.add(f"{name}/grad_norm", norm)
            stepping.append((group, name, cfg))
        if not self.health.finite_step(norms, self.optimizer_cfg.lr):
            opt.zero_grad(set_to_none=True)
            return False
        for group, name, cfg in stepping:
            group["lr"] = cfg.lr * cfg.lr_factor(self.optimizer_steps[name])
            self.optimizer_steps[name] += 1
        opt.step()
        opt.zero_grad(set_to_none=True)
        if deepspeed and self.trainer.strategy.deepspeed_engine.get_global_grad_norm() is not None:
            metrics.add("policy/grad_norm", torch.as_tensor(float(self.trainer.strategy.deepspeed_engine.get_global_grad_norm())))
        return True

    @torch.no_grad()
    def _update_kl(self, batch: RolloutBatch) -> None:
        """Adaptive coefficient from the global batch-mean sequence KL (k1 at pi_old), identical on every rank."""
        counted = batch.counted  # (B,): greedy baseline rows and masked samples are not in the mean, nor in n
        seq_kl = sequence_kl(batch.old_logprobs, batch.ref_logprobs, batch.loss_mask)  # (B,)
        stats = all_reduce_sum(torch.stack([(seq_kl * counted).sum(), counted.sum()]))
        self.kl.update(stats[0] / stats[1].clamp_min(1), int(stats[1]))

    def _count_iteration(self, optimizer_steps: int) -> None:
        """Make ``trainer.global_step`` advance by one per RL iteration.

        Lightning counts every ``optimizer.step()``; an iteration takes ppo_epochs x mini-batches of
        them (and none when skipped), which would make ``max_steps`` and ``every_n_train_steps``
        jump. The progress counters are saved in checkpoints, so resuming stays consistent.
        """
        progress = self.trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
        surplus = optimizer_steps - 1
        for tracker in (progress.total, progress.current):
            tracker.ready -= surplus
            tracker.completed -= surplus
