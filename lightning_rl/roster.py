"""The roster: every model an `RLModule` holds, each declared once as a `Slot`.

    slot        built by                          trains  checkpoint                        LoRA root         FSDP2 unit            export    trainer forward
    policy      load_causal_lm(model.policy)      yes     stored (LoRA: adapters only)      policy.           the LM                policy/   old_logprobs, when recomputed
    reference   load_causal_lm(model.reference)   no      reloaded (stored when refreshed)  -                 the LM                -         ref_logprobs
    critic      ValueCritic.build                 yes     stored (LoRA: adapters, head)     critic.backbone.  the backbone's blocks critic/   values
    reward      Reward.setup                      no      reloaded                          -                 a RewardModel's body  -         -  (scores during collect)
    val_reward  Reward.setup, when not ``reward`` no      reloaded                          -                 a RewardModel's body  -         -
    teacher     Teacher.setup                     no      reloaded                          -                 the LM, in process    -         teacher_logprobs (+ top-k)

The rewards score during the collect phase only: a replay of recorded rollouts (lightning_rl.loop.replay) builds neither.
A server teacher (components.teacher.ServerTeacher) holds no model here: its servers score, and it has no FSDP2 unit.
"Reloaded": checkpoints leave the model's frozen weights out and it is built again from its path; a LoRA model's
frozen base is reloaded the same way and checked against a fingerprint. Checkpointing (lightning_rl.checkpoint), FSDP2
sharding (lightning_rl.loop.sharding), the optimizer's parameter groups (DDP, FSDP2 and DeepSpeed alike: one optimizer,
one group per trained slot), ``--dry_run`` (lightning_rl.cli.dry_run), ``lightning-rl export`` (lightning_rl.export)
and the trainer forward (lightning_rl.loop.forward) iterate over ``ROSTER``: another model is one more `Slot` and its
component. Slots are built, sharded and scored in roster order.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Container, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from components.reward.model import RewardModel, scalar_head
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.config import LoopConfig, OptimizerConfig
from lightning_rl.core.contracts import Critic, KLPenalty, Reward, Teacher
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.lora import LoraSpec, adapters_disabled, is_lora
from lightning_rl.core.models import ModelSpec, freeze, load_causal_lm
from lightning_rl.core.truncation import Truncation


@runtime_checkable
class Run(Protocol):
    """What the roster reads of a run, and the models it builds on it: the run context every `Slot` callable receives
    (an `RLModule` is one). Components are known by their contracts."""

    policy_spec: ModelSpec
    reference_spec: ModelSpec | None
    optimizer_cfg: OptimizerConfig
    loop: LoopConfig
    needs: Container[str]
    """Every `RolloutBatch` field some component reads."""
    reference_is_base: bool
    """A LoRA policy's reference is its base model (adapters off): no second model."""
    recompute_old: bool
    """pi_old is recomputed before the update (several optimizer steps per batch, or read before the optimize phase)."""
    routing_replay: bool
    truncation: Truncation | None
    tokenizer: Any
    policy: nn.Module | None
    reference: nn.Module | None
    critic: Critic | None
    reward: Reward
    val_reward: Reward
    teacher: Teacher | None
    kl: KLPenalty | None


Scorer = Callable[[RolloutBatch, float, bool], dict[str, Tensor]]
"""One trainer forward over a micro-batch: (chunk, sampling temperature, packed) -> {RolloutBatch field: (b, r, ...)}."""
ShardUnit = tuple[nn.Module, "nn.Module | None"]
"""(model, the module whose transformer blocks are sharded first; None = the model's own)."""


@dataclass(frozen=True)
class LoraRoot:
    """Where a slot's LoRA adapters sit, read from the module: the model carrying them, its settings and its base."""

    prefix: str
    """The adapted model's state-dict prefix in an `RLModule` checkpoint."""
    key: str
    """The config key of its LoRA settings (errors name it)."""
    model: Callable[[Run], nn.Module | None]
    spec: Callable[[Run], LoraSpec | None]
    base_path: Callable[[Run], str | None]
    """The base model's path, as errors about another base name it."""


