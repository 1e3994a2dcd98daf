"""The critic-based presets end to end on tiny models: PPO-RLHF (four models), VC-PPO, VAPO."""

from __future__ import annotations

import pytest
import torch
from lightning import Callback

from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main
from lightning_rl.recipes.reward_model import save_tiny_reward_model
from tests.lightning_rl.cli_runs import cli_args, scalars, texts

CRITIC_METRICS = ["critic/loss", "critic/explained_var", "critic/clipfrac", "critic/values_mean", "critic/grad_norm"]
DENSE_REWARD = [
    "--model.reward=components.reward.FunctionReward",
    "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
]


@pytest.fixture(scope="module")
def tiny_rm_path(tmp_path_factory) -> str:
    return save_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"), seed=7)


class Snapshots(Callback):
    """Copies of the policy's and critic's parameters after every RL iteration."""

    def __init__(self) -> None:
        self.policy: list[dict[str, torch.Tensor]] = []
        self.critic: list[dict[str, torch.Tensor]] = []
        self.policy_in_optimizer_state: list[int] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.policy.append({n: p.detach().clone() for n, p in module.policy.named_parameters()})
        self.critic.append({n: p.detach().clone() for n, p in module.critic.named_parameters()})
        state = module.optimizers().optimizer.state
        self.policy_in_optimizer_state.append(sum(p in state for p in module.policy.parameters()))


def _fit(tmp_path, policy_path, config, steps, *extra):
    # run=False has no `fit` subcommand, so its default trainer settings are passed as the first config
    cli = main(
        ["--config", DEFAULT_TRAINER_CONFIG, *cli_args(tmp_path, policy_path, steps, *extra, config=config)], run=False
    )
    cli.model.configure_model()  # idempotent: build the models now to snapshot the initial weights
    initial = {
        "policy": {n: p.detach().clone() for n, p in cli.model.policy.named_parameters()},
        "critic": {n: p.detach().clone() for n, p in cli.model.critic.named_parameters()},
    }
    snapshots = Snapshots()
    cli.trainer.callbacks.append(snapshots)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli, initial, snapshots


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_ppo_rlhf_four_models(tmp_path, tiny_model_path, tiny_rm_path):
    cli, initial, snapshots = _fit(
        tmp_path, tiny_model_path, "configs/ppo_rlhf.yaml", 3, f"--model.reward.init_args.path={tiny_rm_path}"
    )
    module = cli.model
    assert cli.trainer.global_step == 3
    logged = scalars(tmp_path)
    missing = [
        m
        for m in [*CRITIC_METRICS, "kl/ref", "kl/coef", "kl/clamped_frac", "policy/loss", "advantage/std", "val/reward"]
        if m not in logged
    ]
    assert not missing, missing
    # the reward model's score and the reward PPO maximises (score - beta * KL(pi_old || ref), k1 summed per response) apart
    for (_, score), (_, coef), (_, kl), (_, shaped) in zip(
        *(logged[k] for k in ("reward/mean", "kl/coef", "kl/ref", "reward/shaped_mean")), strict=True
    ):
        assert shaped == pytest.approx(score - coef * kl, abs=1e-5)
    assert len({v for _, v in logged["kl/ref"]}) > 1  # the KL moved: the two are not equal by accident
    ((step, table),) = texts(tmp_path)[
        "samples/text_summary"
    ]  # a short run shows its samples too: the first iteration's
    assert (
        step == 1
        and table.startswith("| prompt | completion | reward | gold | advantage |")
        and len(table.splitlines()) == 4
    )
    assert not _equal(snapshots.policy[-1], initial["policy"]) and not _equal(snapshots.critic[-1], initial["critic"])

    # four distinct models with no shared storage
    models = {
        "policy": module.policy,
        "reference": module.reference,
        "reward": module.reward.model,
        "critic": module.critic.backbone,
    }
    assert len({id(m) for m in models.values()}) == 4
    storages = [{p.untyped_storage().data_ptr() for p in m.parameters()} for m in models.values()]
    assert all(storages[i].isdisjoint(storages[j]) for i in range(4) for j in range(i + 1, 4))
    # the critic started from the reward model's head, not the policy's zero head
    from transformers import AutoModelForSequenceClassification

    rm = AutoModelForSequenceClassification.from_pretrained(tiny_rm_path, num_labels=1)
    assert torch.equal(initial["critic"]["head.weight"], rm.score.weight)

    # frozen models: no gradients, eval mode, nowhere in the optimizer
    for name in ("reference", "reward"):
        assert all(not p.requires_grad and p.grad is None for p in models[name].parameters()), name
        assert not any(m.training for m in models[name].modules()), name
    optimizer = module.optimizers().optimizer
    trainable = {p for m in (module.policy, module.critic) for p in m.parameters() if p.requires_grad}
    in_groups = {p for group in optimizer.param_groups for p in group["params"]}
    assert in_groups == trainable
    assert set(optimizer.state) == trainable  # Adam moments for exactly the trainable parameters
    assert [g["name"] for g in optimizer.param_groups] == ["policy", "critic"]
    # frozen weights stay out of checkpoints (reloaded from their paths); the reward's running statistics are state
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert any(k.startswith("critic.") for k in state) and not any(
        k.startswith(("reward.model.", "reference.")) for k in state
    )
    assert {k for k in state if k.startswith("reward.")} == {
        "reward.running_count",
        "reward.running_mean",
        "reward.running_m2",
    }


