"""Each Tinker loss name against the formula the Tinker documentation gives for it, in fp64 on random tensors: the
value and the gradient the service's mapping (our surrogate + `TokenSum`) computes."""

import pytest
import torch

from lightning_rl.service.errors import BadRequest
from lightning_rl.service.losses import loss_batch, loss_named, loss_of


def _tensors(seed=0, b=3, n=6):
    g = torch.Generator().manual_seed(seed)
    q = -torch.rand(b, n, generator=g) * 3
    logp = q + (torch.rand(b, n, generator=g) - 0.5) * 1.2
    adv = torch.randn(b, n, generator=g)
    valid = torch.ones(b, n, dtype=torch.long)
    valid[1, 4:] = 0  # a shorter datum: its padding counts nowhere
    return logp, q, adv, valid


def _service(name, config, logp, inputs, valid, sampled=None):
    loss, surrogate = loss_named(name, config)
    x = logp.clone().requires_grad_(True)
    value, _ = loss_of(surrogate, x, loss_batch(loss, torch.zeros_like(valid), valid, inputs, sampled))
    value.backward()
    return value.double(), x.grad.double()


def _reference(formula, logp, valid):
    x = logp.double().requires_grad_(True)
    value = (formula(x) * valid.double()).sum()
    value.backward()
    return value.detach(), x.grad


def _ratio(x, q):
    return torch.exp(x - q.double())


CASES = {
    "importance_sampling": ({}, lambda x, q, a: -_ratio(x, q) * a),
    "ppo": ({}, lambda x, q, a: -torch.minimum(_ratio(x, q) * a, _ratio(x, q).clamp(0.8, 1.2) * a)),
    "ppo ": (
        {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05},
        lambda x, q, a: -torch.minimum(_ratio(x, q) * a, _ratio(x, q).clamp(0.9, 1.05) * a),
    ),
    "cispo": ({}, lambda x, q, a: -_ratio(x, q).clamp(0.8, 1.2).detach() * x * a),
    "dro": ({"beta": 0.2}, lambda x, q, a: -(x * a - 0.1 * (x - q.double()) ** 2)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_loss_is_its_documented_formula(name):
    config, formula = CASES[name]
    logp, q, adv, valid = _tensors(hash(name) % 100)
    inputs = {"logprobs": q, "advantages": adv}
    value, grad = _service(name.strip(), config, logp, inputs, valid)
    ref_value, ref_grad = _reference(lambda x: formula(x, q, adv.double()), logp, valid)
    torch.testing.assert_close(value, ref_value, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)


def test_cross_entropy_is_the_weighted_negative_log_likelihood():
    logp, _, _, valid = _tensors(5)
    weights = (torch.rand(logp.shape) > 0.4).float()
    value, grad = _service("cross_entropy", {}, logp, {"weights": weights}, valid)
    ref_value, ref_grad = _reference(lambda x: -weights.double() * x, logp, valid)
    torch.testing.assert_close(value, ref_value, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad)
    value, _ = _service("cross_entropy", {}, logp, {}, valid)  # no weights: every position weighs 1
    torch.testing.assert_close(value, -(logp.double() * valid).sum(), rtol=1e-6, atol=1e-6)


def test_gspo_clips_the_sequence_ratio_over_its_mask():
    logp, q, adv, valid = _tensors(6)
    logp = q + (logp - q) * 1e-3  # log-ratios of ~1e-4: inside and outside GSPO's narrow range
    mask = torch.zeros_like(logp)
    mask[:, 2:] = 1.0
    value, grad = _service("gspo", {}, logp, {"logprobs": q, "advantages": adv, "sequence_ratio_mask": mask}, valid)
    m = mask.double() * valid.double()

    def formula(x):
        s = torch.exp(((x - q.double()) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True))  # (B, 1)
        a = adv.double()
        return -torch.minimum(s * a, s.clamp(1 - 3e-4, 1 + 4e-4) * a) * mask.double()

    ref_value, ref_grad = _reference(formula, logp, valid)
    torch.testing.assert_close(value, ref_value, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-6)


def test_stable_reinforce_covers_the_sampled_positions_only():
    logp, q, adv, valid = _tensors(7)
    sampled = torch.zeros_like(valid)
    sampled[:, 3:] = 1
    adv = adv * sampled
    value, grad = _service("stable_reinforce", {}, logp, {"logprobs": q, "advantages": adv}, valid, sampled)
    assert bool((grad[:, :3] == 0).all())
    m = (sampled * valid).double()
    a = adv.double()
    mean = (a * m).sum() / m.sum()
    std = (((a - mean) ** 2 * m).sum() / m.sum()).sqrt()
    keep = ((a - mean).abs() <= 3 * std).double()

    def formula(x):
        r = torch.exp((x - q.double()).clamp(-2, 2))
        return -keep * torch.minimum(r * a, r.clamp(0.8, 1.2) * a) * sampled.double()

    ref_value, ref_grad = _reference(formula, logp, valid)
    torch.testing.assert_close(value, ref_value, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name, config, field",
    [
        ("ppo", {"beta": 0.1}, "loss_fn_config.beta"),
        ("dro", {"beta": -1.0}, "loss_fn_config.beta"),
        ("ppo", {"clip_low_threshold": 1.1}, "loss_fn_config.clip_low_threshold"),
        ("cispo", {"clip_high_threshold": "x"}, "loss_fn_config.clip_high_threshold"),
        ("custom", {}, "loss_fn"),
        ("reinforce", {}, "loss_fn"),
    ],
)
def test_a_bad_loss_or_config_names_its_field(name, config, field):
    with pytest.raises(BadRequest) as err:
        loss_named(name, config)
    assert err.value.field == field and err.value.status == 400
