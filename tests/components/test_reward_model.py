import pytest
import torch

from components.reward import RewardModel
from lightning_rl.core.batch import RolloutBatch
from lightning_rl.core.models import load_tokenizer
from lightning_rl.recipes.reward_model import save_tiny_reward_model


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory) -> str:
    return save_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"), seed=3)


@pytest.fixture(scope="module")
def tok(rm_path):
    return load_tokenizer(rm_path)


@pytest.fixture(scope="module")
def hf_scorer(rm_path):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(rm_path, num_labels=1).eval()


def _reward(rm_path, tok, **kwargs) -> RewardModel:
    reward = RewardModel(path=rm_path, **kwargs)
    reward.setup(tok)
    return reward


def _batch(tok, pairs) -> RolloutBatch:
    """Left-padded prompts, right-padded responses (responses end with EOS unless they are cut)."""
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p, _ in pairs]
    responses = [
        tok(r, add_special_tokens=False)["input_ids"] + ([] if cut else [tok.eos_token_id]) for _, (r, cut) in pairs
    ]
    p_width, r_width = max(map(len, prompts)), max(map(len, responses)) + 2
    b = len(pairs)
    prompt_ids = torch.full((b, p_width), tok.pad_token_id)
    prompt_mask = torch.zeros(b, p_width, dtype=torch.long)
    response_ids = torch.full((b, r_width), tok.pad_token_id)
    response_mask = torch.zeros(b, r_width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        prompt_ids[i, p_width - len(p) :], prompt_mask[i, p_width - len(p) :] = torch.tensor(p), 1
        response_ids[i, : len(r)], response_mask[i, : len(r)] = torch.tensor(r), 1
    return RolloutBatch(
        response_ids=response_ids, response_mask=response_mask, prompt_ids=prompt_ids, prompt_mask=prompt_mask
    )


PAIRS = [("12+7=", ("19", False)), ("3+4=", ("7", False)), ("99+99=", ("198", False)), ("5+5=", ("1234567", True))]


def test_score_read_at_the_last_valid_token_matches_an_unpadded_forward(rm_path, tok, hf_scorer):
    batch = _batch(tok, PAIRS)
    scores = _reward(rm_path, tok)(batch)
    # independent: each sequence alone, no padding at all, the classifier's own pooling (last token)
    for i, (prompt, (response, cut)) in enumerate(PAIRS):
        ids = tok(prompt + response, add_special_tokens=False)["input_ids"] + ([] if cut else [tok.eos_token_id])
        alone = hf_scorer(input_ids=torch.tensor([ids])).logits[0, 0]
        torch.testing.assert_close(scores[i], alone, atol=1e-5, rtol=1e-5)


def test_reading_position_when_pad_equals_eos(rm_path, tok, hf_scorer):
    # a tokenizer whose pad is its EOS: transformers' own pooling (rightmost non-pad) would skip the EOS
    batch = _batch(tok, PAIRS[:2])
    eos = tok.eos_token_id
    batch = batch.replace(response_ids=torch.where(batch.response_mask.bool(), batch.response_ids, torch.full_like(batch.response_ids, eos)),
                          prompt_ids=torch.where(batch.prompt_mask.bool(), batch.prompt_ids, torch.full_like(batch.prompt_ids, eos)))  # fmt: skip
    scores = _reward(rm_path, tok)(batch)
    for i, (prompt, (response, _)) in enumerate(PAIRS[:2]):
        ids = tok(prompt + response, add_special_tokens=False)["input_ids"] + [eos]
        torch.testing.assert_close(
            scores[i], hf_scorer(input_ids=torch.tensor([ids])).logits[0, 0], atol=1e-5, rtol=1e-5
        )
    # the classifier's pooling with pad_token_id = eos reads one token early: a different number
    hf_scorer.config.pad_token_id = eos
    try:
        ids = torch.cat([batch.prompt_ids, batch.response_ids], 1)
        pooled = hf_scorer(input_ids=ids, attention_mask=torch.cat([batch.prompt_mask, batch.response_mask], 1)).logits[
            :, 0
        ]
    finally:
        hf_scorer.config.pad_token_id = tok.pad_token_id
    assert not torch.allclose(pooled, scores, atol=1e-4)


def test_micro_batching_does_not_change_scores(rm_path, tok):
    batch = _batch(tok, PAIRS * 3)
    whole = _reward(rm_path, tok, batch_size=64)(batch)
    pieces = _reward(rm_path, tok, batch_size=5)(batch)
    torch.testing.assert_close(whole, pieces, atol=1e-5, rtol=1e-5)
    assert whole.shape == (12,) and whole.dtype == torch.float32


def test_frozen_and_lazily_built(rm_path, tok):
    reward = RewardModel(path=rm_path)
    assert reward.path == rm_path and reward.model is None
    with pytest.raises(RuntimeError, match="setup"):
        reward(_batch(tok, PAIRS))
    reward.setup(tok)
    model = reward.model
    reward.setup(tok)  # idempotent
    assert reward.model is model
    assert all(not p.requires_grad for p in reward.parameters())
    reward.train()  # the parent LightningModule's train(): the transformer must stay in eval mode
    assert reward.training and not reward.model.training
    assert not any(m.training for m in reward.model.modules())
    scores = reward(_batch(tok, PAIRS))
    assert not scores.requires_grad


def test_static_normalisation_and_clipping(rm_path, tok):
    batch = _batch(tok, PAIRS)
    raw = _reward(rm_path, tok)(batch)
    static = _reward(rm_path, tok, normalize="static", mean=0.3, std=2.0)(batch)
    torch.testing.assert_close(static, (raw - 0.3) / 2.0, atol=1e-6, rtol=0)
    clip = float((raw - raw.mean()).abs().min()) + 1e-3  # at least one score lies beyond the bound
    clipped = _reward(rm_path, tok, normalize="static", mean=float(raw.mean()), clip=clip)(batch)
    torch.testing.assert_close(clipped, (raw - raw.mean()).clamp(-clip, clip), atol=1e-6, rtol=0)
    assert float(clipped.abs().max()) == pytest.approx(clip)


def test_running_statistics_cover_every_score_seen_in_training(rm_path, tok):
    reward = _reward(rm_path, tok, normalize="running")
    raw = _reward(rm_path, tok)
    first, second = _batch(tok, PAIRS[:3]), _batch(tok, PAIRS[1:])
    reward.train()
    reward(first)
    out = reward(second)
    seen = torch.cat([raw(first), raw(second)]).double()
    assert int(reward.running_count) == 6
    torch.testing.assert_close(reward.running_mean, seen.mean(), atol=1e-6, rtol=0)
    torch.testing.assert_close(reward.running_m2 / 6, seen.var(correction=0), atol=1e-6, rtol=1e-6)
    expected = (raw(second).double() - seen.mean()) / seen.std(correction=0)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    # eval mode (validation): statistics frozen
    reward.eval()
    reward(first)
    assert int(reward.running_count) == 6
    assert {"running_count", "running_mean", "running_m2"} <= {name for name, _ in reward.named_buffers()}


def test_every_option_changes_the_output(rm_path, tok):
    batch = _batch(tok, PAIRS)
    base = _reward(rm_path, tok)(batch)
    for kwargs in [
        dict(normalize="static", mean=1.0),
        dict(normalize="static", std=3.0),
        dict(normalize="running"),
        dict(clip=1e-3),
    ]:
        reward = _reward(rm_path, tok, **kwargs).train()
        assert not torch.allclose(reward(batch), base), kwargs
    bf16 = _reward(rm_path, tok, dtype="bfloat16")(batch)
    assert bf16.dtype == torch.float32 and not torch.equal(bf16, base)
    torch.testing.assert_close(bf16, base, atol=0.1, rtol=0.1)


def test_plain_causal_lm_is_refused(tiny_model_path, tok):
    with pytest.raises(ValueError, match="no trained scalar head"):
        RewardModel(path=tiny_model_path).setup(tok)


def test_bad_arguments_and_paths(rm_path, tok, tmp_path):
    with pytest.raises(ValueError, match="normalize"):
        RewardModel(path=rm_path, normalize="whiten")
    with pytest.raises(ValueError, match="std"):
        RewardModel(path=rm_path, std=0.0)
    with pytest.raises(FileNotFoundError, match="model.reward.init_args.path"):
        RewardModel(path=str(tmp_path / "nowhere")).setup(tok)


def test_a_different_tokenizer_is_refused(rm_path, tiny_model_path):
    from transformers import AutoTokenizer

    other = AutoTokenizer.from_pretrained(tiny_model_path)
    other.add_tokens(["<extra>"])
    with pytest.raises(ValueError, match="tokenizer differs"):
        RewardModel(path=rm_path).setup(other)


def test_the_default_path_is_the_built_in_tasks_and_says_how_to_build_it(tok, monkeypatch):
    import components.reward.model as module

    assert RewardModel().path == module.TINY_REWARD_MODEL_PATH
    assert module.TINY_REWARD_MODEL_PATH.endswith("lightning_rl/assets/tiny-arith-rm")
    monkeypatch.setattr(module, "TINY_REWARD_MODEL_PATH", "/nonexistent/tiny-arith-rm")
    with pytest.raises(FileNotFoundError, match="scripts/make_reward_model.py"):
        RewardModel(path="/nonexistent/tiny-arith-rm").setup(tok)


def test_running_normalisation_before_any_statistics_is_the_identity(rm_path, tok):
    batch = _batch(tok, PAIRS)
    raw = _reward(rm_path, tok)(batch)
    running = _reward(rm_path, tok, normalize="running").eval()  # validation before the first iteration
    torch.testing.assert_close(running(batch), raw, atol=0, rtol=0)
