"""pass@k (Chen et al. 2021's unbiased estimator) and mean@n from sampled validation, and several validation sets."""

from __future__ import annotations

from itertools import combinations

import pytest
import torch

from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main
from lightning_rl.loop.validation import ks, pass_at_k, sampled_metrics
from tests.lightning_rl import rewards
from tests.lightning_rl.cli_runs import cli_args


def _by_subsets(correct: torch.Tensor, k: int) -> float:
    """pass@k counted by hand: the fraction of k-subsets of each prompt's samples with a correct one, averaged."""
    per_prompt = []
    for row in correct.tolist():
        subsets = list(combinations(row, k))
        per_prompt.append(sum(any(s) for s in subsets) / len(subsets))
    return sum(per_prompt) / len(per_prompt)


def test_pass_at_k_hand_computed():
    # 4 samples per prompt with 0, 1, 2 and 4 correct; C(4,2) = 6 pairs
    correct = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 1], [1, 1, 1, 1]]).bool()
    assert pass_at_k(correct, 1).item() == pytest.approx((0 + 1 / 4 + 2 / 4 + 1) / 4)
    assert pass_at_k(correct, 2).item() == pytest.approx(
        (0 + (1 - 3 / 6) + (1 - 1 / 6) + 1) / 4
    )  # C(3,2)=3, C(2,2)=1 all-wrong pairs
    assert pass_at_k(correct, 4).item() == pytest.approx(3 / 4)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(correct, 5)


def test_pass_at_k_equals_counting_subsets_on_random_outcomes():
    correct = torch.rand(16, 7, generator=torch.Generator().manual_seed(0)) < 0.3
    for k in range(1, 8):
        assert pass_at_k(correct, k).item() == pytest.approx(_by_subsets(correct, k), abs=1e-6), k


def test_reported_ks_and_mean():
    assert ks(1) == [1] and ks(4) == [1, 2, 4] and ks(6) == [1, 2, 4, 6]
    scores = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.5]])
    metrics = sampled_metrics(scores)
    assert set(metrics) == {"pass@1", "pass@2", "pass@3", "mean@3"}
    assert metrics["mean@3"].item() == pytest.approx(3.5 / 6) and metrics["pass@3"].item() == 1.0
    assert metrics["pass@1"].item() == pytest.approx((1 / 3 + 2 / 3) / 2)  # 0.5 is not solved


@pytest.mark.slow
def test_sampled_validation_on_two_sets_matches_a_hand_count(tmp_path, tiny_model_path):
    n, n_prompts = 4, 6
    args = cli_args(
        tmp_path,
        tiny_model_path,
        1,
        "--model.val_reward=components.reward.FunctionReward",
        "--model.val_reward.fn=tests.lightning_rl.rewards.starts_with_digit",
        f"--model.loop.val_samples={n}",
        "--model.loop.val_temperature=1.0",
        f"--data.val_size={n_prompts}",
        "--data.val_data.easy=builtin:arithmetic",
        "--data.val_data.hard=builtin:arithmetic",
    )
    cli = main(["--config", DEFAULT_TRAINER_CONFIG, *args], run=False)
    rewards.SCORED.clear()
    easy, hard = cli.trainer.validate(cli.model, datamodule=cli.datamodule)  # one dict per set
    logged = {**easy, **hard}
    greedy_easy, sampled_easy, greedy_hard, sampled_hard = rewards.SCORED  # per set: greedy, then n samples per prompt
    assert len(greedy_easy) == n_prompts and len(sampled_easy) == n_prompts * n
    for name, greedy, sampled in (("easy", greedy_easy, sampled_easy), ("hard", greedy_hard, sampled_hard)):
        correct = torch.tensor(sampled).reshape(n_prompts, n).bool()
        assert logged[f"val/{name}/reward"] == pytest.approx(sum(greedy) / n_prompts)
        assert logged[f"val/{name}/mean@4"] == pytest.approx(sum(sampled) / (n_prompts * n))
        for k in (1, 2, 4):
            assert logged[f"val/{name}/pass@{k}"] == pytest.approx(_by_subsets(correct, k), abs=1e-6)
    assert 0 < logged["val/easy/pass@1"] < logged["val/easy/pass@2"] < 1  # not a trivial all-or-nothing count
    assert "val/reward" not in logged and not any("dataloader_idx" in key for key in logged)


@pytest.mark.slow
def test_validation_reports_raw_scores_whatever_the_training_shaping(tmp_path, tiny_model_path):
    """A normalised reward (issue 24: running statistics before the first iteration made mean@4 6.8e5 and pass@1 0.94
    where the raw scores gave 0.68 and 0.06): val/reward, pass@k and mean@n are computed on the raw score."""
    from components.reward import FunctionReward, Shaped

    n, n_prompts = 4, 6
    args = cli_args(tmp_path, tiny_model_path, 1, f"--model.loop.val_samples={n}", f"--data.val_size={n_prompts}")
    cli = main(["--config", DEFAULT_TRAINER_CONFIG, *args], run=False)
    for shaping in (dict(normalize="running"), dict(normalize="static", mean=0.5, std=0.25, clip=1.0)):
        cli.model.val_reward = Shaped(FunctionReward(rewards.starts_with_digit), **shaping)
        rewards.SCORED.clear()
        (logged,) = cli.trainer.validate(cli.model, datamodule=cli.datamodule)
        greedy, sampled = rewards.SCORED
        correct = torch.tensor(sampled).reshape(n_prompts, n).bool()
        assert logged["val/reward"] == pytest.approx(sum(greedy) / n_prompts), shaping
        assert logged["val/mean@4"] == pytest.approx(sum(sampled) / (n_prompts * n)), shaping
        for k in (1, 2, 4):
            assert logged[f"val/pass@{k}"] == pytest.approx(_by_subsets(correct, k), abs=1e-6), shaping
        assert 0 < logged["val/mean@4"] < 1, shaping  # some samples solved, some not: a normalised score would differ