@dataclass(frozen=True)
class Slot:
    """One model of an `RLModule`: how it is built, trained, checkpointed, sharded, exported and scored. Each
    callable takes the run (`Run`: the module, typed by what the roster reads of it)."""

    name: str
    """The module's attribute, the state-dict prefix (``name.``), the checkpoint's ``hf_export`` entry, export's folder."""
    key: str
    """Its config key."""
    build: Callable[[Run], None]
    """Build the model on the module (in ``configure_model``, once the tokenizer exists)."""
    trains: bool = False
    """Its trainable parameters are a parameter group of the one optimizer (named ``name``)."""
    reloaded: Callable[[Run], bool] = lambda m: True
    """Checkpoints leave its frozen weights out; it is built again from its path (False: checkpoints store it)."""
    optimizer: Callable[[Run], OptimizerConfig] | None = None
    """A trained slot's AdamW settings."""
    lora: LoraRoot | None = None
    shard: Callable[[Run], list[ShardUnit]] = lambda m: []
    """The units FSDP2 shards (a frozen model's too: it saves memory; its forward all-gathers like the policy's)."""
    export_info: Callable[[Run], dict | None] | None = None
    """What ``lightning-rl export`` rebuilds the model from (checkpoint entry ``hf_export[name]``); None = not exported."""
    export_as: str | None = None
    """How ``lightning-rl export`` writes it (a kind of lightning_rl.export: ``causal_lm``, ``value_model``)."""
    scorer: Callable[[Run], Scorer | None] = lambda m: None
    """The trainer forward's pass with this model over a micro-batch, or None when the run needs none."""
    note: Callable[[Run], str | None] = lambda m: None
    """What ``--dry_run`` says of the slot besides its parameter count (e.g. a reference without a model of its own)."""
    collects: bool = False
    """It serves the collect phase only (it scores responses): a replay from recorded rollouts builds none."""

    def model(self, module: Run) -> Any:
        """The object the module holds in this slot (a model or a component), or None."""
        return getattr(module, self.name, None)


# ---------------------------------------------------------------------------------------------- policy


def _build_policy(m: Run) -> None:
    m.policy = load_causal_lm(m.policy_spec)


def policy_export_info(policy, spec) -> dict[str, Any]:
    """The ``hf_export["policy"]`` entry of a causal LM loaded from ``spec`` (a `ModelSpec`): what
    `lightning-rl export` rebuilds ``policy/`` from (any module whose state holds it under ``policy.``)."""
    info = {"config": policy.config.to_dict(), "tokenizer": spec.path, **dataclasses.asdict(spec)}
    if is_lora(policy):
        info["base_fingerprint"] = policy.lora_base_fingerprint
    return info


def _policy_scorer(m: Run) -> Scorer | None:
    if not m.recompute_old:  # on policy and nothing reads pi_old before the update: the optimize phase takes it
        return None
    rows = m.loop.logprob_chunk_rows
    return lambda chunk, t, packed: {
        "old_logprobs": policy_logprobs(
            m.policy, chunk, t, chunk_rows=rows, packed=packed, truncation=m.truncation, replay_routes=m.routing_replay
        )[0]
    }


POLICY = Slot(
    "policy",
    "model.policy",
    _build_policy,
    trains=True,
    reloaded=lambda m: False,
    optimizer=lambda m: m.optimizer_cfg,
    lora=LoraRoot("policy.", "model.policy.lora", lambda m: m.policy, lambda m: m.policy_spec.lora, lambda m: m.policy_spec.path),
    shard=lambda m: [(m.policy, None)],
    export_info=lambda m: policy_export_info(m.policy, m.policy_spec),
    export_as="causal_lm",
    scorer=_policy_scorer,
)  # fmt: skip


# ---------------------------------------------------------------------------------------------- reference


def _build_reference(m: Run) -> None:
    if "ref_logprobs" in m.needs and not m.reference_is_base:
        m.reference = freeze(load_causal_lm(m.reference_spec or m.policy_spec, "model.reference"))


def reference_model(m: Run):
    """Context giving the model that scores ``ref_logprobs``: the loaded reference, or the LoRA policy with adapters off."""
    return nullcontext(m.reference) if m.reference is not None else adapters_disabled(m.policy)


def _reference_scorer(m: Run) -> Scorer | None:
    if m.reference is None and not m.reference_is_base:
        return None
    rows = m.loop.logprob_chunk_rows

    def score(chunk: RolloutBatch, t: float, packed: bool) -> dict[str, Tensor]:
        with reference_model(m) as reference:
            return {"ref_logprobs": policy_logprobs(reference, chunk, t, chunk_rows=rows, packed=packed)[0]}

    return score


REFERENCE = Slot(
    "reference",
    "model.reference",
    _build_reference,
    # a reference refreshed during training (kl.refresh_every) is state: checkpoints store it
    reloaded=lambda m: m.kl is None or m.kl.refresh_every is None,
    shard=lambda m: [(m.reference, None)] if m.reference is not None else [],
    scorer=_reference_scorer,
    note=lambda m: (
        "the policy with its LoRA adapters off (no second model)"
        if m.reference is None and m.reference_is_base
        else None
    ),
)


# ---------------------------------------------------------------------------------------------- critic


def _build_critic(m: Run) -> None:
    if m.critic is not None:
        m.critic.build(m.policy_spec.path, m.reward.model_path, policy=m.policy)


