"""`Truncation`: the sampler's top-k / top-p rule, mirrored in the trainer's log-probs.

A sampler that truncates draws from softmax(z / T) restricted to the tokens the rule keeps and renormalised over
them, so the policy that sampled is log pi(y) = z_y / T - logsumexp over the kept tokens of z / T, not the full
log_softmax. vLLM (``--logprobs-mode processed_logprobs``) reports that value; the trainer takes its ratio, KL and
TIS/MIS corrections under the same distribution only if it applies the same rule.

The rule is vLLM 0.32's (``vllm/v1/sample/ops/topk_topp_sampler.py``, ``apply_top_k_top_p_pytorch``: its CPU path)
and transformers' `TopKLogitsWarper` then `TopPLogitsWarper` (`HFRollout`), which agree, on the tempered fp32 logits:

* top-k (k > 0): keep every token whose value is at least the k-th largest; ties with it are all kept, so more
  than k tokens may stay;
* top-p (p < 1), on what top-k left: sort ascending, softmax, cumulative sum; drop the tokens whose cumulative
  mass is <= 1 - p, and never the largest. A tie straddling that boundary is cut by sort position: the count of
  kept tokens is the rule's, and since tied tokens weigh the same, so is the kept mass, whichever of them it kept
  (the gradient spreads that mass evenly over the tie: which tied token the sampler kept is not known).

The sampled token is always in the kept set (the sampler drew it): where the trainer's logits put it just outside
(the engines' logits differ in the last bits) its own weight joins the normaliser instead of giving -inf.

Departures: SGLang truncates by position for top-k (exactly k tokens, ties cut) and keeps a token at exactly p
mass; it reports log-probs before truncation, so nothing is renormalised there to compare with (see the server
rollout docs). min-p is not mirrored (no rollout here sends it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Truncation:
    """A sampler's top-k / top-p settings: ``top_k`` 0 and ``top_p`` 1.0 are off."""

    top_k: int = 0
    top_p: float = 1.0

    @classmethod
    def of(cls, params) -> "Truncation | None":
        """The truncation a rollout's `SamplingParams` sample with; None where there is none (greedy included:
        a greedy sampler takes the argmax, which every rule keeps, and reports untruncated log-probs)."""
        if params is None or params.sampling_temperature == 0 or (params.top_k == 0 and params.top_p >= 1.0):
            return None
        return cls(int(params.top_k), float(params.top_p))

    def kept_logsumexp(self, z: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """logsumexp of ``z`` over the kept tokens, the sampled one included, and the smallest kept value.
        Shapes: (c, V) fp32 tempered logits, (c,) -> (c,), (c,)."""
        v = z.shape[-1]
        z_sorted = z.sort(dim=-1).values  # (c, V) ascending, as vLLM and transformers sort
        if 0 < self.top_k < v:
            kth = z_sorted[:, v - self.top_k, None]  # (c, 1): the k-th largest
            z_sorted = z_sorted.masked_fill(z_sorted < kth, float("-inf"))
        if self.top_p < 1.0:
            cumulative = z_sorted.softmax(dim=-1).cumsum(dim=-1)  # (c, V)
            dropped = cumulative <= 1 - self.top_p
            dropped[:, -1] = False  # at least one: the largest
            z_sorted = z_sorted.masked_fill(dropped, float("-inf"))
        floor = z_sorted.masked_fill(z_sorted == float("-inf"), float("inf")).min(dim=-1).values  # (c,)
        lse = torch.logsumexp(z_sorted, dim=-1)  # (c,)
        picked = z.gather(-1, targets[:, None]).squeeze(-1)  # (c,)
        outside = picked < floor  # the trainer's logits put the sampled token just outside the kept set
        return torch.where(outside, torch.logaddexp(lse, picked), lse), floor

    @staticmethod
    def kept_probs(z: Tensor, targets: Tensor, floor: Tensor, lse: Tensor) -> Tensor:
        """softmax over the kept tokens, for the gradient: exp(z - lse) above ``floor`` and for the sampled token; the
        tokens tied at the floor share the rest of the mass evenly (the rule kept a count of them, not which: the
        gradient of that count's mass, spread over the tie). Shapes: (c, V), (c,), (c,), (c,) -> (c, V)."""
        picked = torch.zeros_like(z, dtype=torch.bool).scatter_(-1, targets[:, None], True)
        strict = (z > floor[:, None]) | picked
        probs = torch.exp(z - lse[:, None]).masked_fill(~strict, 0.0)  # (c, V)
        tied = (z == floor[:, None]) & ~picked
        rest = (1 - probs.sum(-1)).clamp_min(0) / tied.sum(-1).clamp_min(1)  # (c,)
        return probs + tied * rest[:, None]


def reported_kept(support: Tensor, targets: Tensor, vocab: int) -> tuple[Tensor, Tensor]:
    """The kept sets a sampler reported (vLLM's ``sampling_mask``: the token ids top-k / top-p / min-p left samplable
    at each position), the sampled token included, and which rows report one. Shapes: (c, K) long, -1 padded; (c,)
    -> (c, V) bool, (c,) bool. A row of -1 reports none (the rule, or the whole vocabulary, stands there)."""
    listed = support >= 0  # (c, K)
    keep = torch.zeros(support.shape[0], vocab + 1, dtype=torch.bool, device=support.device)
    keep.scatter_(-1, torch.where(listed, support, vocab), True)  # padding lands in the extra column
    keep = keep[:, :vocab].scatter(-1, targets[:, None], True)
    return keep, listed.any(-1)


def kept_normaliser(
    z: Tensor, targets: Tensor, truncation: Truncation | None, support: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """logsumexp of ``z`` over the tokens the sampler kept: those it reported (``support``, where it did), else those
    ``truncation`` keeps, else all; and the rule's smallest kept value (None without a rule).
    Shapes: (c, V), (c,), (c, K) or None -> (c,), (c,) or None."""
    if truncation is None:
        lse, floor = torch.logsumexp(z, dim=-1), None
    else:
        lse, floor = truncation.kept_logsumexp(z, targets)
    if support is not None:
        keep, reported = reported_kept(support, targets, z.shape[-1])
        lse = torch.where(reported, torch.logsumexp(z.masked_fill(~keep, float("-inf")), dim=-1), lse)
    return lse, floor


def kept_softmax(
    z: Tensor, targets: Tensor, truncation: Truncation | None, support: Tensor | None, floor: Tensor | None, lse: Tensor
) -> Tensor:
    """The distribution `kept_normaliser` normalised (its ``floor`` and ``lse``), for the gradient: zero off the kept
    tokens. Shapes: (c, V), (c,), (c, K) or None, (c,) or None, (c,) -> (c, V)."""
    probs = torch.softmax(z, dim=-1) if truncation is None else Truncation.kept_probs(z, targets, floor, lse)
    if support is not None:
        keep, reported = reported_kept(support, targets, z.shape[-1])
        probs = torch.where(reported[:, None], torch.exp(z - lse[:, None]).masked_fill(~keep, 0.0), probs)
    return probs
