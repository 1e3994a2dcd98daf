"""configs/agent_calc.yaml end to end: multi-turn episodes with the calculator on the shipped tiny tool-using policy,
on HFRollout, with a critic (configs/agent_calc_ppo.yaml) and on the loopback SGLang server (configs/rollout/sglang.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.rollout import MultiTurnRollout, SGLangRollout

REPO = Path(__file__).resolve().parents[3]
AGENT = str(REPO / "configs/agent_calc.yaml")
TINY_CALC = str(REPO / "lightning_rl/assets/tiny-calc")
AGENT_METRICS = [
    "agent/turns_mean",
    "agent/tool_calls_mean",
    "tool/error_frac",
    "agent/observation_tokens_mean",
    "agent/max_turns_frac",
]


def _fit(tmp_path, *configs: str, extra: list[str] = ()):
    from lightning_rl.cli import main

    return main(
        ["fit", "--config", AGENT, *[a for c in configs for a in ("--config", c)],
         "--model.policy.path", TINY_CALC,
         "--data.batch_size", "4", "--data.val_size", "8",
         "--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
         "--trainer.default_root_dir", str(tmp_path),
         "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
         "--trainer.callbacks.init_args.dirpath", str(tmp_path / "ckpt"),
         "--trainer.enable_progress_bar", "false",
         "--trainer.accelerator", "cpu", *extra]
    )  # fmt: skip


def _samples_text(tmp_path) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(
        str(next((tmp_path / "logs").rglob("events.out.tfevents.*")).parent), size_guidance={"tensors": 0}
    )
    events.Reload()
    return "".join(e.tensor_proto.string_val[0].decode() for e in events.Tensors("samples/text_summary"))


@pytest.mark.slow
def test_agent_calc_trains_three_iterations_with_the_calculator(tmp_path, monkeypatch):
    from lightning_rl.loop.reporting import Reporter

    batches, log_iteration = [], Reporter.iteration

    def spy(self, trainer, batch, *args):  # the iteration's batch, as the update saw it
        batches.append(batch)
        return log_iteration(self, trainer, batch, *args)

    monkeypatch.setattr(Reporter, "iteration", spy)
    cli = _fit(tmp_path, extra=["--model.loop.log_samples_every_n_steps", "1"])
    assert isinstance(cli.model.agent, MultiTurnRollout) and cli.trainer.global_step == 3
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    # the last iteration: response_length counts the model's tokens; observations carry no advantage and no reward
    last = batches[-1]
    env = (last.response_mask * (1 - last.action_mask)).bool()  # (B, R) the calculator's tokens
    assert env.any() and metrics["agent/observation_tokens_mean"] == pytest.approx(float(env.sum(-1).float().mean()))
    lengths = last.action_tokens.sum(-1)
    assert metrics["response_length/mean"] == pytest.approx(
        float((lengths * last.sample_mask).sum() / last.sample_mask.sum())
    )
    assert not last.advantages[env].any() and not last.token_rewards[env].any()
    assert all(k in metrics for k in AGENT_METRICS), sorted(metrics)
    # the shipped policy calls the calculator on about a third of the problems; every call is well formed
    assert 0.1 < metrics["agent/tool_calls_mean"] < 1.0 and metrics["tool/error_frac"] == 0.0
    assert 1.0 < metrics["agent/turns_mean"] < 2.0 and metrics["agent/observation_tokens_mean"] > 0
    assert "val/reward" in metrics
    # TensorBoard shows whole transcripts, the environment's parts marked
    assert "<call>" in _samples_text(tmp_path) and "[[env: <result>" in _samples_text(tmp_path)


@pytest.mark.slow
def test_agent_calc_ppo_fragment_trains_a_critic_over_the_models_tokens(tmp_path):
    cli = _fit(
        tmp_path, str(REPO / "configs/agent_calc_ppo.yaml"), extra=["--model.critic.init_args.pretrain_steps", "1"]
    )
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert cli.model.critic is not None and cli.trainer.global_step == 3
    assert "critic/loss" in metrics and "policy/loss" in metrics and metrics["agent/tool_calls_mean"] > 0


@pytest.mark.slow
@pytest.mark.server
def test_agent_calc_on_the_sglang_server(tmp_path):
    from tests.fixtures.sglang_server import FakeSGLangServer

    server = FakeSGLangServer(TINY_CALC).start()
    try:
        cli = _fit(
            tmp_path,
            str(REPO / "configs/rollout/sglang.yaml"),
            extra=[
                f"--model.rollout.init_args.servers.urls=[{server.url}]",
                "--model.rollout.init_args.servers.backoff",
                "0.01",
            ],
        )
    finally:
        server.stop()
    assert isinstance(cli.model.rollout, SGLangRollout) and isinstance(cli.model.agent, MultiTurnRollout)
    # pushed before the first rollout and after each update (the server samples concurrent requests in arrival order,
    # so an iteration may draw only degenerate groups and skip its update)
    updates = cli.model.loop_state.optimizer_steps["policy"]
    assert cli.trainer.global_step == 3 and updates >= 1 and server.weight_version == str(1 + updates)
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert metrics["agent/tool_calls_mean"] > 0
    # the trainer's log-probs of the model's tokens agree with the server's, sampled over several turns
    assert metrics["rollout/logprob_diff_max"] < 1e-4
    # later turns were sent with the whole context (prompt, call, result) as input_ids, one sample each
    later = [
        c
        for c in server.generate_calls
        if c["sampling_params"]["n"] == 1 and not c["sampling_params"].get("ignore_eos")
    ]  # not the weight probes
    assert later and all(c["sampling_params"]["stop_token_ids"] for c in later)


def test_calc_task_splits_and_the_tiny_policys_vocabulary():
    from lightning_rl.core.models import load_tokenizer
    from lightning_rl.data.tasks import calc_rows

    train, test = calc_rows("train"), calc_rows("test")
    assert len(test) == 500 and len(train) + len(test) == 900 * 90
    assert not {r["prompt"] for r in test} & {r["prompt"] for r in train}
    assert all(int(a) * int(b) == int(r["answer"]) for r in test for a, b in [r["prompt"].rstrip("=").split("*")])
    tokenizer = load_tokenizer(TINY_CALC)
    for tag in ("<call>", "</call>", "<result>", "</result>"):  # one token each: the sampler stops on </call>
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1
    assert tokenizer.decode(tokenizer.encode("<call>123*45</call>", add_special_tokens=False)) == "<call>123*45</call>"
