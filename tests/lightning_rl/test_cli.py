"""End to end through the CLI: fit a few iterations, then validate from the checkpoint."""

import re

import pytest
import torch

from lightning_rl.cli import main
from lightning_rl.core.models import ModelSpec, load_causal_lm

from .cli_runs import cli_args, run_cli, scalars

REQUIRED_METRICS = [
    "reward/mean",
    "reward/std",
    "response_length/mean",
    "response_length/truncated_frac",
    "policy/loss",
    "policy/clipfrac",
    "policy/approx_kl",
    "policy/entropy",
    "policy/grad_norm",
    "advantage/mean",
    "advantage/std",
    "time/rollout_s",
    "time/score_s",
    "time/optimize_s",
    "time/sync_s",
    "throughput/tokens_per_s",
    "val/reward",
]


@pytest.mark.slow
def test_fit_changes_parameters_logs_metrics_and_checkpoints(tmp_path, tiny_model_path):
    # temperature 3 makes the random tiny model's answers varied enough that some are right
    cli = run_cli(
        "fit",
        cli_args(tmp_path, tiny_model_path, 4, "--model.rollout.init_args.temperature=3.0", "--model.reward=components.reward.FunctionReward", "--model.reward.fn=tests.lightning_rl.rewards.digit_count"),
    )
    module = cli.model
    initial = load_causal_lm(ModelSpec(path=tiny_model_path))
    changed = [n for n, p in module.policy.named_parameters() if not torch.equal(p.detach(), initial.get_parameter(n))]
    assert changed, "no policy parameter changed"
    assert cli.trainer.global_step == 4  # one global step per RL iteration
    logged = scalars(tmp_path)
    missing = [m for m in REQUIRED_METRICS if m not in logged]
    assert not missing, missing
    assert [s for s, _ in logged["reward/mean"]] == [0, 1, 2, 3]
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    assert checkpoint.exists()
    state = torch.load(checkpoint, weights_only=False)["state_dict"]
    assert any(k.startswith("policy.") for k in state) and not any(k.startswith("reference.") for k in state)
    # validate from the checkpoint reports the trained policy's score
    out = run_cli("validate", cli_args(tmp_path / "val", tiny_model_path, 1, f"--ckpt_path={checkpoint}"))
    assert "val/reward" in out.trainer.callback_metrics


def test_print_config_of_the_default(capsys):
    from lightning_rl.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--print_config"])
    printed = capsys.readouterr().out
    assert "components.rollout.HFRollout" in printed and "builtin:arithmetic" in printed


def test_relative_interpolation_follows_stacked_overrides(capsys):
    from lightning_rl.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--config", "configs/dr_grpo.yaml", "--model.rollout.init_args.max_new_tokens=6", "--print_config"])
    printed = capsys.readouterr().out
    aggregator = printed[printed.index("components.aggregator.TokenSumNorm") :]
    assert "constant: 6.0" in aggregator.splitlines()[2]


