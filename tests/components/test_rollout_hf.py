from dataclasses import replace

import torch

from components.rollout import HFRollout, response_mask_from_eos
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.models import ModelSpec, load_causal_lm
from tests.helpers import prompts


def test_mask_stops_after_the_first_eos_and_flags_truncation():
    ids = torch.tensor([[5, 1, 1, 0], [5, 6, 7, 8], [1, 0, 0, 0], [5, 9, 1, 1]])
    mask, truncated = response_mask_from_eos(ids, [1])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]]
    assert truncated.tolist() == [False, True, False, False]
    mask, truncated = response_mask_from_eos(ids, [1, 7])  # an extra stop token
    assert mask[1].tolist() == [1, 1, 1, 0] and not truncated[1]


def _setup(tiny_model_path, tokenizer, **kwargs):
    model = load_causal_lm(ModelSpec(path=tiny_model_path))
    rollout = HFRollout(**kwargs)
    rollout.setup(tokenizer)
    enc = tokenizer(["12+3=", "7+70=", "1+1="], return_tensors="pt", padding=True)
    return model, rollout, enc["input_ids"], enc["attention_mask"]


def test_ignore_eos_runs_every_response_to_the_cap_on_the_same_draws(tiny_model_path, tokenizer):
    """With ``ignore_eos`` an EOS is one more sampled token: every response is ``max_new_tokens`` long and counts in
    full, and up to its first EOS it is the response the default sampler draws for the same seed."""
    model, rollout, ids, mask = _setup(tiny_model_path, tokenizer, group_size=4, max_new_tokens=12, temperature=1.5)
    torch.manual_seed(0)
    stopped = rollout.generate(prompts(ids, mask), model)
    model, ignoring, ids, mask = _setup(
        tiny_model_path, tokenizer, group_size=4, max_new_tokens=12, temperature=1.5, ignore_eos=True
    )
    torch.manual_seed(0)
    full = ignoring.generate(prompts(ids, mask), model)
    assert full.response_ids.shape == (12, 12) and full.response_mask.all() and full.truncated.all()
    eos = tokenizer.eos_token_id
    assert bool((full.response_ids[:, :-1] == eos).any())  # an EOS sampled inside a response, and sampling went on
    lengths = stopped.response_lengths
    assert lengths.min() < 12  # the default sampler ended some responses at their EOS
    for row, n in enumerate(lengths.tolist()):
        assert full.response_ids[row, :n].tolist() == stopped.response_ids[row, :n].tolist()


def test_groups_are_contiguous_and_masks_consistent(tiny_model_path, tokenizer):
    torch.manual_seed(0)
    model, rollout, ids, mask = _setup(tiny_model_path, tokenizer, group_size=4, max_new_tokens=5, temperature=2.0)
    batch = rollout.generate(prompts(ids, mask), model)
    assert batch.batch_size == 12 and batch.response_ids.shape[1] <= 5
    assert batch.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert torch.equal(batch.prompt_ids[4:8], ids[1:2].expand(4, -1))
    recomputed, truncated = response_mask_from_eos(batch.response_ids, [tokenizer.eos_token_id])
    assert torch.equal(batch.response_mask, recomputed) and torch.equal(batch.truncated, truncated)
    lengths = batch.response_lengths
    assert bool(((lengths == 5) | ~batch.truncated).all())  # a truncated response used the whole budget
    assert batch.truncated.any() and (~batch.truncated).any()  # this seed gives both kinds


def test_greedy_is_one_deterministic_argmax_response_per_prompt(tiny_model_path, tokenizer):
    model, rollout, ids, mask = _setup(tiny_model_path, tokenizer, group_size=4, max_new_tokens=4)
    a = rollout.generate(prompts(ids, mask), model, replace(rollout.params, greedy=True))
    b = rollout.generate(prompts(ids, mask), model, replace(rollout.params, greedy=True))
    assert a.batch_size == 3 and torch.equal(a.response_ids, b.response_ids)
    with torch.no_grad():
        first = (
            model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0))
            .logits[:, -1]
            .argmax(-1)
        )
    assert torch.equal(a.response_ids[:, 0], first)


def test_greedy_baseline_rows_close_each_group(tiny_model_path, tokenizer):
    torch.manual_seed(0)
    model, rollout, ids, mask = _setup(
        tiny_model_path, tokenizer, group_size=3, max_new_tokens=4, temperature=1.5, greedy_baseline=True
    )
    batch = rollout.generate(prompts(ids, mask), model)
    assert batch.batch_size == 12
    assert batch.is_greedy.tolist() == [False, False, False, True] * 3
    assert batch.sample_mask.tolist() == [1.0, 1.0, 1.0, 0.0] * 3
    greedy = rollout.generate(prompts(ids, mask), model, replace(rollout.params, greedy=True))
    width = greedy.response_ids.shape[1]
    assert torch.equal(
        batch.response_ids[3::4, :width] * batch.response_mask[3::4, :width], greedy.response_ids * greedy.response_mask
    )


def test_sampler_logprobs_equal_the_trainers_with_the_temperature_mirrored(tiny_model_path, tokenizer):
    torch.manual_seed(0)
    model, rollout, ids, mask = _setup(
        tiny_model_path, tokenizer, group_size=2, max_new_tokens=5, temperature=0.7, return_logprobs=True
    )
    batch = rollout.generate(prompts(ids, mask), model)
    with torch.no_grad():
        trainer, _ = policy_logprobs(model, batch, temperature=0.7)
        untempered, _ = policy_logprobs(model, batch, temperature=1.0)
    m = batch.response_mask.bool()
    torch.testing.assert_close(trainer[m], batch.rollout_logprobs[m], atol=1e-5, rtol=1e-5)
    assert (untempered[m] - batch.rollout_logprobs[m]).abs().max() > 1e-3


