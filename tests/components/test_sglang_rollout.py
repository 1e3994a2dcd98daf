"""SGLangRollout against a loopback server speaking SGLang's native API over a real tiny model (tests/fixtures)."""

from __future__ import annotations

import base64
import importlib.util
import logging
import re
import subprocess
import sys
from dataclasses import replace
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch

from components.rollout import SGLangRollout
from components.rollout.server.settings import Servers, WeightPush
from components.rollout.sglang import SGLangError
from components.rollout.sglang.client import SGLangClient
from components.rollout.sglang.generation import Sample, to_batch
from components.rollout.sglang.server import free_port, server_argv
from components.rollout.sglang.weights import push_tensors, tensor_payloads
from lightning_rl.core.logprobs import policy_logprobs
from lightning_rl.core.models import ModelSpec, load_causal_lm
from tests.fixtures.sglang_server import FakeSGLangServer, fake_sglang_package
from tests.helpers import prompts as make_prompts
from tests.helpers import pythonpath
from tests.support.sglang import server_logprobs_match

REPO = Path(__file__).resolve().parents[2]


def completion_length(completions, **_):
    """A reward that varies within every group (so every iteration updates the policy)."""
    return [float(len(c)) for c in completions]


@pytest.fixture
def policy(tiny_model_path):
    return load_causal_lm(ModelSpec(path=tiny_model_path))


