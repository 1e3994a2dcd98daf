"""The sampler's in-place KV cache and its inverse-CDF draw: the same values as transformers' cache, the same
distribution as ``torch.multinomial``."""

import bisect

import pytest
import torch

import components.rollout.hf as hf
from components.rollout import HFRollout
from components.rollout.hf import inverse_cdf_draw
from tests.helpers import prompts

cache_utils = pytest.importorskip("transformers.cache_utils")
if not hasattr(cache_utils, "DynamicLayer"):
    pytest.skip("transformers 4 keeps its cache as lists: the sampler leaves it as it is", allow_module_level=True)

from components.rollout.kv_cache import GrowingLayer, grow_in_place  # noqa: E402


def _kv(b, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, n, 4, generator=g), torch.randn(b, 2, n, 4, generator=g)


def _same(a, b):
    assert a.get_seq_length() == b.get_seq_length()
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_growing_layer_holds_what_a_dynamic_layer_holds_through_every_cache_operation():
    plain, grown = cache_utils.DynamicLayer(), None
    plain.update(*_kv(3, 5, 0))
    grown = GrowingLayer.of(plain, capacity=7)  # room for two more: the third step grows the buffer
    _same(plain, grown)
    for step in range(1, 4):
        out_plain, out_grown = plain.update(*_kv(3, 1, step)), grown.update(*_kv(3, 1, step))
        assert all(torch.equal(x, y) for x, y in zip(out_plain, out_grown))
        _same(plain, grown)
    assert grown._keys.shape[-2] == 14  # doubled once, past its 7 positions
    for name, arg in (("batch_repeat_interleave", 2), ("reorder_cache", torch.tensor([5, 0, 2])),
                      ("batch_select_indices", torch.tensor([2, 1])), ("crop", -2)):  # fmt: skip
        getattr(plain, name)(arg)
        getattr(grown, name)(arg)
        _same(plain, grown)
    plain.update(*_kv(2, 3, 9)), grown.update(*_kv(2, 3, 9))  # written after the crop: over the dropped positions
    _same(plain, grown)
    with pytest.raises(ValueError, match="negative"):
        grown.crop(1)


def test_grow_in_place_swaps_only_plain_dynamic_layers():
    class Sliding(cache_utils.DynamicLayer):
        pass

    cache = cache_utils.Cache(layers=[cache_utils.DynamicLayer(), Sliding()])
    cache.layers[0].update(*_kv(1, 2, 0))
    grow_in_place(cache, capacity=10)
    assert type(cache.layers[0]) is GrowingLayer and type(cache.layers[1]) is Sliding
    assert cache.layers[0]._keys.shape[-2] == 10 and cache.layers[0].get_seq_length() == 2
    assert torch.equal(cache.layers[0].keys, cache_utils.DynamicLayer().update(*_kv(1, 2, 0))[0])
    plain = [[torch.zeros(1)]]  # not a transformers cache (transformers 4's lists): left as it is
    grow_in_place(plain, capacity=10)
    assert plain == [[torch.zeros(1)]]


def test_inverse_cdf_draw_takes_the_first_token_whose_cumulative_probability_passes_the_uniform():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 1.0, 0.0], [0.25, 0.25, 0.25, 0.25], [2.0, 0.0, 0.0, 2.0]])
    torch.manual_seed(7)
    got = inverse_cdf_draw(probs)
    torch.manual_seed(7)
    u = torch.rand(4, 1, dtype=torch.float64)[:, 0].tolist()  # the numbers the draw consumed
    for row, value, token in zip(probs.tolist(), u, got.tolist()):
        cdf = [sum(row[: i + 1]) for i in range(len(row))]
        assert token == bisect.bisect_right(cdf, value * cdf[-1])  # unnormalised rows: u scales by the total
        assert row[token] > 0
    assert got[1] == 2  # a point mass