def test_shared_prompt_prefill_samples_what_plain_generate_samples(tiny_model_path, tokenizer):
    """Each prompt is prefilled once and its cache repeated to its samples: the same tokens as `generate` on repeated
    prompts for one seed (prefill draws no random numbers), in chunks of whole groups too."""
    model, rollout, ids, mask = _setup(tiny_model_path, tokenizer, group_size=4, max_new_tokens=6, temperature=1.5)
    torch.manual_seed(3)
    plain = model.generate(
        input_ids=ids.repeat_interleave(4, 0), attention_mask=mask.repeat_interleave(4, 0), do_sample=True, temperature=1.5, top_p=1.0,
        top_k=0, max_new_tokens=6, eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
    )[:, ids.shape[1] :]  # fmt: skip
    torch.manual_seed(3)
    batch = rollout.generate(prompts(ids, mask), model)
    assert torch.equal(batch.response_ids, plain)
    chunked = HFRollout(
        group_size=4, max_new_tokens=6, temperature=1.5, generation_batch_size=6
    )  # 6 -> one group per call
    chunked.setup(tokenizer)
    torch.manual_seed(3)
    per_group = [
        model.generate(
            input_ids=ids[i : i + 1].repeat(4, 1), attention_mask=mask[i : i + 1].repeat(4, 1), do_sample=True, temperature=1.5, top_p=1.0,
            top_k=0, max_new_tokens=6, eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
        )[:, ids.shape[1] :]
        for i in range(3)
    ]  # fmt: skip
    torch.manual_seed(3)
    got = chunked.generate(prompts(ids, mask), model).response_ids
    width = got.shape[1]
    expected = torch.cat(
        [torch.nn.functional.pad(o, (0, width - o.shape[1]), value=tokenizer.pad_token_id) for o in per_group]
    )
    assert torch.equal(got, expected)


def _generate(model, ids, mask, tokenizer, repeats, **sampling):
    return model.generate(
        input_ids=ids.repeat_interleave(repeats, 0), attention_mask=mask.repeat_interleave(repeats, 0), max_new_tokens=6,
        eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id, **sampling,
    )[:, ids.shape[1] :]  # fmt: skip


def test_top_k_top_p_and_greedy_draw_what_generate_draws(tiny_model_path, tokenizer):
    """The sampling loop applies temperature, top-k and top-p as transformers' generate does: the same tokens for one
    seed; greedy is generate's argmax decoding."""
    for top_k, top_p in ((3, 1.0), (0, 0.7), (4, 0.8)):
        model, rollout, ids, mask = _setup(
            tiny_model_path, tokenizer, group_size=4, max_new_tokens=6, temperature=1.3, top_k=top_k, top_p=top_p
        )
        torch.manual_seed(5)
        expected = _generate(model, ids, mask, tokenizer, 4, do_sample=True, temperature=1.3, top_k=top_k, top_p=top_p)
        torch.manual_seed(5)
        got = rollout.generate(prompts(ids, mask), model).response_ids
        assert torch.equal(got, expected), (top_k, top_p)
    greedy = rollout.generate(prompts(ids, mask), model, replace(rollout.params, greedy=True)).response_ids
    assert torch.equal(greedy, _generate(model, ids, mask, tokenizer, 1, do_sample=False))


def test_top_k_restricts_every_draw_to_the_k_most_likely_tokens(tiny_model_path, tokenizer):
    torch.manual_seed(0)
    model, rollout, ids, mask = _setup(
        tiny_model_path, tokenizer, group_size=16, max_new_tokens=1, temperature=5.0, top_k=2
    )
    first = rollout.generate(prompts(ids, mask), model).response_ids[:, 0].reshape(3, 16)  # (P, G)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0)).logits[
            :, -1
        ]
    top2 = logits.topk(2, dim=-1).indices  # (P, 2)
    assert bool((first[..., None] == top2[:, None, :]).any(-1).all())
    assert len(set(first.flatten().tolist())) > 1  # at temperature 5 both of a prompt's two tokens are drawn


def test_dropping_finished_rows_keeps_the_tokens_and_computes_fewer_rows(tiny_model_path, tokenizer):
    """Same seed with and without dropping finished rows: same tokens and sampler log-probs; fewer rows computed."""
    results = []
    for drop in (False, True):
        model, rollout, ids, mask = _setup(
            tiny_model_path, tokenizer, group_size=6, max_new_tokens=40, temperature=1.5, return_logprobs=True, drop_finished_rows=drop,
        )  # fmt: skip
        rows = []
        model.register_forward_hook(
            lambda module, args, kwargs, out: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
        )
        torch.manual_seed(0)
        batch = rollout.generate(prompts(ids, mask), model)
        results.append((batch, sum(rows[1:])))  # the decoding steps after the prefill
    (kept, kept_rows), (dropped, dropped_rows) = results
    lengths = kept.response_lengths
    assert lengths.max() >= 4 * lengths.min()  # ragged enough for dropping to matter
    assert torch.equal(dropped.response_ids, kept.response_ids) and torch.equal(
        dropped.response_mask, kept.response_mask
    )
    torch.testing.assert_close(dropped.rollout_logprobs, kept.rollout_logprobs, rtol=1e-5, atol=1e-6)
    assert dropped_rows < 0.8 * kept_rows
    assert dropped_rows >= int(lengths.sum()) - lengths.numel()  # every running row was computed at every step