@pytest.mark.slow
def test_vc_ppo_critic_pretraining_leaves_the_policy_bit_identical(tmp_path, tiny_model_path):
    cli, initial, snapshots = _fit(
        tmp_path, tiny_model_path, "configs/vc_ppo.yaml", 4,
        "--model.critic.init_args.pretrain_steps=2", "--model.rollout.init_args.temperature=3.0", *DENSE_REWARD,
    )  # fmt: skip
    assert cli.trainer.global_step == 4 and len(snapshots.policy) == 4
    for i in range(2):  # pretraining iterations: the critic learns, every policy parameter is bit-identical
        assert _equal(snapshots.policy[i], initial["policy"]), f"policy changed in pretraining iteration {i}"
        assert snapshots.policy_in_optimizer_state[i] == 0
    assert not _equal(snapshots.critic[0], initial["critic"]) and not _equal(snapshots.critic[1], snapshots.critic[0])
    changed = [n for n in initial["policy"] if not torch.equal(snapshots.policy[2][n], initial["policy"][n])]
    assert changed, "the policy did not train after pretraining ended"
    assert cli.model.loop_state.optimizer_steps["critic"] > cli.model.loop_state.optimizer_steps["policy"] > 0
    assert all(m in scalars(tmp_path) for m in CRITIC_METRICS)


@pytest.mark.slow
def test_vapo_runs_with_its_package(tmp_path, tiny_model_path):
    cli, initial, snapshots = _fit(
        tmp_path, tiny_model_path, "configs/vapo.yaml", 3,
        "--model.critic.init_args.pretrain_steps=1", "--model.rollout.init_args.temperature=3.0", *DENSE_REWARD,
    )  # fmt: skip
    module = cli.model
    assert module.advantage.lam_actor == "adaptive" and module.advantage.lam_critic == 1.0
    assert [type(t).__name__ for t in module.loss_terms] == ["PositiveNLL"]
    assert (module.surrogate.eps_low, module.surrogate.eps_high) == (0.2, 0.28)
    assert module.reference is None  # no KL: no reference model loaded
    assert _equal(snapshots.policy[0], initial["policy"]) and not _equal(snapshots.policy[-1], initial["policy"])
    logged = scalars(tmp_path)
    assert all(m in logged for m in CRITIC_METRICS)
    assert [s for s, _ in logged["critic/loss"]] == [0, 1, 2]


@pytest.mark.slow
def test_token_budget_packed_iterations_train_like_fixed_micro_batches(tmp_path, tiny_model_path):
    """Old log-probs, values and the update (2 epochs x 2 mini-batches) in packed token-budget micro-batches:
    the same losses and the same weights as fixed-size micro-batches."""
    common = (
        "--model.critic.init_args.pretrain_steps=0",
        "--model.rollout.init_args.temperature=3.0",
        "--seed_everything=3",
        "--trainer.limit_val_batches=0",
        *DENSE_REWARD,
    )
    runs = []
    for i, extra in enumerate([(), ("--model.loop.max_tokens_per_micro_batch=40",)]):
        cli, _, snapshots = _fit(tmp_path / str(i), tiny_model_path, "configs/vc_ppo.yaml", 2, *common, *extra)
        runs.append((scalars(tmp_path / str(i)), snapshots))
    (fixed, fixed_snaps), (packed, packed_snaps) = runs
    for tag in ("policy/loss", "critic/loss", "policy/grad_norm"):
        assert [v for _, v in packed[tag]] == pytest.approx([v for _, v in fixed[tag]], rel=1e-4, abs=1e-6), tag
    for name, value in fixed_snaps.policy[-1].items():
        torch.testing.assert_close(packed_snaps.policy[-1][name], value, rtol=0, atol=1e-6)
