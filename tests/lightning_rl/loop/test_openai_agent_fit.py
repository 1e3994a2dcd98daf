"""configs/openai_agent.yaml end to end: the shipped example agent (examples/openai_calc_agent.py, written with the
`openai` package, multi-turn with a calculator tool) trained through the trainer's endpoint, on HFRollout and on the
loopback SGLang server (configs/rollout/sglang.yaml)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from components.rollout import OpenAIAgent, SGLangRollout, VerifiersAgent

REPO = Path(__file__).resolve().parents[3]
CONFIG = str(REPO / "configs/openai_agent.yaml")
TINY_CALC = str(REPO / "lightning_rl/assets/tiny-calc")


def _fit(tmp_path, *configs: str, extra: list[str] = ()):
    from lightning_rl.cli import main

    return main(
        ["fit", "--config", CONFIG, *[a for c in configs for a in ("--config", c)],
         "--model.policy.path", TINY_CALC,
         "--model.agent.init_args.chat_template", str(REPO / "lightning_rl/assets/tiny-calc/chat_template.jinja"),
         "--data.batch_size", "4", "--data.val_size", "8",
         "--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
         "--trainer.default_root_dir", str(tmp_path),
         "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
         "--trainer.callbacks.init_args.dirpath", str(tmp_path / "ckpt"),
         "--trainer.enable_progress_bar", "false",
         "--trainer.accelerator", "cpu", *extra]
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.server
def test_the_example_openai_agent_trains_three_iterations_with_its_tool(tmp_path, monkeypatch):
    from lightning_rl.loop.reporting import Reporter

    batches, log_iteration = [], Reporter.iteration

    def spy(self, trainer, batch, *args):
        batches.append(batch)
        return log_iteration(self, trainer, batch, *args)

    monkeypatch.setattr(Reporter, "iteration", spy)
    cli = _fit(tmp_path)
    assert isinstance(cli.model.agent, OpenAIAgent) and cli.trainer.global_step == 3
    assert cli.model.loop_state.optimizer_steps["policy"] >= 1
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert (
        metrics["agent/tool_calls_mean"] > 0
        and metrics["agent/error_frac"] == 0
        and metrics["agent/prefix_breaks"] == 0
    )
    assert (
        metrics["rollout/logprob_diff_max"] < 1e-4
    )  # the trainer's log-probs of the served tokens equal the sampler's
    last = batches[-1]
    results = (
        last.response_mask * (1 - last.action_mask)
    ).bool()  # the calculator's results: in the rows, never trained
    assert results.any() and "val/reward" in metrics
    assert any("<result>" in t for t in last.columns["transcripts"])


@pytest.mark.slow
@pytest.mark.server
def test_the_example_openai_agent_on_the_sglang_server(tmp_path):
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
    assert isinstance(cli.model.rollout, SGLangRollout) and isinstance(cli.model.agent, OpenAIAgent)
    assert cli.trainer.global_step == 3
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert metrics["agent/tool_calls_mean"] > 0 and metrics["rollout/logprob_diff_max"] < 1e-4
    # a later call is sent with the whole recorded context (prompt, call, result) as input_ids
    assert any(
        "<result>"
        in server.tokenizer.decode(c["input_ids"][0] if isinstance(c["input_ids"][0], list) else c["input_ids"])
        for c in server.generate_calls
    )


@pytest.mark.slow
@pytest.mark.server
def test_a_two_turn_agent_fits_the_presets_token_limit_and_the_run_says_where_it_comes_from(
    tmp_path, monkeypatch, caplog
):
    """A follow-up question in the conversation (tests/support/two_turn_agent.py): with the preset's former
    max_total_tokens of 40, 38% of its episodes failed (measured: 0.45, 0.34, 0.34, 0.41 in four iterations of 128);
    unset, each row fills the policy's 64 positions after its prompt, and the run says so once."""
    from lightning_rl.loop.reporting import Reporter

    errors, log_iteration = [], Reporter.iteration

    def spy(self, trainer, batch, *args):
        errors.append(sum(e is not None and e != "" for e in batch.columns["agent_error"]))
        return log_iteration(self, trainer, batch, *args)

    monkeypatch.setattr(Reporter, "iteration", spy)
    caplog.set_level(logging.INFO)
    _fit(
        tmp_path,
        extra=[
            "--model.agent.init_args.function=tests.support.two_turn_agent.two_turn_agent",
            "--data.batch_size=16",
            "--trainer.max_steps=2",
            "--data.val_data=null",
        ],
    )
    said = [r.getMessage() for r in caplog.records if "max_total_tokens is not set" in r.getMessage()]
    assert said == [
        "model.agent.init_args.max_total_tokens is not set: each episode's tokens fill the policy's context "
        "(max_position_embeddings 64) less its prompt; 57 after the longest prompt (7 tokens). Set it to cap them"
    ]
    assert errors == [0, 0]  # 128 episodes each


@pytest.mark.slow
@pytest.mark.server
def test_the_docs_verifiers_example_trains_and_validates_on_other_problems(tmp_path):
    pytest.importorskip("verifiers")
    page = (REPO / "docs" / "agents.md").read_text()
    section = page[page.index("An example environment ships in") :]
    shown = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    assert shown in (REPO / "examples/verifiers_calc_env.py").read_text()  # the page shows the file as it is
    config = tmp_path / "verifiers_calc.yaml"
    config.write_text(re.search(r"```yaml\n(.*?)```", section, flags=re.S).group(1))
    cli = _fit(tmp_path, str(config), extra=["--trainer.max_steps", "2", "--data.val_size", "16"])
    assert isinstance(cli.model.agent, VerifiersAgent) and cli.trainer.global_step == 2
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert metrics["agent/error_frac"] == 0 and metrics["agent/tool_calls_mean"] > 0 and "val/reward" in metrics
    train, val = set(cli.datamodule.train_rows["prompt"]), set(cli.datamodule.val_rows[0]["prompt"])
    assert len(val) == 16 and len(val - train) >= 12  # another seed's problems (a few products may coincide)
