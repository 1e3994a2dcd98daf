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

import time
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
from components.ptx import PretrainMix
from components.reward import ExactMatch, Reward, as_scores
from components.rollout import HFRollout, MultiTurnRollout, Rollout
from components.sampling import DynamicSampling
from components.surrogate import ClippedSurrogate, Surrogate

from .ahead import RolloutAhead, check_asynchronous, drop_stale
from .batch import RolloutBatch, terminal_rewards
from .config import LoopConfig, OptimizerConfig
from .distributed import IterationRNG, gather_rng_states, hf_zero3_config, restore_rng_states, shard_models
from .evaluation import ValidateBeforeAndAfter, Validation
from .export import export_info
from .fault import ResumableCheckpoints, TeardownOnException
from .health import FiniteCheckpoints, TrainingHealth
from .logprobs import policy_logprobs
from .lora import base_fingerprints, check_bases, frozen_base_names, reference_is_base, reference_model
from .metrics import PhaseTimer, WeightedMeans
from .microbatch import micro_batches, pad_to
from .models import ModelSpec, freeze, load_causal_lm, load_tokenizer
from .ops import all_reduce_sum, explained_variance, masked_mean, sequence_kl, zero_variance_fraction
from .reporting import IterationReporting
from .requirements import ContextLengthCheck, check_requirements
from .runs import RunFolders
from .update import UpdatePhase

FROZEN_PREFIXES = ("reference.", "reward.", "val_reward.")
"""Submodules that never train (reference, reward models): their weights are reloaded from their paths, never stored in checkpoints."""