def test_batch_layout_masks_and_request_format(server, policy, prompts, make_rollout):
    ids, mask = prompts
    rollout = make_rollout(
        group_size=3, max_new_tokens=6, temperature=0.7, servers=Servers(urls=(server.url,), max_concurrency=1)
    )  # requests in order
    batch = rollout.generate(make_prompts(ids, mask), policy)

    assert batch.response_ids.shape[0] == 9 and batch.response_ids.shape[1] <= 6
    assert batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    torch.testing.assert_close(batch.prompt_ids, ids.repeat_interleave(3, 0))
    assert set(batch.versions.tolist()) == {1} and server.weight_version == "1"  # pushed before the first rollout
    # the requests: unpadded token ids, explicit max_new_tokens, n = group_size, top_k 0 -> -1, log-probs asked for
    calls = server.generate_calls
    assert [c["input_ids"] for c in calls] == [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    assert all(c["return_logprob"] is True for c in calls)
    assert calls[0]["sampling_params"] == {
        "n": 3,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": 6,
        "stop_token_ids": [],
    }
    # prompt-major: rows 3i..3i+2 are the n answers to request i, in order, right-padded with pad
    answered = [item for answer in server.answers for item in answer]
    for row, item in enumerate(answered):
        n = len(item["output_ids"])
        assert batch.response_ids[row, :n].tolist() == item["output_ids"]
        assert (batch.response_ids[row, n:] == rollout.pad_token_id).all()
        assert batch.response_mask[row].tolist() == [1] * n + [0] * (batch.response_ids.shape[1] - n)
        finish = item["meta_info"]["finish_reason"]["type"]
        assert bool(batch.truncated[row]) == (finish == "length" and item["output_ids"][-1] != rollout.eos_token_id)
    assert (batch.rollout_logprobs[batch.response_mask == 0] == 0).all()
    assert (batch.rollout_logprobs[batch.response_mask == 1] < 0).all()


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_server_logprobs_equal_the_trainers(server, policy, prompts, make_rollout, temperature):
    rollout = make_rollout(group_size=4, max_new_tokens=8, temperature=temperature, servers=Servers(urls=(server.url,)))
    batch = rollout.generate(make_prompts(*prompts), policy)
    assert server_logprobs_match(policy, batch, temperature) < 1e-4
    # the temperature is what makes them agree: the untempered trainer log-probs are far off
    assert server_logprobs_match(policy, batch, 1.0) > 1e-2


def test_disk_sync_after_an_optimizer_step_serves_the_updated_policy(server, policy, prompts, make_rollout, tmp_path):
    rollout = make_rollout(
        group_size=4,
        max_new_tokens=8,
        temperature=1.0,
        servers=Servers(urls=(server.url,)),
        weights=WeightPush(weight_dir=str(tmp_path)),
    )
    batch = rollout.generate(make_prompts(*prompts), policy)
    old = {k: v.clone() for k, v in policy.state_dict().items()}
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    loss = -(policy_logprobs(policy, batch, 1.0)[0] * batch.response_mask).sum()
    loss.backward()
    optimizer.step()
    rollout.sync_weights(policy)

    assert server.weight_version == "2" and rollout.weight_version == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2"]  # the previous checkpoint is removed
    batch = rollout.generate(make_prompts(*prompts), policy)
    assert set(batch.versions.tolist()) == {2}
    assert server_logprobs_match(policy, batch, 1.0) < 1e-4
    stale = load_causal_lm(ModelSpec(path=str(tmp_path / "v2")))
    stale.load_state_dict(old)
    assert server_logprobs_match(stale, batch, 1.0) > 1e-2  # the step changed the log-probs: the sync mattered


def test_tensor_sync_runs_in_a_weight_update_session(server, policy, prompts, make_rollout):
    """The requests of a tensor push. CPU tensors reach this in-process server only (the rollout refuses them for a
    server in another process: see test_tensor_sync_without_cuda_is_refused_at_construction)."""
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    push_tensors(SGLangClient(30.0, 0, 0.0), server.url, policy, "1", bucket_bytes=1)
    pushes = [c for c in server.calls if "weight" in c]
    n_tensors = len({id(t) for t in policy.state_dict(keep_vars=True).values()})  # tied weights once
    assert pushes == ["/begin_weight_update", *["/update_weights_from_tensor"] * n_tensors, "/end_weight_update"]
    assert server.weight_version == "1" and not server.session_open
    rollout = make_rollout(
        group_size=2,
        max_new_tokens=6,
        servers=Servers(urls=(server.url,)),
        weights=WeightPush(sync_before_first_rollout=False),
    )
    batch = rollout.generate(make_prompts(*prompts), policy)
    assert server_logprobs_match(policy, batch, 1.0) < 1e-4


def test_tensor_payloads_cover_every_weight_once_per_tp_rank(policy):
    state = {
        k: v for k, v in policy.state_dict().items() if k != "lm_head.weight"
    }  # tied to the embedding: sent once, as save_pretrained
    bodies = list(tensor_payloads(policy, bucket_bytes=4096, tp_size=2, weight_version="5"))
    assert len(bodies) > 1
    seen = {}
    for i, body in enumerate(bodies):
        first, second = body["serialized_named_tensors"]
        assert first == second  # one entry per tensor-parallel rank; each rank shards on load
        last = i == len(bodies) - 1
        assert body["weight_version"] == ("5" if last else None) and body["flush_cache"] is last
        for name, tensor in ForkingPickler.loads(base64.b64decode(first)):
            assert name not in seen
            seen[name] = tensor
    assert seen.keys() == state.keys()
    for name, tensor in seen.items():
        torch.testing.assert_close(tensor, state[name], rtol=0, atol=0)


def test_flush_cache_is_retried_while_the_server_is_busy(server, policy, make_rollout):
    rollout = make_rollout(servers=Servers(urls=(server.url,), max_retries=3))
    server.flush_busy = 2
    rollout.sync_weights(policy)
    assert server.calls.count("/flush_cache") == 3
    server.flush_busy = 10
    with pytest.raises(SGLangError, match=rf"{server.url}.*/flush_cache failed after 4 attempt"):
        rollout.sync_weights(policy)


def test_length_finish_is_truncated_unless_the_last_token_is_eos():
    ids, mask = torch.tensor([[0, 4], [5, 6]]), torch.tensor([[0, 1], [1, 1]])
    samples = [
        Sample([7, 1], [-0.5, -0.25], "length", [3, 3]),  # EOS exactly at the cap: complete
        Sample([7, 8], [-0.5, -0.25], "length", [3, 3]),  # cap without EOS: truncated
        Sample([1], [-0.5], "stop", [3]),
        Sample([7, 9], [-1.0, -2.0], "length", [3, 3]),
    ]
    batch = to_batch(
        make_prompts(ids, mask), samples, rows=2, greedy_last=False, eos_ids=[1], pad_token_id=0, version=3
    )
    assert batch.truncated.tolist() == [False, True, False, True]
    assert batch.response_mask.tolist() == [[1, 1], [1, 1], [1, 0], [1, 1]]
    assert batch.rollout_logprobs.tolist() == [[-0.5, -0.25], [-0.5, -0.25], [-0.5, 0.0], [-1.0, -2.0]]
    assert set(batch.versions.tolist()) == {3} and batch.group_ids.tolist() == [0, 0, 1, 1]


def test_a_server_stop_token_unknown_to_the_trainer_still_ends_the_mask():
    # the server stopped on 9 (e.g. an extra EOS in its generation_config): what it did not sample is masked
    samples = [Sample([7, 9], [-1.0, -1.0], "stop", [3, 3]), Sample([7, 8, 6], [-1.0] * 3, "length", [3, 3, 3])]
    batch = to_batch(
        make_prompts(torch.tensor([[3], [3]]), torch.ones(2, 1)),
        samples,
        rows=1,
        greedy_last=False,
        eos_ids=[1],
        pad_token_id=1,
        version=1,
    )
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch.truncated.tolist() == [False, True]


def test_real_truncation_from_the_server(server, policy, prompts, make_rollout):
    rollout = make_rollout(group_size=2, max_new_tokens=1, temperature=0.0, servers=Servers(urls=(server.url,)))
    batch = rollout.generate(make_prompts(*prompts), policy)
    assert batch.response_ids.shape[1] == 1
    assert batch.truncated.tolist() == (batch.response_ids[:, 0] != rollout.eos_token_id).tolist()
    assert all(item["meta_info"]["finish_reason"]["type"] == "length" for answer in server.answers for item in answer)


def test_aborted_requests_are_sent_again(server, policy, prompts, make_rollout):
    rollout = make_rollout(
        group_size=2, max_new_tokens=4, servers=Servers(urls=(server.url,), max_retries=3, max_concurrency=1)
    )
    rollout.sync_weights(policy)
    server.abort_next = 2
    batch = rollout.generate(make_prompts(*prompts), policy)
    assert len(server.generate_calls) == 3 + 2 and batch.batch_size == 6
    server.abort_next = 10
    with pytest.raises(SGLangError, match=rf"{server.url}: POST /generate failed after 4 attempt.*aborted"):
        rollout.generate(make_prompts(*prompts), policy)


def test_server_death_mid_rollout_names_the_server(server, policy, prompts, make_rollout):
    rollout = make_rollout(
        group_size=2,
        max_new_tokens=4,
        servers=Servers(urls=(server.url,), max_retries=1, max_concurrency=1, server_wait_s=0),
    )
    rollout.sync_weights(policy)
    server.die_after = 1  # the second request finds the server dying, the retry finds nothing listening
    with pytest.raises(
        SGLangError, match=rf"SGLang server at {server.url}: POST /generate failed after 2 attempt.*unreachable"
    ):
        rollout.generate(make_prompts(*prompts), policy)


def test_unreachable_server_names_the_url_and_the_setting(tokenizer):
    url = f"http://127.0.0.1:{free_port()}"
    rollout = SGLangRollout(servers=Servers(urls=(url,), max_retries=1, backoff=0.01))
    with pytest.raises(SGLangError, match=rf"{url}: GET /health_generate failed after 2 attempt.*servers\.urls"):
        rollout.setup(tokenizer)


def test_a_slow_answer_times_out(server, policy, prompts, make_rollout):
    rollout = make_rollout(
        group_size=1, max_new_tokens=2, servers=Servers(urls=(server.url,), timeout_s=0.3, max_retries=0)
    )
    rollout.sync_weights(policy)
    server.delay_s = 1.0
    with pytest.raises(SGLangError, match="no answer within timeout_s=0.3"):
        rollout.generate(make_prompts(*prompts), policy)


def test_greedy_validation_and_greedy_baseline(server, policy, prompts, make_rollout):
    rollout = make_rollout(
        group_size=3, max_new_tokens=6, temperature=0.8, greedy_baseline=True, servers=Servers(urls=(server.url,))
    )
    assert {"is_greedy", "sample_mask", "rollout_logprobs"} <= rollout.provides
    greedy = rollout.generate(make_prompts(*prompts), policy, replace(rollout.params, greedy=True))
    assert greedy.batch_size == 3 and greedy.is_greedy is None
    assert server.generate_calls[-1]["sampling_params"]["temperature"] == 0.0
    assert server_logprobs_match(policy, greedy, 1.0) < 1e-4  # greedy: untempered

    batch = rollout.generate(make_prompts(*prompts), policy)
    assert batch.batch_size == 12 and batch.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert batch.is_greedy.tolist() == [False, False, False, True] * 3
    assert batch.sample_mask.tolist() == [1.0, 1.0, 1.0, 0.0] * 3
    for prompt in range(3):  # the baseline row is the greedy decode of its prompt
        width = int(greedy.response_mask[prompt].sum())
        assert batch.response_ids[4 * prompt + 3, :width].tolist() == greedy.response_ids[prompt, :width].tolist()


@pytest.mark.server
def test_requests_are_spread_over_servers_and_every_server_gets_the_weights(
    tiny_model_path, policy, prompts, make_rollout
):
    a, b = FakeSGLangServer(tiny_model_path).start(), FakeSGLangServer(tiny_model_path).start()
    try:
        rollout = make_rollout(group_size=2, max_new_tokens=4, servers=Servers(urls=(a.url, b.url)))
        batch = rollout.generate(make_prompts(*prompts), policy)
        assert (len(a.generate_calls), len(b.generate_calls)) == (2, 1) and batch.batch_size == 6
        assert a.weight_version == b.weight_version == "1"
    finally:
        a.stop()
        b.stop()


@pytest.mark.server
def test_a_server_that_missed_a_weight_update_fails_loudly(tiny_model_path, policy, prompts, make_rollout):
    a, b = FakeSGLangServer(tiny_model_path).start(), FakeSGLangServer(tiny_model_path).start()
    try:
        rollout = make_rollout(
            group_size=2,
            max_new_tokens=4,
            servers=Servers(urls=(a.url, b.url)),
            weights=WeightPush(weight_update_urls=(a.url,)),
        )
        with pytest.raises(
            SGLangError, match=rf"{b.url} sampled with weight_version 'default' but the trainer pushed 1"
        ):
            rollout.generate(make_prompts(*prompts), policy)
    finally:
        a.stop()
        b.stop()


def test_memory_is_released_between_rollouts_and_resumed_before_use(server, policy, prompts, make_rollout):
    rollout = make_rollout(
        group_size=2, max_new_tokens=4, servers=Servers(urls=(server.url,)), weights=WeightPush(release_memory=True)
    )
    rollout.generate(make_prompts(*prompts), policy)
    assert server.released  # the fixture refuses /generate while released: resume must come first
    rollout.sync_weights(policy)
    batch = rollout.generate(make_prompts(*prompts), policy)
    assert server.released and set(batch.versions.tolist()) == {2}
    calls = [c for c in server.calls if "memory" in c or c in ("/generate", "/update_weights_from_disk")]
    assert calls[:6] == [
        "/update_weights_from_disk",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/generate",
        "/generate",
        "/generate",
    ]


def test_sampling_options_reach_the_request():
    from components.rollout.sglang.generation import sampling_params

    assert sampling_params(4, 0.5, 0.9, 20, 7, [3]) == {
        "n": 4,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "max_new_tokens": 7,
        "stop_token_ids": [3],
    }
    assert sampling_params(1, 1.0, 1.0, 0, 7, [])["top_k"] == -1


def test_stop_token_ids_end_responses_on_the_server_and_in_the_mask(server, policy, prompts, make_rollout, tokenizer):
    stops = [i for i in range(len(tokenizer)) if i != tokenizer.eos_token_id]  # every token but EOS stops
    rollout = make_rollout(group_size=2, max_new_tokens=6, stop_token_ids=stops, servers=Servers(urls=(server.url,)))
    batch = rollout.generate(make_prompts(*prompts), policy)
    assert server.generate_calls[-1]["sampling_params"]["stop_token_ids"] == stops
    assert batch.response_ids.shape[1] == 1 and batch.response_mask.all() and not batch.truncated.any()


def test_ignore_eos_reaches_the_server_and_every_response_runs_to_the_cap(server, policy, prompts, make_rollout):
    rollout = make_rollout(
        group_size=2, max_new_tokens=6, temperature=1.5, ignore_eos=True, servers=Servers(urls=(server.url,))
    )
    batch = rollout.generate(make_prompts(*prompts), policy)
    assert all(c["sampling_params"]["ignore_eos"] is True for c in server.generate_calls)
    assert batch.response_ids.shape == (6, 6) and batch.response_mask.all() and batch.truncated.all()


def test_without_first_sync_or_flush_the_server_keeps_its_weights(server, policy, prompts, make_rollout):
    rollout = make_rollout(
        group_size=1,
        max_new_tokens=2,
        servers=Servers(urls=(server.url,)),
        weights=WeightPush(sync_before_first_rollout=False, flush_cache=False),
    )
    batch = rollout.generate(make_prompts(*prompts), policy)
    assert (
        set(batch.versions.tolist()) == {0}
        and server.weight_version == "default"
        and "/update_weights_from_disk" not in server.calls
    )
    rollout.sync_weights(policy)
    assert server.weight_version == "1" and "/flush_cache" not in server.calls


def test_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="exactly one of servers.urls"):
        SGLangRollout()
    with pytest.raises(ValueError, match="exactly one of servers.urls"):
        SGLangRollout(servers=Servers(urls=("http://x:1",), launch={"model_path": "m"}))
    with pytest.raises(ValueError, match="weight_sync must be"):
        SGLangRollout(servers=Servers(urls=("http://x:1",)), weights=WeightPush(weight_sync="nccl"))
    with pytest.raises(ValueError, match="top_k"):
        SGLangRollout(top_k=-1, servers=Servers(urls=("http://x:1",)))


