"""Top-k / top-p in the trainer's log-probs (#46 item 7): renormalised over the tokens the sampler kept, by vLLM's
rule (transformers' warpers agree), ties included; hand-computed values, transformers' warpers, an independent fp64
re-derivation and its gradient."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation import TopKLogitsWarper, TopPLogitsWarper

from components.rollout.server.settings import Servers
from lightning_rl.core.logprobs import sampled_logprobs
from lightning_rl.core.sampling_params import SamplingParams
from lightning_rl.core.truncation import Truncation


def _logprobs(probs, targets, truncation, temperature=1.0):
    z = torch.tensor([probs] * len(targets)).log() * temperature  # (c, V): softmax(z / T) = probs
    return sampled_logprobs(z, torch.tensor(targets), temperature, truncation=truncation).tolist()


def test_hand_computed_top_p_top_k_and_the_sampled_token_just_outside():
    probs = [0.5, 0.25, 0.15, 0.1]
    # top-p 0.7: ascending 0.1, 0.15, 0.25, 0.5 sum to 0.1, 0.25, 0.5, 1.0; those <= 0.3 go: kept {0.5, 0.25}, mass 0.75
    got = _logprobs(probs, [0, 1, 2], Truncation(top_p=0.7), temperature=0.6)
    # token 2 is outside the kept set (trainer's and sampler's logits differ): its own weight joins the normaliser
    expected = [math.log(0.5 / 0.75), math.log(0.25 / 0.75), math.log(0.15 / 0.9)]
    assert got == pytest.approx(expected, abs=1e-6)
    assert _logprobs(probs, [0, 1], Truncation(top_k=2)) == pytest.approx(expected[:2], abs=1e-6)
    # top-k 3 first (mass 0.9: 5/9, 5/18, 1/6), then top-p 0.8 on it: 1/6 <= 0.2 goes, 1/6 + 5/18 = 4/9 stays
    assert _logprobs(probs, [0, 1], Truncation(top_k=3, top_p=0.8)) == pytest.approx(expected[:2], abs=1e-6)
    assert _logprobs(probs, [3], Truncation()) == pytest.approx([math.log(0.1)], abs=1e-6)  # off: plain log_softmax


def test_ties_are_kept_by_top_k_and_counted_by_position_at_the_top_p_boundary():
    z = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    # top-k 2: the 2nd largest is 1.0, and both tokens at 1.0 stay: mass e^2 + 2e
    got = sampled_logprobs(z, torch.tensor([0]), truncation=Truncation(top_k=2))
    assert got.item() == pytest.approx(2 - math.log(math.e**2 + 2 * math.e), abs=1e-6)
    # top-p 0.5 on 0.4, 0.2, 0.2, 0.2: ascending sums 0.2, 0.4, 0.6, 1.0, the first two go (<= 0.5): one of the three
    # tied tokens stays (which one is the sort's), mass 0.6; a sampled tied token is the one that stayed
    z = torch.tensor([[0.4, 0.2, 0.2, 0.2]]).log().expand(4, 4).clone().requires_grad_(True)
    got = sampled_logprobs(z, torch.tensor([0, 1, 2, 3]), truncation=Truncation(top_p=0.5))
    assert got.tolist() == pytest.approx([math.log(0.4 / 0.6)] + [math.log(0.2 / 0.6)] * 3, abs=1e-6)
    # the gradient: one of the tie's three is kept, its share of the mass (1/3) spread over the three; a sampled tied
    # token is the kept one, so the other two get none
    got[:2].sum().backward()
    assert z.grad[0].tolist() == pytest.approx([1 - 2 / 3, -1 / 9, -1 / 9, -1 / 9], abs=1e-6)
    assert z.grad[1].tolist() == pytest.approx([-2 / 3, 1 - 1 / 3, 0.0, 0.0], abs=1e-6)


def test_the_kept_set_is_transformers_warpers_top_k_then_top_p():
    """HFRollout samples through these warpers; vLLM's apply_top_k_top_p_pytorch is the same rule (and its real
    processed log-probs are checked in benchmarks/truncated_logprobs.py)."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(64, 300, generator=gen) * 3  # (c, V) tempered logits
    for top_k, top_p in ((5, 1.0), (0, 0.9), (0, 0.3), (40, 0.95), (300, 0.5)):
        warped = z.clone()
        if top_k:
            warped = TopKLogitsWarper(top_k)(None, warped)
        if top_p < 1:
            warped = TopPLogitsWarper(top_p)(None, warped)
        targets = torch.multinomial(warped.softmax(-1), 1, generator=gen).squeeze(1)  # (c,): drawn as the sampler does
        expected = warped.log_softmax(-1).gather(-1, targets[:, None]).squeeze(1)
        got = sampled_logprobs(z, targets, truncation=Truncation(top_k, top_p), chunk_rows=7)
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=0, msg=str((top_k, top_p)))


