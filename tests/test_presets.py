"""Every shipped preset in configs/ parses and trains for 2 iterations on the tiny model, through the CLI in-process.

The preset's reward is kept and a dense term is added to it (the fraction of digits in the completion),
so a random tiny model gets groups with a reward spread and the optimize phase really runs: every
preset's advantage, surrogate, KL and aggregator are exercised, not just parsed. A preset whose reward
is a learned model gets a tiny random reward model instead, which already scores densely.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import cpu_and_cuda

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ALL_YAMLS = sorted(CONFIGS.glob("*.yaml"))  # presets; fragments that stack on them live in subfolders


def _is_rl_preset(path: Path) -> bool:
    """An `RLModule` preset (lightning-rl fit); other entry points (e.g. the reward-model trainer) have their own tests."""
    return "rollout" in (yaml.safe_load(path.read_text()).get("model") or {})


def _is_vlm_preset(path: Path) -> bool:
    """A preset for a vision-language policy (its data has images): trained on the tiny VLM and pictures instead."""
    return str((yaml.safe_load(path.read_text()).get("data") or {}).get("train_data", "")) == "builtin:count_shapes"


PRESETS = [p for p in ALL_YAMLS if _is_rl_preset(p)]
OTHERS = [p for p in ALL_YAMLS if not _is_rl_preset(p)]
# the CPU run here; on a GPU (pytest -m gpu) the same two iterations on CUDA in bf16-mixed precision
ACCELERATORS = cpu_and_cuda({"accelerator": "cpu"}, {"accelerator": "gpu", "devices": 1, "precision": "bf16-mixed"})


def digit_fraction(completions, **_):
    """Fraction of characters that are digits: varies between samples of even a random tiny model."""
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]


def _reward_override(reward: dict, tmp_path: Path) -> dict:
    if reward["class_path"].endswith("RewardModel"):
        from lightning_rl.recipes.reward_model import save_tiny_reward_model

        path = save_tiny_reward_model(tmp_path / "tiny-rm", seed=3)
        return {**reward, "init_args": {**(reward.get("init_args") or {}), "path": path}}
    dense = {"class_path": "components.reward.FunctionReward", "init_args": {"fn": f"{__name__}.digit_fraction"}}
    return {
        "class_path": "components.reward.Composite",
        "init_args": {"rewards": [reward, dense], "weights": [1.0, 1.0]},
    }


def _picture_rows(tmp_path: Path) -> Path:
    """16 builtin:count_shapes rows as a .jsonl file whose images are PNG files named relative to it."""
    from lightning_rl.data.tasks import count_shapes_rows

    (tmp_path / "pictures").mkdir()
    lines = []
    for i, row in enumerate(count_shapes_rows("train", n_train=16)):
        row["image"].save(tmp_path / "pictures" / f"{i}.png")
        lines.append(json.dumps({**row, "image": f"pictures/{i}.png"}) + "\n")
    train = tmp_path / "pictures.jsonl"
    train.write_text("".join(lines))
    return train


def _policy_path(preset: Path, tiny_model_path: str) -> str:
    """The tiny model, or the preset's own policy where its data is a generated task whose words only that one spells,
    or where a loss term reads a mixture of experts' routers (the shipped tiny MoE)."""
    config = yaml.safe_load(preset.read_text())
    terms = [term["class_path"] for term in config["model"].get("loss_terms") or []]
    if (
        config["data"]["train_data"].startswith("reasoning_gym:")
        or "components.load_balance.LoadBalancingLoss" in terms
    ):
        return str(CONFIGS.parent / config["model"]["policy"]["path"])
    return tiny_model_path


def _override(preset: Path, tmp_path: Path, model_path: str, hardware: dict | None = None) -> Path:
    from lightning_rl.data.tasks import arithmetic_rows

    train = tmp_path / "train.jsonl"
    if _is_vlm_preset(preset):
        train = _picture_rows(tmp_path)
    else:
        train.write_text("".join(json.dumps(row) + "\n" for row in arithmetic_rows("train")[:32]))
    config = yaml.safe_load(preset.read_text())
    reward, source = config["model"]["reward"], config["data"]["train_data"]
    # a generated task's rows carry the entries its scorer reads: keep the source, generate few
    train_data = f"{source}&size=32&test_size=8" if source.startswith("reasoning_gym:") else str(train)
    override = {
        "model": {"policy": {"path": model_path}, "reward": _reward_override(reward, tmp_path)},
        "data": {"train_data": train_data, "val_data": None, "batch_size": 2},
        "trainer": {
            "max_steps": 2,
            **(hardware or {}),
            "default_root_dir": str(tmp_path),
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": str(tmp_path), "name": "run"},
            },
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {
                        "dirpath": str(tmp_path / "checkpoints"),
                        "save_last": True,
                        "every_n_train_steps": 1,
                        "save_top_k": 0,
                    },
                }
            ],
        },
    }
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump(override))
    return path


