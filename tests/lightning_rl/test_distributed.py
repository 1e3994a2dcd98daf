"""Data parallel and sharded training on CPU with gloo: 2 processes must train exactly like 1 on the same global batch.

The 2-process runs go through the real CLI and the shipped strategy fragments
(configs/strategy/ddp.yaml, fsdp.yaml) in a subprocess, `python -m tests.lightning_rl.dist_probe fit
...`, which Lightning's launcher re-runs for rank 1. One process with data.batch_size=4 and two with 2
each see the same 4 prompts (PromptStream deals the shuffled prompts round-robin to the ranks), and
`SeededRollout` samples each prompt from a seed taken from its tokens, so the global batch is the same
and every difference comes from the reductions: token counts, whitening, gradient averaging and
sharding.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import pythonpath
from tests.support.distributed import (
    SEEDED,
    assert_same_training,
    every_step_checkpoints,
    launch,
    no_checkpoints,
    one_process,
    probe_args,
)
from tests.support.resume import assert_same

from .dist_reductions import reduction_inputs, reductions_worker

REPO = Path(__file__).parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_cross_rank_reductions_equal_single_process_statistics(tmp_path):
    """Global whitening, the aggregators' global normalisers and the metrics, on 2 gloo ranks, vs the whole batch."""
    from components.aggregator import (
        SeqMeanTokenMean,
        SeqMeanTokenSum,
        TokenMean,
        TokenSumNorm,
    )
    from lightning_rl.core.ops import masked_whiten

    out = tmp_path / "reductions.pt"
    torch.multiprocessing.spawn(reductions_worker, args=(2, _free_port(), str(out)), nprocs=2)
    ranks = torch.load(out)
    x, mask = reduction_inputs()
    torch.testing.assert_close(torch.cat([r["whitened"] for r in ranks]), masked_whiten(x, mask), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        torch.cat([r["whitened_scale_only"] for r in ranks]),
        masked_whiten(x, mask, shift_mean=False),
        rtol=0,
        atol=1e-6,
    )
    # whitening each rank on its own would give other numbers: the global statistics matter here
    assert not torch.allclose(masked_whiten(x[:3], mask[:3]), masked_whiten(x, mask)[:3], atol=1e-3)
    for aggregator in (TokenMean(), SeqMeanTokenMean(), SeqMeanTokenSum(), TokenSumNorm(4.0)):
        expected = aggregator(x, mask, aggregator.denominator(mask))
        for r in ranks:
            torch.testing.assert_close(r[type(aggregator).__name__], expected, rtol=0, atol=1e-6)
    for r in ranks:
        torch.testing.assert_close(r["token_mean"], (x * mask).sum() / mask.sum(), rtol=0, atol=1e-6)
        torch.testing.assert_close(r["x_max"], (x * mask).max())


@pytest.fixture(scope="module")
def one_process_grpo(tmp_path_factory, tiny_model_path) -> dict:
    root = tmp_path_factory.mktemp("grpo-1")
    return one_process("configs/grpo.yaml", [*probe_args(root, tiny_model_path, 1, 4), *SEEDED, *no_checkpoints()])


@pytest.fixture(scope="module")
def ddp_grpo(tmp_path_factory, tiny_model_path) -> tuple[dict, Path]:
    root = tmp_path_factory.mktemp("grpo-ddp")
    args = [
        *probe_args(root, tiny_model_path, 2, 2),
        *SEEDED,
        *every_step_checkpoints(root),
        "--config",
        "configs/strategy/ddp.yaml",
    ]
    return launch("configs/grpo.yaml", args), root


@pytest.mark.slow
def test_ddp_grpo_steps_equal_one_process(ddp_grpo, one_process_grpo):
    two, _ = ddp_grpo
    assert_same_training(one_process_grpo, two)
    assert any(abs(loss) > 1e-4 for loss in two["losses"])  # the steps did something


@pytest.mark.slow
def test_ddp_resume_from_a_checkpoint_file_continues_exactly(ddp_grpo, tmp_path, tiny_model_path):
    straight, root = ddp_grpo
    args = [
        *probe_args(tmp_path, tiny_model_path, 2, 2),
        *SEEDED,
        *every_step_checkpoints(tmp_path),
        "--config",
        "configs/strategy/ddp.yaml",
    ]
    resumed = launch("configs/grpo.yaml", [*args, f"--ckpt_path={root / 'checkpoints' / 'step=1.ckpt'}"])
    assert resumed["rewards"] == straight["rewards"][1:] and resumed["losses"] == straight["losses"][1:]
    assert_same(straight["state"], resumed["state"], "state")
    a, b = (torch.load(r / "checkpoints" / "step=2.ckpt", weights_only=False) for r in (root, tmp_path))
    assert_same(
        {k: a[k] for k in ("optimizer_states", "rng", "optimizer_steps", "PromptDataModule")},
        {k: b[k] for k in ("optimizer_states", "rng", "optimizer_steps", "PromptDataModule")},
    )
    assert len(a["rng"]) == 2  # one random state per rank


