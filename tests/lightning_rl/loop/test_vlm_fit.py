"""The visual task end to end through the CLI: the shipped preset on the shipped tiny VLM for a few iterations (validation
before and after, the samples table and TensorBoard images), PPO with a critic and a reference on a VLM, LoRA with the
vision tower untouched, export, and packing refused before anything runs wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from lightning_rl.core.models import ModelSpec, load_causal_lm
from tests.lightning_rl.cli_runs import cli_args, run_cli, scalars, texts

REPO = Path(__file__).resolve().parents[3]
PRESET = "configs/vlm_count_shapes.yaml"
ASSET = REPO / "lightning_rl" / "assets" / "tiny-vlm"


def images(root: Path) -> dict[str, list[int]]:
    """TensorBoard image summaries of the newest run under ``root/run``: tag -> steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (version,) = sorted((root / "run").glob("version_*"))[-1:]
    events = EventAccumulator(str(version), size_guidance={"images": 0})
    events.Reload()
    return {tag: [e.step for e in events.Images(tag)] for tag in events.Tags()["images"]}


@pytest.mark.slow
def test_the_shipped_visual_task_runs_a_few_iterations(tmp_path):
    cli = run_cli(
        "fit",
        cli_args(
            tmp_path, str(ASSET), 3, "--model.loop.log_samples_every_n_steps=2", "--data.val_size=20", config=PRESET
        ),
    )
    assert cli.trainer.global_step == 3
    written = scalars(tmp_path)
    assert [step for step, _ in written["val/reward"]] == [0, 2, 3]  # before the first iteration, at 2, after the last
    assert 0 < written["val/reward"][0][1] < 1  # the shipped policy is well below perfect and not hopeless
    # the two rows' pictures at iterations 1 and 3, and the held-out curve the summary draws at the end
    assert set(images(tmp_path)) == {"samples/0", "samples/1", "val/curve"} and images(tmp_path)["samples/0"] == [1, 3]
    table = texts(tmp_path)["samples/text_summary"][0][1]
    assert "| images |" in table and "1 image (56x56)" in table
    frozen = load_causal_lm(ModelSpec(path=str(ASSET)))
    trained = cli.model.policy.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in frozen.state_dict().items() if k.startswith("model.visual."))
    assert any(not torch.equal(v, trained[k]) for k, v in frozen.state_dict().items() if ".language_model." in k)


@pytest.mark.slow
def test_ppo_with_a_critic_and_a_reference_on_a_vlm(tiny_vlm_path, tmp_path):
    override = tmp_path / "ppo.yaml"
    override.write_text(yaml.safe_dump({"model": {
        "kl": {"class_path": "components.kl.KLRegularizer", "init_args": {"coef": 0.05, "estimator": "k1", "placement": "reward"}},
        "advantage": {"class_path": "components.advantage.GAE", "init_args": {"gamma": 1.0, "lam_actor": 0.95, "whiten": "batch"}},
        "critic": {"class_path": "components.critic.ValueCritic", "init_args": {"init_from": "policy", "value_clip": 0.2}},
        "rollout": {"class_path": "components.rollout.HFRollout", "init_args": {"group_size": 2, "max_new_tokens": 3}},
        "loop": {"ppo_epochs": 2, "num_mini_batches": 2, "micro_batch_size": 3, "forward_batch_size": 3},
    }}))  # fmt: skip
    cli = run_cli(
        "fit", cli_args(tmp_path, tiny_vlm_path, 2, "--config", str(override), "--data.val_size=4", config=PRESET)
    )
    logged = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert cli.model.reference is not None and cli.model.critic is not None
    assert {"critic/loss", "policy/loss", "reward/shaped_mean"} <= set(logged), sorted(logged)
    assert all(v == v for v in logged.values())  # no NaN


@pytest.mark.slow
def test_lora_on_a_vlm_trains_and_exports(tiny_vlm_path, tmp_path):
    from lightning_rl.export import export_checkpoint

    cli = run_cli(
        "fit", cli_args(tmp_path, tiny_vlm_path, 2, "--model.policy.lora.rank=4", "--data.val_size=4", config=PRESET)
    )
    adapted = [n for n, p in cli.model.policy.named_parameters() if p.requires_grad]
    assert adapted and all(".lora_" in n and ".language_model." in n for n in adapted)
    written = export_checkpoint(tmp_path / "checkpoints" / "last.ckpt", tmp_path / "hf")
    exported = load_causal_lm(ModelSpec(path=str(written["policy"])))
    assert type(exported).__name__ == "Qwen2VLForConditionalGeneration"
    assert (written["policy"] / "preprocessor_config.json").exists() and (
        written["policy"] / "chat_template.jinja"
    ).exists()


def test_token_budget_packing_is_refused_for_images_before_training(tiny_vlm_path, tmp_path):
    with pytest.raises(
        ValueError,
        match="model.loop.max_tokens_per_micro_batch: token-budget packing is not supported for prompts with images",
    ):
        run_cli(
            "fit",
            cli_args(
                tmp_path,
                tiny_vlm_path,
                1,
                "--model.loop.max_tokens_per_micro_batch=256",
                "--data.val_size=2",
                config=PRESET,
            ),
        )
