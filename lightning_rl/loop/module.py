"""`RLModule`: one LightningModule, five phases per RL iteration, every algorithmic choice a component.

    1 collect   rollout ``group_size`` responses per prompt and score them (again while dynamic sampling asks)
    2 score     trainer forward passes -> old / reference log-probs, values
    3 estimate  KL-in-reward -> token_rewards; advantage estimator -> advantages, returns
    4 optimize  ppo_epochs x mini-batches x micro-batches of surrogate + KL + loss terms (+ critic)
    5 sync      rollout.sync_weights(policy); adaptive KL step; log

Each phase is an object built from the components and settings it needs (lightning_rl.loop.collect, forward,
estimate, optimize, reporting, validation); this module holds the models and Lightning's hooks and runs the phases
in order. One ``training_step`` is one iteration, and ``trainer.global_step`` counts iterations (see
``lightning_rl.lightning_compat.count_iteration``), so ``max_steps``, checkpoint cadence and logging steps mean RL iterations.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from lightning import LightningModule
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import nn

from lightning_rl import checkpoint, defaults
from lightning_rl.callbacks import (
    ContextLengthCheck,
    FiniteCheckpoints,
    RecordRollouts,
    ResumableCheckpoints,
    RunFolders,
    RunLog,
    RunSummary,
    TeardownOnException,
    ValidateBeforeAndAfter,
)
from lightning_rl.core.config import LoopConfig, OptimizerConfig
from lightning_rl.core.contracts import (
    AdvantageEstimator,
    Agent,
    Aggregator,
    LossTerm,
    Reward,
    Rollout,
    Surrogate,
    Teacher,
)
from lightning_rl.core.lora import reference_is_base
from lightning_rl.core.models import ModelSpec, check_model_path, load_tokenizer
from lightning_rl.core.truncation import Truncation
from lightning_rl.data.prompts import PromptDataModule
from lightning_rl.distributed import hf_zero3_config
from lightning_rl.lightning_compat import count_iteration
from lightning_rl.loop.ahead import RolloutAhead, check_asynchronous
from lightning_rl.loop.collect import Collector
from lightning_rl.loop.estimate import estimate
from lightning_rl.loop.forward import TrainerForward
from lightning_rl.loop.health import TrainingHealth
from lightning_rl.loop.metrics import PhaseTimer, WeightedMeans
from lightning_rl.loop.optimize import PolicyUpdate
from lightning_rl.loop.recording import IterationRecorder
from lightning_rl.loop.replay import Replay
from lightning_rl.loop.reporting import Reporter
from lightning_rl.loop.requirements import (
    check_data_columns,
    check_requirements,
    derived_token_limit,
)
from lightning_rl.loop.sharding import shard_models
from lightning_rl.loop.validation import Validator
from lightning_rl.rollouts import Record
from lightning_rl.roster import ROSTER, scorers, trained


class RLModule(LightningModule):
    """Reinforcement learning on a causal LM, composed of parts known by their contracts: the phases are listed in this module's docstring."""

    def __init__(
        self,
        policy: ModelSpec = ModelSpec(),
        rollout: Rollout = defaults.ROLLOUT,
        reward: Reward = defaults.REWARD,
        advantage: AdvantageEstimator = defaults.ADVANTAGE,
        surrogate: Surrogate = defaults.SURROGATE,
        aggregator: Aggregator = defaults.AGGREGATOR,
        kl: defaults.KL | None = None,
        critic: defaults.CRITIC | None = None,
        reference: ModelSpec | None = None,
        sampling: defaults.SAMPLING | None = None,
        loss_terms: list[LossTerm] | None = None,
        val_reward: Reward | None = None,
        ptx: defaults.PTX | None = None,
        agent: Agent | None = None,
        teacher: Teacher | None = None,
        optimizer: OptimizerConfig = OptimizerConfig(lr=1e-4),
        loop: LoopConfig = LoopConfig(),
        routing_replay: bool = False,
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
            agent: whole episodes sampled by ``rollout`` (None = one turn): MultiTurnRollout (an `Environment` with tools) or
                OpenAIAgent (your function, given an OpenAI client on a loopback endpoint).
            teacher: scores the policy's sampled tokens for on-policy distillation (``teacher_logprobs``): HFTeacher, a
                transformers model with the policy's tokenizer, or a server that scores given tokens (SGLangTeacher,
                VLLMTeacher, CompletionsTeacher) (None = no teacher).
            optimizer: the policy's AdamW, LR schedule and gradient clipping.
            loop: epochs, mini-batches, micro-batches and logging.
            routing_replay: every trainer forward of a mixture-of-experts policy (old log-probs, the update) routes each
                token to the experts the sampler chose (the rollout's ``routed_experts``), with gates from the current
                router logits over them, so the loss is the network the sampler ran and the routers still learn
                (routing replay, "R3": Ma et al. 2025, arXiv:2510.11370). The reference and the critic route themselves.
        """
        super().__init__()
        self.automatic_optimization = False
        check_model_path(policy.path, "model.policy.path")  # a mistyped path fails here, before any model loads
        if reference is not None:
            check_model_path(reference.path, "model.reference.path")
        self.policy_spec, self.reference_spec = policy, reference
        self.rollout, self.reward, self.advantage = rollout, reward, advantage
        self.surrogate, self.aggregator, self.kl, self.critic = surrogate, aggregator, kl, critic
        self.sampling, self.loss_terms = sampling, list(loss_terms or [])
        self.val_reward = val_reward if val_reward is not None else reward
        self.ptx, self.agent, self.teacher = ptx, agent, teacher
        self.optimizer_cfg, self.loop, self.routing_replay = optimizer, loop, routing_replay
        if routing_replay and "routed_experts" not in rollout.provides:
            raise ValueError(
                f"model.routing_replay: {type(rollout).__name__} does not report the sampler's routes; use HFRollout, or "
                "SGLangRollout / VLLMRollout with return_routes: true, or set model.routing_replay: false"
            )
        if routing_replay and agent is not None:
            raise ValueError(
                f"model.routing_replay with model.agent ({type(agent).__name__}): an episode's transcript carries no "
                "routes (its turns' prompts are laid out anew), so there is nothing to replay; set model.routing_replay: false"
            )
        if routing_replay and policy.gradient_checkpointing:
            raise ValueError(
                "model.routing_replay with model.policy.gradient_checkpointing: the recomputed forward would route "
                "itself, not replay; set one of them false"
            )
        self.needs = check_requirements(self)  # fails here, before any model loads, on a config that cannot run
        on_policy = loop.ppo_epochs == 1 and loop.num_mini_batches == 1
        # pi_old (pi_prox of decoupled PPO: the weights before this update) needs a forward pass of its own only when
        # something reads it before the update, or when the batch gets several optimizer steps; with one step the
        # update's own forward runs on those very weights, also on a batch sampled by older ones (asynchronous)
        self.recompute_old = not on_policy or "old_logprobs" in self.needs.before_optimize
        self.reference_is_base = reference_is_base(policy, reference, self.needs)  # LoRA: adapters off, no second model
        if self.reference_is_base and kl is not None and kl.refresh_every is not None:
            raise ValueError(
                "model.kl.init_args.refresh_every needs a reference model of its own, but with a LoRA policy and no "
                "`model.reference` the reference is the base model (adapters off); set model.reference, or refresh_every: null"
            )
        self.policy: nn.Module | None = None
        self.reference: nn.Module | None = None
        self.tokenizer = None
        self.loop_state = checkpoint.LoopState()  # random streams and optimizer step counts, checkpointed
        self.health = TrainingHealth(loop.max_nonfinite_steps, loop.degenerate_patience, loop.min_entropy)
        # the phases, built with the models (configure_model)
        self.collector: Collector | None = None
        self.trainer_forward: TrainerForward | None = None
        self.update: PolicyUpdate | None = None
        self.reporter: Reporter | None = None
        self.validator: Validator | None = None
        self.replay: Replay | None = None  # lightning-rl replay: batches from a rollout record (replay_from)
        self.recording: IterationRecorder | None = None  # record_rollouts: the RecordRollouts callback's loop side
        self.restored_step = 0  # the iteration of the checkpoint a validate run restored

    @property
    def prompt_data(self) -> PromptDataModule | None:
        """The run's data module when it is ours (its prompt lengths, validation sets' names, resumable position);
        None before a Trainer is attached or with a data module of the user's own."""
        data = self._trainer.datamodule if self._trainer is not None else None
        return data if isinstance(data, PromptDataModule) else None

    # ------------------------------------------------------------------ models
    def configure_model(self) -> None:
        """Build every model once (idempotent: Lightning may call it again, e.g. for validate), then the phases."""
        if self.policy is not None:
            return
        self.tokenizer = load_tokenizer(self.policy_spec.path)
        self._hf_zero3 = hf_zero3_config(self._trainer)  # DeepSpeed ZeRO-3: models load into partitioned parameters
        replaying = self.replay is not None  # a replay samples and scores nothing: no sampler, reward model or agent
        for slot in ROSTER:  # policy, reference, critic, rewards, teacher (lightning_rl.roster)
            if not (replaying and slot.collects):
                slot.build(self)
        if self.routing_replay:
            from lightning_rl.core.routes import replay_unsupported

            said = replay_unsupported(self.policy)
            if said:
                raise ValueError(said)
        if not replaying:
            self.rollout.setup(self.tokenizer)
        if self.agent is not None and not replaying:
            self.agent.setup(self.tokenizer, self.rollout)
            longest = self.prompt_data.longest_prompt if self.prompt_data is not None else None
            said = derived_token_limit(self.agent, self.policy.config, longest)
            if said:
                rank_zero_info(said)
        if self._device_mesh is not None:  # ModelParallelStrategy: FSDP2 over its mesh
            shard_models(self, self._trainer.strategy if self._trainer is not None else None)
        loop, kl = self.loop, self.kl
        self.collector = Collector(self.rollout, self.reward, self.agent, self.sampling, loop, self.tokenizer)
        self.trainer_forward = TrainerForward(scorers(self), loop)
        self.update = PolicyUpdate(
            self.policy,
            self.critic,
            self.surrogate,
            self.aggregator,
            kl,
            self.loss_terms,
            self.ptx,
            loop,
            self.optimizer_cfg,
            self.health,
            self.loop_state,
            {slot.name: slot.optimizer(self) for slot, _ in trained(self)},
            self.teacher.logits if "teacher_logits" in self.needs else None,
            self.routing_replay,
        )
        self.reporter = Reporter(
            loop,
            self.health,
            self.tokenizer,
            None if kl is None or not kl.active else (lambda: kl.coef),  # no curve of a KL that does nothing
            self.rollout.params.group_size,
            filters_groups=self.sampling is not None,
            shapes_reward=kl is not None and kl.placement == "reward",
            recompute_old=self.recompute_old,
            totals=self.loop_state.totals,
        )
        self.validator = Validator(self.collector, self.val_reward, loop)

    def configure_optimizers(self):
        groups = [self._param_group(slot.name, model, slot.optimizer(self)) for slot, model in trained(self)]
        params = [p for group in groups for p in group["params"]]
        # the fused kernel is one call for all parameters (~6x faster than the per-tensor loop torch picks on CPU);
        # sharded DTensor parameters (FSDP2) keep torch's default implementation
        fused = all(
            type(p) is nn.Parameter and p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params
        )
        return torch.optim.AdamW(groups, fused=fused or None)

    @staticmethod
    def _param_group(name: str, module: nn.Module, cfg: OptimizerConfig) -> dict:
        params = [p for p in module.parameters() if p.requires_grad]
        return dict(
            params=params, name=name, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas), eps=cfg.eps
        )

    @property
    def critic_pretraining(self) -> bool:
        return self.critic is not None and self.global_step < self.critic.pretrain_steps

    @property
    def temperature(self) -> float:
        """The training sampler's temperature, which the trainer's log-probs mirror."""
        return self.rollout.params.temperature or 1.0

    def replay_from(self, record: Record, reproduces: bool = True) -> None:
        """Train on ``record``'s batches instead of sampling and scoring them (``lightning-rl replay``,
        lightning_rl.loop.replay). ``reproduces``: the config trains as the recorded run did, so each iteration is
        checked against the record. Call before ``fit``."""
        self.replay = Replay(record, self.loop_state, self, reproduces)

    @property
    def truncation(self) -> Truncation | None:
        """The training sampler's top-k / top-p, which the trainer's log-probs mirror (None: it samples untruncated)."""
        return Truncation.of(self.rollout.params)

    # ------------------------------------------------------------------ the loop
    def training_step(self, dataloader_iter: Iterator) -> None:
        with self.loop_state.rng.scope(
            self.global_rank
        ):  # sampling has its own random stream: a resumed run draws the same
            self._iteration(dataloader_iter)

    def _iteration(self, dataloader_iter: Iterator) -> None:
        timer, metrics = PhaseTimer(), WeightedMeans(self.device)
        self.loop_state.trained = False
        iterations_done = self.global_step + 1  # read now: Lightning advances global_step at every optimizer step below
        max_steps = self.trainer.max_steps
        rounds_left = (
            max_steps - self.global_step if max_steps > 0 else None
        )  # the final validation waits for every round queued
        source = self.collector if self.replay is None else self.replay
        with timer("rollout"):
            batch, data = source.collect(
                lambda: next(dataloader_iter)[0], self.policy, metrics, self.device, self.global_step, rounds_left
            )
            ptx_text = self._ptx_text(data)
        if self.recording is not None:
            self.recording.collected(batch, metrics, self)
        with timer("score"):
            batch = self.trainer_forward(batch, self.temperature)
        with timer("estimate"):
            batch = estimate(batch, self.advantage, self.kl, metrics)
        if self.recording is not None:
            with timer("record"):  # the loop's share: the file is encoded and written on the writer's thread
                self.recording.trained(iterations_done, batch, source.version, self, ptx_text)
        if self.replay is not None:
            self.replay.check(batch, self)
        steps = 0
        worth = bool(batch.batch_size) and self.update.worth_optimizing(batch, self.global_step)
        metrics.add(
            "health/skipped_degenerate", torch.tensor(float(bool(batch.batch_size) and not worth), device=self.device)
        )
        if worth:
            with timer("optimize"):
                steps = self.update.run(
                    batch,
                    metrics,
                    self.optimizers(),
                    self.manual_backward,
                    self._trainer,
                    self.temperature,
                    train_policy=not self.critic_pretraining,
                    truncation=self.truncation,
                    ptx_text=ptx_text,
                )
        with timer("sync"):
            if self.kl is not None and self.kl.refresh_due(iterations_done):
                self.reference.load_state_dict(self.policy.state_dict())  # the iterative variant's new anchor
            if self.kl is not None and self.kl.target is not None:
                self.update.update_kl(batch)
            # the iteration is trained: a failure from here on (a push to a dead server) saves it, never loses it
            count_iteration(self.trainer, steps)  # global_step counts RL iterations (lightning_rl.lightning_compat)
            if self.collector.ahead is not None:
                self.collector.ahead.trained()  # an exception before here resamples this iteration's rounds after a resume
            self.loop_state.trained = True
            if steps:
                source.push(self.policy)
        self.reporter.iteration(self.trainer, batch, metrics, timer, self.optimizers().param_groups[0]["lr"], self.log)

    def _ptx_text(self, data: dict):
        """PPO-ptx: this iteration's pretraining text (ids, mask), which the data module attaches to the prompts."""
        if self.ptx is None:
            return None
        if "ptx" not in data:
            raise ValueError(
                "model.ptx (PPO-ptx) is set but data.ptx_data is not: give the data module pretraining text, or drop model.ptx"
            )
        return data["ptx"]["ids"].to(self.device), data["ptx"]["mask"].to(self.device)

    # ------------------------------------------------------------------ validation
    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Greedy accuracy on held-out prompts, pass@k / mean@n from sampled responses (lightning_rl.loop.validation)."""
        names = self.prompt_data.val_names if self.prompt_data is not None else None
        prefix = f"val/{names[dataloader_idx]}/" if names else "val/"
        self.validator.step(
            batch["prompts"], self.policy, prefix, self.log, self.global_step, self.global_rank, progress_bar=not names
        )

    def on_validation_start(self) -> None:
        if (
            self.collector.ahead is not None
        ):  # validation seeds torch's random stream for its samples: no round may sample meanwhile
            self.collector.ahead.drain()

    def on_validation_epoch_end(self) -> None:
        self.validator.epoch_end(self.trainer)

    def on_validation_end(self) -> None:
        trainer = self.trainer
        step = self.global_step if trainer.state.fn == "fit" else self.restored_step
        self.validator.end(trainer, step, self.prompt_data.val_names if self.prompt_data is not None else None)

    # ------------------------------------------------------------------ checkpoints (lightning_rl.checkpoint)
    def on_save_checkpoint(self, checkpoint_: dict[str, Any]) -> None:
        ahead = self.collector.ahead if self.collector is not None else None
        checkpoint.save(
            self,
            checkpoint_,
            self._trainer.datamodule if self._trainer is not None else None,
            ahead.untrained_position if ahead else None,
        )

    def on_load_checkpoint(self, checkpoint_: dict[str, Any]) -> None:
        if self.replay is not None:  # the reward models' state (running statistics) has no model to go to in a replay
            collects = tuple(f"{slot.name}." for slot in ROSTER if slot.collects)
            state = checkpoint_.get("state_dict") or {}
            for key in [k for k in state if k.startswith(collects)]:
                del state[key]
        checkpoint.load(self, checkpoint_)
        self.restored_step = int(
            checkpoint_.get("global_step", 0)
        )  # `validate` logs at the step of the weights it loaded

    def configure_callbacks(self) -> list:
        """lightning_rl.callbacks: each fit in its own run folder with a ``latest`` link; last.ckpt at the final / last
        completed iteration, no checkpoint of non-finite weights and teardown on failure; prompt + response lengths
        against the policy's positions; validation before and after training; the run's log file, its folder and its
        summary on the console."""
        return [
            RunFolders(),
            ResumableCheckpoints(),
            FiniteCheckpoints(),
            TeardownOnException(),
            RunLog(),
            ContextLengthCheck(),
            ValidateBeforeAndAfter(),
            RunSummary(),
        ]

    def setup(self, stage: str) -> None:
        """Before any model loads (Lightning sets the data up first): the dataset columns the rewards read, checked
        against the data (lightning_rl.loop.requirements)."""
        check_data_columns(self, self.prompt_data)

    def on_fit_start(self) -> None:
        """Asynchronous training (``loop.max_staleness`` > 0, lightning_rl.loop.ahead): the rounds sampled ahead. They start
        at the first iteration, once every strategy has restored the checkpoint's weights."""
        recorders = [c for c in self.trainer.callbacks if isinstance(c, RecordRollouts)]
        if recorders and self.replay is None:  # lightning_rl.callbacks.record; a replay records nothing again
            world = self.trainer.world_size
            self.recording = IterationRecorder(recorders[0], self.loop_state, self.global_rank, world)
        if self.loop.max_staleness > 0 and self.replay is None:
            check_asynchronous(self.rollout, self.trainer, self.agent)
            produce = lambda prompts, policy: self.collector.produce(prompts, policy, self.device)  # noqa: E731
            # several ranks stop together at an iteration's end (Lightning syncs the signal): one alone would hang them
            stopped = lambda: self.trainer.received_sigterm and self.trainer.world_size == 1  # noqa: E731
            self.collector.ahead = RolloutAhead(
                self.rollout, produce, self.loop.max_staleness, self.prompt_data, stopped
            )

    def teardown(self, stage: str) -> None:
        if self.collector is not None and self.collector.ahead is not None:
            # a round sampling ahead ends its episodes and tool calls now, not after every tool's timeout
            self.collector.ahead.close(interrupt=self.agent.cancel if self.agent is not None else None)
            self.collector.ahead = None
        if self.replay is None:  # a replay set up no sampler or agent
            self.rollout.close()
        if self.agent is not None and self.replay is None:
            self.agent.close()
        if self.teacher is not None:  # a server teacher's connections and the server it launched
            self.teacher.close()
