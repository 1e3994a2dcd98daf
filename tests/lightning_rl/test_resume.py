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

from .cli_runs import cli_args, run_cli

DENSE_REWARD = ["--model.reward=components.reward.FunctionReward", "--model.reward.fn=tests.lightning_rl.rewards.digit_count", "--model.rollout.init_args.temperature=3.0"]
# keep every checkpoint, one per 2 iterations, named by step
KEEP_CHECKPOINTS = ["--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.filename={step}"]

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
PPO_RLHF = ["--model.rollout.init_args.temperature=3.0", "--model.reward.init_args.normalize=running", "--model.loop.ppo_epochs=2"]
# VC-PPO with critic pretraining that ends after the stop (iterations 0-2 train only the critic)
VC_PPO = [*DENSE_REWARD, "--model.rollout.init_args.group_size=2", "--model.critic.init_args.pretrain_steps=3"]


def _fit(root, model_path, steps: int, config: str, extra: list[str], ckpt_path=None):
    resume = [f"--ckpt_path={ckpt_path}"] if ckpt_path else []
    return run_cli("fit", cli_args(root, model_path, steps, *extra, *KEEP_CHECKPOINTS, *resume, config=config))


def assert_same(a, b, path: str = "checkpoint") -> None:
    """Recursive equality of two checkpoint objects; tensors to 1e-6 (fp32), everything else exactly."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=lambda m: f"{path}: {m}")
        else:
            assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def compared(checkpoint: dict) -> dict:
    """What must match: all of it, except the ModelCheckpoint callback's bookkeeping (it names the run's folder) and
    the count of validation batches (a resumed run does not repeat the validation before training)."""
    out = {k: v for k, v in checkpoint.items() if k not in ("callbacks", "loops")}
    fit_loop = {k: v for k, v in checkpoint["loops"]["fit_loop"].items() if not k.startswith("epoch_loop.val_loop.")}
    out["loops"] = {**checkpoint["loops"], "fit_loop": fit_loop}
    return out


def _resume_matches_straight(tmp_path, model_path, config: str, extra: list[str]) -> tuple[dict, dict]:
    _fit(tmp_path / "straight", model_path, 4, config, extra)
    _fit(tmp_path / "stopped", model_path, 2, config, extra)
    stopped_at = tmp_path / "stopped" / "checkpoints" / "step=2.ckpt"
    _fit(tmp_path / "resumed", model_path, 4, config, extra, ckpt_path=stopped_at)

    load = lambda run, step: torch.load(tmp_path / run / "checkpoints" / f"step={step}.ckpt", weights_only=False)  # noqa: E731
    assert_same(compared(load("straight", 2)), compared(load("stopped", 2)))
    straight, resumed = load("straight", 4), load("resumed", 4)
    assert resumed["global_step"] == 4 and resumed["PromptDataModule"]["position"]["batch"] == 4
    assert_same(compared(straight), compared(resumed))
    return straight, load("straight", 2)


@pytest.mark.slow
def test_resume_reinforce_with_adaptive_kl_and_minibatches(tmp_path, tiny_model_path):
    final, middle = _resume_matches_straight(tmp_path, tiny_model_path, "configs/reinforce.yaml", REINFORCE)
    # the state that had to be carried really moved between the stop and the end (else the test proves little)
    state, before = final["state_dict"], middle["state_dict"]
    assert not torch.equal(state["kl.coef"], before["kl.coef"])
    assert not torch.equal(state["advantage.running_mean"], before["advantage.running_mean"])
    assert final["optimizer_steps"]["policy"] == 16 and middle["optimizer_steps"]["policy"] == 8  # 4 steps per iteration
    assert not torch.equal(state["policy.model.layers.0.mlp.up_proj.weight"], before["policy.model.layers.0.mlp.up_proj.weight"])


@pytest.mark.slow
def test_resume_vc_ppo_with_critic_pretraining_across_the_stop(tmp_path, tiny_model_path):
    final, middle = _resume_matches_straight(tmp_path, tiny_model_path, "configs/vc_ppo.yaml", VC_PPO)
    # iterations 0-2 pretrain the critic: the policy group took no step before the stop and 2 x 2 after iteration 3
    assert middle["optimizer_steps"]["policy"] == 0 and final["optimizer_steps"]["policy"] == 4
    assert final["optimizer_steps"]["critic"] == 16


@pytest.mark.slow
def test_resume_ppo_rlhf_keeps_the_reward_models_running_statistics(tmp_path, tiny_model_path):
    from lightning_rl.recipes.reward_model import save_tiny_reward_model

    reward_model = save_tiny_reward_model(tmp_path / "rm", seed=7)
    final, middle = _resume_matches_straight(tmp_path, tiny_model_path, "configs/ppo_rlhf.yaml", [*PPO_RLHF, f"--model.reward.init_args.path={reward_model}"])
    assert final["state_dict"]["reward.running_count"] > middle["state_dict"]["reward.running_count"] > 0
    assert not any(k.startswith(("reference.", "reward.model.")) for k in final["state_dict"])  # frozen weights stay out
