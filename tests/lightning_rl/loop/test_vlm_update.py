"""Vision-language policies in the update: every surrogate and aggregator path on a VLM batch, the vision tower frozen
unless asked (full fine-tuning and LoRA), the reference as LoRA-off base, and the critic's values on image rows."""

from __future__ import annotations

import pytest
import torch

from components.aggregator import SeqMeanTokenMean, SeqMeanTokenSum, TokenMean, TokenSumNorm
from components.surrogate import (
    CISPO,
    ClippedSurrogate,
    CovariancePG,
    DecoupledClip,
    OffPolicyCorrection,
    PolicyGradient,
)
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.lora import LoraSpec, adapters_disabled, is_lora
from lightning_rl.core.models import ModelSpec, load_causal_lm
from tests.support.vlm import sample

SURROGATES = {
    "clipped": ClippedSurrogate(),
    "clipped_dual_sequence": ClippedSurrogate(dual_clip=3.0, level="sequence"),
    "clipped_tis": ClippedSurrogate(correction=OffPolicyCorrection("tis")),
    "clipped_mis_sequence": ClippedSurrogate(correction=OffPolicyCorrection("mis", lower=0.5, level="sequence")),
    "cispo": CISPO(correction=OffPolicyCorrection("reject", lower=0.5)),
    "clip_cov": CovariancePG(mode="clip_cov"),
    "kl_cov": CovariancePG(mode="kl_cov"),
    "decoupled": DecoupledClip(),
    "policy_gradient": PolicyGradient(),
}
AGGREGATORS = {
    "token_mean": TokenMean(),
    "seq_mean_token_mean": SeqMeanTokenMean(),
    "seq_mean_token_sum": SeqMeanTokenSum(),
    "token_sum_norm": TokenSumNorm(8),
}


@pytest.fixture(scope="module")
def scored(tiny_vlm_path):
    """A sampled VLM batch (images, left padding, groups of 3) with old log-probs off the current policy, advantages."""
    policy, batch = sample(tiny_vlm_path, group_size=3, seed=1)
    with torch.no_grad():
        old = policy_logprobs(policy, batch)[0] + 0.05 * torch.randn(batch.response_ids.shape) * batch.response_mask
    advantages = torch.randn(batch.batch_size, 1) * batch.response_mask
    return batch.replace(old_logprobs=old, advantages=advantages, sample_mask=torch.ones(batch.batch_size))


@pytest.mark.parametrize("aggregator", list(AGGREGATORS))
@pytest.mark.parametrize("surrogate", list(SURROGATES))
def test_every_surrogate_and_aggregator_trains_the_language_model_on_a_vlm_batch(
    surrogate, aggregator, scored, tiny_vlm_path
):
    policy = load_causal_lm(ModelSpec(path=tiny_vlm_path))
    policy.train()
    micro = scored.split(5)[0]  # a micro-batch: part of the groups, its rows' images only
    logprobs, _ = policy_logprobs(policy, micro, 1.0)
    per_token, _ = SURROGATES[surrogate](logprobs, micro)
    loss = AGGREGATORS[aggregator](per_token, micro.loss_mask, AGGREGATORS[aggregator].denominator(scored.loss_mask))
    loss.backward()
    assert torch.isfinite(loss)
    grads = {n: p.grad for n, p in policy.named_parameters()}
    assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if ".language_model." in n)
    assert all(
        grads[n] is None for n in grads if n.startswith("model.visual.")
    )  # frozen: no gradient, no optimizer state


def test_the_vision_tower_trains_only_when_asked(tiny_vlm_path):
    frozen = load_causal_lm(ModelSpec(path=tiny_vlm_path))
    trained = load_causal_lm(ModelSpec(path=tiny_vlm_path, train_vision=True))
    assert not any(p.requires_grad for n, p in frozen.named_parameters() if n.startswith("model.visual."))
    assert all(p.requires_grad for n, p in frozen.named_parameters() if not n.startswith("model.visual."))
    assert all(p.requires_grad for p in trained.parameters())


@pytest.mark.parametrize("train_vision", [False, True])
def test_lora_adapters_sit_on_the_language_model_unless_the_vision_tower_is_asked_for(tiny_vlm_path, train_vision):
    spec = ModelSpec(path=tiny_vlm_path, lora=LoraSpec(rank=4, target_modules="all-linear"), train_vision=train_vision)
    policy = load_causal_lm(spec)
    adapted = {n.split(".lora_A")[0] for n, _ in policy.named_parameters() if ".lora_A." in n}
    assert is_lora(policy) and any(".language_model." in n for n in adapted)
    assert any(n.startswith("model.visual.") for n in adapted) == train_vision
    assert all(".lora_" in n for n, p in policy.named_parameters() if p.requires_grad)


def test_lora_reference_is_the_base_and_the_critic_reads_the_images(tiny_vlm_path, scored):
    from components.critic import ValueCritic

    policy = load_causal_lm(ModelSpec(path=tiny_vlm_path, lora=LoraSpec(rank=4)))
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.add_(0.1)
        plain = load_causal_lm(ModelSpec(path=tiny_vlm_path))
        with adapters_disabled(policy) as reference:
            torch.testing.assert_close(
                policy_logprobs(reference, scored)[0], policy_logprobs(plain, scored)[0], atol=1e-5, rtol=0
            )
        assert (policy_logprobs(policy, scored)[0] - policy_logprobs(plain, scored)[0]).abs().max() > 1e-3
    for lora in (None, LoraSpec(rank=4)):  # its own backbone, or the LoRA policy's frozen base shared
        critic = ValueCritic(lora=lora)
        critic.build(tiny_vlm_path, policy=policy)
        assert not any(p.requires_grad for n, p in critic.backbone.named_parameters() if n.startswith("visual."))
        torch.nn.init.normal_(critic.head.weight)
        values = critic(scored)
        assert values.shape == scored.response_ids.shape and torch.isfinite(values).all()
        # the values read the pictures: another prompt's images (same token ids) give other values
        swapped = scored.replace(
            image_inputs=scored.image_inputs[3:6] + scored.image_inputs[:3] + scored.image_inputs[6:]
        )
        first = scored.response_mask[:3].float()
        assert ((critic(swapped)[:3] - values[:3]).abs() * first).max() > 1e-4
