"""Mixture-of-experts policies train as dense ones do: every MoE family transformers ships (random Qwen3-MoE, OLMoE
and Mixtral-style models with the tiny tokenizer) for two iterations with the load-balancing loss, each iteration
logging the routers' load and entropy; a load-balancing loss on a dense policy is refused in one line."""

from __future__ import annotations

import math

import pytest
import torch

from tests.lightning_rl.cli_runs import cli_args, run_cli, scalars
from tests.support.moe import FAMILIES, save_moe

pytestmark = pytest.mark.slow

BALANCED = ["--model.loss_terms=[{class_path: components.load_balance.LoadBalancingLoss, init_args: {coef: 0.01}}]",
            "--model.reward=components.reward.FunctionReward", "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
            "--model.rollout.init_args.temperature=2.0"]  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_every_moe_family_trains_two_iterations_with_its_routing_logged(family, tmp_path):
    from lightning_rl.core.models import ModelSpec, load_causal_lm
    from lightning_rl.core.moe import routers

    path = save_moe(tmp_path / family, family)
    cli = run_cli("fit", cli_args(tmp_path, path, 2, *BALANCED))
    assert cli.trainer.global_step == 2 and cli.model.loop_state.optimizer_steps["policy"] == 2
    logged = scalars(tmp_path)
    cv, entropy = logged["moe/expert_load_cv"], logged["moe/router_entropy"]
    assert [step for step, _ in cv] == [step for step, _ in entropy] and len(cv) == 2  # every iteration
    assert all(0 <= v < math.sqrt(3) for _, v in cv)  # 4 experts: at most sqrt(E - 1), everything on one
    assert all(0 < v <= math.log(4) + 1e-6 for _, v in entropy)
    start, trained = load_causal_lm(ModelSpec(path=path)).state_dict(), cli.model.policy.state_dict()
    for router in routers(cli.model.policy):  # the routers and the experts learned
        for name in (f"{router.name}.weight", f"{router.name.rsplit('.', 1)[0]}.experts.down_proj"):
            assert not torch.equal(trained[name], start[name]), name


def test_a_load_balancing_loss_on_a_dense_policy_is_refused_in_one_line(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match=r"model.loss_terms\[0\] \(LoadBalancingLoss\) reads the router logits .* "
                       r"the policy \(LlamaForCausalLM\) has no router"):  # fmt: skip
        run_cli("fit", cli_args(tmp_path, tiny_model_path, 1, *BALANCED))


def test_routing_replay_trains_with_a_bf16_sampler_and_logs_route_agreement(tmp_path):
    """Two iterations replaying a bfloat16 sampler's routes in the fp32 trainer (old log-probs recomputed: two
    mini-batches), ``moe/route_agreement`` every iteration, within [0, 1] and mostly agreeing on a random model, and
    the trainer/sampler gap split by whether a token's routes agree."""
    path = save_moe(tmp_path / "qwen3_moe", "qwen3_moe")
    args = cli_args(tmp_path, path, 2, *BALANCED, "--model.routing_replay=true",
                    "--model.rollout.init_args.dtype=bfloat16", "--model.loop.num_mini_batches=2",
                    "--model.rollout.init_args.return_logprobs=true")  # fmt: skip
    cli = run_cli("fit", args)
    assert cli.trainer.global_step == 2
    logged = scalars(tmp_path)
    agreement = logged["moe/route_agreement"]
    assert len(agreement) == 2 and all(0.5 < v <= 1.0 for _, v in agreement)
    assert len(logged["moe/logprob_diff_mean_agreeing"]) == 2 and "moe/logprob_diff_mean_disagreeing" in logged


def test_routing_replay_on_a_dense_policy_is_refused_in_one_line(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match=r"^model.routing_replay: LlamaForCausalLM has no router"):
        run_cli("fit", cli_args(tmp_path, tiny_model_path, 1, "--model.routing_replay=true"))
