"""`PretrainMix`: PPO-ptx, a pretraining language-modelling loss mixed into the policy loss (InstructGPT)."""

from __future__ import annotations

from torch import Tensor, nn

from lightning_rl.core.contracts import PretrainLoss
from lightning_rl.core.inputs import mask_positions
from lightning_rl.core.logprobs import sampled_logprobs
from lightning_rl.core.ops import masked_mean


class PretrainMix(PretrainLoss):
    """PPO-ptx (Ouyang et al. 2022, arXiv:2203.02155, eq. 2): the RL objective plus gamma times the
    log-likelihood of pretraining text, so the policy keeps its language modelling ("alignment tax"):

        loss = policy_loss + gamma * NLL,   NLL = -1/N sum_{x in D_pretrain} sum_t log pi_theta(x_t | x_<t)

    N counts the text's predicted tokens (a token mean). The text comes from ``data.ptx_data``, one batch of
    ``data.ptx_batch_size`` rows per iteration, reused by every optimizer step of that iteration. The
    log-probs are untempered (pretraining likelihood, not the sampler's distribution).
    """

    def __init__(self, coef: float = 1.0):
        """
        Args:
            coef: gamma, the weight of the pretraining NLL (InstructGPT: 27.8 with their loss scales; start near 0.1-1).
        """
        if coef < 0:
            raise ValueError(f"PretrainMix: coef (gamma) must be >= 0, got {coef}")
        self.coef = coef

    def loss(self, policy: nn.Module, text_ids: Tensor, text_mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """gamma * token-mean NLL of left-padded text (N, L) under the policy, and the detached NLL."""
        logits = policy(
            input_ids=text_ids, attention_mask=text_mask, position_ids=mask_positions(text_mask), use_cache=False
        ).logits
        logprobs = sampled_logprobs(logits[:, :-1], text_ids[:, 1:])  # (N, L - 1): token t predicted from its prefix
        predicted = (text_mask[:, :-1] * text_mask[:, 1:]).float()  # both the context token and the target are text
        nll = -masked_mean(logprobs.float(), predicted)
        return self.coef * nll, {"ptx/nll": nll.detach()}