@pytest.mark.slow
def test_fsdp2_grpo_steps_equal_one_process_and_generation_works_sharded(tmp_path, tiny_model_path, one_process_grpo):
    args = [*probe_args(tmp_path, tiny_model_path, 2, 2), "--trainer.callbacks.generate_lengths=true", *SEEDED]
    two = launch(
        "configs/grpo.yaml", [*args, *every_step_checkpoints(tmp_path), "--config", "configs/strategy/fsdp.yaml"]
    )
    assert_same_training(one_process_grpo, two)
    # the rollout sampled on the sharded policy, also with 1 vs 5 new tokens on the two ranks (ranks stepped together)
    assert two["fsdp_managed"] and two["generated_lengths"] == [1, 5]
    # the checkpoint is a folder of shards without the frozen reference; it exports to a Hugging Face policy
    from safetensors.torch import load_file

    from lightning_rl.export import export_checkpoint

    folder = tmp_path / "checkpoints" / "step=2.ckpt"
    assert (folder / "meta.pt").is_file() and len(list(folder.glob("*.distcp"))) == 2
    written = export_checkpoint(folder, tmp_path / "hf")
    exported = load_file(written["policy"] / "model.safetensors")
    for name, value in exported.items():
        assert torch.equal(value, two["state"][f"policy.{name}"]), name


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_model_path", pytest.param("tiny_moe_path", marks=pytest.mark.soak)])
def test_fsdp2_resume_from_a_sharded_checkpoint_continues_exactly(tmp_path, model, request):
    """2 ranks, real sampling, adaptive KL (sharded reference), 2 shuffled mini-batches: 2 iterations straight ==
    1, stop, resume from the folder of shards, 1 more. Each rank's random state and data position must come back.
    Also a mixture of experts (its 3-D expert tensors sharded over the experts), whose export transformers loads."""
    tiny_model_path = request.getfixturevalue(model)
    extra = [
        "--model.reward=components.reward.FunctionReward",
        "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
        "--model.rollout.init_args.temperature=3.0",
        "--model.rollout.init_args.group_size=2",
        "--model.kl.init_args.coef=0.05",
        "--model.kl.init_args.target=0.01",
        "--model.kl.init_args.horizon=10",
        "--model.loop.num_mini_batches=2",
        "--config",
        "configs/strategy/fsdp.yaml",
    ]
    straight = launch(
        "configs/grpo.yaml",
        [*probe_args(tmp_path / "a", tiny_model_path, 2, 2), *every_step_checkpoints(tmp_path / "a"), *extra],
    )
    resume_from = tmp_path / "a" / "checkpoints" / "step=1.ckpt"
    resumed = launch(
        "configs/grpo.yaml",
        [
            *probe_args(tmp_path / "b", tiny_model_path, 2, 2),
            *every_step_checkpoints(tmp_path / "b"),
            *extra,
            f"--ckpt_path={resume_from}",
        ],
    )
    assert resumed["rewards"] == straight["rewards"][1:]  # iteration 1 sampled the same responses
    assert_same(straight["state"], resumed["state"], "state")
    assert not torch.equal(
        straight["state"]["kl.coef"], torch.tensor(0.05, dtype=torch.float64)
    )  # the controller moved

    from lightning.fabric.utilities.load import _load_distributed_checkpoint

    a = _load_distributed_checkpoint(tmp_path / "a" / "checkpoints" / "step=2.ckpt")
    b = _load_distributed_checkpoint(tmp_path / "b" / "checkpoints" / "step=2.ckpt")
    assert_same(a["optimizer_0"], b["optimizer_0"], "optimizer")  # AdamW moments and step counts, all shards
    assert_same(
        {k: a[k] for k in ("rng", "optimizer_steps", "PromptDataModule")},
        {k: b[k] for k in ("rng", "optimizer_steps", "PromptDataModule")},
    )
    assert not any(k.startswith("reference.") for k in a["state_dict"])  # frozen: reloaded from its path, not stored
    if model == "tiny_moe_path":
        from lightning_rl.core.models import ModelSpec, load_causal_lm
        from lightning_rl.export import export_checkpoint

        written = export_checkpoint(tmp_path / "b" / "checkpoints" / "step=2.ckpt", tmp_path / "hf")
        exported = load_causal_lm(ModelSpec(path=str(written["policy"]))).state_dict()
        assert exported.keys() == {k[len("policy.") :] for k in b["state_dict"] if k.startswith("policy.")}
        for name, value in exported.items():
            assert torch.equal(value, b["state_dict"][f"policy.{name}"]), name


