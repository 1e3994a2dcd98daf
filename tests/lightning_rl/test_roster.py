"""The roster of model slots: one module holding all six models, and what checkpointing, the optimizer, export, the
trainer forward and the dry run read from the roster about each."""

from __future__ import annotations

import pytest
import torch

from lightning_rl import checkpoint
from lightning_rl.roster import ROSTER, scorers, trained
from tests.support.probes import probe_batch


@pytest.fixture(scope="module")
def six_models(tmp_path_factory, tiny_model_path, tiny_model_path_b):
    """PPO-RLHF with a reward model, a validation reward, and a teacher: every slot filled."""
    from components.advantage import GAE
    from components.critic import ValueCritic
    from components.kl import KLRegularizer
    from components.reward import ExactMatch, RewardModel
    from components.teacher import HFTeacher
    from lightning_rl.core.models import ModelSpec
    from lightning_rl.loop.module import RLModule
    from lightning_rl.recipes.reward_model import save_tiny_reward_model

    reward_path = save_tiny_reward_model(tmp_path_factory.mktemp("rm"), seed=3)
    module = RLModule(
        policy=ModelSpec(path=tiny_model_path),
        reward=RewardModel(path=reward_path),
        val_reward=ExactMatch(),
        advantage=GAE(),
        critic=ValueCritic(init_from="policy"),
        kl=KLRegularizer(coef=0.05, estimator="k1", placement="reward"),
        teacher=HFTeacher(path=tiny_model_path_b, top_k=2),
    )
    module.configure_model()
    return module


def test_the_roster_names_each_slot_once_in_build_order():
    assert [slot.name for slot in ROSTER] == ["policy", "reference", "critic", "reward", "val_reward", "teacher"]
    assert [slot.name for slot in ROSTER if slot.trains] == ["policy", "critic"]
    assert [slot.name for slot in ROSTER if slot.export_as] == ["policy", "critic"]


def test_checkpoints_leave_out_every_frozen_slot_and_store_the_trained_ones(six_models):
    module = six_models
    left_out = checkpoint.left_out(module)
    frozen = {n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}
    assert left_out == frozen  # every frozen parameter belongs to a reloaded slot here (no LoRA base)
    assert {name.split(".")[0] for name in left_out} == {"reference", "reward", "teacher"}
    stored = set(module.state_dict()) - left_out
    assert {name.split(".")[0] for name in stored} == {"policy", "critic", "kl", "reward"}  # + the RM's running stats
    assert set(checkpoint.export_info(module)) == {"policy", "critic"}


def test_the_optimizer_has_one_group_per_trained_slot(six_models):
    groups = six_models.configure_optimizers().param_groups
    assert [g["name"] for g in groups] == [slot.name for slot, _ in trained(six_models)] == ["policy", "critic"]
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(
        p.numel() for p in six_models.parameters() if p.requires_grad
    )


def test_the_trainer_forward_runs_each_slot_that_scores(six_models):
    module = six_models
    batch = probe_batch(module.tokenizer)
    with torch.no_grad():
        fields = {}
        for scorer in scorers(module):
            fields.update(scorer(batch, 1.0, False))
    expected = {
        "old_logprobs",
        "ref_logprobs",
        "values",
        "teacher_logprobs",
        "teacher_topk_ids",
        "teacher_topk_logprobs",
    }
    assert set(fields) == expected
    scored = module.trainer_forward(batch, 1.0)
    assert scored.teacher_topk_ids.shape == (2, 4, 2) and scored.teacher_topk_ids.dtype == torch.long
    assert bool((scored.teacher_logprobs[0, 3] == 0) & (scored.teacher_topk_logprobs[0, 3] == 0).all())  # padding