def test_inverse_cdf_draw_has_the_rows_distribution():
    """200k draws from one row of 6 probabilities: each frequency within 5 standard errors of its probability."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    torch.manual_seed(0)
    n = 200_000
    counts = torch.bincount(inverse_cdf_draw(p.expand(n, 6)), minlength=6).double()
    freq = counts / n
    stderr = (p.double() * (1 - p.double()) / n).sqrt()
    assert bool(((freq - p.double()).abs() <= 5 * stderr + 1e-12).all()), freq
    assert counts[5] == 0


def test_the_sampler_with_inverse_cdf_draws_what_generate_draws_with_the_same_rule(
    tiny_model_path, tokenizer, monkeypatch
):
    """HFRollout(draw='inverse_cdf') against transformers' generate whose torch.multinomial is replaced by the same
    rule: the same tokens for one seed, so the loop (cache repeat, temperature, top-k, the in-place cache) is
    generate's; with the default draw the tokens differ from it for that seed (other random numbers)."""
    from lightning_rl.core.models import ModelSpec, load_causal_lm

    monkeypatch.setattr(hf, "IN_PLACE_FROM", 1)  # 6 tokens: on the in-place cache too
    model = load_causal_lm(ModelSpec(path=tiny_model_path))
    enc = tokenizer(["12+3=", "7+70=", "1+1="], return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    fast = HFRollout(group_size=4, max_new_tokens=6, temperature=1.4, top_k=5, draw="inverse_cdf")
    fast.setup(tokenizer)
    torch.manual_seed(11)
    got = fast.generate(prompts(ids, mask), model).response_ids
    default = HFRollout(group_size=4, max_new_tokens=6, temperature=1.4, top_k=5)
    default.setup(tokenizer)
    torch.manual_seed(11)
    assert not torch.equal(default.generate(prompts(ids, mask), model).response_ids, got)

    monkeypatch.setattr(torch, "multinomial", lambda probs, num_samples: inverse_cdf_draw(probs)[:, None])
    torch.manual_seed(11)
    expected = model.generate(
        input_ids=ids.repeat_interleave(4, 0), attention_mask=mask.repeat_interleave(4, 0), do_sample=True, temperature=1.4,
        top_k=5, top_p=1.0, max_new_tokens=6, eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
    )[:, ids.shape[1] :]  # fmt: skip
    width = got.shape[1]
    expected = torch.nn.functional.pad(expected, (0, width - expected.shape[1]), value=tokenizer.pad_token_id)
    assert torch.equal(got, expected)


def test_the_in_place_cache_samples_what_concatenation_samples_while_finished_rows_leave(
    tiny_model_path, tokenizer, monkeypatch
):
    """40 tokens at temperature 1.5 (ragged lengths: finished rows leave the cache, which reorders its buffers): the
    same tokens and sampler log-probs on the in-place cache as on transformers' concatenating one."""
    from lightning_rl.core.models import ModelSpec, load_causal_lm

    model = load_causal_lm(ModelSpec(path=tiny_model_path))
    enc = tokenizer(["12+3=", "7+70=", "1+1="], return_tensors="pt", padding=True)
    grown = []
    real = hf.grow_in_place
    monkeypatch.setattr(hf, "grow_in_place", lambda cache, capacity: grown.append(capacity) or real(cache, capacity))
    results = []
    for threshold in (1, 10_000):
        monkeypatch.setattr(hf, "IN_PLACE_FROM", threshold)
        rollout = HFRollout(group_size=6, max_new_tokens=40, temperature=1.5, return_logprobs=True)
        rollout.setup(tokenizer)
        torch.manual_seed(0)
        results.append(rollout.generate(prompts(enc["input_ids"], enc["attention_mask"]), model))
    assert grown == [enc["input_ids"].shape[1] + 40]  # the first run only
    (in_place, concatenated) = results
    lengths = in_place.response_lengths
    assert lengths.max() >= 4 * lengths.min()  # ragged: rows left the cache
    assert torch.equal(in_place.response_ids, concatenated.response_ids)
    torch.testing.assert_close(in_place.rollout_logprobs, concatenated.rollout_logprobs, rtol=0, atol=0)


def test_an_unknown_draw_is_one_line_naming_the_choices():
    with pytest.raises(ValueError, match="HFRollout draw 'gumbel': use multinomial or inverse_cdf"):
        HFRollout(draw="gumbel")
