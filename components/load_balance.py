"""`LoadBalancingLoss`: the auxiliary loss that keeps a mixture-of-experts policy's routers spreading tokens over their
experts (Switch Transformer, Fedus et al. 2021, arXiv:2101.03961, eqs. 4-6; with top-k routing as Qwen-MoE, Mixtral
and OLMoE train with it). Over the tokens T that count, for each router (layer) l of L, expert i of E, k experts per
token and router logits z_lt:

    f_li = 1 / (k |T|) sum_t 1[i in top_k(z_lt)]        the fraction of the layer's assignments expert i receives
    P_li = 1 / |T| sum_t softmax(z_lt)_i                the router's mean probability for expert i
    L_aux = alpha * 1/L sum_l E sum_i f_li P_li         1 * alpha when routing is uniform, up to E * alpha

f has no gradient (a top-k count); the gradient moves each router's probabilities away from the experts it
overloads. As a per-token term (the loss-term contract) token t carries alpha E/L sum_l sum_i f_li softmax(z_lt)_i,
whose mean over T is L_aux: with ``TokenMean`` (the presets') the aggregated term is exactly L_aux of each
micro-batch, weighted by its tokens.

Departures: Switch routes to one expert (k = 1, where this is its loss exactly); with k experts f is normalised by
k so the balanced value stays 1 (as Megatron-LM's; transformers' ``load_balancing_loss_func`` leaves f summing to k,
so its value is k times this one, and it pools the layers' counts instead of averaging each layer's loss). The tokens
are those the loss counts (the response tokens, at the positions whose outputs predict them), not the prompt's, and
f is taken over one micro-batch on one rank, not over the global batch (Qiu et al. 2025, arXiv:2501.11873, argue
for the latter at scale).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.contracts import LossTerm
from lightning_rl.core.forward_outputs import PolicyForward
from lightning_rl.core.moe import chosen_experts


class LoadBalancingLoss(LossTerm):
    """alpha * E * sum_i f_i P_i per router, averaged over routers: the Switch Transformer's load-balancing loss
    (Fedus et al. 2021, arXiv:2101.03961, eq. 4), with top-k routing. Reads the policy's router logits."""

    reads = frozenset({"router_logits"})

    def __init__(self, coef: float = 0.001, top_k: int | None = None):
        """
        Args:
            coef: alpha (Qwen3-MoE's router_aux_loss_coef: 0.001; Switch Transformer: 0.01).
            top_k: the experts each token is routed to (None: the policy's config, num_experts_per_tok).
        """
        if coef < 0:
            raise ValueError(f"LoadBalancingLoss: coef must be >= 0, got {coef}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"LoadBalancingLoss: top_k must be >= 1 (or null), got {top_k}")
        self.coef, self.top_k = coef, top_k

    def __call__(self, forward: PolicyForward, batch: RolloutBatch) -> Tensor:
        """Shape: (B, R)."""
        router = forward.router_logits
        if router is None:
            raise ValueError(
                "LoadBalancingLoss reads the router logits of a mixture-of-experts policy; this forward has none"
            )
        logits = router.logits  # (B, R, L, E) or (N, L, E)
        k = self.top_k or router.top_k
        experts = logits.shape[-1]
        mask = router.align(batch.loss_mask).float()  # (B, R) or (N,)
        counted = mask[..., None, None]
        tokens = mask.sum().clamp_min(1.0)
        fraction = (chosen_experts(logits, k) * counted).reshape(-1, *logits.shape[-2:]).sum(0) / (k * tokens)  # (L, E)
        probs = torch.softmax(logits.float(), dim=-1)  # (..., L, E)
        per_token = experts * (probs * fraction).sum(-1).mean(-1)  # (B, R) or (N,)
        return self.coef * router.scatter(per_token)
