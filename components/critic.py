"""`ValueCritic`: a transformer backbone with a scalar value head, V(s_t) for every response token.

Value at token t is read from the hidden state that predicts token t (position P - 1 + t), i.e.
the state s_t before the token is chosen, the same alignment as the policy's log-probs.
Loss (Schulman et al. 2017, eq. 9; value clipping as in OpenAI baselines):
    l_t = 1/2 max((V_t - G_t)^2, (V_old,t + clip(V_t - V_old,t, -c, c) - G_t)^2)
with G_t the value targets (``returns``) and the clipped branch only when ``value_clip`` is set.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.config import OptimizerConfig
from lightning_rl.core.contracts import Critic
from lightning_rl.core.hf_attributes import child
from lightning_rl.core.inputs import forward_accepts, image_kwargs, row_positions, sequence_inputs
from lightning_rl.core.lora import LoraSpec, apply_lora, is_lora
from lightning_rl.core.models import DTYPES, disable_dropout, load_pretrained, vision_prefixes
from lightning_rl.core.ops import masked_mean
from lightning_rl.core.packing import attention_backend, pack, packable, packed_outputs, refuse_images


class ValueCritic(Critic):
    """Trainable critic for PPO-style estimators (GAE). Built lazily in the module's ``configure_model``."""

    requires = frozenset({"returns", "values"})

    def __init__(
        self,
        init_from: Literal["policy", "reward_model", "path"] = "policy",
        path: str | None = None,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        value_clip: float | None = None,
        pretrain_steps: int = 0,
        optimizer: OptimizerConfig = OptimizerConfig(lr=1e-5),
        lora: LoraSpec | None = None,
    ):
        """
        Args:
            init_from: initialise the backbone from the policy's weights, the reward model's (its
                scalar head becomes the value head; InstructGPT), or ``path``.
            path: checkpoint for ``init_from="path"`` (a save_pretrained directory or hub id).
            dtype: parameter dtype at load time.
            value_clip: clip V - V_old to +-value_clip in the loss (None = off, the default).
            pretrain_steps: RL iterations at the start during which only the critic learns and the
                policy is left untouched (value pretraining, VC-PPO, Yuan et al. 2025, arXiv:2503.01491).
            optimizer: the critic's own AdamW settings (LR, schedule, gradient clipping).
            lora: train low-rank adapters on a frozen backbone (the value head always trains). Initialised
                from a LoRA policy in the same dtype, the backbone's frozen weights are the policy's own
                tensors (no copy); otherwise the backbone is loaded on its own.
        """
        super().__init__()
        if init_from == "path" and not path:
            raise ValueError("ValueCritic: init_from='path' needs model.critic.init_args.path")
        self.init_from, self.path, self.dtype = init_from, path, dtype
        self.value_clip, self.pretrain_steps, self.optimizer, self.lora = value_clip, pretrain_steps, optimizer, lora
        self.backbone: nn.Module | None = None
        self.head: nn.Linear | None = None

    def build(self, policy_path: str, reward_model_path: str | None = None, policy: nn.Module | None = None) -> None:
        """Load the backbone and create the head once (idempotent). ``policy``: the live policy, whose frozen
        base a LoRA critic shares when that is exact."""
        if self.backbone is not None:
            return
        if (
            self.lora is not None
            and self.init_from == "policy"
            and is_lora(policy)
            and policy.dtype == DTYPES[self.dtype]
        ):
            backbone = shared_backbone(policy)
            self.backbone = apply_lora(backbone, self.lora, "model.critic.init_args", exclude=vision_prefixes(backbone))
            self.head = nn.Linear(self.backbone.config.get_text_config().hidden_size, 1, dtype=torch.float32)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
            return
        from transformers import AutoModel, AutoModelForSequenceClassification

        source = {"policy": policy_path, "reward_model": reward_model_path, "path": self.path}[self.init_from]
        if source is None:
            raise ValueError(
                "ValueCritic: init_from='reward_model' needs a RewardModel reward (or use init_from='policy')"
            )
        kwargs = dict(dtype=DTYPES[self.dtype])
        if self.init_from == "reward_model":
            scorer = load_pretrained(
                AutoModelForSequenceClassification.from_pretrained, source, "model.critic", num_labels=1, **kwargs
            )
            self.backbone = getattr(scorer, scorer.base_model_prefix)
            head = child(scorer, "score")
            head = head if head is not None else child(scorer, "classifier")
            self.head = nn.Linear(head.in_features, 1, bias=True, dtype=torch.float32)
            with torch.no_grad():
                self.head.weight.copy_(head.weight.float()[:1])
                self.head.bias.copy_(head.bias.float()[:1] if head.bias is not None else torch.zeros(1))
        else:
            self.backbone = load_pretrained(AutoModel.from_pretrained, source, "model.critic", **kwargs)
            self.head = nn.Linear(self.backbone.config.get_text_config().hidden_size, 1, dtype=torch.float32)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
        disable_dropout(self.backbone)
        frozen = vision_prefixes(
            self.backbone
        )  # a vision-language backbone's vision tower: the value head learns from its features as they are
        for prefix in frozen:
            self.backbone.get_submodule(prefix).requires_grad_(False)
        if self.lora is not None:
            apply_lora(self.backbone, self.lora, "model.critic.init_args", exclude=frozen)

    def forward(self, batch: RolloutBatch, packed: bool = False) -> Tensor:
        """V(s_t) for every response position, fp32; ``packed``: padding-free, as one packed row. Shape: (B, R)."""
        if self.backbone is None:
            raise RuntimeError(
                "ValueCritic.build() must run before the critic is used (RLModule.configure_model does it)"
            )
        if packed:
            refuse_images(batch)
        if packed and packable(self.backbone, batch.prompt_mask, batch.response_mask):
            row = pack(
                batch.prompt_ids,
                batch.prompt_mask,
                batch.response_ids,
                batch.response_mask,
                attention_backend(self.backbone),
            )
            return row.scatter(self._values(packed_outputs(self.backbone, row, hidden=True)))  # (B, R)
        input_ids, attention_mask, position_ids = sequence_inputs(
            batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask
        )
        r = batch.response_ids.shape[1]
        if batch.image_inputs is not None:
            states = self._states_after_images(batch, input_ids, attention_mask)
        else:
            hidden = self.backbone(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).last_hidden_state
            states = hidden[:, -(r + 1) : -1]  # (B, R, H): the state before each response token
        return self._values(states) * batch.response_mask.float()

    def _values(self, states: Tensor) -> Tensor:
        """The fp32 head on fp32 states, also under bf16-mixed: autocast would run the product in bf16. Shape: (..., H) -> (...)."""
        with torch.autocast(states.device.type, enabled=False):
            return self.head(states.float()).squeeze(-1)

    def _states_after_images(self, batch: RolloutBatch, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """(B, R, H) for rows with images, as the policy reads them: the prompts with their images and their positions
        (`row_positions`), then the responses on that cache as text (a sampled image placeholder id stays a token)."""
        p = batch.prompt_ids.shape[1]
        positions = row_positions(self.backbone, input_ids, attention_mask, batch.image_inputs, p)  # (3, B, P + R)
        head = self.backbone(
            input_ids=batch.prompt_ids,
            attention_mask=batch.prompt_mask,
            position_ids=positions[..., :p],
            use_cache=True,
            **image_kwargs(batch.image_inputs, input_ids.device),
        )
        states = [head.last_hidden_state[:, -1:]]  # (B, 1, H): before response token 0
        if batch.response_ids.shape[1] > 1:
            cache = head["cache"] if "cache" in head else head.past_key_values  # transformers 5 renamed it
            rest = self.backbone(
                input_ids=batch.response_ids[:, :-1],
                attention_mask=attention_mask[:, :-1],
                position_ids=positions[..., p:-1],
                use_cache=True,
                **{"cache" if forward_accepts(self.backbone, "cache") else "past_key_values": cache},
            )
            states.append(rest.last_hidden_state)  # (B, R - 1, H)
        return torch.cat(states, dim=1)

    def loss(self, values: Tensor, batch: RolloutBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """Per-token value loss (B, R) and metrics; the module aggregates it like the policy loss."""
        batch.require(["returns", "values"], "ValueCritic.loss")
        returns, old_values = batch.returns.float(), batch.values.float()
        mask = batch.loss_mask
        loss = (values - returns).square()
        metrics = {"critic/values_mean": masked_mean(values.detach(), mask)}
        if self.value_clip is not None:
            clipped = old_values + (values - old_values).clamp(-self.value_clip, self.value_clip)
            clipped_loss = (clipped - returns).square()
            metrics["critic/clipfrac"] = masked_mean((clipped_loss > loss).float().detach(), mask)
            loss = torch.maximum(loss, clipped_loss)
        else:
            metrics["critic/clipfrac"] = torch.zeros((), device=values.device)
        return 0.5 * loss, metrics


def shared_backbone(policy: nn.Module) -> nn.Module:
    """A fresh transformer body (the policy's architecture without its LM head) whose weights and buffers are the
    LoRA policy's frozen base tensors themselves: one copy in memory, exact since neither side changes them."""
    inner = getattr(policy, policy.base_model_prefix)  # e.g. LlamaModel inside LlamaForCausalLM, adapters injected
    base_params = {n.replace(".base_layer.", "."): p for n, p in inner.named_parameters() if ".lora_" not in n}
    with torch.device("meta"):
        backbone = type(inner)(inner.config)
    backbone.load_state_dict(base_params, strict=True, assign=True)
    for name, buffer in inner.named_buffers():
        owner, _, leaf = name.rpartition(".")
        module = backbone.get_submodule(owner)
        module.register_buffer(leaf, buffer, persistent=leaf not in module._non_persistent_buffers_set)
    return disable_dropout(backbone.eval())
