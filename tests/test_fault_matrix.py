"""The fault matrix: each fault a researcher can hit, the outcome the framework guarantees, and a test that checks it.

| fault                                                    | outcome                                                             | row (here) / end-to-end test                                                             |
|----------------------------------------------------------|---------------------------------------------------------------------|------------------------------------------------------------------------------------------|
| max_steps not a multiple of every_n_train_steps          | last.ckpt at the final step                                         | test_fit_end / lightning_rl/test_fault.py                                                 |
| exception in a component mid-run                         | last.ckpt at the last completed iteration; resume is exact          | test_component_exception / lightning_rl/test_fault.py                                     |
| Ctrl-C                                                   | last.ckpt at the last completed iteration, exit 1                   | test_ctrl_c / lightning_rl/test_fault.py                                                  |
| SIGTERM (pre-emption)                                    | the iteration finishes, last.ckpt there, exit                       | test_sigterm / lightning_rl/test_fault.py                                                 |
| NaN/inf loss or gradient norm                            | step skipped on every rank, counted; N in a row: error naming LR    | test_nonfinite_update / lightning_rl/test_health.py                                       |
| NaN/inf weights at a save                                | save refused, previous checkpoint kept                              | test_nonfinite_checkpoint / lightning_rl/test_health.py                                   |
| every group degenerate N iterations; entropy collapse    | one warning saying what happened and what to try                    | test_divergence / lightning_rl/test_health.py                                             |
| negative / NaN LR; batch_size <= 0; loop sizes < 1       | error at construction naming the config key                         | test_bad_sizes / lightning_rl/test_validation.py                                          |
| group-relative estimator with group_size 1               | error at construction naming group_size                             | test_group_of_one / lightning_rl/test_validation.py                                       |
| reward that never returns                                | TimeoutError after timeout_s (FunctionReward)                       | test_hung_reward / components/test_reward_timeouts.py                                     |
| slow or crashing reward in PooledReward                  | failure_score (or a hard error) per sample, fractions logged        | test_hung_reward / components/test_reward_timeouts.py                                     |
| stalled SGLang server                                    | progress logged while waiting; SGLangError at deadline_s            | test_stalled_sglang / components/test_sglang_rollout.py (loopback server)                 |
| failed run after an SGLang weight push                   | temporary weights folder removed                                    | test_sglang_weights_folder / components/test_sglang_rollout.py                            |
| kill during a save                                       | stale .<name>.tmp-<pid> swept at the next save                      | test_stale_temporaries / lightning_rl/test_checkpoint.py                                  |
| crafted .ckpt given to export                            | refused (weights_only=True), its code never runs                    | test_crafted_checkpoint / lightning_rl/test_export.py                                     |
| empty or malformed .jsonl                                | error naming file, line and fix                                     | test_bad_jsonl / lightning_rl/test_errors.py                                              |
| .jsonl row without its prompt (missing key, null, number) | one line naming file, row, line and column (exit 1)                 | lightning_rl/test_errors.py::test_a_bad_row_is_one_line_from_the_command_line            |
| bad config value (batch_size -2, refresh_every 0, ...)   | `error: <key>: <message>` at construction, exit 2, no trace         | lightning_rl/test_cli.py::test_a_config_error_is_one_line_and_exit_status_2_at_construction |
| SGLang server that does not answer                       | one line naming its URL and base_url, exit 1                        | lightning_rl/test_cli.py::test_a_server_that_does_not_answer_is_one_line                  |
| two fits of a preset started together; a renamed run     | a version folder each (claimed with an exclusive mkdir); no checkpoint shared | lightning_rl/test_run_folders.py                                               |
| validate / resume on a run's checkpoint                  | the run's config.yaml untouched; latest/ resolved before anything moves | lightning_rl/test_run_folders.py                                                     |
| reward returning numpy / 0-d tensor scores               | accepted; a wrong shape is named as a shape                         | test_numpy_scores / components/test_rewards.py                                            |
| prompt + response past max_position_embeddings          | warning at fit start; truncated prompts counted                     | test_context_overflow / lightning_rl/test_errors.py                                       |
| multi-node launch (2 nodes x 1 process, loopback)        | trains exactly like 1 process                                       | lightning_rl/test_distributed.py::test_two_nodes_of_one_process_on_loopback_equal_one_process |
| max_staleness deeper than the run (100 on 3 steps)       | only the run's rounds sampled; the final validation waits for none  | lightning_rl/test_async.py::test_a_bound_deeper_than_the_run_samples_only_the_runs_rounds |
| LoRA checkpoint resumed with another rank/alpha/targets  | error naming model.policy.lora.<key> and the checkpoint's value     | lightning_rl/test_lora.py::test_resuming_adapters_with_another_lora_spec_names_the_key   |
| model-written code (PythonTool) attacks the trainer      | each attempt fails: no secret, file, socket, kill, survivor, bomb   | test_hostile_tool_code / components/test_sandbox.py                                       |
| no user namespaces for PythonTool's sandbox              | refuses to start naming why; isolation: none warns what is exposed  | test_hostile_tool_code / components/test_sandbox.py                                       |
| tool function that never returns (any thread, C code)    | error result at timeout_s, its worker killed and started again      | test_hung_tool / components/test_function_tool.py                                         |
| Ctrl-C / SIGTERM, async agent run hung in a tool         | the process ends, last.ckpt at the last completed iteration         | test_hung_tool / lightning_rl/test_fault.py (subprocess: agent_calc + loop/async)         |
| tool that prints 100 MB                                  | nothing reaches the trainer's log                                   | test_tool_flood / components/test_function_tool.py                                        |
| tool result with a lone surrogate; Step with bad counts  | error observation; one error naming the environment                 | test_bad_tool_text / components/test_env_tools.py, components/test_multi_turn.py          |
| weight_sync: tensor without CUDA (CPU policy, server in another process) | error at construction naming weight_sync: disk      | test_tensor_sync_without_cuda / components/test_sglang_rollout.py                         |
| SGLang server killed in the middle of a distributed weight push | SGLangError naming its URL; no request sampled until a whole push succeeds | test_sglang_failed_push / components/test_sglang_weight_sync.py (servers in processes) |
| SGLang server that silently keeps an old tensor          | the push's verification fails the iteration naming the server       | test_stale_server_weights / components/test_sglang_weight_sync.py                         |

Each row below runs the fault at the smallest scale that shows it (a Lightning BoringModel for the
checkpoint rows, the components themselves for the rest) and bounds its time where a hang is the fault.
"""

