"""The fault matrix: each fault a researcher can hit, the outcome the framework guarantees, and a test that checks it.

| fault                                                    | outcome                                                             | row (here) / end-to-end test                                                             |
|----------------------------------------------------------|---------------------------------------------------------------------|------------------------------------------------------------------------------------------|
| max_steps not a multiple of every_n_train_steps          | last.ckpt at the final step                                         | test_fit_end / lightning_rl/callbacks/test_fault.py                                                 |
| exception in a component mid-run                         | last.ckpt at the last completed iteration; resume is exact          | test_component_exception / lightning_rl/callbacks/test_fault.py                                     |
| Ctrl-C                                                   | last.ckpt at the last completed iteration, exit 1                   | test_ctrl_c / lightning_rl/callbacks/test_fault.py                                                  |
| SIGTERM (pre-emption)                                    | the iteration finishes, last.ckpt there, exit                       | test_sigterm / lightning_rl/callbacks/test_fault.py                                                 |
| NaN/inf loss or gradient norm                            | step skipped on every rank, counted; N in a row: error naming LR    | test_nonfinite_update / lightning_rl/loop/test_health.py                                       |
| NaN/inf weights at a save                                | save refused, previous checkpoint kept                              | test_nonfinite_checkpoint / lightning_rl/loop/test_health.py                                   |
| every group degenerate N iterations; entropy collapse    | one warning saying what happened and what to try                    | test_divergence / lightning_rl/loop/test_health.py                                             |
| negative / NaN LR; batch_size <= 0; loop sizes < 1       | error at construction naming the config key                         | test_bad_sizes / lightning_rl/loop/test_validation.py                                          |
| group-relative estimator with group_size 1               | error at construction naming group_size                             | test_group_of_one / lightning_rl/loop/test_validation.py                                       |
| reward that never returns                                | TimeoutError after timeout_s (FunctionReward)                       | test_hung_reward / components/test_reward_timeouts.py                                     |
| slow or crashing reward in PooledReward                  | failure_score (or a hard error) per sample, fractions logged        | test_hung_reward / components/test_reward_timeouts.py                                     |
| stalled SGLang server                                    | progress logged while waiting; SGLangError at deadline_s            | test_stalled_sglang / components/test_sglang_rollout.py (loopback server)                 |
| failed run after an SGLang weight push                   | temporary weights folder removed                                    | test_sglang_weights_folder / components/test_sglang_rollout.py                            |
| kill during a save                                       | stale .<name>.tmp-<pid> swept at the next save                      | test_stale_temporaries / lightning_rl/test_checkpoint.py                                  |
| crafted .ckpt given to export                            | refused (weights_only=True), its code never runs                    | test_crafted_checkpoint / lightning_rl/test_export.py                                     |
| empty or malformed .jsonl                                | error naming file, line and fix                                     | test_bad_jsonl / lightning_rl/cli/test_errors.py                                              |
| .jsonl row without its prompt (missing key, null, number) | one line naming file, row, line and column (exit 1)                 | lightning_rl/cli/test_errors.py::test_a_bad_row_is_one_line_from_the_command_line            |
| bad config value (batch_size -2, refresh_every 0, ...)   | `error: <key>: <message>` at construction, exit 2, no trace         | lightning_rl/cli/test_cli.py::test_a_config_error_is_one_line_and_exit_status_2_at_construction |
| SGLang server that does not answer                       | one line naming its URL and servers.urls, exit 1                    | lightning_rl/cli/test_cli.py::test_a_server_that_does_not_answer_is_one_line                  |
| two fits of a preset started together; a renamed run     | a version folder each (claimed with an exclusive mkdir); no checkpoint shared | lightning_rl/test_run_folders.py                                               |
| validate / resume on a run's checkpoint                  | the run's config.yaml untouched; latest/ resolved before anything moves | lightning_rl/test_run_folders.py                                                     |
| reward returning numpy / 0-d tensor scores               | accepted; a wrong shape is named as a shape                         | test_numpy_scores / components/test_rewards.py                                            |
| prompt + response past max_position_embeddings          | warning at fit start; truncated prompts counted                     | test_context_overflow / lightning_rl/cli/test_errors.py                                       |
| multi-node launch (2 nodes x 1 process, loopback)        | trains exactly like 1 process                                       | lightning_rl/test_distributed.py::test_two_nodes_of_one_process_on_loopback_equal_one_process |
| max_staleness deeper than the run (100 on 3 steps)       | only the run's rounds sampled; the final validation waits for none  | lightning_rl/loop/test_async.py::test_a_bound_deeper_than_the_run_samples_only_the_runs_rounds |
| LoRA checkpoint resumed with another rank/alpha/targets  | error naming model.policy.lora.<key> and the checkpoint's value     | lightning_rl/core/test_lora.py::test_resuming_adapters_with_another_lora_spec_names_the_key   |
| model-written code (PythonTool) attacks the trainer      | each attempt fails: no secret, file, socket, kill, survivor, bomb   | test_hostile_tool_code / components/test_sandbox.py                                       |
| no user namespaces for PythonTool's sandbox              | refuses to start naming why; isolation: none warns what is exposed  | test_hostile_tool_code / components/test_sandbox.py                                       |
| tool function that never returns (any thread, C code)    | error result at timeout_s, its worker killed and started again      | test_hung_tool / components/test_function_tool.py                                         |
| Ctrl-C / SIGTERM, async agent run hung in a tool         | the process ends, last.ckpt at the last completed iteration         | test_hung_tool / lightning_rl/callbacks/test_fault.py (subprocess: agent_calc + loop/async)         |
| tool that prints 100 MB                                  | nothing reaches the trainer's log                                   | test_tool_flood / components/test_function_tool.py                                        |
| tool result with a lone surrogate; Step with bad counts  | error observation; one error naming the environment                 | test_bad_tool_text / components/test_env_tools.py, components/test_multi_turn.py          |
| weight_sync: tensor without CUDA (CPU policy, server in another process) | error at construction naming weight_sync: disk      | test_tensor_sync_without_cuda / components/test_sglang_rollout.py                         |
| SGLang server killed in the middle of a distributed weight push | SGLangError naming its URL; no request sampled until a whole push succeeds | test_sglang_failed_push / components/test_sglang_weight_sync.py (servers in processes) |
| SGLang server that silently keeps an old tensor          | the push's verification fails the iteration naming the server       | test_stale_server_weights / components/test_sglang_weight_sync.py                         |
| model-written code reads the trainer's kernel keyring    | refused (root's program = nobody, and a uid-1000 trainer's alike)   | test_sandbox_keyring / components/test_sandbox.py                                         |
| model-written code holds memory past memory_mb (System V shm, memfds, 105k files, ...) | refused, or bounded (files per MiB of scratch_mb) | test_sandbox_memory / components/test_sandbox.py                           |
| model-written code connects to a Unix socket the trainer binds in a mounted folder | Operation not permitted; nothing reaches the socket | test_sandbox_unix_socket / components/test_sandbox.py                            |
| model-written code writes a file past 1 MiB in /tmp      | error naming the file (or stream) and the per-file limit            | test_sandbox_file_too_large / components/test_sandbox.py                                  |
| model-written code opens a socket of any family 0..AF_MAX-1 (AF_VSOCK, AF_NETLINK, ...) | the filter's EPERM; with network: true only AF_INET / AF_INET6 open | test_sandbox_socket_families / components/test_sandbox.py, components/test_syscall_filter.py |
| reasoning-gym entry with tuples (arc_agi, rearc grids)   | kept through the data column: the gold answer scores 1, not 0.05    | test_reasoning_gym_gold / components/test_reasoning_gym_reward.py (all tasks)             |
| reasoning-gym scorer raising on a completion             | that sample scores 0, counted in reward/scorer_error_frac           | test_reasoning_gym_scorer_error / components/test_reasoning_gym_reward.py                 |
| reasoning_gym: setting twice, of the wrong type, rejected | one line naming the field and its value                            | test_reasoning_gym_bad_setting / lightning_rl/data/test_reasoning_gym_data.py                  |
| image past PIL's limit or data.max_image_pixels (20000², 12000²) | a bad image naming file and row (bad_images: skip skips it), or shrunk | test_oversize_image / lightning_rl/data/test_vlm_data.py                              |
| a prompt's image tokens expanded in the wrong order (two images of different sizes) | ids equal transformers' own Qwen2VLProcessor's | test_image_token_order / lightning_rl/core/test_vision.py                  |
| agents' endpoint: 300 MiB unauthenticated body, Content-Length -1 / abc, 500 idle connections | 401 on the head, body unread; 400 from h11; no thread each, closed at idle_timeout_s | test_endpoint_probes / components/test_openai_endpoint.py |
| one episode's key sent to another episode's URL          | 403 (wrong_episode), never a row of the other episode               | test_endpoint_episode_keys / components/test_openai_agent.py                              |
| 80 idle connections without a key past max_connections 64; bodies past max_bytes_in_flight | an agent's request served within 2 s; the later body waits unread until earlier ones are answered | test_endpoint_idle_connections / components/test_openai_endpoint.py |
| "n" / "logprobs": 1e999, NaN, 2.0; "stop" as an object  | 400 naming the parameter; the round goes on                          | test_endpoint_overflowing_parameters / components/test_openai_agent.py                    |
| tools / arguments / a body nested 800 to 100,000 deep; the model's own call 1,000 deep | 400 (the body), text (the model's call); no trace, the round goes on | test_endpoint_deep_nesting / components/test_openai_agent.py, components/test_openai_tito.py |
| agent request no sampler can serve (OOV ids, 5 MB prompt, another model, tool_choice) | 400 naming the limit before sampling; the run goes on           | test_unservable_agent_requests / components/test_openai_agent.py                         |
| one episode sends 300 calls at once                      | at most max_rows_per_episode rows / max_calls_per_episode calls, 400 past them, counted | components/test_openai_agent.py::test_300_calls_at_once_from_one_episode_make_at_most_max_rows_per_episode_rows |
| episode deadline / SIGTERM while an agent round samples  | the sampler call ends within a step; SIGTERM: round untrained, RoundInterrupted (last.ckpt as for Ctrl-C) | components/test_openai_tito.py, components/test_rollout_interrupt.py |
| 256 (1,024 in benchmarks/agent_episodes_at_once.py) episodes connecting at once, busy CPUs | none lost (agent/error_frac 0)                          | components/test_openai_tito.py::test_a_round_of_many_episodes_connecting_at_once_loses_none |
| server keeps one old tensor below the probe's tolerance (a norm, the vision tower) | the exact check (checksums before/after the push) names tensor and server | test_stale_tensor_named / components/test_server_verify.py |
| server loads a push but keeps its old weight_version     | verification fails naming the server and both versions              | test_version_not_applied / components/test_server_verify.py                               |
| server serving another model than the policy (vocabulary 22 vs 18, architecture, a weight's name or shape) | one line naming server, checkpoint and difference before any request or push | test_served_model / components/test_server_served.py, components/test_rollout_contract.py (both engines) |
| `launch: {port: P}` on a port another run's server holds (or takes before the launched one binds it) | one line before anything is sent: the port is in use, or the socket on it is not the launched process group's | test_launch_port_taken / components/test_server_connection.py (both engines) |
| hand-started vLLM without `--logprobs-mode processed_logprobs` (log-probs of the raw logits at temperature 0.5) | refused at set-up, one line naming the flag | components/test_vllm_server_checks.py::test_log_probs_of_the_raw_logits_are_refused_naming_the_flag (real vLLM) |
| hand-started vLLM without `--weight-transfer-config`, `weight_sync: distributed` | one line naming the flag before any weight group, exit status 1 (was 134) | components/test_vllm_server_checks.py::test_a_distributed_push_to_a_server_without_the_transfer_engine_is_one_line_and_status_1 |
| a server refusing to join the weight group at once (either engine)  | its one-line error and exit status 1: the group's store is made on the calling thread (was 134) | components/test_server_weight_group.py |
| teacher server answers NaN/null, +inf or positive log-probs, a top-k id twice or past the vocabulary | one error naming the server and the value, before the loss | test_teacher_answer / components/test_server_teacher.py (loopback SGLang) |
| launched server killed (kill -9) mid-generation, mid-push, between iterations (SGLang, vLLM) | restarted in place (max_restarts), the work retried, the whole policy pushed and verified before it samples; one line, servers/restarts | test_server_killed / components/test_server_healing.py, lightning_rl/loop/test_server_healing_fit.py |
| launched server stopped (SIGSTOP)                        | down after health_deadline_s: killed and restarted, the work retried | test_server_killed / components/test_server_healing.py                                    |
| launched server down past max_restarts; servers.urls server gone past server_wait_s | one line, the run stops (last.ckpt resumes it)           | test_server_killed / components/test_server_healing.py                                    |
| trainer killed (SIGKILL, SIGTERM, Ctrl-C, exception) with launched servers | no server process remains (a watchdog per server)  | test_trainer_killed / components/test_server_watchdog.py (loopback SGLang; vLLM slow)     |

Each row below runs the fault at the smallest scale that shows it (a Lightning BoringModel for the
checkpoint rows, the components themselves for the rest) and bounds its time where a hang is the fault.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
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
from components.reward import FunctionReward, PooledReward
from components.rollout import HFRollout
from components.rollout.server.fanout import wait_for_answers
from components.rollout.server.settings import Servers, Verification, WeightPush
from components.rollout.sglang.client import SGLangError
from lightning_rl.callbacks import FiniteCheckpoints
from lightning_rl.callbacks.context_length import check_context_length
from lightning_rl.callbacks.fault import ResumableCheckpoints
from lightning_rl.core.config import LoopConfig, OptimizerConfig
from lightning_rl.core.contracts import as_scores
from lightning_rl.core.errors import NonFiniteTrainingError
from lightning_rl.data.prompts import PromptDataModule
from lightning_rl.data.sources import check_jsonl
from lightning_rl.loop.health import TrainingHealth
from lightning_rl.loop.module import RLModule
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
            wait_for_answers(
                futures, deadline_s=0.3, progress_every_s=0.1, urls=["http://gen:30000"], error=SGLangError
            )
        assert time.monotonic() - start < 1.0


def test_sglang_weights_folder():
    from components.rollout import SGLangRollout

    rollout = SGLangRollout(servers=Servers(urls=("http://127.0.0.1:9",)))
    folder = rollout.pusher.folders.version(1).parent
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
    from components.env import FunctionTool, ToolEnvironment
    from lightning_rl.core.contracts import Step, Turn, checked_step
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
        SGLangRollout(servers=Servers(urls=("http://127.0.0.1:9",)), weights=WeightPush(weight_sync="tensor"))


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
        servers=Servers(urls=(server.url,), backoff=0.01), verify=Verification(every=1, tolerance=1e-3)
    )  # fp32 on both sides
    try:
        rollout.setup(tokenizer)
        with pytest.raises(SGLangError, match=f"{server.url} does not hold the weights just pushed"):
            rollout.sync_weights(policy)
    finally:
        rollout.close()
        server.stop()


def test_sandbox_keyring():
    from tests.support.sandbox_attacks import check_the_trainers_keyring_is_out_of_reach

    assert check_the_trainers_keyring_is_out_of_reach() == ["read -1 1 ", "search -1 1", "keys 0"]


def test_sandbox_memory():
    from tests.support.sandbox_attacks import check_memory_outside_the_address_space_is_bounded

    answers = check_memory_outside_the_address_space_is_bounded()
    assert answers["shm"] == "shm 0 MiB 1" and answers["memfd"] == "memfd 0 MiB Operation not permitted"
    # a bound, not a count: the inodes free under it depend on where the clone lives (some are mounted inside it)
    created, error = answers["files"].removeprefix("files ").split(" ", 1)
    assert int(created) <= 4095 and error == "No space left on device"


def test_sandbox_unix_socket(tmp_path, monkeypatch):
    from tests.support.sandbox_attacks import check_no_unix_socket_of_the_host_is_reachable

    assert check_no_unix_socket_of_the_host_is_reachable(tmp_path, monkeypatch).splitlines() == [
        "stream Operation not permitted",
        "datagram Operation not permitted",
    ]


def test_sandbox_file_too_large():
    from components.env import PythonTool
    from tests.support.tools import attempt

    assert attempt(PythonTool(), "open('/tmp/big', 'wb').write(b'x' * (2 << 20))") == (
        "error: a file the program wrote passed 1048576 bytes, the limit on each file it writes (File too large)"
    )


def test_reasoning_gym_gold():
    pytest.importorskip("reasoning_gym")
    from components.reward import ReasoningGymScore
    from lightning_rl.data.sources import load_rows
    from tests.helpers import batch_from_scores

    rows = load_rows("reasoning_gym:arc_agi?size=1&test_size=2", "test").to_list()
    columns = {"completions": [r["answer"] for r in rows], "reasoning_gym": [r["reasoning_gym"] for r in rows]}
    assert ReasoningGymScore()(batch_from_scores(torch.zeros(2), columns=columns)).tolist() == [1.0, 1.0]


def test_reasoning_gym_scorer_error():
    pytest.importorskip("reasoning_gym")
    from components.reward import ReasoningGymScore
    from lightning_rl.data.sources import load_rows
    from tests.helpers import batch_from_scores

    row = load_rows("reasoning_gym:prime_factorization?size=1&test_size=1", "test")[0]
    columns = {"completions": [row["answer"], "two times three"], "reasoning_gym": [row["reasoning_gym"]] * 2}
    reward = ReasoningGymScore()
    with pytest.warns(UserWarning, match="such samples score 0"):
        scores = reward.score(batch_from_scores(torch.zeros(2), columns=columns))
    assert scores.total.tolist() == [1.0, 0.0] and scores.metrics["reward/scorer_error_frac"].item() == 0.5


def test_reasoning_gym_bad_setting():
    pytest.importorskip("reasoning_gym")
    from lightning_rl.data.sources import load_rows

    with pytest.raises(
        ValueError, match=r"^'reasoning_gym:basic_arithmetic\?size=-5': size must be a whole number >= 1, got size=-5$"
    ):
        load_rows("reasoning_gym:basic_arithmetic?size=-5", "train")
    with pytest.raises(ValueError, match=r"size is given twice \(size=3 and size=4\)"):
        load_rows("reasoning_gym:basic_arithmetic?size=3&size=4", "train")


def test_oversize_image(tiny_vlm_path, tmp_path):
    from lightning_rl.data.checks import DataError
    from lightning_rl.data.prompts import PromptDataModule
    from tests.support.vlm import png_declaring

    (tmp_path / "bomb.png").write_bytes(png_declaring(20000, 20000))
    (tmp_path / "huge.png").write_bytes(png_declaring(12000, 12000))
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "a", "image": "bomb.png"}\n{"prompt": "b", "image": "huge.png"}\n')

    def load(**kwargs):
        PromptDataModule(
            train_data=str(data), val_data=None, tokenizer=tiny_vlm_path, chat_template=True, **kwargs
        ).setup("fit")

    with pytest.raises(DataError, match=r"row 0 \(line 1\): image 'bomb.png' is larger than PIL decodes"):
        load()
    with pytest.raises(DataError, match=r"every row has a bad image, e.g. row 0 \(line 1\)"), pytest.warns(UserWarning):
        load(bad_images="skip", oversize_images="refuse")


def test_image_token_order():
    from tests.support.vlm import check_prompt_ids_match_transformers_own_processor

    assert check_prompt_ids_match_transformers_own_processor() == [6, 2]


@pytest.mark.server
def test_endpoint_probes():
    from components.rollout.endpoint.server import Endpoint, EndpointLimits
    from tests.support.endpoint import head, raw

    endpoint = Endpoint(limits=EndpointLimits(idle_timeout_s=1.0))
    endpoint.open("e", lambda route, request: None)  # never reached: every probe is refused on its head
    try:
        start = time.monotonic()
        unauthenticated = raw(endpoint, head(endpoint, token="wrong", Content_Length=300 * 2**20), b"x" * 2**20)
        assert unauthenticated.startswith(b"HTTP/1.1 401 ")
        for length in ("-1", "abc"):
            assert raw(endpoint, head(endpoint, Content_Length=length), b"{}").startswith(b"HTTP/1.1 400 ")
        with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as idle:
            assert idle.recv(1) == b""  # closed by the server at idle_timeout_s
        assert time.monotonic() - start < 5
    finally:
        endpoint.close()


@pytest.mark.server
def test_unservable_agent_requests():
    from components.rollout import OpenAIAgent
    from components.rollout.endpoint import HermesToolCalls
    from tests.fixtures.chat_templates import family_tokenizer
    from tests.helpers import prompts
    from tests.support.openai import ScriptedChat

    tokenizer = family_tokenizer("chatml")
    sampler = ScriptedChat(tokenizer, "chatml", group_size=1)
    sampler.setup(tokenizer)
    agent = OpenAIAgent(
        "tests.support.endpoint.unservable_agent", tool_calls=HermesToolCalls(), timeout_s=60, max_total_tokens=1024
    )
    agent.setup(tokenizer, sampler)
    try:
        batch, metrics = agent.generate(sampler, prompts([tokenizer.encode("1+2?")], None, [{"prompt": "1+2?"}]), None)
    finally:
        agent.close()
    oov, model, tool_choice = batch.columns["result"][0]
    assert oov.startswith("BadRequest: prompt token ids outside the vocabulary [0, ") and "[999999, -5]" in oov
    assert "model 'gpt-4o' is not served here" in model and "tool_choice 'required' is not supported" in tool_choice
    assert float(metrics["agent/error_frac"]) == 0


def _pushed_twice(tiny_model_path, tokenizer, fault: dict, **rollout_kwargs):
    """A loopback server with ``fault``; a push of the policy, a small update, a second push (the one checked)."""
    from components.rollout import SGLangRollout
    from lightning_rl.core.models import ModelSpec, load_causal_lm
    from tests.fixtures.sglang_server import FakeSGLangServer

    server = FakeSGLangServer(tiny_model_path).start()
    policy = load_causal_lm(ModelSpec(path=tiny_model_path))
    rollout = SGLangRollout(servers=Servers(urls=(server.url,), backoff=0.01), **rollout_kwargs)
    try:
        rollout.setup(tokenizer)
        rollout.sync_weights(policy)
        for name, value in fault.items():
            setattr(server, name, value)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
        rollout.sync_weights(policy)
    finally:
        rollout.close()
        server.stop()


@pytest.mark.server
def test_stale_tensor_named(tiny_model_path, tokenizer):
    stale = "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(SGLangError, match=rf"kept their checksum on the server: {stale}"):
        _pushed_twice(tiny_model_path, tokenizer, {"keep_stale": {stale}})  # the default verify.tolerance 0.1


@pytest.mark.server
def test_version_not_applied(tiny_model_path, tokenizer):
    with pytest.raises(SGLangError, match=r"answers with weight_version '1' after the push of version 2"):
        _pushed_twice(tiny_model_path, tokenizer, {"keep_version": True})


# Round five, rows 1-5: requests and the sandbox
def test_sandbox_socket_families():
    from tests.support.sandbox_attacks import AF_INET, AF_INET6, check_socket_families

    assert {kinds for kinds in map(tuple, check_socket_families(network=False).values())} == {("EPERM", "EPERM")}
    opened = {family for family, kinds in check_socket_families(network=True).items() if kinds != ["EPERM", "EPERM"]}
    assert opened == {AF_INET, AF_INET6}


@pytest.mark.server
def test_endpoint_episode_keys():
    from components.rollout.endpoint.server import Endpoint
    from tests.support.endpoint import head, raw

    endpoint, served = Endpoint(), []
    for episode in ("a", "b"):
        endpoint.open(episode, lambda route, request, e=episode: served.append(e))  # never reached
    try:
        body = b'{"prompt": "1"}'
        crossed = raw(
            endpoint, head(endpoint, "/b/v1/completions", endpoint.token("a"), Content_Length=len(body)), body
        )
        assert crossed.startswith(b"HTTP/1.1 403 ") and b"wrong_episode" in crossed
        forged = endpoint.token("a")[:-1] + ("x" if endpoint.token("a")[-1] != "x" else "y")
        assert raw(endpoint, head(endpoint, "/a/v1/completions", forged, Content_Length=len(body)), body).startswith(
            b"HTTP/1.1 401 "
        )
    finally:
        endpoint.close()
    assert served == [] and endpoint.token("a") != endpoint.token("b")


@pytest.mark.server
def test_endpoint_idle_connections():
    from tests.support.endpoint import (
        check_bytes_past_the_bound_wait_unread,
        check_idle_connections_give_their_slots_up,
    )

    check_idle_connections_give_their_slots_up()
    check_bytes_past_the_bound_wait_unread()


def _scripted_agent_round(function: str, family: str) -> tuple[list, dict]:
    """``function``'s answers and the round's metrics, one episode, on a scripted ChatML sampler."""
    from components.rollout import OpenAIAgent
    from components.rollout.endpoint import HermesToolCalls
    from tests.fixtures.chat_templates import family_tokenizer
    from tests.helpers import prompts
    from tests.support.openai import ScriptedChat

    tokenizer = family_tokenizer("chatml")
    sampler = ScriptedChat(tokenizer, family)
    sampler.setup(tokenizer)
    agent = OpenAIAgent(function, tool_calls=HermesToolCalls(), timeout_s=60, max_total_tokens=4096)
    agent.setup(tokenizer, sampler)
    try:
        batch, metrics = agent.generate(sampler, prompts([tokenizer.encode("1*2=")], None, [{"prompt": "1*2="}]), None)
    finally:
        agent.close()
    return batch.columns["result"][0], metrics


@pytest.mark.server
def test_endpoint_overflowing_parameters():
    answers, metrics = _scripted_agent_round("tests.support.endpoint.overflowing_agent", "answer")
    assert [status for status, _ in answers] == [400] * 9 + [200]  # OverflowError ended the run
    assert "1e999 is too large for a float" in answers[0][1] and "stop must be a text" in answers[7][1]
    assert float(metrics["agent/error_frac"]) == 0


@pytest.mark.server
def test_endpoint_deep_nesting(capfd):
    # the sampler answers the last call (the one that is fine) with a call nested 1,000 deep: text, not a crash
    answers, metrics = _scripted_agent_round("tests.support.endpoint.deeply_nested_agent", "deep_hermes")
    assert [status for status, _ in answers] == [400] * 5 + [200]  # RecursionError ended the run
    assert float(metrics["agent/error_frac"]) == 0 and "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize(
    "fault, problem",
    [
        ({"logprobs": [float("nan"), -1.0]}, "log-prob nan for the given token at position 0"),
        ({"logprobs": [-0.5, 0.7]}, "log-prob 0.7 for the given token at position 1"),
        ({"top_ids": [[3, 3], [5, 6]]}, "token id 3 twice in the top 2 at position 0"),
        ({"top_ids": [[3, 4], [5, 40]]}, "top-k token id 40 at position 1, outside the policy's vocabulary (0..17)"),
        ({"top_logprobs": [[-0.5, float("inf")], [-0.6, -1.1]]}, "top-2 log-probs [-0.5, inf] at position 0"),
    ],
)
def test_teacher_answer(fault, problem):
    from components.rollout.server.samples import Scored
    from components.teacher.answers import check_scored

    answer = Scored([-0.5, -1.0], None, [[3, 4], [5, 6]], [[-0.5, -1.2], [-0.6, -1.1]])
    check_scored(SGLangError, "http://teacher:30000", "model.teacher.init_args", answer, 2, 2, 18)  # a model's answer
    with pytest.raises(
        SGLangError, match=r"^SGLang server at http://teacher:30000 \(model.teacher.init_args\) "
    ) as err:
        check_scored(SGLangError, "http://teacher:30000", "model.teacher.init_args", answer._replace(**fault), 2, 2, 18)
    assert problem in str(err.value)


@pytest.mark.server
def test_served_model(tiny_model_path, tokenizer):
    from components.rollout import SGLangRollout
    from lightning_rl.core.models import ModelSpec, load_causal_lm
    from tests.fixtures.sglang_server import FakeSGLangServer

    calc = str(Path(__file__).resolve().parents[1] / "lightning_rl/assets/tiny-calc")  # 22 tokens
    server = FakeSGLangServer(calc).start()
    rollout = SGLangRollout(servers=Servers(urls=(server.url,), backoff=0.01))
    try:
        rollout.setup(tokenizer)
        with pytest.raises(SGLangError, match=r"serves .*tiny-calc, not the policy's: its vocabulary has 22 tokens"):
            rollout.sync_weights(load_causal_lm(ModelSpec(path=tiny_model_path)))  # 18 tokens
        assert server.weight_version == "default" and not server.generate_calls  # nothing was sent
    finally:
        rollout.close()
        server.stop()


@pytest.mark.server
def test_launch_port_taken(tiny_model_path, tokenizer):
    from components.rollout import SGLangRollout
    from tests.fixtures.sglang_server import FakeSGLangServer

    other = FakeSGLangServer(tiny_model_path).start()  # another run's server
    port = other.httpd.server_address[1]
    rollout = SGLangRollout(servers=Servers(launch={"model_path": tiny_model_path, "port": port}, backoff=0.01))
    try:
        with pytest.raises(SGLangError, match=f"another process already listens on port {port}"):
            rollout.setup(tokenizer)
    finally:
        rollout.close()
        other.stop()
    assert not other.generate_calls and other.weight_version == "default"  # nothing was sent to it


STAND_IN = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def _stand_in_connection(**settings):
    """A connection to one launched stand-in server (a stdlib HTTP server that answers every GET with 200)."""
    import sys

    from components.rollout.server.connection import Connection
    from components.rollout.server.healing import Healing
    from components.rollout.server.http import HTTPClient
    from components.rollout.server.launch import Command, LaunchedServer, free_port

    port = free_port()
    command = Command([sys.executable, "-c", STAND_IN, str(port)], f"http://127.0.0.1:{port}", "/health")
    connection = Connection(Servers(urls=("http://unused",), **settings), None)
    connection.urls, connection.client = [command.url], HTTPClient(5.0, 0, 0.01, death_note=connection._death_note)
    connection.launched = [LaunchedServer(command, HTTPClient)]
    connection.launched[0].wait_ready(60)
    return connection, Healing(connection, "Rollout")


def test_server_killed(capfd, monkeypatch):
    from components.rollout.server import healing as module
    from components.rollout.server.healing import ServerDown

    monkeypatch.setattr(module, "HEALTH_EVERY_S", 0.0)  # every watch asks for health
    connection, healing = _stand_in_connection(health_deadline_s=1.0, max_restarts=2)
    try:
        first = connection.launched[0].process.pid
        os.kill(first, signal.SIGKILL)  # kill -9: its process is gone at once
        time.sleep(0.5)
        with pytest.raises(ServerDown) as down:
            healing.watch()
        healing.recover(down.value)
        assert healing.rejoin(wait=True) and healing.restarts == 1
        second = connection.launched[0].process.pid
        assert second != first and connection.launched[0].url == connection.urls[0]  # in place: same address
        os.kill(second, signal.SIGSTOP)  # hung: its process runs, nothing answers
        start = time.monotonic()
        with pytest.raises(ServerDown) as down:
            healing.watch()
        assert 1.0 <= time.monotonic() - start < 10  # the health deadline, not a request's timeout
        healing.recover(down.value)
        assert healing.rejoin(wait=True) and healing.restarts == 2 and connection.launched[0].process.pid != second
        os.kill(connection.launched[0].process.pid, signal.SIGKILL)
        time.sleep(0.5)
        with pytest.raises(ServerDown) as down:
            healing.watch()
        with pytest.raises(Exception, match=r"is down .*\(2 of max_restarts=2\); the run stops here"):
            healing.recover(down.value)
        lines = [line for line in capfd.readouterr().err.splitlines() if "restarting the Rollout server" in line]
        assert len(lines) == 2
    finally:
        connection.close()


def test_trainer_killed(tmp_path):
    import subprocess
    import sys

    from tests.support.processes import gone_within, group_alive

    trainer = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from tests.test_fault_matrix import _stand_in_connection; "
         "print(_stand_in_connection()[0].launched[0].process.pid, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    group = int(trainer.stdout.readline())
    assert group_alive(group)
    trainer.kill()
    trainer.wait()
    assert gone_within(group, 15) == []