def test_dry_run_lists_the_teacher(tmp_path, capsys):
    from lightning_rl.cli import main

    main(["fit", "--config", "configs/distill.yaml", "--dry_run", f"--trainer.default_root_dir={tmp_path}",
          f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    out = capsys.readouterr().out
    assert "model.teacher     HFTeacher" in out
    assert "  teacher    593,792 parameters (0 trainable)" in out
    assert "  policy     " in out and "reference" not in out


def test_a_reward_model_is_sharded_wherever_it_sits_in_the_reward(tmp_path):
    """#46 item 4: the roster looked for a RewardModel at the top level only (``getattr(reward, "model")``): inside a
    Composite or a Shaped it was silently not sharded under FSDP2."""
    from components.reward import Composite, ExactMatch, MissingEOSPenalty, RewardModel, Shaped
    from components.reward.model import scalar_head
    from lightning_rl.recipes.reward_model import save_tiny_reward_model
    from lightning_rl.roster import REWARD

    path = save_tiny_reward_model(tmp_path / "rm", seed=3)
    model = RewardModel(path=path)
    model.setup(None)
    backbone = scalar_head(model.model)[0]
    for reward in (
        model,
        Composite([ExactMatch(), Shaped(model, normalize="running")]),
        Shaped(Composite([model, ExactMatch()])),
        MissingEOSPenalty(model),
    ):
        holder = type("Module", (), {"reward": reward})()
        assert REWARD.shard(holder) == [(backbone, None)], reward.name
    assert REWARD.shard(type("Module", (), {"reward": Composite([ExactMatch()])})()) == []


def test_a_checkpoint_keeps_a_nested_reward_models_statistics_and_leaves_its_weights_out(tmp_path, tiny_model_path):
    """#46 item 4, the round trip: a RewardModel inside a Composite is saved like one at the top level (its frozen
    weights left out and reloaded from its path, its running statistics stored) and a fresh module loads it strictly."""
    from components.reward import Composite, ExactMatch, RewardModel
    from lightning_rl.core.models import ModelSpec
    from lightning_rl.loop.module import RLModule
    from lightning_rl.recipes.reward_model import save_tiny_reward_model

    path = save_tiny_reward_model(tmp_path / "rm", seed=3)

    def build():
        reward = Composite([ExactMatch(), RewardModel(path=path, normalize="running")])
        module = RLModule(policy=ModelSpec(path=tiny_model_path), reward=reward)
        module.configure_model()
        return module

    saved = build()
    part = saved.reward.rewards[1]
    part.running_count.fill_(8), part.running_mean.fill_(0.25), part.running_m2.fill_(3.5)
    ckpt = {"state_dict": saved.state_dict()}
    checkpoint.save(saved, ckpt)
    stored = {k for k in ckpt["state_dict"] if k.startswith("reward.")}
    assert stored == {f"reward.parts.1.running_{s}" for s in ("count", "mean", "m2")}  # no weight of the model
    assert any(k.startswith("reward.parts.1.model.") for k in checkpoint.left_out(saved))

    loaded = build()
    checkpoint.load(loaded, ckpt)  # fills in the left-out weights from the model as loaded
    loaded.load_state_dict(ckpt["state_dict"], strict=True)
    part = loaded.reward.rewards[1]
    assert (float(part.running_count), float(part.running_mean), float(part.running_m2)) == (8.0, 0.25, 3.5)


def test_a_critic_starts_from_a_reward_model_wherever_it_sits_in_the_reward(tmp_path, tiny_model_path):
    """#47: the critic's ``init_from: reward_model`` read ``getattr(reward, "path", None)``, so a RewardModel inside a
    Composite or a Shaped was not found and the run stopped ("needs a RewardModel reward"). ``Reward.model_path`` finds
    it: the value head starts as the reward model's scalar head."""
    from components.advantage import GAE
    from components.critic import ValueCritic
    from components.reward import Composite, ExactMatch, MissingEOSPenalty, RewardModel, Shaped
    from components.reward.model import scalar_head
    from lightning_rl.core.models import ModelSpec
    from lightning_rl.loop.module import RLModule
    from lightning_rl.recipes.reward_model import save_tiny_reward_model

    path = save_tiny_reward_model(tmp_path / "rm", seed=3)
    probe = RewardModel(path=path)
    probe.setup(None)
    head = scalar_head(probe.model)[1].weight.float()[:1]
    for reward in (
        Composite([ExactMatch(), Shaped(RewardModel(path=path), normalize="running")]),
        MissingEOSPenalty(Shaped(RewardModel(path=path))),
    ):
        assert reward.model_path == path
        module = RLModule(
            policy=ModelSpec(path=tiny_model_path),
            reward=reward,
            advantage=GAE(),
            critic=ValueCritic(init_from="reward_model"),
        )
        module.configure_model()
        torch.testing.assert_close(module.critic.head.weight, head, rtol=0, atol=0)
    assert Composite([ExactMatch()]).model_path is None


def test_the_module_is_the_run_the_roster_reads(six_models):
    """Every slot callable receives a `Run`: the attributes the roster reads, typed; an RLModule has them all."""
    from lightning_rl.roster import Run

    assert isinstance(six_models, Run)
    missing = [name for name in Run.__annotations__ if not hasattr(six_models, name)]
    assert not missing