from __future__ import annotations

import gc
import os
import signal
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from components.advantage import GroupNormalized
from components.reward import FunctionReward, PooledReward, as_scores
from components.rollout import HFRollout
from components.rollout.sglang.client import SGLangError, wait_for_answers
from lightning_rl.checkpoint import FiniteCheckpoints
from lightning_rl.core.config import LoopConfig, OptimizerConfig
from lightning_rl.data.prompts import PromptDataModule
from lightning_rl.data.sources import check_jsonl
from lightning_rl.loop.fault import ResumableCheckpoints
from lightning_rl.loop.health import NonFiniteTrainingError, TrainingHealth
from lightning_rl.loop.module import RLModule
from lightning_rl.loop.requirements import check_context_length
from tests.helpers import batch_from_scores
from tests.lightning_rl.rewards import hangs_on_x


class FaultyModel(BoringModel):
    """BoringModel whose training step number ``at`` (0-based) raises, is interrupted or receives a SIGTERM."""

    def __init__(self, fault: str | None = None, at: int = 2):
        super().__init__()
        self.fault, self.at = fault, at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.at and self.fault == "error":
            raise ValueError("component failed")
        if self.global_step == self.at and self.fault == "interrupt":
            raise KeyboardInterrupt
        if self.global_step == self.at and self.fault == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(batch, batch_idx)


