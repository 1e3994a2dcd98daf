"""End to end through the CLI: fit a few iterations, then validate from the checkpoint."""

import re
import sys
from pathlib import Path

import pytest
import torch

from lightning_rl.cli import main
from lightning_rl.core.models import ModelSpec, load_causal_lm
from tests.helpers import pythonpath
from tests.lightning_rl.cli_runs import cli_args, run_cli, scalars

REPO = Path(__file__).parents[3]

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
        cli_args(
            tmp_path,
            tiny_model_path,
            4,
            "--model.rollout.init_args.temperature=3.0",
            "--model.reward=components.reward.FunctionReward",
            "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
        ),
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
        main(
            ["fit", "--config", "configs/dr_grpo.yaml", "--model.rollout.init_args.max_new_tokens=6", "--print_config"]
        )
    printed = capsys.readouterr().out
    aggregator = printed[printed.index("components.aggregator.TokenSumNorm") :]
    assert "constant: 6.0" in aggregator.splitlines()[2]


def test_a_settings_field_set_to_null_on_the_command_line_is_none():
    """jsonargparse 4.53 passes such a value on as text ("None": an error for ``servers.launch``, the folder "None" for
    ``weights.weight_dir``); the command line sets it through the group's mapping, keeping the group's other fields."""
    cli = main(
        [
            f"--config={REPO / 'configs/rollout/vllm.yaml'}",
            "--model.rollout.init_args.servers.urls=[http://h:1]",
            "--model.rollout.init_args.servers.launch",
            "null",
            "--model.rollout.weights.weight_dir=null",  # jsonargparse's short form, without init_args
            "--trainer.logger=false",
            "--trainer.callbacks=null",
        ],
        run=False,
    )
    servers, weights = cli.model.rollout.connection.servers, cli.model.rollout.pusher.weights
    assert servers.launch is None and servers.urls == ("http://h:1",) and servers.max_concurrency == 64
    assert weights.weight_dir is None and weights.weight_sync == "distributed"  # the rest from the config file


