"""Checks shared by the SGLang rollout tests (tests/components/test_sglang_*.py)."""

from __future__ import annotations

import torch

from lightning_rl.core.logprobs import policy_logprobs


def server_logprobs_match(policy, batch, temperature):
    trainer = policy_logprobs(policy, batch, temperature)[0].detach() * batch.response_mask
    return (trainer - batch.rollout_logprobs).abs().max().item()


def check_logprobs_by_version(batch, old, new):
    """Each token's reported log-prob is the one of the weights its version names (fp32: the server's incremental decode
    and the trainer's one full forward sum in different orders; a wrong version differs by ~1e-1)."""
    under_old, _ = policy_logprobs(old.eval(), batch)
    under_new, _ = policy_logprobs(new.eval(), batch)
    mask = batch.response_mask.bool()
    for version, expected in ((1, under_old), (2, under_new)):
        tokens = mask & (batch.token_versions == version)
        torch.testing.assert_close(batch.rollout_logprobs[tokens], expected[tokens], atol=5e-5, rtol=0)