@pytest.mark.slow
def test_ddp_critic_pretraining_and_global_whitening_equal_one_process(tmp_path, tiny_model_path):
    """VC-PPO: iteration 0 trains only the critic, then both; GAE advantages whitened over all ranks.
    DDP needs a gradient for every policy parameter while the policy is idle: the module gives it zeros."""
    extra = [
        *SEEDED,
        "--model.rollout.group_size=2",
        "--model.critic.init_args.pretrain_steps=1",
        "--model.advantage.init_args.whiten=global",
        "--model.loop.num_mini_batches=1",
        "--trainer.callbacks.policy_snapshots=true",
        *no_checkpoints(),
    ]
    one = one_process("configs/vc_ppo.yaml", [*probe_args(tmp_path / "one", tiny_model_path, 1, 4), *extra])
    two = launch(
        "configs/vc_ppo.yaml",
        [*probe_args(tmp_path / "two", tiny_model_path, 2, 2), *extra, "--config", "configs/strategy/ddp.yaml"],
    )
    assert_same_training(one, two)
    initial, after_pretraining, after_update = two["snapshots"]
    assert all(
        torch.equal(initial[n], after_pretraining[n]) for n in initial
    )  # bit-identical while the critic pretrains
    assert not all(torch.equal(initial[n], after_update[n]) for n in initial)
    assert any(k.startswith("critic.") for k in two["state"])


@pytest.mark.slow
@pytest.mark.soak  # make test keeps FSDP2 GRPO and distillation against one process
def test_fsdp2_ppo_rlhf_four_models_equal_one_process(tmp_path, tiny_model_path):
    """Policy, critic (from the reward model), reference and reward model all sharded: the same 2 PPO iterations
    (2 epochs, KL in the reward, GAE whitened over all ranks) as one process."""
    from lightning_rl.recipes.reward_model import save_tiny_reward_model

    reward_model = save_tiny_reward_model(tmp_path / "rm", seed=7)
    extra = [
        *SEEDED[:4],  # the seeded sampler; the reward stays the preset's reward model
        "--model.rollout.group_size=2",
        f"--model.reward.init_args.path={reward_model}",
        "--model.advantage.init_args.whiten=global",
        "--model.loop.ppo_epochs=2",
        "--model.loop.num_mini_batches=1",
        *no_checkpoints(),
    ]
    one = one_process("configs/ppo_rlhf.yaml", [*probe_args(tmp_path / "one", tiny_model_path, 1, 4), *extra])
    two = launch(
        "configs/ppo_rlhf.yaml",
        [*probe_args(tmp_path / "two", tiny_model_path, 2, 2), *extra, "--config", "configs/strategy/fsdp.yaml"],
    )
    assert two["sharded"] == ["critic", "policy", "reference", "reward"] and one["sharded"] == []
    assert_same_training(one, two)
    assert any(k.startswith("critic.head") for k in two["state"]) and not any(
        k.startswith(("reference.", "reward.model.")) for k in two["state"]
    )


@pytest.mark.slow
def test_fsdp2_distillation_with_a_sharded_teacher_equals_one_process(tmp_path, tiny_model_path, tiny_model_path_b):
    """configs/distill.yaml: the teacher is sharded with the policy, scores every sample and gives its whole
    distribution to the exact reverse KL on each micro-batch of the 2 epochs: 2 ranks train as 1 (one mini-batch:
    shuffled mini-batches would hold other samples on 2 ranks than on 1)."""
    extra = [
        *SEEDED,
        f"--model.teacher.init_args.path={tiny_model_path_b}",
        "--model.teacher.init_args.dtype=float32",
        "--model.loop.num_mini_batches=1",
        *no_checkpoints(),
    ]
    one = one_process("configs/distill.yaml", [*probe_args(tmp_path / "one", tiny_model_path, 1, 4), *extra])
    two = launch(
        "configs/distill.yaml",
        [*probe_args(tmp_path / "two", tiny_model_path, 2, 2), *extra, "--config", "configs/strategy/fsdp.yaml"],
    )
    assert two["sharded"] == ["policy", "teacher"] and one["sharded"] == []
    assert_same_training(one, two)
    assert not any(k.startswith("teacher.") for k in two["state"])


@pytest.mark.slow
@pytest.mark.soak  # make test keeps DDP on two processes of one node against one process
def test_two_nodes_of_one_process_on_loopback_equal_one_process(tmp_path, tiny_model_path, one_process_grpo):
    """A multi-node launch as a cluster does it (torchrun, SLURM): each "node" starts its own process with Lightning's
    environment variables (MASTER_ADDR / MASTER_PORT / NODE_RANK / LOCAL_RANK / WORLD_SIZE) and --trainer.num_nodes=2;
    no launcher spawns anything. Two loopback nodes of 1 process each train exactly like 1 process."""
    args = [
        *probe_args(tmp_path, tiny_model_path, 1, 2),
        *SEEDED,
        *no_checkpoints(),
        "--config",
        "configs/strategy/ddp.yaml",
        "--trainer.num_nodes=2",
    ]
    port = _free_port()
    cmd = [sys.executable, "-m", "tests.lightning_rl.dist_probe", "fit", "--config", "configs/grpo.yaml", *args]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": pythonpath(),
    }
    nodes = [
        subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={
                **env,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "NODE_RANK": str(node),
                "LOCAL_RANK": "0",
                "WORLD_SIZE": "2",
            },
        )
        for node in (0, 1)
    ]
    try:
        outputs = [node.communicate(timeout=240)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for node, output in zip(nodes, outputs):
        assert node.returncode == 0, output[-4000:]
    assert_same_training(one_process_grpo, torch.load(tmp_path / "probe.pt", weights_only=False))