def _critic_base(m: Run) -> str | None:
    critic = m.critic
    return None if critic is None else (critic.path if critic.init_from == "path" else critic.init_from)


def _critic_export_info(m: Run) -> dict | None:
    critic = m.critic
    if critic is None or critic.backbone is None:
        return None
    info = {"config": critic.backbone.config.to_dict()}
    if is_lora(critic.backbone):
        reward_path = m.reward.model_path
        info.update(
            init_from=critic.init_from, path=critic.path, dtype=critic.dtype, lora=dataclasses.asdict(critic.lora)
        )
        info.update(reward_path=reward_path, base_fingerprint=critic.backbone.lora_base_fingerprint)
    return info


CRITIC = Slot(
    "critic",
    "model.critic",
    _build_critic,
    trains=True,
    reloaded=lambda m: False,
    optimizer=lambda m: m.critic.optimizer,
    lora=LoraRoot(
        "critic.backbone.", "model.critic.init_args.lora", lambda m: m.critic.backbone if m.critic is not None else None,
        lambda m: m.critic.lora if m.critic is not None else None, _critic_base,
    ),
    shard=lambda m: [(m.critic, m.critic.backbone)] if m.critic is not None else [],
    export_info=_critic_export_info,
    export_as="value_model",
    scorer=lambda m: None if m.critic is None else (lambda chunk, t, packed: {"values": m.critic(chunk, packed=packed).float()}),
)  # fmt: skip


# ---------------------------------------------------------------------------------------------- rewards


def _reward_units(reward) -> list[ShardUnit]:
    # a RewardModel calls the backbone and the scalar head itself, not the classifier's forward: the backbone is the
    # unit to shard (its root hooks gather the embeddings); the one-row head stays replicated. It may sit inside
    # rewards that wrap others (Composite, Shaped, MissingEOSPenalty), which hold it as a submodule.
    found = reward.modules() if isinstance(reward, nn.Module) else ()
    return [(scalar_head(r.model)[0], None) for r in found if isinstance(r, RewardModel) and r.model is not None]


REWARD = Slot(
    "reward",
    "model.reward",
    lambda m: m.reward.setup(m.tokenizer),
    shard=lambda m: _reward_units(m.reward),
    collects=True,
)
VAL_REWARD = Slot(
    "val_reward",
    "model.val_reward",
    # the same object as ``reward`` unless configured: set up (and sharded) once
    lambda m: m.val_reward.setup(m.tokenizer) if m.val_reward is not m.reward else None,
    shard=lambda m: _reward_units(m.val_reward) if m.val_reward is not m.reward else [],
    collects=True,
)


# ---------------------------------------------------------------------------------------------- teacher


def _teacher_scorer(m: Run) -> Scorer | None:
    if m.teacher is None:
        return None
    return lambda chunk, t, packed: {k: v for k, v in m.teacher.score(chunk)._asdict().items() if v is not None}


TEACHER = Slot(
    "teacher",
    "model.teacher",
    lambda m: m.teacher.setup(m.tokenizer) if m.teacher is not None else None,
    shard=lambda m: (
        [(m.teacher.shard_unit, None)] if m.teacher is not None and m.teacher.shard_unit is not None else []
    ),
    scorer=_teacher_scorer,
    note=lambda m: m.teacher.describe() if m.teacher is not None else None,
)


ROSTER: tuple[Slot, ...] = (POLICY, REFERENCE, CRITIC, REWARD, VAL_REWARD, TEACHER)


def trained(module: Run) -> list[tuple[Slot, nn.Module]]:
    """(slot, model) of every trained slot the module holds, in roster order (the optimizer's parameter groups)."""
    return [(slot, slot.model(module)) for slot in ROSTER if slot.trains and slot.model(module) is not None]


def training_modes(module: Run) -> Tensor:
    """(M,) bool: the training flag of every submodule of the trained models, in roster order (dropout in the update
    depends on them, and a sampler that switches the policy to eval mode and back changes them)."""
    return torch.tensor([m.training for _, model in trained(module) for m in model.modules()], dtype=torch.bool)


def set_training_modes(module: Run, modes: Tensor) -> None:
    """Set what `training_modes` returned (on a module holding the same models)."""
    submodules = [m for _, model in trained(module) for m in model.modules()]
    if len(submodules) != len(modes):
        raise ValueError(f"{len(modes)} training flags for {len(submodules)} submodules of the trained models")
    for submodule, mode in zip(submodules, modes.tolist()):
        submodule.training = mode


def scorers(module: Run) -> list[Scorer]:
    """The trainer forward's passes this run needs, in roster order."""
    return [scorer for slot in ROSTER if (scorer := slot.scorer(module)) is not None]