def _cli_error(capsys, *args) -> tuple[int, str]:
    """The exit status and the ``error:`` line; the error is all that is printed (no usage), with where help is."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: ") and err[1].startswith("every option: lightning-rl"), err
    return exit_.value.code, err[0]


def test_help_lists_exactly_the_working_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    listed = set(re.findall(r"^    (\w+) ", out, flags=re.M))
    assert {"fit", "validate", "export"} <= listed and not {"test", "predict"} & listed
    assert "Reinforcement learning for language models" in out and "Lightning Trainer command line tool" not in out


def test_a_mistyped_option_fails_with_a_suggestion_and_no_usage(capsys):
    code, last = _cli_error(capsys, "fit", "--model.advantge", "x")
    assert (
        code == 2 and "unrecognized arguments: --model.advantge" in last and "did you mean --model.advantage?" in last
    )
    assert capsys.readouterr().err == ""  # nothing after it (the 100 lines of usage are gone)


def test_a_suggestion_follows_the_last_names_meaning_not_the_whole_strings_spelling(capsys):
    code, last = _cli_error(capsys, "fit", "--model.optimizer.learning_rate", "3e-4")
    assert "--model.optimizer.learning_rate -> did you mean --model.optimizer.lr?" in last  # not min_lr_ratio
    code, last = _cli_error(capsys, "fit", "--model.loop.ppo_epoch", "2")
    assert "did you mean --model.loop.ppo_epochs?" in last


@pytest.mark.parametrize(
    "yaml_text, suggestion",
    [
        (
            "model:\n  advantage:\n    clas_path: components.advantage.GroupNormalized\n",
            "clas_path -> did you mean class_path?",
        ),
        (
            "model:\n  advantage:\n    class_path: components.advantage.GroupNormalized\n    init_arg: {scale: group}\n",
            "init_arg -> did you mean init_args?",
        ),
        (
            "model:\n  advantage:\n    class_path: components.advantage.GroupNormalized\n    init_args: {scal: group}\n",
            "scal -> did you mean scale?",
        ),
        (
            "model:\n  advantge:\n    class_path: components.advantage.GroupNormalized\n",
            "model.advantge.class_path -> did you mean model.advantage?",
        ),
    ],
    ids=["class_path", "init_args", "init-argument", "key"],
)
def test_a_misspelled_key_in_a_yaml_gets_a_suggestion(tmp_path, capsys, yaml_text, suggestion):
    config = tmp_path / "typo.yaml"
    config.write_text(yaml_text)
    code, last = _cli_error(capsys, "fit", "--config", str(config), "--print_config")
    assert code == 2 and suggestion in last


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data.batch_size=-2"], "error: data.batch_size=-2 must be >= 1"),
        (["--model.kl.init_args.refresh_every=0"], "error: model.kl: KLRegularizer: refresh_every must be >= 1"),
        (["--model.loop.max_tokens_per_micro_batch=0"], "error: model.loop.max_tokens_per_micro_batch=0 must be >= 1"),
        (
            ["--config", "configs/agent_calc.yaml", "--model.agent.init_args.max_turns=0"],
            "error: model.agent: MultiTurnRollout: max_turns (0)",
        ),
    ],
    ids=["batch_size", "refresh_every", "max_tokens_per_micro_batch", "max_turns"],
)
def test_a_config_error_is_one_line_and_exit_status_2_at_construction(capsys, monkeypatch, args, message):
    monkeypatch.delenv("LIGHTNING_RL_DEBUG", raising=False)
    code, last = _cli_error(capsys, "fit", *args)  # raised while the config is built: no model is loaded, nothing runs
    assert code == 2 and last.startswith(message)


def test_the_debug_flag_shows_the_trace_of_a_config_error(monkeypatch):
    monkeypatch.setenv("LIGHTNING_RL_DEBUG", "1")
    with pytest.raises(ValueError, match="data.batch_size=-2 must be >= 1"):
        main(["fit", "--data.batch_size=-2"])


def test_an_abbreviated_option_is_rejected_not_guessed(capsys):
    code, last = _cli_error(capsys, "fit", "--trainer.max_step", "3")
    assert code != 0 and "did you mean --trainer.max_steps?" in last


@pytest.mark.parametrize(
    "flag, route", [("--optimizer", "--model.optimizer"), ("--lr_scheduler", "--model.optimizer.schedule")]
)
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
    assert (
        "--dry_run Compose the run and print its components" in out
        and "--new_run With --ckpt_path: start a new version" in out
    )
    assert "DESIGN" not in out and "STYLE.md" not in out


def _entry(monkeypatch, capsys, *argv) -> str:
    from lightning_rl.command import entry

    monkeypatch.setattr("sys.argv", ["lightning-rl", *argv])
    monkeypatch.setattr("sys.path", list(sys.path))  # entry() moves the working folder to the end of it
    entry()
    return capsys.readouterr().out


def test_dry_run_prints_the_batch_arithmetic_and_trains_nothing(
    tmp_path, tiny_model_path, monkeypatch, capsys, recwarn
):
    out = _entry(
        monkeypatch,
        capsys,
        "fit",
        "--config",
        "configs/dapo.yaml",
        "--dry_run",
        f"--model.policy.path={tiny_model_path}",
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.save_dir={tmp_path}",
        f"--trainer.callbacks.dirpath={tmp_path}/dapo/checkpoints",
    )
    # dapo: 8 prompts x group 8 = 64 samples, 1 epoch x 4 mini-batches, 16 samples x 8 tokens per step
    assert "samples            64 per rank (group_size 8) = 64" in out
    assert "optimizer steps    4 (ppo_epochs 1 x num_mini_batches 4)" in out
    assert "per optimizer step 16 samples, at most 128 response tokens" in out
    assert "model.sampling    DynamicSampling" in out and "policy " in out
    assert "sampling           synchronous (loop.max_staleness 0)" in out
    assert (
        f"logs         {tmp_path}/dapo/version_<next> ({tmp_path}/dapo/latest/checkpoints will link to its checkpoints)"
        in out
    )
    assert f"checkpoints  {tmp_path}/dapo/version_<next>/checkpoints" in out  # where lightning_rl.runs will put them
    assert not any(tmp_path.rglob("*.ckpt")) and not any(tmp_path.rglob("events.*"))
    assert not [w for w in recwarn if "args parameter" in str(w.message)]  # Lightning's warning of args given twice


def test_dry_run_names_asynchronous_sampling(tmp_path, tiny_model_path, monkeypatch, capsys):
    out = _entry(
        monkeypatch,
        capsys,
        "fit",
        "--config",
        "configs/grpo.yaml",
        "--config",
        "configs/loop/async.yaml",
        "--dry_run",
        f"--model.policy.path={tiny_model_path}",
        "--model.rollout.init_args.return_logprobs=true",
        f"--trainer.default_root_dir={tmp_path}",
    )
    assert "model.surrogate   DecoupledClip" in out
    assert "sampling           asynchronous: 1 round(s) ahead, on weights at most 1 version(s) older" in out
    assert "old log-probs from the update's own forward (one optimizer step per batch)" in out  # grpo: 1 x 1


def test_components_lists_every_kind_with_its_formula(monkeypatch, capsys):
    out = _entry(monkeypatch, capsys, "components")
    assert "components.advantage.GroupNormalized" in out and "components.surrogate.CovariancePG" in out
    assert "model.aggregator:" in out and "(1/N) sum_i (1/|o_i|) sum_t l_it" in out


def _printed_config(monkeypatch, capsys, run, argv: list[str]) -> str:
    """What ``run()`` prints with ``argv`` as the command line (``--print_config`` exits 0), run from the repository."""
    monkeypatch.chdir(REPO)
    monkeypatch.setattr("sys.argv", argv)
    monkeypatch.setattr("sys.path", list(sys.path))  # entry() moves the working folder to the end of it
    with pytest.raises(SystemExit) as done:
        run()
    assert done.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "subcommand, module, args, says",
    [
        ("fit", "lightning_rl.cli", ["fit"], "class_path: components.advantage.GroupNormalized"),
        ("sft", "lightning_rl.recipes.sft", ["fit", "--config", "configs/sft.yaml"], "completion_key: completion"),
        (
            "reward-model",
            "lightning_rl.recipes.reward_model",
            ["fit", "--config", "configs/reward_model.yaml"],
            "output_dir: runs/reward_model/final",
        ),
    ],
)
def test_each_job_is_a_subcommand_and_its_python_m_form_keeps_working(
    monkeypatch, capsys, subcommand, module, args, says
):
    """`lightning-rl sft ...` is `python -m lightning_rl.recipes.sft fit ...` (fit when neither fit nor validate is
    given), `lightning-rl reward-model ...` the reward model's; the `python -m` forms run as they did."""
    import runpy

    from lightning_rl.command import entry

    def as_main():
        runpy.run_module(module, run_name="__main__", alter_sys=True)

    old = _printed_config(monkeypatch, capsys, as_main, [module, *args, "--print_config"])
    new = _printed_config(monkeypatch, capsys, entry, ["lightning-rl", subcommand, *args[1:], "--print_config"])
    assert says in old and new == old


