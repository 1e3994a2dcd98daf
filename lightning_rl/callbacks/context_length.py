"""`ContextLengthCheck`: prompt + response lengths against the policy's positions, once the policy is built and the
data module is known (`check_context_length`)."""

from __future__ import annotations

import warnings

from lightning import Callback

from lightning_rl.core.models import context_length
from lightning_rl.core.packing import NO_PACKING_WITH_IMAGES
from lightning_rl.data.prompts import PromptDataModule


def check_context_length(
    policy_config,
    longest_prompt: int | None,
    max_prompt_length: int | None,
    max_new_tokens: int | None,
    key: str = "model.rollout.init_args.max_new_tokens",
) -> None:
    """Warn when the longest prompt plus a full response is longer than the positions the policy was built for.
    ``key`` names the setting that bounds a response (an agent's: ``model.agent.init_args.max_total_tokens``)."""
    limit = context_length(policy_config)
    if limit is None or longest_prompt is None or max_new_tokens is None or longest_prompt + max_new_tokens <= limit:
        return
    warnings.warn(
        f"the longest prompt ({longest_prompt} tokens; data.max_prompt_length={max_prompt_length}) + "
        f"{key} ({max_new_tokens}) = {longest_prompt + max_new_tokens} exceeds the policy's "
        f"max_position_embeddings ({limit}): long responses would run past the positions the model knows (errors or "
        f"garbage). Lower data.max_prompt_length (with data.overlong_prompt: truncate or drop) or {key.rsplit('.', 1)[-1]} so they fit."
    )


class ContextLengthCheck(Callback):
    """`check_context_length` once the policy is built and the data module is known; and token-budget packing refused
    for data with images before the first iteration (the trainer would refuse it at its first packed forward)."""

    def on_fit_start(self, trainer, pl_module) -> None:
        data, agent = trainer.datamodule, pl_module.agent  # pl_module: the RLModule that adds this callback
        ours = isinstance(data, PromptDataModule)  # a data module of the user's own: its prompts' lengths are unknown
        if ours and data.image_columns and pl_module.loop.max_tokens_per_micro_batch is not None:
            raise ValueError(NO_PACKING_WITH_IMAGES)
        check_context_length(
            pl_module.policy.config,
            data.longest_prompt if ours else None,
            data.hparams.get("max_prompt_length") if ours else None,
            *(
                (agent.max_total_tokens, "model.agent.init_args.max_total_tokens")  # None: fits by construction
                if agent is not None
                else (pl_module.rollout.params.max_new_tokens,)
            ),
        )
