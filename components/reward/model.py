"""`RewardModel`: a frozen learned reward, the fourth model of PPO-RLHF.

The prompt and response ids of the `RolloutBatch` are scored as they are (the reward model must
share the policy's tokenizer: checked at setup when its directory has one). The input is the
left-padded prompt followed by the right-padded response, position ids from the attention mask,
and the score is read at the last attention-mask position, i.e. the response's last valid token
(its EOS when it has one). transformers' sequence classifiers pool at the rightmost token that is
not ``pad_token_id``, which is the wrong token when pad == EOS; this reads the position itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import Reward
from lightning_rl.core.hf_attributes import child
from lightning_rl.core.inputs import mask_positions, sequence_inputs
from lightning_rl.core.models import DTYPES, disable_dropout, load_pretrained

from .shaping import ScoreNormalizer

TINY_REWARD_MODEL_PATH = str(Path(__file__).resolve().parents[2] / "lightning_rl" / "assets" / "tiny-arith-rm")
"""Reward model for the built-in arithmetic task (scripts/make_reward_model.py writes it)."""


def scalar_head(scorer: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """(backbone, per-token scalar head) of a transformers decoder sequence classifier."""
    head = child(scorer, "score")
    if not isinstance(head, nn.Linear) or head.out_features != 1:
        raise ValueError(
            f"{type(scorer).__name__} has no per-token scalar `score` head (num_labels=1); use a decoder sequence classifier "
            "(Llama, Qwen2, Mistral, Gemma, ...) saved with num_labels=1"
        )
    return getattr(scorer, scorer.base_model_prefix), head


def last_token_scores(
    scorer: nn.Module, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None = None
) -> Tensor:
    """Scalar score at each row's last attention-mask position, fp32. Shapes: (B, S), (B, S) -> (B,).

    Position ids default to the attention mask's running count, so left padding does not shift them.
    """
    backbone, head = scalar_head(scorer)
    if position_ids is None:
        position_ids = mask_positions(attention_mask)
    hidden = backbone(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    last = (positions * attention_mask.long()).argmax(-1)  # (B,)
    states = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, H)
    return head(states).squeeze(-1).float()


class RewardModel(ScoreNormalizer, Reward):
    """r(x, y): a learned scalar reward read at the last valid token (InstructGPT, Ouyang et al. 2022,
    arXiv:2203.02155), then optionally normalised and clipped: static (r - mean) / std, or running
    statistics (the identity until the scores seen have a spread), then clamp to [-clip, clip]
    (`components.reward.shaping`, which applies to any reward; validation reports the raw score).

    Frozen: no gradients, no optimizer state, the transformer always in eval mode. Like batch norm,
    the running statistics update only while the module is in train mode (not during validation);
    they are buffers (``running_count``, ``running_mean``, ``running_m2``).
    """

    requires = frozenset({"prompt_ids", "prompt_mask"})

    def __init__(
        self,
        path: str = TINY_REWARD_MODEL_PATH,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        batch_size: int = 32,
        normalize: Literal["none", "static", "running"] = "none",
        mean: float = 0.0,
        std: float = 1.0,
        clip: float | None = None,
        trust_remote_code: bool = False,
    ):
        """
        Args:
            path: a save_pretrained sequence classifier with num_labels=1 (``python -m
                lightning_rl.recipes.reward_model fit`` makes one); the default is the built-in task's.
            dtype: parameter dtype at load time (a frozen model can be bfloat16: 2 bytes/parameter).
            batch_size: sequences per no-grad forward pass.
            normalize: none, static (``mean``, ``std``) or running statistics.
            mean: static normalisation: subtracted from every score.
            std: static normalisation: every score is divided by it.
            clip: clamp the (normalised) score to [-clip, clip]; None = no clipping.
            trust_remote_code: passed to transformers when loading.
        """
        super().__init__(normalize, mean, std, clip)
        if batch_size < 1:
            raise ValueError(f"RewardModel: need batch_size >= 1, got {batch_size}")
        self.path, self.dtype, self.batch_size = path, dtype, batch_size
        self.trust_remote_code = trust_remote_code
        self.model: nn.Module | None = None

    @property
    def model_path(self) -> str:
        return self.path

    def setup(self, tokenizer) -> None:
        """Load the frozen classifier once (the module calls this in ``configure_model``)."""
        if self.model is not None:
            return
        from transformers import AutoModelForSequenceClassification

        what = "model.reward.init_args.path"
        if self.path == TINY_REWARD_MODEL_PATH and not os.path.isdir(self.path):
            raise FileNotFoundError(
                f"{what}: the built-in task's reward model is not built yet; run python scripts/make_reward_model.py (writes {self.path})"
            )
        model, info = load_pretrained(
            AutoModelForSequenceClassification.from_pretrained, self.path, what,
            num_labels=1, dtype=DTYPES[self.dtype], trust_remote_code=self.trust_remote_code, output_loading_info=True,
        )  # fmt: skip
        _, head = scalar_head(model)
        head_keys = {name for name, p in model.named_parameters() if any(p is q for q in head.parameters())}
        if head_keys & set(info.get("missing_keys", ())):
            raise ValueError(
                f"{what}: '{self.path}' has no trained scalar head (it looks like a plain causal LM); train a reward model "
                "first: python -m lightning_rl.recipes.reward_model fit --config configs/reward_model.yaml (or scripts/make_reward_model.py)"
            )
        self._check_tokenizer(tokenizer, what)
        self.model = disable_dropout(model).requires_grad_(False).eval()

    def _check_tokenizer(self, tokenizer, what: str) -> None:
        path = os.path.expanduser(self.path)
        if tokenizer is None or not os.path.isdir(path) or not any(f.startswith("tokenizer") for f in os.listdir(path)):
            return
        from transformers import AutoTokenizer

        if AutoTokenizer.from_pretrained(path).get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"{what}: the reward model's tokenizer differs from the policy's; it scores the policy's token ids as they are"
            )

    def train(self, mode: bool = True) -> "RewardModel":
        """Train mode only lets running statistics update; the transformer stays in eval mode."""
        self.training = mode
        if self.model is not None:
            self.model.eval()
        return self

    @torch.no_grad()
    def forward(self, batch: RolloutBatch) -> Tensor:
        """Scores of prompt + response. Shape: (B,) float32 on the batch's device."""
        if self.model is None:
            raise RuntimeError(
                "RewardModel.setup(tokenizer) must run before scoring (RLModule.configure_model does it)"
            )
        batch.require(self.requires, "RewardModel")
        device = batch.response_ids.device
        if next(self.model.parameters()).device != device:
            self.to(device)
        parts = []
        for chunk in batch.split(self.batch_size):
            input_ids, attention_mask, position_ids = sequence_inputs(
                chunk.prompt_ids, chunk.prompt_mask, chunk.response_ids, chunk.response_mask
            )
            parts.append(last_token_scores(self.model, input_ids, attention_mask, position_ids))
        return self.normalized(torch.cat(parts))
