"""Resuming continues as if never stopped: 4 iterations straight == 2, stop, resume from the checkpoint, 2 more.

Compared at the end (fp32, 1e-6; in practice bit-identical on CPU): every parameter and buffer
(the KL coefficient, the REINFORCE moving average), the AdamW state, the per-group step counters of
the LR schedules, the data position, Lightning's loop counters and every random state. The runs
sample with the real HFRollout, so a resumed run that drew one random number more or less, or
started one prompt batch off, samples different responses and fails.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.resume import resume_matches_straight

DENSE_REWARD = [
    "--model.reward=components.reward.FunctionReward",
    "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
    "--model.rollout.init_args.temperature=3.0",
]
# keep every checkpoint, one per 2 iterations, named by step

# REINFORCE with the moving-average baseline, an adaptive KL coefficient (reference model), 2 epochs x
# 2 shuffled mini-batches and a warmup + cosine LR schedule: every piece of state a resume must carry
REINFORCE = [
    *DENSE_REWARD,
    "--model.rollout.init_args.group_size=2",
    "--model.kl.init_args.target=0.01",
    "--model.kl.init_args.horizon=100",
    "--model.loop.ppo_epochs=2",
    "--model.loop.num_mini_batches=2",
    "--model.optimizer.warmup_steps=3",
    "--model.optimizer.schedule=cosine",
    "--model.optimizer.total_steps=20",
]
# PPO-RLHF with the reward model's running score normalisation (buffers next to its frozen weights)
PPO_RLHF = [
    "--model.rollout.init_args.temperature=3.0",
    "--model.reward.init_args.normalize=running",
    "--model.loop.ppo_epochs=2",
]
# Dr. GRPO (no division by the group's std, so the parts' running scales reach the advantages) on a Composite of two
# running-normalised parts (#46 item 4: the parts' statistics were in no state_dict)
SHAPED_PART = '{"class_path": "components.reward.Shaped", "init_args": {"reward": %s, "normalize": "running"}}'
COMPOSITE = [
    "--model.rollout.init_args.temperature=3.0",
    "--model.rollout.init_args.group_size=2",
    "--model.advantage.init_args.scale=none",
    '--model.reward={"class_path": "components.reward.Composite", "init_args": {"rewards": [%s, %s], "names": ["digits", "accuracy"]}}'
    % (
        SHAPED_PART
        % '{"class_path": "components.reward.FunctionReward", "init_args": {"fn": "tests.lightning_rl.rewards.digit_count"}}',
        SHAPED_PART % '{"class_path": "components.reward.ExactMatch"}',
    ),
]
# VC-PPO with critic pretraining that ends after the stop (iterations 0-2 train only the critic)
VC_PPO = [*DENSE_REWARD, "--model.rollout.init_args.group_size=2", "--model.critic.init_args.pretrain_steps=3"]


@pytest.mark.slow
def test_resume_reinforce_with_adaptive_kl_and_minibatches(tmp_path, tiny_model_path):
    final, middle = resume_matches_straight(tmp_path, tiny_model_path, "configs/reinforce.yaml", REINFORCE)
    # the state that had to be carried really moved between the stop and the end (else the test proves little)
    state, before = final["state_dict"], middle["state_dict"]
    assert not torch.equal(state["kl.coef"], before["kl.coef"])
    assert not torch.equal(state["advantage.running_mean"], before["advantage.running_mean"])
    assert (
        final["optimizer_steps"]["policy"] == 16 and middle["optimizer_steps"]["policy"] == 8
    )  # 4 steps per iteration
    assert not torch.equal(
        state["policy.model.layers.0.mlp.up_proj.weight"], before["policy.model.layers.0.mlp.up_proj.weight"]
    )


@pytest.mark.slow
def test_resume_vc_ppo_with_critic_pretraining_across_the_stop(tmp_path, tiny_model_path):
    final, middle = resume_matches_straight(tmp_path, tiny_model_path, "configs/vc_ppo.yaml", VC_PPO)
    # iterations 0-2 pretrain the critic: the policy group took no step before the stop and 2 x 2 after iteration 3
    assert middle["optimizer_steps"]["policy"] == 0 and final["optimizer_steps"]["policy"] == 4
    assert final["optimizer_steps"]["critic"] == 16


@pytest.mark.slow
def test_resume_ppo_rlhf_keeps_the_reward_models_running_statistics(tmp_path, tiny_model_path):
    from lightning_rl.recipes.reward_model import save_tiny_reward_model

    reward_model = save_tiny_reward_model(tmp_path / "rm", seed=7)
    final, middle = resume_matches_straight(
        tmp_path, tiny_model_path, "configs/ppo_rlhf.yaml", [*PPO_RLHF, f"--model.reward.init_args.path={reward_model}"]
    )
    assert final["state_dict"]["reward.running_count"] > middle["state_dict"]["reward.running_count"] > 0
    assert not any(
        k.startswith(("reference.", "reward.model.")) for k in final["state_dict"]
    )  # frozen weights stay out


@pytest.mark.slow
def test_resume_with_a_composite_of_running_normalised_parts(tmp_path, tiny_model_path):
    """#46 item 4: a Composite held its parts in a plain list, so their running statistics were in no checkpoint and
    the resumed run restarted them from zero (running mean 0.0426 straight, 0.0515 resumed at step 4)."""
    final, middle = resume_matches_straight(tmp_path, tiny_model_path, "configs/grpo.yaml", COMPOSITE)
    state, before = final["state_dict"], middle["state_dict"]
    assert state["reward.parts.0.running_count"] == 16 and before["reward.parts.0.running_count"] == 8
    assert not torch.equal(state["reward.parts.0.running_mean"], before["reward.parts.0.running_mean"])
    assert state["reward.parts.1.running_count"] == 16