@pytest.mark.slow
@pytest.mark.server  # the OpenAI-agent preset serves its episodes on the agents' endpoint
@pytest.mark.parametrize("hardware", ACCELERATORS)
@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_trains_two_iterations(preset, hardware, tiny_model_path, tmp_path, request):
    from lightning_rl.cli import main
    from lightning_rl.core.lora import is_lora, merged_state_dict
    from lightning_rl.core.models import ModelSpec, load_causal_lm
    from tests.lightning_rl.cli_runs import scalars, texts

    policy_path = (
        request.getfixturevalue("tiny_vlm_path") if _is_vlm_preset(preset) else _policy_path(preset, tiny_model_path)
    )
    cli = main(["fit", "--config", str(preset), "--config", str(_override(preset, tmp_path, policy_path, hardware))])
    module, trainer = cli.model, cli.trainer
    assert trainer.global_step == 2
    assert trainer.strategy.root_device.type == (
        "cuda" if hardware["accelerator"] == "gpu" else "cpu"
    )  # (fit's end moves the models back to CPU)
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # the optimize phase ran: it moved the policy, or (a critic still pretraining, policy frozen) trained the critic
    if module.critic is not None and module.critic.pretrain_steps >= 2:
        assert "critic/loss" in logged
    else:
        initial = load_causal_lm(ModelSpec(path=policy_path)).state_dict()
        current = (
            merged_state_dict(module.policy) if is_lora(module.policy) else module.policy.state_dict()
        )  # LoRA: adapters folded in
        assert any(not torch.equal(v.cpu(), initial[k]) for k, v in current.items())
        assert "policy/loss" in logged
    bad = {k: v for k, v in logged.items() if not math.isfinite(v)}
    assert not bad, bad
    # what TensorBoard shows: each part of the Composite reward (here the preset's reward + the dense term), sample text
    written = scalars(tmp_path)
    missing = [f"reward/{name}" for name in getattr(module.reward, "names", []) if f"reward/{name}" not in written]
    assert not missing, missing
    assert texts(tmp_path)["samples/text_summary"], "no table of sampled completions"


def test_every_preset_is_found_and_every_other_yaml_has_its_own_test():
    assert {"grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce", "reinforce_pp", "remax"} <= {
        p.stem for p in PRESETS
    }
    tests = [t for t in Path(__file__).parent.rglob("test_*.py") if t.name != Path(__file__).name]
    for config in OTHERS:
        assert any(config.name in t.read_text() for t in tests), (
            f"configs/{config.name} is shipped but no test instantiates it"
        )


@pytest.mark.slow
def test_the_klcov_preset_trains_off_policy_so_its_penalty_acts(tiny_model_path, tmp_path):
    """configs/grpo_klcov.yaml: on one on-policy update |log r| = 0, so the penalty and its gradient were exactly 0 and
    beta 1 trained the same weights as beta 0 (issue 24). With several mini-batches, every one after the first is
    off-policy: the penalty is positive and changes the update."""
    from lightning_rl.cli import main

    preset = CONFIGS / "grpo_klcov.yaml"
    trained = {}
    for beta in (1.0, 0.0):
        root = tmp_path / f"beta{beta:g}"
        root.mkdir()
        cli = main(["fit", "--config", str(preset), "--config", str(_override(preset, root, tiny_model_path)), f"--model.surrogate.init_args.beta={beta}",
                    "--model.optimizer.lr=1e-2"])  # fmt: skip
        trained[beta] = cli.model.policy.state_dict()
        penalty = float(cli.trainer.callback_metrics["policy/cov_penalty"])
        assert (penalty > 0) if beta else (penalty == 0), (beta, penalty)
    assert any(not torch.equal(trained[1.0][k], trained[0.0][k]) for k in trained[1.0])


def _longest_prompt_and_budget(preset: Path) -> tuple[str, int, int, str]:
    """(the policy path, the longest prompt of the preset's own data, the most tokens one response may take, the
    setting that bounds it), the preset composed as `lightning-rl fit` composes it."""
    from lightning_rl.cli import DEFAULT_TRAINER_CONFIG, main

    if preset.stem == "sft":
        from lightning_rl.recipes.sft import main as sft

        cli = sft(["--config", DEFAULT_TRAINER_CONFIG, "--config", str(preset), "--trainer.logger=false"], run=False)
        budget, key = cli.model.hparams.max_completion_length, "model.max_completion_length"
    else:
        cli = main(["--config", DEFAULT_TRAINER_CONFIG, "--config", str(preset), "--trainer.logger=false"], run=False)
        agent = cli.model.agent
        budget, key = cli.model.rollout.params.max_new_tokens, "model.rollout.init_args.max_new_tokens"
        if agent is not None and agent.max_total_tokens is not None:  # unset: each row fits by construction
            budget, key = max(budget, agent.max_total_tokens), "model.agent.init_args.max_total_tokens"
    cli.datamodule.setup("fit")
    return cli.model.policy_spec.path, cli.datamodule.longest_prompt, budget, key


@pytest.mark.parametrize("preset", [*PRESETS, CONFIGS / "sft.yaml"], ids=[*(p.stem for p in PRESETS), "sft"])
def test_every_presets_token_limits_fit_its_policys_context(preset, monkeypatch):
    """The longest prompt of a preset's data plus the most tokens one response may take (per call; an agent's whole
    row where it sets max_total_tokens) fits the positions of the shipped policy it names."""
    from transformers import AutoConfig

    from lightning_rl.core.models import context_length

    monkeypatch.chdir(CONFIGS.parent)  # the presets name the shipped models relative to the repository
    monkeypatch.setattr("sys.argv", ["lightning-rl"])
    path, longest, budget, key = _longest_prompt_and_budget(preset)
    positions = context_length(AutoConfig.from_pretrained(path))
    assert longest + budget <= positions, (
        f"{preset.name}: {longest} prompt tokens + {key} {budget} > {positions} positions"
    )