def _fp64_reference(z: torch.Tensor, target: int, top_k: int, top_p: float) -> float:
    """One row's log-prob in fp64, by the definition read from the top: the top-k tokens by value (ties at the k-th
    kept), then, most likely first, each token while the mass before it is < p of what top-k kept (vLLM's "ascending
    cumulative mass > 1 - p"), then the sampled token."""
    kept = _kept_sets(z[None], torch.tensor([target]), top_k, top_p)[0]
    values = z.double()
    return float(values[target] - values[kept].logsumexp(0))


def test_an_fp64_rederivation_in_value_and_the_gradient_over_the_kept_tokens():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(24, 50, generator=gen, dtype=torch.float64) * 2
    targets = torch.randint(0, 50, (24,), generator=gen)  # some outside the kept set
    for top_k, top_p, t in ((0, 0.9, 0.7), (6, 1.0, 1.3), (10, 0.8, 1.0)):
        truncation = Truncation(top_k, top_p)
        x = logits.float().requires_grad_(True)
        got = sampled_logprobs(x, targets, t, chunk_rows=5, truncation=truncation)
        expected = [_fp64_reference(logits[i] / t, int(targets[i]), top_k, top_p) for i in range(24)]
        assert got.tolist() == pytest.approx(expected, abs=2e-6)
        # gradient: that of the fp64 log-softmax over the kept set (held fixed), times 1/T
        weights = torch.randn(24, generator=gen, dtype=torch.float64)
        (got * weights.float()).sum().backward()
        y = (logits / t).requires_grad_(True)
        kept = _kept_sets(logits / t, targets, top_k, top_p)
        ref = (y.gather(1, targets[:, None]).squeeze(1) - y.masked_fill(~kept, -math.inf).logsumexp(1)) * weights
        (grad,) = torch.autograd.grad(ref.sum(), y)
        torch.testing.assert_close(x.grad.double(), grad / t, atol=2e-6, rtol=0)
        assert (x.grad[~kept] == 0).all()  # dropped tokens get no gradient