def test_tensor_sync_without_cuda_is_refused_at_construction(monkeypatch):
    """CPU tensors reach another process only through multiprocessing's shared-memory handover, which needs the
    server to be our child: SGLang answered HTTP 500 'digest sent was rejected' at the first push (#24 item 14)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"weight_sync: tensor.*CUDA.*weight_sync: disk.*distributed"):
        SGLangRollout(servers=Servers(urls=("http://127.0.0.1:9",)), weights=WeightPush(weight_sync="tensor"))


def test_tensor_sync_of_a_policy_on_the_cpu_is_refused_before_any_request(server, policy, make_rollout, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine, but the policy stayed on the CPU
    rollout = make_rollout(servers=Servers(urls=(server.url,)), weights=WeightPush(weight_sync="tensor"))
    with pytest.raises(ValueError, match=r"policy's weights are on cpu.*weight_sync: disk"):
        rollout.sync_weights(policy)
    assert not [c for c in server.calls if "weight" in c]


def test_server_arguments_become_launch_server_flags():
    argv = server_argv(
        {
            "model_path": "/m",
            "port": 30000,
            "enable_memory_saver": True,
            "log_requests": False,
            "chat_template": None,
            "cuda_graph_bs": [1, 2],
        }
    )
    assert argv == ["--model-path", "/m", "--port", "30000", "--enable-memory-saver", "--cuda-graph-bs", "1", "2"]


@pytest.mark.slow
def test_launched_server_lifecycle(tiny_model_path, policy, prompts, tokenizer, tmp_path, monkeypatch, caplog):
    fake_sglang_package(tmp_path)
    monkeypatch.setenv("PYTHONPATH", pythonpath(tmp_path))
    rollout = SGLangRollout(
        group_size=2,
        max_new_tokens=4,
        servers=Servers(launch={"model_path": tiny_model_path, "skip_tokenizer_init": True}, backoff=0.01),
    )
    with caplog.at_level(logging.INFO):
        rollout.setup(tokenizer)
    launched = rollout.connection.server
    process = launched.process
    # the console says what starts, where it listens and logs, and when it answers
    said = [r.getMessage() for r in caplog.records]
    assert (
        f"starting SGLang on the policy ({tiny_model_path}) at {launched.url} for model.rollout; its log: "
        f"{launched.log_path}"
    ) in said
    assert any(re.fullmatch(r"SGLang ready in \d+ s", line) for line in said), said
    try:
        assert rollout.connection.urls == [launched.url] and process.poll() is None
        batch = rollout.generate(make_prompts(*prompts), policy)
        assert batch.batch_size == 6 and server_logprobs_match(policy, batch, 1.0) < 1e-4
    finally:
        rollout.close()
    assert process.poll() is not None  # stopped with the rollout

    crashing = SGLangRollout(servers=Servers(launch={"model_path": tiny_model_path, "crash_on_start": True}))
    with pytest.raises(SGLangError, match=r"(?s)did not start.*exited with code 3.*no kernel image"):
        crashing.setup(tokenizer)
    crashing.close()


@pytest.mark.slow
def test_sglang_yaml_runs_grpo_end_to_end_against_a_server(server, tiny_model_path, tmp_path):
    from lightning_rl.cli import main

    cli = main(
        [
            "fit",
            "--config", str(REPO / "configs/grpo.yaml"),
            "--config", str(REPO / "configs/rollout/sglang.yaml"),
            "--model.policy.path", tiny_model_path,
            f"--model.rollout.init_args.servers.urls=[{server.url}]",
            "--model.rollout.init_args.servers.backoff", "0.01",
            "--model.reward", "components.reward.FunctionReward",
            "--model.reward.init_args.fn", "tests.components.test_sglang_rollout.completion_length",
            "--model.optimizer.lr", "0.01",
            "--data.batch_size", "2",
            "--data.val_size", "8",  # validation before and after training: 8 held-out prompts, not the whole test split
            "--trainer.max_steps", "2",
            "--trainer.default_root_dir", str(tmp_path),
            "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
            "--trainer.callbacks.init_args.dirpath", str(tmp_path / "ckpt"),
            "--trainer.accelerator", "cpu",
        ]
    )  # fmt: skip
    rollout = cli.model.rollout
    assert (
        isinstance(rollout, SGLangRollout) and rollout.params.group_size == 8 and rollout.params.max_new_tokens == 8
    )  # preset's, carried over
    metrics = cli.trainer.logged_metrics
    assert cli.trainer.global_step == 2
    # sampler and trainer agree on every token of the second iteration, sampled after a weight sync
    assert metrics["rollout/logprob_diff_mean"] < 1e-4 and metrics["rollout/logprob_diff_max"] < 1e-3
    assert server.weight_version == "3"  # before the first rollout, then after each of the two updates
    assert not rollout.connection.open  # closed at teardown


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("sglang") is None, reason="needs a CUDA device and sglang"
)
def test_cuda_tensors_reach_another_process_as_sglang_reads_them():
    layer = torch.nn.Linear(4, 4).cuda()
    body = next(tensor_payloads(layer, bucket_bytes=1 << 20, tp_size=1, weight_version="1"))
    reader = (
        "import sys, torch; from sglang.srt.utils import MultiprocessingSerializer as S; "
        "print(','.join(f'{n}:{t.double().sum().item():.6f}' for n, t in S.deserialize(sys.stdin.read())))"
    )
    out = subprocess.run(
        [sys.executable, "-c", reader],
        input=body["serialized_named_tensors"][0],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == ",".join(f"{n}:{t.double().sum().item():.6f}" for n, t in layer.state_dict().items())


def test_close_then_use_again_reconnects(server, policy, prompts, make_rollout):
    rollout = make_rollout(group_size=1, max_new_tokens=2, servers=Servers(urls=(server.url,)))
    rollout.generate(make_prompts(*prompts), policy)
    rollout.close()
    assert rollout.generate(make_prompts(*prompts), policy).batch_size == 3


def test_a_stalled_server_logs_progress_and_fails_at_the_deadline(server, policy, prompts, make_rollout, caplog):
    """A server that stops answering (as under SIGSTOP) while each request may wait 600 s x 4 attempts: the rollout
    reports its progress while it waits and fails at deadline_s, naming the setting."""
    import logging
    import time

    rollout = make_rollout(
        group_size=1, max_new_tokens=2, servers=Servers(urls=(server.url,), deadline_s=1.2, progress_every_s=0.4)
    )
    rollout.sync_weights(policy)
    server.delay_s = 30.0
    start = time.monotonic()
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(
            SGLangError,
            match=r"0/3 requests answered within deadline_s=1.2 s \(model.rollout.init_args.servers.deadline_s\)",
        ),
    ):
        rollout.generate(make_prompts(*prompts), policy)
    assert time.monotonic() - start < 3.0
    progress = [r.getMessage() for r in caplog.records if "SGLang rollout: waiting" in r.getMessage()]
    assert len(progress) >= 2 and "0/3 requests answered, 3 pending" in progress[0]


def test_the_temporary_weights_folder_is_removed_even_when_the_rollout_is_never_closed(server, policy, tokenizer):
    """A failed run never reaches close(): the policy-sized copy pushed to the server must not outlive the rollout."""
    import gc

    rollout = SGLangRollout(group_size=1, max_new_tokens=2, servers=Servers(urls=(server.url,), backoff=0.01))
    rollout.setup(tokenizer)
    rollout.sync_weights(policy)
    folder = Path(rollout.pusher.folders.own)
    assert any(folder.rglob("*.safetensors"))
    rollout.connection.pool.shutdown(wait=False)
    del rollout
    gc.collect()
    assert not folder.exists()