class RLModule(UpdatePhase, IterationReporting, Validation, LightningModule):
    """Reinforcement learning on a causal LM, composed from components: the phases are listed in this module's docstring."""

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
        ptx: PretrainMix | None = None,
        agent: MultiTurnRollout | None = None,
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
            ptx: PPO-ptx, a pretraining LM loss on ``data.ptx_data`` mixed into the policy loss (None = off).
            agent: multi-turn episodes through an environment (tools), sampled by ``rollout`` (None = one turn).
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
        self.ptx, self._ptx_text = ptx, None  # the iteration's pretraining text (ids, mask), from the data module
        self.agent = agent
        self.optimizer_cfg, self.loop = optimizer, loop
        self.needs = check_requirements(self)  # fails here, before any model loads, on a config that cannot run
        on_policy = loop.ppo_epochs == 1 and loop.num_mini_batches == 1
        # a batch sampled by older weights (asynchronous) needs pi_prox, the weights before this update, recomputed
        self.recompute_old = not on_policy or "old_logprobs" in self.needs.before_optimize or loop.max_staleness > 0
        self.reference_is_base = reference_is_base(policy, reference, self.needs)  # LoRA: adapters off, no second model
        if self.reference_is_base and kl is not None and kl.refresh_every is not None:
            raise ValueError("model.kl.init_args.refresh_every needs a reference model of its own, but with a LoRA policy and no "
                             "`model.reference` the reference is the base model (adapters off); set model.reference, or refresh_every: null")
        self.policy: nn.Module | None = None
        self.reference: nn.Module | None = None
        self.tokenizer = None
        self.optimizer_steps = {"policy": 0, "critic": 0}  # per group, for the LR schedules (host ints: no device sync)
        self._shuffle = torch.Generator().manual_seed(0)
        self._rng = IterationRNG()  # torch's global random state inside iterations (lightning_rl.distributed)
        self.health = TrainingHealth(loop.max_nonfinite_steps, loop.degenerate_patience, loop.min_entropy)  # lightning_rl.health
        self._ahead: RolloutAhead | None = None  # asynchronous training (loop.max_staleness > 0): lightning_rl.ahead

    # ------------------------------------------------------------------ models
    def configure_model(self) -> None:
        """Build every model once (idempotent: Lightning may call it again, e.g. for validate)."""
        if self.policy is not None:
            return
        self.tokenizer = load_tokenizer(self.policy_spec.path)
        self._hf_zero3 = hf_zero3_config(self._trainer)  # DeepSpeed ZeRO-3: models load into partitioned parameters
        self.policy = load_causal_lm(self.policy_spec)
        if "ref_logprobs" in self.needs and not self.reference_is_base:
            self.reference = freeze(load_causal_lm(self.reference_spec or self.policy_spec, "model.reference"))
        if self.critic is not None:
            self.critic.build(self.policy_spec.path, getattr(self.reward, "path", None), policy=self.policy)
        for component in {id(c): c for c in (self.rollout, self.reward, self.val_reward)}.values():
            component.setup(self.tokenizer)
        if self.agent is not None:
            self.agent.setup(self.tokenizer, self.rollout)
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
        iterations_done = self.global_step + 1  # read now: Lightning advances global_step at every optimizer step below
        with timer("rollout"):
            batch, meta = self._collect(dataloader_iter, metrics)
        with timer("score"):
            batch = self._forward_passes(batch)
        with timer("estimate"):
            batch = self._estimate(batch, metrics)
        steps = 0
        worth = bool(batch.batch_size) and self._worth_optimizing(batch)
        metrics.add("health/skipped_degenerate", torch.tensor(float(bool(batch.batch_size) and not worth), device=self.device))
        if worth:
            with timer("optimize"):
                steps = self._optimize(batch, metrics)
        with timer("sync"):
            if steps and self._ahead is not None:
                self._ahead.push(self.policy)
            elif steps:
                self.rollout.sync_weights(self.policy)
            if self.kl is not None and self.kl.refresh_due(iterations_done):
                self.reference.load_state_dict(self.policy.state_dict())  # the iterative variant's new anchor
            if self.kl is not None and self.kl.target is not None:
                self._update_kl(batch)
        self._count_iteration(steps)
        self._log_iteration(batch, meta, metrics, timer)
        if self._ahead is not None:
            self._ahead.trained()  # last: an exception before here resamples this iteration's rounds after a resume

    def _collect(self, dataloader_iter: Iterator, metrics: WeightedMeans) -> tuple[RolloutBatch, dict]:
        """Rollout and reward; with dynamic sampling, keep informative groups until the batch is full."""
        kept, kept_meta, groups_seen, target, waited = [], [], 0, None, 0.0
        rounds = self.sampling.max_rounds if self.sampling is not None else 1
        for round_ in range(rounds):
            prompts, batch, meta, extra, wait = self._next_round(dataloader_iter)
            waited += wait
            if round_ == 0 and self.ptx is not None:
                if "ptx" not in prompts:
                    raise ValueError("model.ptx (PPO-ptx) is set but data.ptx_data is not: give the data module pretraining text, or drop model.ptx")
                self._ptx_text = (prompts["ptx"]["ids"].to(self.device), prompts["ptx"]["mask"].to(self.device))
            batch = batch.replace(group_ids=batch.group_ids + groups_seen)
            metrics.add_all({k: v.to(self.device) for k, v in extra.items()})  # e.g. reward/timeout_frac, agent/turns_mean
            target = target or prompts["prompt_ids"].shape[0]
            groups_seen += prompts["prompt_ids"].shape[0]
            if self.sampling is None:
                metrics.add("time/rollout_wait_s", torch.tensor(waited))  # the trainer idle on samples (all of the rollout when synchronous)
                return batch, meta
            keep = self.sampling.keep(batch, {k.removeprefix("reward/"): torch.tensor(v) for k, v in meta.items() if k.startswith("reward/")})
            metrics.add("sampling/zero_var_groups", zero_variance_fraction(batch.scores, batch.group_ids, batch.is_greedy))
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
        metrics.add("time/rollout_wait_s", torch.tensor(waited))
        return batch, meta

    def _next_round(self, dataloader_iter: Iterator) -> tuple[dict, RolloutBatch, dict, dict, float]:
        """Prompts and their scored samples: sampled now, or (asynchronous) taken from the rounds sampled ahead,
        with the groups older than ``loop.max_staleness`` versions left out. Scoring runs here, on the trainer's
        thread: a reward may hold state or run collectives (running normalisation, a sharded reward model)."""
        start = time.perf_counter()
        if self._ahead is None:
            prompts = next(dataloader_iter)[0]
            batch, meta, extra = self._rollout(prompts, self.policy)
            staleness = {}
        else:
            prompts, batch, meta, extra = self._ahead.take(lambda: next(dataloader_iter)[0], self.policy)
            batch, meta, staleness = drop_stale(batch.to(self.device), meta, self._ahead.version, self.loop.max_staleness)
        waited = time.perf_counter() - start
        batch, meta, scored = self._score(batch, meta)
        return prompts, batch, meta, {**extra, **staleness, **scored}, waited

    @torch.no_grad()
    def _rollout(self, prompts: dict, policy: nn.Module) -> tuple[RolloutBatch, dict, dict]:
        """Sample with ``policy`` (the trainer's, or an asynchronous sampler's copy): the batch, each sample's texts and
        data columns, and the agent's metrics. Runs on the background thread in asynchronous training."""
        prompt_ids, prompt_mask = prompts["prompt_ids"].to(self.device), prompts["prompt_mask"].to(self.device)
        batch, texts = self._sample(prompt_ids, prompt_mask, prompts["meta"], policy=policy)
        rows = batch.batch_size // prompt_ids.shape[0]
        if batch.sample_mask is None:
            batch = batch.replace(sample_mask=torch.ones(batch.batch_size, device=self.device))
        if self.loop.mask_truncated:
            batch = batch.replace(sample_mask=batch.sample_mask * (batch.truncated == 0).float())
        meta = {k: [v for v in vals for _ in range(rows)] for k, vals in prompts["meta"].items()}
        meta.update(texts)
        meta["prompts"] = meta["prompt"] if "prompt" in meta else self.tokenizer.batch_decode(batch.prompt_ids, skip_special_tokens=True)
        return batch, meta, dict(self.agent.last_metrics) if self.agent is not None else {}

    @torch.no_grad()
    def _score(self, batch: RolloutBatch, meta: dict) -> tuple[RolloutBatch, dict, dict]:
        scores = as_scores(self.reward(batch, meta), batch.batch_size, _name(self.reward), meta)
        for name, part in getattr(self.reward, "last_parts", {}).items():  # a Composite's parts, per sample
            meta[f"reward/{name}"] = part.tolist()
        return batch.replace(scores=scores.to(self.device)), meta, dict(self.reward.last_metrics)

    def _sample(self, prompt_ids: Tensor, prompt_mask: Tensor, columns: dict[str, list], greedy: bool = False, policy: nn.Module | None = None) -> tuple[RolloutBatch, dict[str, list]]:
        """The rollout's samples and their ``completions``; with ``agent``, whole episodes through its environment,
        built from each prompt's data row (components.rollout.multi_turn), and their ``transcripts``."""
        policy = policy if policy is not None else self.policy
        if self.agent is None:
            batch = self.rollout.generate(prompt_ids, prompt_mask, policy, greedy=greedy)
            return batch, {"completions": self._decode(batch)}
        rows = [dict(zip(columns, values)) for values in zip(*columns.values())] if columns else [{} for _ in range(prompt_ids.shape[0])]
        return self.agent.generate(self.rollout, prompt_ids, prompt_mask, policy, rows, greedy=greedy)

    def _decode(self, batch: RolloutBatch) -> list[str]:
        lengths = batch.response_lengths.tolist()
        return self.tokenizer.batch_decode([ids[:n] for ids, n in zip(batch.response_ids.tolist(), lengths)], skip_special_tokens=True)

    @torch.no_grad()
    def _forward_passes(self, batch: RolloutBatch) -> RolloutBatch:
        """Old / reference log-probs and values, batched under no_grad. Old log-probs are skipped when the
        update is on-policy and nothing reads them before the optimize phase: the ratio is 1 there by construction."""
        fields: dict[str, list[Tensor]] = {}
        t = self.rollout.temperature or 1.0
        packed, width = self.loop.max_tokens_per_micro_batch is not None, batch.response_ids.shape[1]
        for chunk in micro_batches(batch, self.loop.forward_batch_size, self.loop.max_tokens_per_micro_batch):
            if self.recompute_old:
                fields.setdefault("old_logprobs", []).append(policy_logprobs(self.policy, chunk, t, chunk_rows=self.loop.logprob_chunk_rows, packed=packed)[0])
            if self.reference is not None or self.reference_is_base:
                with reference_model(self) as reference:
                    fields.setdefault("ref_logprobs", []).append(policy_logprobs(reference, chunk, t, chunk_rows=self.loop.logprob_chunk_rows, packed=packed)[0])
            if self.critic is not None:
                fields.setdefault("values", []).append(self.critic(chunk, packed=packed).float())
        mask = batch.response_mask.float()
        return batch.replace(**{k: torch.cat([pad_to(x, width) for x in v]) * mask for k, v in fields.items()})

    def _estimate(self, batch: RolloutBatch, metrics: WeightedMeans) -> RolloutBatch:
        rewards = terminal_rewards(batch.scores, batch.action_tokens)
        if batch.env_rewards is not None:  # multi-turn: an environment's rewards, on the last token of their turn
            rewards = rewards + batch.env_rewards
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
            counted = batch.counted
            metrics.add("kl/ref", masked_mean(sequence_kl(batch.old_logprobs, batch.ref_logprobs, mask), counted), counted.sum())
        return batch

    def _worth_optimizing(self, batch: RolloutBatch) -> bool:
        """False when nothing in the loss has a gradient on any rank: every advantage on a token that counts is
        zero (every group degenerate), no KL term is in the loss and no loss term touches a counted token.
        (A step without gradient is not a no-op: AdamW's momentum and weight decay would still move the policy.)"""
        kl_in_loss = self.kl is not None and self.kl.placement == "loss" and float(self.kl.coef) > 0
        if not self.loop.skip_degenerate_batches or self.critic is not None or kl_in_loss:
            return True
        informative = ((batch.advantages.abs() > 0).float() * batch.loss_mask).sum()
        for term in self.loss_terms:
            informative = informative + term.gradient_tokens(batch)
        if float(all_reduce_sum(informative)) > 0:
            return True
        if not getattr(self, "_said_degenerate", False):  # said once; health/skipped_degenerate counts every one
            self._said_degenerate = True
            warnings.warn(
                f"iteration {self.global_step}: every advantage is zero (all groups degenerate) and nothing else in the loss has a "
                "gradient; skipping the update. Said once: health/skipped_degenerate is 1 at each iteration skipped so"
            )
        return False

    # ------------------------------------------------------------------ validation
    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Greedy accuracy on held-out prompts, pass@k / mean@k from sampled responses (lightning_rl.evaluation)."""
        self._validate(batch, dataloader_idx)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Frozen models are reloaded from their paths, not stored; every rank's RNG is (a collective), so sampling resumes exactly."""
        state = checkpoint.get("state_dict", {})
        # frozen parameters only: buffers under these prefixes are state (RewardModel's running score statistics)
        frozen = {name for name, p in self.named_parameters(remove_duplicate=False) if not p.requires_grad}
        lora_base = frozen_base_names(self)  # LoRA: the frozen base is reloaded from its path too
        reloaded = FROZEN_PREFIXES if self.kl is None or self.kl.refresh_every is None else tuple(p for p in FROZEN_PREFIXES if p != "reference.")
        for key in [k for k in state if (k.startswith(reloaded) and k in frozen) or k in lora_base]:
            del state[key]
        checkpoint["rng"] = gather_rng_states(self._rng, {"shuffle": self._shuffle})
        checkpoint["optimizer_steps"] = dict(self.optimizer_steps)
        checkpoint["hf_export"] = export_info(self)  # architecture + tokenizer for `lightning-rl export`
        checkpoint["lora_base"] = base_fingerprints(self)
        if self._ahead is not None:
            self._ahead.save_untrained_position(checkpoint, self._trainer.datamodule)  # rounds sampled ahead are sampled again

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("state_dict")
        check_bases(checkpoint.get("lora_base"), self)
        if state is not None:
            lora_base = frozen_base_names(self)
            for key, value in self.state_dict().items():
                if key.startswith(FROZEN_PREFIXES) or key in lora_base:
                    state.setdefault(key, value)
        self.optimizer_steps.update(checkpoint.get("optimizer_steps", {}))
        self.restored_step = int(checkpoint.get("global_step", 0))  # `validate` logs at the step of the weights it loaded
        if checkpoint.get("rng"):
            restore_rng_states(checkpoint["rng"], self._rng, {"shuffle": self._shuffle})

    def configure_callbacks(self) -> list:
        """last.ckpt at the final / last completed iteration and teardown on failure (lightning_rl.fault); no checkpoint of
        non-finite weights (lightning_rl.health); prompt + response lengths against the policy's positions (lightning_rl.requirements);
        each fit in its own run folder with a ``latest`` link (lightning_rl.runs); validation before and after training (lightning_rl.evaluation)."""
        return [RunFolders(), ResumableCheckpoints(), FiniteCheckpoints(), TeardownOnException(), ContextLengthCheck(), ValidateBeforeAndAfter()]

    def on_fit_start(self) -> None:
        """Asynchronous training (``loop.max_staleness`` > 0, lightning_rl.ahead): the rounds sampled ahead. They start
        at the first iteration, once every strategy has restored the checkpoint's weights."""
        if self.loop.max_staleness > 0:
            check_asynchronous(self.rollout, self.trainer, self.agent)
            self._ahead = RolloutAhead(self.rollout, self._rollout, self.loop.max_staleness, self.trainer.datamodule)

    def on_validation_start(self) -> None:
        if self._ahead is not None:  # validation changes the sampler's settings for a while: no round may sample meanwhile
            self._ahead.drain()

    def teardown(self, stage: str) -> None:
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        self.rollout.close()
        if self.agent is not None:
            self.agent.close()


def _name(component) -> str:
    return getattr(component, "name", type(component).__name__)
