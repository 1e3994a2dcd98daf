"""`RLModule`: one LightningModule, five phases per RL iteration, every algorithmic choice a component.

    1 collect   rollout ``group_size`` responses per prompt (again while dynamic sampling asks)
    2 score     reward -> scores; trainer forward passes -> old / reference log-probs, values
    3 estimate  KL-in-reward -> token_rewards; advantage estimator -> advantages, returns
    4 optimize  ppo_epochs x mini-batches x micro-batches of surrogate + KL + loss terms (+ critic)
    5 sync      rollout.sync_weights(policy); adaptive KL step; log

One ``training_step`` is one iteration, and ``trainer.global_step`` counts iterations (see
``_count_iteration``), so ``max_steps``, checkpoint cadence and logging steps mean RL iterations.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterator

import torch
from jsonargparse import lazy_instance
from lightning import LightningModule
from torch import Tensor, nn

from components.advantage import AdvantageEstimator, GroupNormalized
from components.aggregator import Aggregator, TokenMean
from components.critic import ValueCritic
from components.kl import KLRegularizer
from components.loss_terms import LossTerm
from components.reward import ExactMatch, Reward, as_scores
from components.rollout import HFRollout, Rollout
from components.sampling import DynamicSampling
from components.surrogate import ClippedSurrogate, Surrogate

from .batch import RolloutBatch, terminal_rewards
from .config import LoopConfig, OptimizerConfig
from .distributed import IterationRNG, gather_rng_states, hf_zero3_config, restore_rng_states, shard_models, touch, uses_ddp, uses_deepspeed
from .export import export_info
from .logprobs import policy_logprobs
from .metrics import PhaseTimer, WeightedMeans
from .models import ModelSpec, freeze, load_causal_lm, load_tokenizer
from .ops import all_reduce_sum, explained_variance, group_view, masked_mean, world_size
from .requirements import check_requirements

FROZEN_PREFIXES = ("reference.", "reward.", "val_reward.")
"""Submodules that never train (reference, reward models): their weights are reloaded from their paths, never stored in checkpoints."""


class RLModule(LightningModule):
    """Reinforcement learning on a causal LM, composed from components (see DESIGN.md)."""

    def __init__(
        self,
        policy: ModelSpec = ModelSpec(),
        rollout: Rollout = lazy_instance(HFRollout, group_size=8, max_new_tokens=8, temperature=1.0),
        reward: Reward = lazy_instance(ExactMatch),
        advantage: AdvantageEstimator = lazy_instance(GroupNormalized),
        surrogate: Surrogate = lazy_instance(ClippedSurrogate, eps_low=0.2, eps_high=0.2),
        aggregator: Aggregator = lazy_instance(TokenMean),
        kl: KLRegularizer | None = None,
        critic: ValueCritic | None = None,
        reference: ModelSpec | None = None,
        sampling: DynamicSampling | None = None,
        loss_terms: list[LossTerm] | None = None,
        val_reward: Reward | None = None,
        optimizer: OptimizerConfig = OptimizerConfig(lr=1e-4),
        loop: LoopConfig = LoopConfig(),
    ):
        """
        Args:
            policy: the trainable policy's checkpoint (local path or hub id) and load options.
            rollout: the sampler (HFRollout, SGLangRollout).
            reward: scores each response (ExactMatch, FunctionReward, RewardModel, Composite, ...).
            advantage: GroupNormalized, LeaveOneOut, ReinforceBaseline, ReinforcePlusPlus, ReMax, GAE.
            surrogate: ClippedSurrogate, CISPO, PolicyGradient.
            aggregator: TokenMean, SeqMeanTokenMean, SeqMeanTokenSum, TokenSumNorm.
            kl: KL to the reference (None = no KL; a coefficient of 0 loads no reference model).
            critic: a ValueCritic for GAE-based presets (None for critic-free ones).
            reference: the reference model's checkpoint (None = the policy's initial weights).
            sampling: DynamicSampling to drop zero-variance groups and resample (DAPO).
            loss_terms: extra per-token terms (EntropyBonus, PositiveNLL).
            val_reward: the reward validation reports as ``val/reward`` (None = ``reward``).
            optimizer: the policy's AdamW, LR schedule and gradient clipping.
            loop: epochs, mini-batches, micro-batches and logging.
        """
        super().__init__()
        self.automatic_optimization = False
        self.policy_spec, self.reference_spec = policy, reference
        self.rollout, self.reward, self.advantage = rollout, reward, advantage
        self.surrogate, self.aggregator, self.kl, self.critic = surrogate, aggregator, kl, critic
        self.sampling, self.loss_terms = sampling, list(loss_terms or [])
        self.val_reward = val_reward if val_reward is not None else reward
        self.optimizer_cfg, self.loop = optimizer, loop
        self.needs = check_requirements(self)  # fails here, before any model loads, on a config that cannot run
        on_policy = loop.ppo_epochs == 1 and loop.num_mini_batches == 1
        self.recompute_old = not on_policy or "old_logprobs" in self.needs.before_optimize
        self.policy: nn.Module | None = None
        self.reference: nn.Module | None = None
        self.tokenizer = None
        self.optimizer_steps = {"policy": 0, "critic": 0}  # per group, for the LR schedules (host ints: no device sync)
        self._shuffle = torch.Generator().manual_seed(0)
        self._rng = IterationRNG()  # torch's global random state inside iterations (lightning_rl.distributed)

    # ------------------------------------------------------------------ models
    def configure_model(self) -> None:
        """Build every model once (idempotent: Lightning may call it again, e.g. for validate)."""
        if self.policy is not None:
            return
        self.tokenizer = load_tokenizer(self.policy_spec.path)
        self._hf_zero3 = hf_zero3_config(self._trainer)  # DeepSpeed ZeRO-3: models load into partitioned parameters
        self.policy = load_causal_lm(self.policy_spec)
        if "ref_logprobs" in self.needs:
            self.reference = freeze(load_causal_lm(self.reference_spec or self.policy_spec, "model.reference"))
        if self.critic is not None:
            self.critic.build(self.policy_spec.path, getattr(self.reward, "path", None))
        for component in {id(c): c for c in (self.rollout, self.reward, self.val_reward)}.values():
            component.setup(self.tokenizer)
        if self._device_mesh is not None:  # ModelParallelStrategy: FSDP2 over its mesh (lightning_rl.distributed)
            shard_models(self)

    def configure_optimizers(self):
        groups = [self._param_group("policy", self.policy, self.optimizer_cfg)]
        if self.critic is not None:
            groups.append(self._param_group("critic", self.critic, self.critic.optimizer))
        params = [p for group in groups for p in group["params"]]
        # the fused kernel is one call for all parameters (~6x faster than the per-tensor loop torch picks on CPU);
        # sharded DTensor parameters (FSDP2) keep torch's default implementation
        fused = all(type(p) is nn.Parameter and p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
        return torch.optim.AdamW(groups, fused=fused or None)

    @staticmethod
    def _param_group(name: str, module: nn.Module, cfg: OptimizerConfig) -> dict:
        params = [p for p in module.parameters() if p.requires_grad]
        return dict(params=params, name=name, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas), eps=cfg.eps)

    @property
    def critic_pretraining(self) -> bool:
        return self.critic is not None and self.global_step < self.critic.pretrain_steps

    # ------------------------------------------------------------------ the loop
    def training_step(self, dataloader_iter: Iterator) -> None:
        with self._rng.scope(self.global_rank):  # sampling has its own random stream: a resumed run draws the same
            self._iteration(dataloader_iter)

    def _iteration(self, dataloader_iter: Iterator) -> None:
        timer, metrics = PhaseTimer(), WeightedMeans()
        with timer("rollout"):
            batch, meta = self._collect(dataloader_iter, metrics)
        with timer("score"):
            batch = self._forward_passes(batch)
        with timer("estimate"):
            batch = self._estimate(batch, metrics)
        steps = 0
        if batch.batch_size and self._worth_optimizing(batch):
            with timer("optimize"):
                steps = self._optimize(batch, metrics)
        with timer("sync"):
            if steps:
                self.rollout.sync_weights(self.policy)
            if self.kl is not None and self.kl.target is not None:
                self._update_kl(batch)
        self._count_iteration(steps)
        self._log_iteration(batch, meta, metrics, timer)

    def _collect(self, dataloader_iter: Iterator, metrics: WeightedMeans) -> tuple[RolloutBatch, dict]:
        """Rollout and reward; with dynamic sampling, keep informative groups until the batch is full."""
        kept, kept_meta, groups_seen, target = [], [], 0, None
        rounds = self.sampling.max_rounds if self.sampling is not None else 1
        for round_ in range(rounds):
            prompts, _, _ = next(dataloader_iter)
            batch, meta = self._rollout_and_score(prompts, group_offset=groups_seen)
            target = target or prompts["prompt_ids"].shape[0]
            groups_seen += prompts["prompt_ids"].shape[0]
            if self.sampling is None:
                return batch, meta
            keep = self.sampling.keep(batch)
            metrics.add("sampling/zero_var_groups", _zero_variance_fraction(batch))
            kept.append(batch.select(keep))
            kept_meta.append({k: [v for v, flag in zip(vals, keep.tolist()) if flag] for k, vals in meta.items()})
            n_kept = sum(int(torch.unique(b.group_ids).numel()) for b in kept)
            # every rank runs the same number of rounds: a collective inside generate or the reward must not hang
            if int(all_reduce_sum(torch.tensor(float(n_kept < target), device=self.device))) == 0:
                break
        batch = RolloutBatch.cat(kept)
        meta = {k: sum((m[k] for m in kept_meta), []) for k in kept_meta[0]}
        if n_kept == 0:
            warnings.warn(f"iteration {self.global_step}: dynamic sampling kept no group in {round_ + 1} round(s); skipping the update")
        rows = batch.batch_size // max(1, n_kept) if n_kept else 0
        if n_kept > target:
            batch = batch.select(slice(0, target * rows))
            meta = {k: v[: target * rows] for k, v in meta.items()}
        metrics.add("sampling/kept_frac", torch.tensor(min(n_kept, target) / target))
        metrics.add("sampling/rounds", torch.tensor(float(round_ + 1)))
        return batch, meta

    @torch.no_grad()
    def _rollout_and_score(self, prompts: dict, group_offset: int) -> tuple[RolloutBatch, dict]:
        prompt_ids, prompt_mask = prompts["prompt_ids"].to(self.device), prompts["prompt_mask"].to(self.device)
        batch = self.rollout.generate(prompt_ids, prompt_mask, self.policy)
        rows = batch.batch_size // prompt_ids.shape[0]
        batch = batch.replace(group_ids=batch.group_ids + group_offset)
        if batch.sample_mask is None:
            batch = batch.replace(sample_mask=torch.ones(batch.batch_size, device=self.device))
        if self.loop.mask_truncated:
            batch = batch.replace(sample_mask=batch.sample_mask * (batch.truncated == 0).float())
        meta = {k: [v for v in vals for _ in range(rows)] for k, vals in prompts["meta"].items()}
        meta["completions"] = self._decode(batch)
        meta["prompts"] = meta["prompt"] if "prompt" in meta else self.tokenizer.batch_decode(batch.prompt_ids, skip_special_tokens=True)
        scores = as_scores(self.reward(batch, meta), batch.batch_size, _name(self.reward), meta)
        return batch.replace(scores=scores.to(self.device)), meta

    def _decode(self, batch: RolloutBatch) -> list[str]:
        lengths = batch.response_lengths.tolist()
        return self.tokenizer.batch_decode([ids[:n] for ids, n in zip(batch.response_ids.tolist(), lengths)], skip_special_tokens=True)

    @torch.no_grad()
    def _forward_passes(self, batch: RolloutBatch) -> RolloutBatch:
        """Old / reference log-probs and values, batched under no_grad. Old log-probs are skipped when the
        update is on-policy and nothing reads them before the optimize phase: the ratio is 1 there by construction."""
        fields: dict[str, list[Tensor]] = {}
        t = self.rollout.temperature or 1.0
        for chunk in batch.split(self.loop.forward_batch_size):
            if self.recompute_old:
                fields.setdefault("old_logprobs", []).append(policy_logprobs(self.policy, chunk, t, chunk_rows=self.loop.logprob_chunk_rows)[0])
            if self.reference is not None:
                fields.setdefault("ref_logprobs", []).append(policy_logprobs(self.reference, chunk, t, chunk_rows=self.loop.logprob_chunk_rows)[0])
            if self.critic is not None:
                fields.setdefault("values", []).append(self.critic(chunk).float())
        mask = batch.response_mask.float()
        return batch.replace(**{k: torch.cat(v) * mask for k, v in fields.items()})

    def _estimate(self, batch: RolloutBatch, metrics: WeightedMeans) -> RolloutBatch:
        rewards = terminal_rewards(batch.scores, batch.response_mask)
        if self.kl is not None:
            rewards = rewards + self.kl.reward_penalty(batch)
        batch = batch.replace(token_rewards=rewards)
        advantages, returns = self.advantage(batch)
        batch = batch.replace(advantages=advantages, returns=returns)
        mask = batch.loss_mask
        metrics.add("advantage/mean", masked_mean(advantages, mask))
        metrics.add("advantage/std", masked_mean((advantages - masked_mean(advantages, mask)).square(), mask).sqrt())
        if batch.values is not None and returns is not None:
            metrics.add("critic/explained_var", explained_variance(batch.values, returns, mask))
        if batch.old_logprobs is not None and batch.ref_logprobs is not None:
            metrics.add("kl/ref", _sequence_kl(batch.old_logprobs, batch.ref_logprobs, mask).mean(), batch.batch_size)
        return batch

    def _worth_optimizing(self, batch: RolloutBatch) -> bool:
        """False when no rank has a nonzero advantage on a token that counts (every group degenerate)."""
        if not self.loop.skip_degenerate_batches or self.critic is not None:
            return True
        informative = ((batch.advantages.abs() > 0).float() * batch.loss_mask).sum()
        if float(all_reduce_sum(informative)) > 0:
            return True
        warnings.warn(f"iteration {self.global_step}: every advantage is zero (all groups degenerate); skipping the update")
        return False

    def _optimize(self, batch: RolloutBatch, metrics: WeightedMeans) -> int:
        opt, loop = self.optimizers(), self.loop
        train_policy = not self.critic_pretraining
        needs_entropy = any(term.needs_entropy for term in self.loss_terms)
        t = self.rollout.temperature or 1.0
        steps, ddp = 0, uses_ddp(self._trainer)
        for _ in range(loop.ppo_epochs):
            order = torch.randperm(batch.batch_size, generator=self._shuffle) if loop.num_mini_batches > 1 else torch.arange(batch.batch_size)
            for index in order.chunk(loop.num_mini_batches):
                mini = batch.select(index.to(self.device))
                # the normaliser of the whole mini-batch over all ranks, shared by every micro-batch; DDP then
                # averages gradients over ranks, hence the division by the world size
                total = all_reduce_sum(self.aggregator.denominator(mini.loss_mask)) / world_size()
                policy_loss = critic_loss = torch.zeros((), device=self.device)
                for micro in mini.split(loop.micro_batch_size):
                    tokens = micro.loss_mask.sum()
                    loss = torch.zeros((), device=self.device)
                    if train_policy:
                        loss = loss + self._policy_loss(micro, total, tokens, t, needs_entropy, metrics)
                        policy_loss = policy_loss + loss.detach()
                    elif ddp:  # DDP's reducer needs a gradient for every parameter: zeros for the idle policy
                        loss = loss + touch(self.policy)
                    if self.critic is not None:
                        value_loss, value_metrics = self.critic.loss(self.critic(micro), micro)
                        value_loss = self.aggregator(value_loss, micro.loss_mask, total)
                        critic_loss = critic_loss + value_loss.detach()
                        loss = loss + value_loss
                        metrics.add_all(value_metrics, tokens)
                    self.manual_backward(loss)
                # each rank holds its share of the mini-batch loss; the mean over ranks is the loss itself
                metrics.add("policy/loss", policy_loss)
                if self.critic is not None:
                    metrics.add("critic/loss", critic_loss)
                self._step(opt, train_policy, metrics)
                steps += 1
        return steps

    def _policy_loss(self, micro: RolloutBatch, total: Tensor, tokens: Tensor, t: float, needs_entropy: bool, metrics: WeightedMeans) -> Tensor:
        logprobs, entropy = policy_logprobs(self.policy, micro, t, with_entropy=True, entropy_grad=needs_entropy, chunk_rows=self.loop.logprob_chunk_rows)
        if micro.old_logprobs is None:  # on-policy: pi_old is the current policy
            micro = micro.replace(old_logprobs=logprobs.detach())
            if micro.ref_logprobs is not None:
                metrics.add("kl/ref", _sequence_kl(micro.old_logprobs, micro.ref_logprobs, micro.loss_mask).mean(), micro.batch_size)
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

    def _step(self, opt, train_policy: bool, metrics: WeightedMeans) -> None:
        """Clip each group's gradients on its own, set its scheduled LR, step.

        Under DeepSpeed the engine clips (one global norm, ``gradient_clipping`` in its config)."""
        deepspeed = uses_deepspeed(self._trainer)
        for group in opt.param_groups:
            name = group["name"]
            cfg = self.optimizer_cfg if name == "policy" else self.critic.optimizer
            if name == "policy" and not train_policy:
                for p in group["params"]:
                    p.grad = None  # no gradients (or DDP's zeros): AdamW skips these parameters, which stay bit-identical
                continue
            if cfg.max_grad_norm is not None and not deepspeed:
                norm = torch.nn.utils.clip_grad_norm_(group["params"], cfg.max_grad_norm)
                metrics.add(f"{name}/grad_norm", norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
            group["lr"] = cfg.lr * cfg.lr_factor(self.optimizer_steps[name])
            self.optimizer_steps[name] += 1
        opt.step()
        opt.zero_grad(set_to_none=True)
        if deepspeed and self.trainer.strategy.deepspeed_engine.get_global_grad_norm() is not None:
            metrics.add("policy/grad_norm", torch.as_tensor(float(self.trainer.strategy.deepspeed_engine.get_global_grad_norm())))

    @torch.no_grad()
    def _update_kl(self, batch: RolloutBatch) -> None:
        """Adaptive coefficient from the global batch-mean sequence KL (k1 at pi_old), identical on every rank."""
        seq_kl = _sequence_kl(batch.old_logprobs, batch.ref_logprobs, batch.loss_mask)  # (B,)
        stats = all_reduce_sum(torch.stack([seq_kl.sum(), torch.tensor(float(batch.batch_size), device=seq_kl.device)]))
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

    # ------------------------------------------------------------------ logging
    def _log_iteration(self, batch: RolloutBatch, meta: dict, metrics: WeightedMeans, timer: PhaseTimer) -> None:
        sampled = batch.sample_mask if batch.is_greedy is None else (batch.is_greedy == 0).float()
        lengths = batch.response_lengths.float()
        metrics.add("reward/mean", masked_mean(batch.scores, sampled), sampled.sum())
        metrics.add("reward/std", masked_mean((batch.scores - masked_mean(batch.scores, sampled)).square(), sampled).sqrt())
        metrics.add("response_length/mean", masked_mean(lengths, sampled), sampled.sum())
        metrics.add("response_length/truncated_frac", masked_mean(batch.truncated.float(), sampled), sampled.sum())
        if self.sampling is None and batch.batch_size:  # with dynamic sampling, _collect logs it before filtering
            metrics.add("sampling/zero_var_groups", _zero_variance_fraction(batch))
        if self.kl is not None:
            metrics.add("kl/coef", self.kl.coef.float())
        values = metrics.compute()
        values["policy/old_logprobs_recomputed"] = torch.tensor(float(self.recompute_old))
        seconds = timer.metrics()
        total = sum(seconds.values())
        values["throughput/tokens_per_s"] = all_reduce_sum(batch.response_mask.sum().float()) / max(total, 1e-9)
        values["optim/lr_policy"] = torch.tensor(self.optimizers().param_groups[0]["lr"])
        self._write_metrics({**dict(zip(values, torch.stack([v.float().reshape(()) for v in values.values()]).tolist())), **seconds})
        if self.trainer.progress_bar_callback is not None:  # self.log costs ~1 ms: only when a bar shows it
            self.log("reward", values["reward/mean"], prog_bar=True, on_step=True, logger=False, batch_size=batch.batch_size)
        every = self.loop.log_samples_every_n_steps
        if every and self.global_step % every == 0:
            self._log_samples(meta, batch)

    def _write_metrics(self, scalars: dict[str, float]) -> None:
        """Iteration metrics (already reduced over ranks, one host sync for all) straight to the loggers and to
        ``trainer.callback_metrics`` / ``logged_metrics``. ``self.log`` costs ~1 ms of host time per metric
        (Lightning's result collection moves and deep-copies each entry), ~20 ms per iteration for these ~25."""
        trainer = self.trainer
        tensors = {k: torch.tensor(v) for k, v in scalars.items()}
        trainer.callback_metrics.update(tensors)
        trainer.logged_metrics.update(tensors)
        if trainer.loggers and trainer.log_every_n_steps and self.global_step % trainer.log_every_n_steps == 0:  # Lightning's cadence
            for logger in trainer.loggers:  # the step Lightning's own logging would use: iterations before this one
                logger.log_metrics(scalars, step=self.global_step - 1)

    def _log_samples(self, meta: dict, batch: RolloutBatch) -> None:
        experiment = getattr(self.logger, "experiment", None)
        if self.global_rank != 0 or not hasattr(experiment, "add_text"):
            return
        rows = ["| prompt | completion | score |", "|---|---|---|"]
        for i in range(min(self.loop.log_samples, batch.batch_size)):
            cells = [str(x).replace("|", "\\|").replace("\n", " ") for x in (meta["prompts"][i], meta["completions"][i])]
            rows.append(f"| {cells[0]} | {cells[1]} | {float(batch.scores[i]):.3f} |")
        experiment.add_text("samples", "\n".join(rows), self.global_step)

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def validation_step(self, batch: dict, batch_idx: int) -> None:
        """Greedy decoding on held-out prompts; ``val/reward`` is held-out greedy accuracy for a 0/1 reward."""
        prompt_ids, prompt_mask = batch["prompt_ids"], batch["prompt_mask"]
        rollout = self.rollout.generate(prompt_ids, prompt_mask, self.policy, greedy=True)
        meta = {**batch["meta"], "completions": self._decode(rollout)}
        meta["prompts"] = meta.get("prompt", [])
        scores = as_scores(self.val_reward(rollout, meta), rollout.batch_size, _name(self.val_reward), meta).to(self.device)
        n = rollout.batch_size
        self.log("val/reward", scores.mean(), on_epoch=True, sync_dist=True, batch_size=n, prog_bar=True)
        self.log("val/response_length", rollout.response_lengths.float().mean(), on_epoch=True, sync_dist=True, batch_size=n)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Frozen models are reloaded from their paths, not stored; every rank's RNG is (a collective), so sampling resumes exactly."""
        state = checkpoint.get("state_dict", {})
        # frozen parameters only: buffers under these prefixes are state (RewardModel's running score statistics)
        frozen = {name for name, p in self.named_parameters(remove_duplicate=False) if not p.requires_grad}
        for key in [k for k in state if k.startswith(FROZEN_PREFIXES) and k in frozen]:
            del state[key]
        checkpoint["rng"] = gather_rng_states(self._rng, {"shuffle": self._shuffle})
        checkpoint["optimizer_steps"] = dict(self.optimizer_steps)
        checkpoint["hf_export"] = export_info(self)  # architecture + tokenizer for `lightning-rl export`

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("state_dict")
        if state is not None:
            for key, value in self.state_dict().items():
                if key.startswith(FROZEN_PREFIXES):
                    state.setdefault(key, value)
        self.optimizer_steps.update(checkpoint.get("optimizer_steps", {}))
        if checkpoint.get("rng"):
            restore_rng_states(checkpoint["rng"], self._rng, {"shuffle": self._shuffle})

    def teardown(self, stage: str) -> None:
        self.rollout.close()


def _sequence_kl(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-sample KL(pi || ref) estimate: k1 summed over the sequence (unbiased for the sequence KL). Shape: (B,)."""
    return ((logprobs - ref_logprobs) * mask).sum(-1)


def _zero_variance_fraction(batch: RolloutBatch) -> Tensor:
    """Fraction of groups whose sampled responses all scored the same (they teach nothing)."""
    scores = batch.scores if batch.is_greedy is None else batch.scores[batch.is_greedy == 0]
    groups = batch.group_ids if batch.is_greedy is None else batch.group_ids[batch.is_greedy == 0]
    grouped = group_view(scores, groups)  # (n_groups, G)
    return ((grouped.amax(-1) - grouped.amin(-1)) <= 1e-6).float().mean()


def _name(component) -> str:
    return getattr(component, "name", type(component).__name__)
