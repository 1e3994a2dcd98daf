"""HFTeacher: the teacher's log-probs of the student's sampled tokens, its top k, its own precision and device, and a
teacher whose tokenizer reads the ids otherwise refused at setup with the reason."""

from __future__ import annotations

import pytest
import torch

from components.teacher import TINY_TEACHER_PATH, HFTeacher, tokenizer_mismatch
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.models import ModelSpec, load_causal_lm, load_tokenizer
from tests.support.probes import probe_batch


@pytest.fixture
def teacher(tiny_model_path, tokenizer):
    t = HFTeacher(path=tiny_model_path, top_k=3, temperature=0.5)
    t.setup(tokenizer)
    return t


def test_the_teachers_logprobs_are_the_trainers_logprobs_of_the_same_model(teacher, tiny_model_path, tokenizer):
    batch = probe_batch(tokenizer)
    scores = teacher.score(batch)
    model = load_causal_lm(ModelSpec(path=tiny_model_path)).eval()
    with torch.no_grad():
        expected = policy_logprobs(model, batch, temperature=0.5)[0]
    assert scores.teacher_logprobs.dtype == torch.float32 and scores.teacher_logprobs.shape == (2, 4)
    torch.testing.assert_close(scores.teacher_logprobs, expected, rtol=0, atol=1e-6)


def test_top_k_is_the_k_most_likely_tokens_of_the_tempered_distribution(teacher, tiny_model_path, tokenizer):
    batch = probe_batch(tokenizer)
    scores = teacher.score(batch)
    logits = teacher.logits(batch)  # (B, R, V), already divided by the temperature
    logq = torch.log_softmax(logits, dim=-1)
    values, ids = logq.topk(3, dim=-1)
    assert scores.teacher_topk_ids.shape == (2, 4, 3)
    assert torch.equal(scores.teacher_topk_ids, ids)
    torch.testing.assert_close(scores.teacher_topk_logprobs, values, rtol=0, atol=1e-6)
    # the sampled token's log-prob from the same distribution
    torch.testing.assert_close(
        logq.gather(-1, batch.response_ids[..., None]).squeeze(-1), scores.teacher_logprobs, rtol=0, atol=1e-6
    )
    assert teacher.provides == {"teacher_logprobs", "teacher_topk_ids", "teacher_topk_logprobs", "teacher_logits"}


def test_the_shipped_teacher_runs_in_its_own_precision_with_the_students_tokenizer():
    student = load_tokenizer(str(TINY_TEACHER_PATH).replace("tiny-arith-teacher", "tiny-arith"))
    teacher = HFTeacher(dtype="bfloat16")
    teacher.setup(student)
    assert type(teacher.model).__name__ == "Qwen2ForCausalLM"  # another architecture than the Llama student
    assert next(teacher.model.parameters()).dtype == torch.bfloat16
    scores = teacher.score(probe_batch(student))
    assert scores.teacher_logprobs.dtype == torch.float32 and bool(torch.isfinite(scores.teacher_logprobs).all())


def test_a_teacher_on_its_own_device_is_outside_the_module_tree(tiny_model_path, tokenizer):
    """Pinned to a device, the teacher is not a submodule: Lightning's ``.to`` (here a dtype) and state dicts skip it."""
    pinned = HFTeacher(path=tiny_model_path, device="cpu")
    pinned.setup(tokenizer)
    assert list(pinned.parameters()) == [] and pinned.state_dict() == {} and pinned.shard_unit is None
    pinned.to(torch.float64)
    assert next(pinned.model.parameters()).dtype == torch.float32
    with_policy = HFTeacher(path=tiny_model_path)
    with_policy.setup(tokenizer)
    assert with_policy.shard_unit is with_policy.model and len(with_policy.state_dict()) > 0
    with_policy.train()
    assert not with_policy.model.training  # frozen: stays in eval mode


def test_a_teacher_whose_tokenizer_differs_is_refused_at_setup_with_the_reason(tmp_path, tokenizer):
    from transformers import PreTrainedTokenizerFast

    from lightning_rl.recipes.tiny import build_char_tokenizer, build_tiny_llama

    # the same characters, two of them swapped: the ids of "0" and "1" read as the other digit
    other = build_char_tokenizer()
    vocab = other.get_vocab()
    swapped = {"0": vocab["1"], "1": vocab["0"]}
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    core = Tokenizer(models.WordLevel(vocab={**vocab, **swapped}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    shuffled = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    model = build_tiny_llama(shuffled, hidden_size=32, layers=1, heads=2)
    model.save_pretrained(tmp_path)
    shuffled.save_pretrained(tmp_path)
    teacher = HFTeacher(path=str(tmp_path))
    with pytest.raises(ValueError) as err:
        teacher.setup(tokenizer)
    message = str(err.value)
    assert "model.teacher.init_args.path: the teacher's tokenizer" in message
    assert (
        f"2 of the policy's token ids mean another token to the teacher (e.g. id {vocab['0']} is '0' to the policy, '1' to the teacher)"
        in message
    )
    assert teacher.model is None  # refused before any weight loads


def test_tokenizer_mismatch_says_none_for_the_same_vocabulary_and_counts_extra_tokens(tokenizer):
    from lightning_rl.recipes.tiny import build_char_tokenizer

    assert tokenizer_mismatch(tokenizer, build_char_tokenizer()) is None
    extra = tokenizer_mismatch(tokenizer, build_char_tokenizer(tags=["<call>"]))
    assert extra == "its vocabulary has 19 tokens, the policy's 18 (the teacher's has tokens the policy never samples)"