def _cli_error(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    return exit_.value.code, capsys.readouterr().err.strip().splitlines()[-1]


def test_help_lists_exactly_the_working_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    listed = set(re.findall(r"^    (\w+) ", out, flags=re.M))
    assert {"fit", "validate", "export"} <= listed and not {"test", "predict"} & listed
    assert "Reinforcement learning for language models" in out and "Lightning Trainer command line tool" not in out


def test_a_mistyped_option_fails_with_a_suggestion_on_the_last_line(capsys):
    code, last = _cli_error(capsys, "fit", "--model.advantge", "x")
    assert code != 0 and "unrecognized arguments: --model.advantge" in last and "did you mean --model.advantage?" in last


def test_an_abbreviated_option_is_rejected_not_guessed(capsys):
    code, last = _cli_error(capsys, "fit", "--trainer.max_step", "3")
    assert code != 0 and "did you mean --trainer.max_steps?" in last


@pytest.mark.parametrize("flag, route", [("--optimizer", "--model.optimizer"), ("--lr_scheduler", "--model.optimizer.schedule")])
def test_lightnings_optimizer_flags_are_not_offered_but_routed(capsys, flag, route):
    code, last = _cli_error(capsys, "fit", flag, "Adam")
    assert code != 0 and f"{flag} -> did you mean {route}?" in last


def test_fit_help_documents_the_loop_and_optimizer_options(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # help text is wrapped at the terminal width
    assert "--model.loop.ppo_epochs PPO_EPOCHS Passes over each rollout batch." in out
    assert "--model.loop.val_samples VAL_SAMPLES Responses sampled per held-out prompt" in out
    assert "--model.optimizer.max_grad_norm MAX_GRAD_NORM Clip this group's gradients" in out
    assert "DESIGN" not in out and "STYLE.md" not in out


def _entry(monkeypatch, capsys, *argv) -> str:
    from lightning_rl.cli import entry

    monkeypatch.setattr("sys.argv", ["lightning-rl", *argv])
    entry()
    return capsys.readouterr().out


def test_dry_run_prints_the_batch_arithmetic_and_trains_nothing(tmp_path, tiny_model_path, monkeypatch, capsys, recwarn):
    out = _entry(monkeypatch, capsys, "fit", "--config", "configs/dapo.yaml", "--dry_run", f"--model.policy.path={tiny_model_path}", f"--trainer.default_root_dir={tmp_path}",
                 f"--trainer.logger.save_dir={tmp_path}", f"--trainer.callbacks.dirpath={tmp_path}/dapo/checkpoints")
    # dapo: 8 prompts x group 8 = 64 samples, 1 epoch x 4 mini-batches, 16 samples x 8 tokens per step
    assert "samples            64 per rank (group_size 8) = 64" in out
    assert "optimizer steps    4 (ppo_epochs 1 x num_mini_batches 4)" in out
    assert "per optimizer step 16 samples, at most 128 response tokens" in out
    assert "model.sampling    DynamicSampling" in out and "policy " in out
    assert "sampling           synchronous (loop.max_staleness 0)" in out
    assert f"logs         {tmp_path}/dapo/version_<next> ({tmp_path}/dapo/latest will link to it)" in out
    assert f"checkpoints  {tmp_path}/dapo/version_<next>/checkpoints" in out  # where lightning_rl.loop.runs will put them
    assert not any(tmp_path.rglob("*.ckpt")) and not any(tmp_path.rglob("events.*"))
    assert not [w for w in recwarn if "args parameter" in str(w.message)]  # Lightning's warning of args given twice


def test_dry_run_names_asynchronous_sampling(tmp_path, tiny_model_path, monkeypatch, capsys):
    out = _entry(monkeypatch, capsys, "fit", "--config", "configs/grpo.yaml", "--config", "configs/loop/async.yaml", "--dry_run",
                 f"--model.policy.path={tiny_model_path}", "--model.rollout.init_args.return_logprobs=true", f"--trainer.default_root_dir={tmp_path}")
    assert "model.surrogate   DecoupledClip" in out
    assert "sampling           asynchronous: 1 round(s) ahead, on weights at most 1 version(s) older" in out


def test_components_lists_every_kind_with_its_formula(monkeypatch, capsys):
    out = _entry(monkeypatch, capsys, "components")
    assert "components.advantage.GroupNormalized" in out and "components.surrogate.CovariancePG" in out
    assert "model.aggregator:" in out and "(1/N) sum_i (1/|o_i|) sum_t l_it" in out


def test_gpu_accelerator_on_cpu_torch_says_how_to_install_cuda(tmp_path, tiny_model_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a GPU host
    with pytest.raises(SystemExit, match="Install the CUDA build"):
        main(["fit", *cli_args(tmp_path, tiny_model_path, 1, "--trainer.accelerator=gpu")])


@pytest.mark.slow
def test_console_has_none_of_the_noise_a_newcomer_cannot_act_on(tmp_path, tiny_model_path):
    import subprocess
    import sys

    args = [a for a in cli_args(tmp_path, tiny_model_path, 1, "--data.val_data=null") if not a.startswith(("--trainer.enable_progress_bar", "--trainer.enable_model_summary"))]
    run = subprocess.run([sys.executable, "-m", "lightning_rl.cli", "fit", *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    console = run.stdout + run.stderr
    for noise in ("Seed set to", "No seed found", "Tip:", "Total estimated model params size", "Total FLOPs", "| Name", "`Trainer.fit` stopped"):
        assert noise not in console, noise
    assert "RL iterations" in console  # the bar is there


def test_a_reward_in_the_working_folder_imports_by_dotted_path(tmp_path, tiny_model_path, monkeypatch, capsys):
    import sys

    (tmp_path / "my_rewards_here.py").write_text("def score(completions, **_):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in sys.path if p not in ("", str(tmp_path))])
    out = _entry(monkeypatch, capsys, "fit", "--dry_run", f"--model.policy.path={tiny_model_path}", "--model.reward=components.reward.FunctionReward", "--model.reward.fn=my_rewards_here.score", f"--trainer.default_root_dir={tmp_path}")
    assert "model.reward      FunctionReward" in out