def _kept_sets(z: torch.Tensor, targets: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """(c, V) bool, row by row in fp64 Python floats."""
    kept = torch.zeros(z.shape, dtype=torch.bool)
    for i in range(z.shape[0]):
        values = z[i].tolist()
        order = sorted(range(len(values)), key=lambda j: -values[j])
        if top_k:
            order = [j for j in order if values[j] >= values[order[top_k - 1]]]
        total, before = sum(math.exp(values[j]) for j in order), 0.0
        for j in order:
            if kept[i].any() and before >= top_p * total:
                break
            kept[i, j] = True
            before += math.exp(values[j])
        kept[i, targets[i]] = True
    return kept


def test_which_samplers_truncate():
    assert Truncation.of(SamplingParams(temperature=1.0)) is None
    assert Truncation.of(SamplingParams(temperature=0.7, top_p=0.9)) == Truncation(0, 0.9)
    assert Truncation.of(SamplingParams(temperature=0.7, top_k=20)) == Truncation(20, 1.0)
    assert Truncation.of(SamplingParams(temperature=0.0, top_p=0.9)) is None  # greedy: the argmax, untruncated
    assert Truncation.of(SamplingParams(temperature=0.7, top_p=0.9, greedy=True)) is None


def test_only_a_sampler_reporting_untruncated_logprobs_is_warned_about():
    """The trainer mirrors top-k / top-p now: HFRollout with top_p is no longer warned about (it was, for every
    sampler); SGLang, which reports log-probs before the truncation, is, since TIS/MIS would read log(kept mass)."""
    import warnings

    from components.rollout import HFRollout
    from components.rollout.sglang import SGLangRollout
    from lightning_rl.loop.module import RLModule

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*top_p.*")
        module = RLModule(rollout=HFRollout(temperature=0.8, top_p=0.9, return_logprobs=True))
    assert module.truncation == Truncation(0, 0.9)
    assert RLModule(rollout=HFRollout(temperature=0.8)).truncation is None
    with pytest.warns(UserWarning, match="reports its log-probs before the truncation"):
        RLModule(rollout=SGLangRollout(temperature=0.8, top_k=20, servers=Servers(urls=("http://127.0.0.1:9",))))


VLLM_RULE = """
import json, sys, torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
z = torch.load(sys.argv[1])
out = {}
for top_k, top_p in ((3, 1.0), (0, 0.9), (0, 0.5), (20, 0.95)):
    k = torch.full((z.shape[0],), top_k) if top_k else None
    p = torch.full((z.shape[0],), top_p) if top_p < 1 else None
    logprobs = apply_top_k_top_p_pytorch(z.clone(), k, p, allow_cpu_sync=True).log_softmax(-1)
    targets = torch.multinomial(logprobs.exp(), 1, generator=torch.Generator().manual_seed(0)).squeeze(1)
    out[f"{top_k},{top_p}"] = [targets.tolist(), logprobs.gather(-1, targets[:, None]).squeeze(1).tolist()]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_vllms_own_rule_on_logits_full_of_ties(tmp_path):
    """vLLM 0.32's apply_top_k_top_p_pytorch (its CPU path), run in its environment, on logits in steps of 1/4 (ties
    at most boundaries): the log-probs it renormalises equal the trainer's."""
    import json
    import subprocess

    from tests.fixtures.vllm_server import unavailable

    if unavailable() is not None:
        pytest.skip(f"no vLLM environment: {unavailable()}")
    from components.rollout.vllm.environment import vllm_python

    z = (torch.randn(48, 64, generator=torch.Generator().manual_seed(2)) * 8).round() / 4  # (c, V): ties
    torch.save(z, tmp_path / "z.pt")
    done = subprocess.run([vllm_python(), "-c", VLLM_RULE, str(tmp_path / "z.pt")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    for key, (targets, expected) in json.loads(done.stdout.strip().splitlines()[-1]).items():
        top_k, top_p = key.split(",")
        got = sampled_logprobs(z, torch.tensor(targets), truncation=Truncation(int(top_k), float(top_p)))
        torch.testing.assert_close(got, torch.tensor(expected), atol=1e-6, rtol=0, msg=key)


def test_reported_kept_sets_in_value_and_gradient_for_the_policy_only(tiny_model_path):
    """The kept sets a sampler reported (``sampling_support``, vLLM's sampling_mask) replace the rule for the policy's
    log-probs, packed or not, in value and gradient; the reference (no truncation passed) takes the whole vocabulary."""
    from lightning_rl.core.batch import RolloutBatch
    from lightning_rl.core.logprobs import policy_logprobs, response_logits
    from lightning_rl.core.models import ModelSpec, load_causal_lm

    model = load_causal_lm(ModelSpec(path=tiny_model_path))
    gen = torch.Generator().manual_seed(4)
    prompt, response = torch.tensor([[5, 6, 7], [5, 6, 7]]), torch.tensor([[8, 9, 1], [9, 8, 0]])
    support = torch.randint(0, model.config.vocab_size, (2, 3, 6), generator=gen)
    support[..., 4:] = -1
    support[1, 2] = -1  # padding: reports nothing
    batch = RolloutBatch(
        prompt_ids=prompt, prompt_mask=torch.ones_like(prompt), response_ids=response,
        response_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]), sampling_support=support,
    )  # fmt: skip
    truncation = Truncation(top_k=3)
    logits = response_logits(model, prompt, batch.prompt_mask, response, batch.response_mask).detach()  # (2, 3, V)
    y = logits.double().requires_grad_(True)
    z = y / 0.8
    keep = torch.zeros(z.shape, dtype=torch.bool)
    for b in range(2):
        for t in range(3):
            listed = [int(i) for i in support[b, t] if i >= 0]
            kept = listed if listed else z[b, t].topk(3).indices.tolist()  # none reported: the rule (top-k 3)
            keep[b, t, kept + [int(response[b, t])]] = True
    expected = z.gather(-1, response[..., None]).squeeze(-1) - z.masked_fill(~keep, -math.inf).logsumexp(-1)
    m = batch.response_mask.bool()
    with torch.no_grad():
        for packed in (False, True):
            got, _ = policy_logprobs(model, batch, 0.8, packed=packed, truncation=truncation)
            torch.testing.assert_close(got[m].double(), expected[m].detach(), atol=2e-6, rtol=0)
        reference, _ = policy_logprobs(model, batch, 0.8)  # no truncation: the reference's whole vocabulary
        plain = z.gather(-1, response[..., None]).squeeze(-1) - z.logsumexp(-1)
        torch.testing.assert_close(reference[m].double(), plain[m], atol=2e-6, rtol=0)
    # the gradient: that of the fp64 log-softmax over the kept sets, zero on every other token
    x = logits.clone().requires_grad_(True)
    (sampled_logprobs(x, response, 0.8, truncation=truncation, support=support) * m).sum().backward()
    (dy,) = torch.autograd.grad((expected * m).sum(), y)
    torch.testing.assert_close(x.grad.double(), dy, atol=2e-6, rtol=0)
    assert (x.grad[~keep] == 0).all()