def test_distill_is_fit_on_the_distillation_recipe_with_the_users_config_stacked_on_it(monkeypatch, capsys, tmp_path):
    from lightning_rl.command import entry

    mine = tmp_path / "mine.yaml"
    mine.write_text("model:\n  optimizer: {lr: 1.0e-5}\n")
    distill = _printed_config(
        monkeypatch, capsys, entry, ["lightning-rl", "distill", "--config", str(mine), "--print_config"]
    )
    fit = _printed_config(
        monkeypatch,
        capsys,
        entry,
        ["lightning-rl", "fit", "--config", "configs/distill.yaml", "--config", str(mine), "--print_config"],
    )
    assert distill == fit and "class_path: components.teacher.HFTeacher" in fit and "lr: 1.0e-05" in fit


def test_gpu_accelerator_on_cpu_torch_says_how_to_install_cuda(tmp_path, tiny_model_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a GPU host
    with pytest.raises(SystemExit, match="Install the CUDA build"):
        main(["fit", *cli_args(tmp_path, tiny_model_path, 1, "--trainer.accelerator=gpu")])


NOISE = (
    "Seed set to",
    "No seed found",
    "Tip:",
    "Total estimated model params size",
    "Total FLOPs",
    "| Name",
    "`Trainer.fit` stopped",
    "GPU available",
    "TPU available",
    "Loading weights",
    "Writing model shards",
    "FutureWarning",
    "Traceback",
)


def _console(*args, cwd=None, env=None) -> str:
    """Everything a real command prints (stdout and stderr), run as a user runs it."""
    import os
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd or REPO,
        env={**os.environ, **(env or {})},
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    return run.stdout + run.stderr


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.soak  # make test keeps the in-process fit's console
def test_console_of_a_fit_on_sglang_and_its_validate_has_none_of_the_noise(tmp_path, tiny_model_path):
    from tests.fixtures.sglang_server import FakeSGLangServer

    server = FakeSGLangServer(tiny_model_path).start()
    try:
        args = [
            a
            for a in cli_args(
                tmp_path,
                tiny_model_path,
                2,
                "--data.val_size=4",
                "--model.rollout.init_args.temperature=3.0",
                "--model.reward=components.reward.FunctionReward",
                "--model.reward.fn=tests.lightning_rl.rewards.digit_count",
                "--config",
                str(REPO / "configs/rollout/sglang.yaml"),
                f"--model.rollout.init_args.servers.urls=[{server.url}]",
            )
            if not a.startswith(("--trainer.enable_progress_bar", "--trainer.enable_model_summary"))
        ]
        fit = _console("-m", "lightning_rl.cli", "fit", *args)
        assert (
            server.calls.count("/update_weights_from_disk") >= 2
        )  # a weight push per iteration (and one at the start): no bar for any
        validate = _console(
            "cli.py", "validate", *args, f"--ckpt_path={tmp_path}/checkpoints/last.ckpt", "--trainer.logger=false"
        )
    finally:
        server.stop()
    for noise in NOISE:
        assert noise not in fit and noise not in validate, noise
    assert "RL iterations" in fit and "samples at iteration 1" in fit  # the bar and the table are there
    assert "val/reward" in validate


@pytest.mark.soak
@pytest.mark.slow
def test_lora_fit_and_export_print_no_deprecation_of_transformers(tmp_path, tiny_model_path):
    args = cli_args(tmp_path, tiny_model_path, 1, "--data.val_data=null", config="configs/grpo_lora.yaml")
    fit = _console("cli.py", "fit", *args)
    export = _console(
        "cli.py", "export", f"{tmp_path}/checkpoints/last.ckpt", str(tmp_path / "hf")
    )  # through the shim too
    for noise in NOISE:
        assert noise not in fit and noise not in export, noise
    assert (tmp_path / "hf" / "policy").is_dir()


@pytest.mark.slow
def test_a_server_that_does_not_answer_is_one_line(tmp_path, tiny_model_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = cli_args(
        tmp_path,
        tiny_model_path,
        1,
        "--data.val_data=null",
        "--config",
        str(REPO / "configs/rollout/sglang.yaml"),
        f"--model.rollout.init_args.servers.urls=[http://127.0.0.1:{port}]",
        "--model.rollout.init_args.servers.max_retries=0",
    )
    run = subprocess.run(
        [sys.executable, "-m", "lightning_rl.cli", "fit", *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(f"error: SGLang server at http://127.0.0.1:{port}")


@pytest.mark.slow
def test_a_project_with_its_own_components_folder_does_not_shadow_ours(tmp_path, tiny_model_path):
    """`python -m lightning_rl.cli` from a project whose folder has a components/ package of its own: ours is used,
    and the project's modules still import by dotted path (a reward in the working folder)."""
    import os
    import subprocess
    import sys

    (tmp_path / "components").mkdir()
    (tmp_path / "components" / "__init__.py").write_text("raise ImportError('the project's own components package')\n")
    (tmp_path / "project_rewards.py").write_text("def score(completions, **_):\n    return [1.0] * len(completions)\n")
    env = {**os.environ, "PYTHONPATH": pythonpath()}
    args = [
        "fit",
        "--dry_run",
        f"--model.policy.path={tiny_model_path}",
        "--model.reward=components.reward.FunctionReward",
        "--model.reward.fn=project_rewards.score",
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.save_dir={tmp_path}",
    ]
    run = subprocess.run(
        [sys.executable, "-m", "lightning_rl.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "model.reward      FunctionReward" in run.stdout


def test_a_reward_in_the_working_folder_imports_by_dotted_path(tmp_path, tiny_model_path, monkeypatch, capsys):
    import sys

    (tmp_path / "my_rewards_here.py").write_text("def score(completions, **_):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in sys.path if p not in ("", str(tmp_path))])
    out = _entry(
        monkeypatch,
        capsys,
        "fit",
        "--dry_run",
        f"--model.policy.path={tiny_model_path}",
        "--model.reward=components.reward.FunctionReward",
        "--model.reward.fn=my_rewards_here.score",
        f"--trainer.default_root_dir={tmp_path}",
    )
    assert "model.reward      FunctionReward" in out