def fit(tmp_path: Path, model: BoringModel, max_steps: int = 3) -> dict:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=5, save_top_k=0)
    trainer = Trainer(
        max_steps=max_steps,
        callbacks=[checkpoint, ResumableCheckpoints()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    sigint = signal.getsignal(signal.SIGINT)
    try:
        trainer.fit(model)
    finally:
        signal.signal(signal.SIGINT, sigint)
    return torch.load(tmp_path / "last.ckpt", weights_only=True)


@pytest.mark.slow
def test_fit_end(tmp_path):
    assert fit(tmp_path, FaultyModel())["global_step"] == 3  # every_n_train_steps=5 never fired


@pytest.mark.slow
def test_component_exception(tmp_path):
    with pytest.raises(ValueError, match="component failed"):
        fit(tmp_path, FaultyModel("error"))
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 2


@pytest.mark.slow
def test_ctrl_c(tmp_path):
    with pytest.raises(SystemExit):
        fit(tmp_path, FaultyModel("interrupt"))
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 2


@pytest.mark.slow
def test_sigterm(tmp_path):
    with pytest.raises(SystemExit):  # Lightning's SIGTERMException, raised once the iteration is over
        fit(tmp_path, FaultyModel("sigterm"), max_steps=5)
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 3


def test_nonfinite_update():
    health = TrainingHealth(max_nonfinite_steps=2, degenerate_patience=0, min_entropy=0)
    with pytest.warns(UserWarning, match="optimizer step skipped"):
        assert not health.finite_step([torch.tensor(0.3), torch.tensor(float("nan"))], lr=10.0)
    with pytest.raises(NonFiniteTrainingError, match=r"model\.optimizer\.lr=10.*reward"):
        health.finite_step([torch.tensor(float("inf"))], lr=10.0)


def test_nonfinite_checkpoint():
    trainer, module = type("T", (), {"global_step": 4})(), type("M", (), {"device": torch.device("cpu")})()
    with pytest.raises(NonFiniteTrainingError, match="refusing to save"):
        FiniteCheckpoints().on_save_checkpoint(trainer, module, {"state_dict": {"w": torch.tensor([float("inf")])}})


def test_divergence():
    health = TrainingHealth(max_nonfinite_steps=3, degenerate_patience=3, min_entropy=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            health.observe({"sampling/zero_var_groups": 1.0}, i)
    assert (
        len(caught) == 1 and "degenerate" in str(caught[0].message) and "model.optimizer.lr" in str(caught[0].message)
    )


@pytest.mark.parametrize(
    "build, key",
    [
        (lambda: OptimizerConfig(lr=-1.0), "model.optimizer.lr"),
        (lambda: PromptDataModule(batch_size=-2), "data.batch_size=-2"),
        (lambda: PromptDataModule(batch_size=0), "data.batch_size=0"),
        (lambda: LoopConfig(micro_batch_size=0), "model.loop.micro_batch_size=0"),
    ],
)
def test_bad_sizes(build, key):
    with pytest.raises(ValueError, match=key):
        build()


def test_group_of_one():
    with pytest.raises(ValueError, match="group_size=1"):
        RLModule(rollout=HFRollout(group_size=1), advantage=GroupNormalized())


def test_hung_reward():
    batch, meta = batch_from_scores([0.0, 0.0]), {"prompts": ["p", "p"], "completions": ["ok", "x"]}
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="timeout_s"):
        FunctionReward(hangs_on_x, timeout_s=0.2)(batch.replace(columns=meta))
    pooled = PooledReward(hangs_on_x, workers=2, timeout_s=0.2, failure_score=-1.0)
    try:
        assert pooled(batch.replace(columns=meta)).tolist() == [1.0, -1.0]
    finally:
        pooled.close()
    assert time.monotonic() - start < 5.0


def test_stalled_sglang():
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(time.sleep, 0.0), pool.submit(time.sleep, 2.0)]  # one request never answers in time
        start = time.monotonic()
        with pytest.raises(SGLangError, match=r"1/2 requests answered within deadline_s=0.3"):
            wait_for_answers(futures, deadline_s=0.3, progress_every_s=0.1, urls=["http://gen:30000"])
        assert time.monotonic() - start < 1.0


def test_sglang_weights_folder():
    from components.rollout import SGLangRollout

    rollout = SGLangRollout(base_url="http://127.0.0.1:9")
    folder = rollout._checkpoint_dir("1").parent
    assert folder.is_dir()
    del rollout  # a failed run: close() never called
    gc.collect()
    assert not folder.exists()


def test_stale_temporaries(tmp_path):
    from lightning_rl.checkpoint import AtomicCheckpointIO

    stale = tmp_path / ".last.ckpt.tmp-999999999"  # no such process
    stale.write_bytes(b"half a checkpoint")
    AtomicCheckpointIO().save_checkpoint({"global_step": 1}, tmp_path / "last.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_crafted_checkpoint(tmp_path):
    from tests.support.checkpoints import check_a_crafted_checkpoint_is_refused_without_running_its_code

    check_a_crafted_checkpoint_is_refused_without_running_its_code(tmp_path)


@pytest.mark.parametrize(
    "content, message", [("\n", "is empty"), ('{"prompt": "1"}\n{"prompt": \n', "line 2: not valid JSON")]
)
def test_bad_jsonl(tmp_path, content, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        check_jsonl(str(path))


def test_numpy_scores():
    torch.testing.assert_close(as_scores(np.array([0.5, 1.0], dtype=np.float32), 2, "r"), torch.tensor([0.5, 1.0]))
    torch.testing.assert_close(as_scores([torch.tensor(0.5), np.float64(1.0)], 2, "r"), torch.tensor([0.5, 1.0]))


def test_context_overflow():
    config = type("Config", (), {"max_position_embeddings": 64})()
    with pytest.warns(UserWarning, match="exceeds the policy's max_position_embeddings \\(64\\)"):
        check_context_length(config, 60, 256, 8)


def test_hostile_tool_code(tmp_path, monkeypatch):
    from tests.support.tools import (
        check_no_file_outside_the_scratch_folder_is_read_or_written,
        check_process_count_is_bounded,
        check_without_namespaces_the_tool_refuses_unless_opted_out,
    )

    check_no_file_outside_the_scratch_folder_is_read_or_written(tmp_path, monkeypatch)
    check_process_count_is_bounded()
    check_without_namespaces_the_tool_refuses_unless_opted_out()


def test_hung_tool(tokenizer):
    from components.env import FunctionTool
    from tests.fixtures.tools import echo_or_hang
    from tests.support.multi_turn import check_cancel_ends_the_episodes_of_a_generate_under_way
    from tests.support.tools import attempt, on_a_thread

    tool = FunctionTool(echo_or_hang, timeout_s=0.5)
    start = time.monotonic()
    assert on_a_thread(lambda: attempt(tool, "spin")) == [
        "error: no answer within 0.5 s"
    ]  # stuck in C code, on a background thread
    assert time.monotonic() - start < 5.0
    tool.close()
    check_cancel_ends_the_episodes_of_a_generate_under_way(
        tokenizer
    )  # what the teardown of an interrupted async run does


def test_tool_flood(capfd):
    from tests.support.tools import check_what_a_tool_prints_never_reaches_the_trainers_log

    check_what_a_tool_prints_never_reaches_the_trainers_log(capfd)


def test_bad_tool_text():
    from components.env import FunctionTool, Step, ToolEnvironment, Turn
    from components.env.base import checked_step
    from tests.fixtures.tools import unencodable

    env = ToolEnvironment([FunctionTool(unencodable)])
    step = env.step(None, Turn([], "<call>unencodable()</call>", "stop", 0))
    env.close()
    assert (
        step.observation
        == "<result>error: the tool's result is not valid text (surrogates not allowed at character 3)</result>"
    )
    with pytest.raises(TypeError, match=r"ToolEnvironment.step returned tool_calls=-5, tool_errors=7"):
        checked_step(env, Step("x", None, False, -5, 7))


def test_tensor_sync_without_cuda(monkeypatch):
    from components.rollout import SGLangRollout

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="weight_sync: disk"):
        SGLangRollout(base_url="http://127.0.0.1:9", weight_sync="tensor")


def test_sglang_failed_push():
    from components.rollout.sglang.client import SamplingGate

    gate = SamplingGate()
    gate.close()
    gate.open(failure="SGLang server at http://gen:30000: the weight broadcast of bucket 3/9 failed")
    with pytest.raises(SGLangError, match="http://gen:30000"), gate.sampling():
        pass


@pytest.mark.server
def test_stale_server_weights(tiny_model_path, tokenizer):
    from components.rollout import SGLangRollout
    from lightning_rl.core.models import ModelSpec, load_causal_lm
    from tests.fixtures.sglang_server import FakeSGLangServer

    server = FakeSGLangServer(tiny_model_path).start()
    server.keep_stale = {"model.layers.1.mlp.up_proj.weight"}
    policy = load_causal_lm(ModelSpec(path=tiny_model_path))
    with torch.no_grad():  # an update of that tensor the server misses
        policy.model.layers[1].mlp.up_proj.weight.add_(
            0.1
            * torch.randn(policy.model.layers[1].mlp.up_proj.weight.shape, generator=torch.Generator().manual_seed(0))
        )
    rollout = SGLangRollout(
        base_url=server.url, verify_every=1, verify_tolerance=1e-3, backoff=0.01
    )  # fp32 on both sides
    try:
        rollout.setup(tokenizer)
        with pytest.raises(SGLangError, match=f"{server.url} does not hold the weights just pushed"):
            rollout.sync_weights(policy)
    finally:
        rollout.close()
        server.stop()
