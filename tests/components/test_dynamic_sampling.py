"""DynamicSampling's filter, and the skipped update when every group is degenerate (end to end through RLModule)."""

import json

import pytest
import torch

from components.dynamic_sampling import DynamicSampling
from lightning_rl.core.batch import RolloutBatch
from tests.helpers import batch_from_scores


def test_keeps_groups_with_a_reward_spread_and_drops_the_rest():
    scores = [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.25, 0.7, 0.7, 0.7]
    keep = DynamicSampling().keep(batch_from_scores(scores, group_size=3))
    assert keep.tolist() == [True] * 3 + [False] * 3 + [True] * 3 + [False] * 3


def test_tolerance_decides_what_counts_as_equal():
    batch = batch_from_scores([1.0, 1.0 + 1e-8, 0.0, 0.5], group_size=2)
    assert DynamicSampling().keep(batch).tolist() == [False, False, True, True]
    assert DynamicSampling(tol=0.6).keep(batch).tolist() == [False, False, False, False]


def test_greedy_rows_follow_their_group_and_do_not_count_as_spread():
    # group 0: sampled [1, 1] and a greedy 0 -> degenerate (the greedy row is a baseline, not a sample)
    is_greedy = torch.tensor([False, False, True, False, False, True])
    batch = batch_from_scores([1.0, 1.0, 0.0, 1.0, 0.0, 1.0], group_size=3, is_greedy=is_greedy)
    assert DynamicSampling().keep(batch).tolist() == [False] * 3 + [True] * 3


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="max_rounds"):
        DynamicSampling(max_rounds=0)


def constant_reward(completions, **_):
    return [0.7] * len(completions)


def _fit(tiny_model_path, tmp_path, sampling):
    from lightning import Trainer

    from components.advantage import LeaveOneOut
    from components.reward import FunctionReward
    from components.rollout import HFRollout
    from components.surrogate import PolicyGradient
    from lightning_rl.core.models import ModelSpec, load_causal_lm
    from lightning_rl.data.prompts import PromptDataModule
    from lightning_rl.loop.module import RLModule

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(8)))
    module = RLModule(
        policy=ModelSpec(path=tiny_model_path),
        rollout=HFRollout(group_size=4, max_new_tokens=4),
        reward=FunctionReward(fn=constant_reward),
        advantage=LeaveOneOut(),
        surrogate=PolicyGradient(),
        sampling=sampling,
    )
    datamodule = PromptDataModule(train_data=str(data), val_data=None, tokenizer=tiny_model_path, batch_size=2)
    trainer = Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule)
    initial = load_causal_lm(ModelSpec(path=tiny_model_path)).state_dict()
    return trainer, module, initial


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampling, message",
    [(None, "every advantage is zero"), (DynamicSampling(max_rounds=2), "dynamic sampling kept no group")],
    ids=["no-sampling", "dynamic-sampling"],
)
def test_all_degenerate_batch_is_skipped_with_a_warning_and_parameters_stay(
    tiny_model_path, tmp_path, sampling, message
):
    # every sample scores 0.7: each group is degenerate, every advantage is exactly 0
    with pytest.warns(UserWarning, match=message):
        trainer, module, initial = _fit(tiny_model_path, tmp_path, sampling)
    assert trainer.global_step == 2  # both iterations ran (and were skipped)
    for name, value in module.policy.state_dict().items():
        assert torch.equal(value, initial[name]), name


def test_dynamic_sampling_filters_on_a_named_reward_part():
    # group 0: all wrong, but the overlong penalty spreads the total: [0, -0.25, -0.5, -1.0]; group 1: one correct
    accuracy = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    total = accuracy + torch.tensor([0.0, -0.25, -0.5, -1.0, 0.0, 0.0, 0.0, 0.0])
    batch = RolloutBatch(
        response_ids=torch.zeros(8, 2, dtype=torch.long),
        response_mask=torch.ones(8, 2),
        scores=total,
        group_ids=torch.arange(2).repeat_interleave(4),
    )
    assert (
        DynamicSampling(part="accuracy").keep(batch.replace(score_parts={"accuracy": accuracy})).tolist()
        == [False] * 4 + [True] * 4
    )
    assert DynamicSampling().keep(batch).tolist() == [True] * 8  # the total score keeps the all-wrong group
    with pytest.raises(ValueError, match="no part named 'accuracy'"):
        DynamicSampling(part="accuracy").keep(batch.replace(score_parts={"ExactMatch": accuracy}))


def test_composite_exposes_its_unweighted_parts_by_name():
    from components.reward import Composite, FunctionReward

    batch = RolloutBatch(response_ids=torch.zeros(2, 2, dtype=torch.long), response_mask=torch.ones(2, 2))
    composite = Composite(
        [FunctionReward(constant_reward), FunctionReward(constant_reward)], weights=[1.0, -0.5], names=["a", "b"]
    )
    batch = batch.replace(columns={"completions": ["x", "y"]})
    torch.testing.assert_close(composite(batch), torch.tensor([0.35, 0.35]))  # 0.7 - 0.5 * 0.7
    scored = composite.score(batch)
    torch.testing.assert_close(scored.total, torch.tensor([0.35, 0.35]))
    assert sorted(scored.parts) == ["a", "b"]
    torch.testing.assert_close(scored.parts["b"], torch.tensor([0.7, 0.7]))  # unweighted
    names = Composite([FunctionReward(constant_reward)] * 2).names  # a repeated class is numbered
    assert names[1] == names[0] + "_2"
    with pytest.raises(ValueError, match="distinct name"):
        Composite([FunctionReward(constant_reward)] * 2, names=["a", "a"])
