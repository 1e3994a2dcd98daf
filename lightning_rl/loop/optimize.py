"""Phase 4 of an RL iteration, optimize: epochs x mini-batches x micro-batches of surrogate + KL + loss terms
(+ critic), one optimizer step per mini-batch; and the adaptive KL step of phase 5 that follows it."""

from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import Tensor, nn

from lightning_rl.checkpoint import LoopState
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.config import LoopConfig, OptimizerConfig
from lightning_rl.core.contracts import Aggregator, Critic, KLPenalty, LossTerm, PretrainLoss, Surrogate
from lightning_rl.core.logprobs import policy_outputs
from lightning_rl.core.microbatch import micro_batches
from lightning_rl.core.moe import is_moe
from lightning_rl.core.ops import all_reduce_sum, masked_mean, sequence_kl, world_size
from lightning_rl.core.truncation import Truncation
from lightning_rl.distributed import touch, uses_ddp, uses_deepspeed
from lightning_rl.loop.estimate import add_distill_metrics
from lightning_rl.loop.health import TrainingHealth
from lightning_rl.loop.metrics import ExpertLoad, WeightedMeans


class PolicyUpdate:
    """The optimize phase: the losses of the policy (and critic) on a scored, estimated batch, and the steps."""

    def __init__(
        self,
        policy: nn.Module,
        critic: Critic | None,
        surrogate: Surrogate,
        aggregator: Aggregator,
        kl: KLPenalty | None,
        loss_terms: list[LossTerm],
        ptx: PretrainLoss | None,
        loop: LoopConfig,
        optimizer: OptimizerConfig,
        health: TrainingHealth,
        state: LoopState,
        group_configs: dict[str, OptimizerConfig],
        teacher_logits: Callable[[RolloutBatch], Tensor] | None = None,
        routing_replay: bool = False,
    ):
        """``state``: the optimizer step counters (LR schedules) and the mini-batch shuffle, checkpointed.
        ``group_configs``: each parameter group's settings, by name (the roster's trained slots). ``teacher_logits``:
        the teacher's full distribution on a micro-batch (``teacher_logits``), when a loss term reads it.
        ``routing_replay``: the policy's routers replay the sampler's routes (``model.routing_replay``)."""
        self.policy, self.critic, self.surrogate, self.aggregator, self.kl = policy, critic, surrogate, aggregator, kl
        self.loss_terms, self.ptx, self.loop, self.optimizer_cfg, self.health, self.state = (
            loss_terms,
            ptx,
            loop,
            optimizer,
            health,
            state,
        )
        self.group_configs, self.teacher_logits, self.routing_replay = group_configs, teacher_logits, routing_replay
        self.moe = is_moe(policy)
        for i, term in enumerate(loss_terms):
            if "router_logits" in term.reads and not self.moe:
                raise ValueError(
                    f"model.loss_terms[{i}] ({type(term).__name__}) reads the router logits of a mixture-of-experts policy, "
                    f"but the policy ({type(policy).__name__}) has no router: drop the term, or train an MoE policy "
                    "(e.g. lightning_rl/assets/tiny-arith-moe, configs/grpo_moe.yaml)"
                )
        self._said_degenerate = False

    def worth_optimizing(self, batch: RolloutBatch, iteration: int) -> bool:
        """False when nothing in the loss has a gradient on any rank: every advantage on a token that counts is
        zero (every group degenerate), no KL term is in the loss, no loss term touches a counted token and no
        PPO-ptx loss is mixed in. (A step without gradient is not a no-op: AdamW's momentum and weight decay would
        still move the policy.)"""
        kl_in_loss = self.kl is not None and self.kl.placement == "loss" and float(self.kl.coef) > 0
        if not self.loop.skip_degenerate_batches or self.critic is not None or kl_in_loss or self.ptx is not None:
            return True
        informative = ((batch.advantages.abs() > 0).float() * batch.loss_mask).sum()
        for term in self.loss_terms:
            informative = informative + term.gradient_tokens(batch)
        if float(all_reduce_sum(informative)) > 0:
            return True
        if not self._said_degenerate:  # said once; health/skipped_degenerate counts every one
            self._said_degenerate = True
            warnings.warn(
                f"iteration {iteration}: every advantage is zero (all groups degenerate) and nothing else in the loss has a "
                "gradient; skipping the update. Said once: health/skipped_degenerate is 1 at every iteration skipped this way"
            )
        return False

    def run(
        self,
        batch: RolloutBatch,
        metrics: WeightedMeans,
        optimizer: torch.optim.Optimizer,
        backward: Callable[[Tensor], None],
        trainer,
        temperature: float,
        train_policy: bool,
        ptx_text: tuple[Tensor, Tensor] | None = None,
        truncation: Truncation | None = None,
    ) -> int:
        """Epochs x mini-batches of ``batch``; returns the optimizer steps taken. ``backward`` is the strategy's
        (``LightningModule.manual_backward``); ``train_policy`` is False while the critic pretrains; ``ptx_text``:
        PPO-ptx's (ids, mask) of this iteration; ``temperature`` and ``truncation``: the sampler's, which the
        policy's log-probs mirror."""
        loop, device = self.loop, batch.response_ids.device
        steps, skipped, ddp = 0, 0, uses_ddp(trainer)
        routing = ExpertLoad() if self.moe else None  # a mixture of experts: its routers' load, every iteration
        packed = loop.max_tokens_per_micro_batch is not None
        for epoch in range(loop.ppo_epochs):
            kl_before = metrics.running("policy/approx_kl")
            order = (
                torch.randperm(batch.batch_size, generator=self.state.shuffle)
                if loop.num_mini_batches > 1
                else torch.arange(batch.batch_size)
            )
            for index in order.chunk(loop.num_mini_batches):
                mini = batch.select(index.to(device))
                # the normaliser of the whole mini-batch over all ranks, shared by every micro-batch; DDP then
                # averages gradients over ranks, hence the division by the world size
                total = all_reduce_sum(self.aggregator.denominator(mini.loss_mask)) / world_size()
                policy_loss = critic_loss = torch.zeros((), device=device)
                for micro in micro_batches(mini, loop.micro_batch_size, loop.max_tokens_per_micro_batch):
                    tokens = micro.loss_mask.sum()
                    loss = torch.zeros((), device=device)
                    if train_policy:
                        loss = loss + self._policy_loss(
                            micro, total, tokens, temperature, metrics, routing, truncation, first_epoch=epoch == 0
                        )
                        policy_loss = policy_loss + loss.detach()
                    elif ddp:  # DDP's reducer needs a gradient for every parameter: zeros for the idle policy
                        loss = loss + touch(self.policy)
                    if self.critic is not None:
                        value_loss, value_metrics = self.critic.loss(self.critic(micro, packed=packed), micro)
                        value_loss = self.aggregator(value_loss, micro.loss_mask, total)
                        critic_loss = critic_loss + value_loss.detach()
                        loss = loss + value_loss
                        metrics.add_all(value_metrics, tokens)
                    backward(loss)
                if train_policy and self.ptx is not None:  # PPO-ptx: gamma * NLL of this iteration's pretraining text
                    ptx_loss, ptx_metrics = self.ptx.loss(self.policy, *ptx_text)
                    backward(ptx_loss)
                    metrics.add_all(ptx_metrics)
                    policy_loss = policy_loss + ptx_loss.detach()
                # each rank holds its share of the mini-batch loss; the mean over ranks is the loss itself
                metrics.add("policy/loss", policy_loss)
                if self.critic is not None:
                    metrics.add("critic/loss", critic_loss)
                if self._step(optimizer, trainer, train_policy, metrics, [policy_loss, critic_loss]):
                    steps += 1
                else:
                    skipped += 1
            if (
                loop.target_kl is not None
                and train_policy
                and self._epoch_kl(metrics, kl_before, device) > loop.target_kl
            ):
                break  # every rank sees the same all-reduced KL: all stop together
        metrics.add("policy/epochs_run", torch.tensor(float(epoch + 1), device=device))
        if routing is not None:
            routing.report(metrics)
        metrics.add("health/skipped_nonfinite", torch.tensor(float(skipped), device=device))
        return steps

    @staticmethod
    def _epoch_kl(metrics: WeightedMeans, before: Tensor, device: torch.device) -> float:
        """The token-mean approx-KL of the epoch just finished, over all ranks (a host sync, once per epoch)."""
        total = all_reduce_sum((metrics.running("policy/approx_kl") - before).to(device))
        return float(total[0] / total[1].clamp_min(1e-12))

    def _policy_loss(
        self,
        micro: RolloutBatch,
        total: Tensor,
        tokens: Tensor,
        t: float,
        metrics: WeightedMeans,
        routing: ExpertLoad | None,
        truncation: Truncation | None = None,
        first_epoch: bool = True,
    ) -> Tensor:
        reads = frozenset().union(*(term.reads for term in self.loss_terms))
        forward = policy_outputs(
            self.policy,
            micro,
            t,
            with_entropy=True,
            entropy_grad="entropy" in reads,
            chunk_rows=self.loop.logprob_chunk_rows,
            packed=self.loop.max_tokens_per_micro_batch is not None,
            keep_logits="logits" in reads,
            keep_router_logits=routing is not None,
            truncation=truncation,
            replay_routes=self.routing_replay,
        )
        logprobs, entropy = forward.logprobs, forward.entropy
        if self.teacher_logits is not None:  # the teacher's whole distribution, one micro-batch at a time
            micro = micro.replace(teacher_logits=self.teacher_logits(micro))
        if micro.old_logprobs is None:  # on-policy: pi_old is the current policy
            micro = micro.replace(old_logprobs=logprobs.detach())
            if micro.ref_logprobs is not None:
                counted = micro.counted
                metrics.add(
                    "kl/ref",
                    masked_mean(sequence_kl(micro.old_logprobs, micro.ref_logprobs, micro.loss_mask), counted),
                    counted.sum(),
                )
            if micro.teacher_logprobs is not None:
                add_distill_metrics(metrics, micro, tokens)
        if micro.rollout_logprobs is not None:
            # over the tokens that count: greedy baseline rows carry untempered sampler log-probs
            diff = (micro.old_logprobs - micro.rollout_logprobs).abs() * micro.loss_mask
            metrics.add("rollout/logprob_diff_mean", masked_mean(diff, micro.loss_mask), tokens)
            metrics.add("rollout/logprob_diff_max", diff.max())
            if first_epoch:  # each token once, whatever the epochs
                metrics.values("histogram/logprob_diff", diff[micro.loss_mask.bool()])
        per_token, surrogate_metrics = self.surrogate(logprobs, micro)
        if self.kl is not None:
            per_token = per_token + self.kl.loss_term(logprobs, micro)
            if self.kl.placement == "loss" and self.kl.active:
                metrics.add("kl/clamped_frac", masked_mean(self.kl.clamped(logprobs, micro), micro.loss_mask), tokens)
        for term in self.loss_terms:
            per_token = per_token + term(forward, micro)
        metrics.add("policy/entropy", masked_mean(entropy.detach(), micro.loss_mask), tokens)
        if routing is not None:
            diff = None if micro.rollout_logprobs is None else (micro.old_logprobs - micro.rollout_logprobs).abs()
            routing.add(forward.router_logits, micro.loss_mask, metrics, micro, diff)
        metrics.add_all(surrogate_metrics, tokens)
        return self.aggregator(per_token, micro.loss_mask, total)

    def _step(self, optimizer, trainer, train_policy: bool, metrics: WeightedMeans, losses: list[Tensor]) -> bool:
        """Clip each group's gradients on its own, set its scheduled LR, step; False when the step was skipped
        because a loss or gradient norm is NaN/inf (lightning_rl.loop.health: every rank agrees).

        Under DeepSpeed the engine clips (one global norm, ``gradient_clipping`` in its config)."""
        deepspeed = uses_deepspeed(trainer)
        norms, stepping = list(losses), []
        for group in optimizer.param_groups:
            name = group["name"]
            cfg = self.group_configs[name]
            if name == "policy" and not train_policy:
                for p in group["params"]:
                    p.grad = (
                        None  # no gradients (or DDP's zeros): AdamW skips these parameters, which stay bit-identical
                    )
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
            optimizer.zero_grad(set_to_none=True)
            return False
        steps = self.state.optimizer_steps
        for group, name, cfg in stepping:
            group["lr"] = cfg.lr * cfg.lr_factor(steps[name])
            steps[name] += 1
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if deepspeed and trainer.strategy.deepspeed_engine.get_global_grad_norm() is not None:
            metrics.add(
                "policy/grad_norm", torch.as_tensor(float(trainer.strategy.deepspeed_engine.get_global_grad_norm()))
            )
        return True

    @torch.no_grad()
    def update_kl(self, batch: RolloutBatch) -> None:
        """Adaptive coefficient from the global batch-mean sequence KL (k1 at pi_old), identical on every rank."""
        counted = batch.counted  # (B,): greedy baseline rows and masked samples are not in the mean, nor in n
        seq_kl = sequence_kl(batch.old_logprobs, batch.ref_logprobs, batch.loss_mask)  # (B,)
        stats = all_reduce_sum(torch.stack([(seq_kl * counted).sum(), counted.sum()]))
        self.kl.update(stats[0] / stats[1].clamp_min(1), int(stats[1]))
