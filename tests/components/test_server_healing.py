"""Self-healing servers (components/rollout/server/healing.py), on launched loopback SGLang servers (a process each, as
``launch`` starts SGLang): a server killed (kill -9) or stopped (SIGSTOP) mid-generation, mid-push or between rollouts
is restarted in place, the rollout or push retried, the restarted server pushed the whole policy and verified before it
samples; with two servers the other samples while one restarts; past max_restarts the run stops with one line; a
``servers.urls`` server is waited for up to server_wait_s."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace

import pytest
import torch

from components.rollout.server.settings import Servers, Verification, WeightPush
from lightning_rl.core.models import ModelSpec, load_causal_lm
from tests.fixtures.sglang_server import ServerProcess, fake_sglang_package
from tests.helpers import prompts as make_prompts
from tests.helpers import pythonpath

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture
def launch(tmp_path, monkeypatch, tiny_model_path, make_rollout):
    """``launch(**rollout_kwargs)``: a rollout that starts its own loopback server(s), verifying every push."""
    fake_sglang_package(tmp_path)
    monkeypatch.setenv("PYTHONPATH", pythonpath(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    def make(servers: Servers = Servers(), verify: Verification = Verification(every=1), **kwargs):
        kwargs.setdefault("group_size", 2)
        kwargs.setdefault("max_new_tokens", 4)
        return make_rollout(replace(servers, launch={"model_path": tiny_model_path}), verify=verify, **kwargs)

    return make


@pytest.fixture
def policy(tiny_model_path):
    return load_causal_lm(ModelSpec(path=tiny_model_path))


def pid(rollout, i: int = 0) -> int:
    return rollout.connection.launched[i].process.pid


def fault(rollout, url: str, **body) -> None:
    rollout.connection.client.request(url, "/loopback_fault", body)


def probes(rollout, url: str) -> int:
    """The probe's greedy requests the server answered so far (a verified push asks one)."""
    return rollout.connection.client.request(url, "/loopback_stats", method="GET")["generate_calls"]


def test_a_server_killed_between_rollouts_is_restarted_and_pushed_the_policy_verified(launch, policy, prompts, capfd):
    rollout = launch()
    asked = make_prompts(*prompts)
    assert set(rollout.generate(asked, policy).versions.tolist()) == {1}
    first = pid(rollout)
    os.kill(first, signal.SIGKILL)
    batch = rollout.generate(asked, policy)
    assert pid(rollout) != first and rollout.healing.restarts == 1
    assert batch.batch_size == 3 * 2 and set(batch.versions.tolist()) == {2}  # the whole policy again, as version 2
    assert float(rollout.metrics()["servers/restarts"]) == 1.0
    lines = [line for line in capfd.readouterr().err.splitlines() if "restarting the SGLang server" in line]
    assert len(lines) == 1 and rollout.connection.urls[0] in lines[0] and "restart 1 of max_restarts=3" in lines[0]


@pytest.mark.soak  # make test keeps the in-fit kill (test_server_healing_fit.py)
def test_a_server_killed_mid_generation_or_mid_push_is_restarted_and_the_work_retried(launch, policy, prompts):
    rollout = launch()
    asked = make_prompts(*prompts)
    rollout.generate(asked, policy)
    url = rollout.connection.urls[0]
    fault(rollout, url, token_delay_s=0.5)  # slow: the kill lands while the requests sample
    killer = threading.Timer(1.0, os.kill, (pid(rollout), signal.SIGKILL))
    killer.start()
    batch = rollout.generate(asked, policy)
    killer.join()
    assert rollout.healing.restarts == 1 and batch.batch_size == 6 and set(batch.versions.tolist()) == {2}
    # mid-push: the server dies as the push reaches it; the push is sent whole again to the restarted server
    engine, original = rollout.pusher.engine, rollout.pusher.engine.push_folder

    def dying(urls, *args, **kwargs):
        engine.push_folder = original
        os.kill(pid(rollout), signal.SIGKILL)
        return original(urls, *args, **kwargs)

    engine.push_folder = dying
    rollout.sync_weights(policy)
    assert rollout.healing.restarts == 2 and rollout.weight_version == 3
    assert probes(rollout, url) >= 1  # the push to the restarted server was verified (the probe's request)
    assert set(rollout.generate(asked, policy).versions.tolist()) == {3}


def test_a_stopped_server_is_down_after_its_health_deadline(launch, policy, prompts):
    rollout = launch(servers=Servers(health_deadline_s=2.0))
    asked = make_prompts(*prompts)
    rollout.generate(asked, policy)
    stopped = pid(rollout)
    os.kill(stopped, signal.SIGSTOP)
    start = time.monotonic()
    batch = rollout.generate(asked, policy)
    assert rollout.healing.restarts == 1 and pid(rollout) != stopped and batch.batch_size == 6
    assert time.monotonic() - start < 120  # the request's own timeout (600 s) was not waited for


def test_past_max_restarts_the_run_stops_with_one_line(launch, policy, prompts):
    rollout = launch(servers=Servers(max_restarts=0))
    asked = make_prompts(*prompts)
    rollout.generate(asked, policy)
    os.kill(pid(rollout), signal.SIGKILL)
    with pytest.raises(Exception, match=r"is down .*\(0 of max_restarts=0\); the run stops here") as err:
        rollout.generate(asked, policy)
    assert "\n" not in str(err.value).split("Log:")[0]


def test_with_two_servers_the_other_keeps_sampling_while_one_restarts(launch, policy, prompts):
    rollout = launch(servers=Servers(launch_servers=2))
    asked = make_prompts(*prompts)
    rollout.generate(asked, policy)
    dead, alive = rollout.connection.urls
    before = probes(rollout, alive)
    os.kill(pid(rollout, 0), signal.SIGKILL)
    batch = rollout.generate(asked, policy)  # retried on the live server while the other starts
    assert batch.batch_size == 6 and rollout.healing.restarts == 1 and dead in rollout.healing.pending
    assert probes(rollout, alive) - before == 1 + 3  # its share of the failed round, then the whole round again
    rollout.sync_weights(policy)  # waits for the restarted server, pushes the whole policy to both, verified
    assert rollout.healing.pending == {} and probes(rollout, dead) >= 1
    batch = rollout.generate(asked, policy)
    assert set(batch.versions.tolist()) == {rollout.weight_version} and probes(rollout, dead) >= 2


def test_a_base_url_server_is_waited_for(tiny_model_path, make_rollout, policy, prompts, capfd):
    process = ServerProcess(tiny_model_path, env={"OMP_NUM_THREADS": "1"})
    try:
        rollout = make_rollout(
            group_size=2, max_new_tokens=4, servers=Servers(urls=(process.url,), server_wait_s=120, max_retries=0)
        )
        asked = make_prompts(*prompts)
        rollout.generate(asked, policy)
        port = process.port
        process.stop()
        threading.Timer(2.0, lambda: process.__dict__.update(vars(ServerProcess(tiny_model_path, port=port)))).start()
        batch = rollout.generate(asked, policy)  # waited for, pushed the policy again, sampled
        assert batch.batch_size == 6 and rollout.healing.restarts == 0
        assert "waiting up to server_wait_s=120 s" in capfd.readouterr().err
        waits = make_rollout(
            group_size=2, max_new_tokens=4, servers=Servers(urls=(process.url,), server_wait_s=1, max_retries=0)
        )
        waits.generate(asked, policy)
        fails = make_rollout(
            group_size=2, max_new_tokens=4, servers=Servers(urls=(process.url,), server_wait_s=0, max_retries=0)
        )
        fails.generate(asked, policy)
        process.stop()
        with pytest.raises(Exception, match=r"did not come back within server_wait_s=1 s; the run stops here"):
            waits.generate(asked, policy)
        with pytest.raises(Exception, match=rf"SGLang server at {process.url}: POST /generate failed"):
            fails.generate(asked, policy)  # 0: no wait, the request's own error
    finally:
        process.stop()


@pytest.mark.soak  # make test keeps the rollout's killed-server restarts
def test_a_launched_teacher_server_killed_or_stopped_is_restarted_and_the_scoring_retried(launch):
    from components.rollout import HFRollout
    from components.teacher import TINY_TEACHER_PATH, SGLangTeacher
    from lightning_rl.core.models import TINY_MODEL_PATH, load_tokenizer

    student = load_tokenizer(TINY_MODEL_PATH)
    sampler = HFRollout(group_size=2, max_new_tokens=6)
    sampler.setup(student)
    enc = student(["12+3=", "4*5="], return_tensors="pt", padding=True)
    batch = sampler.generate(
        make_prompts(enc.input_ids, enc.attention_mask), load_causal_lm(ModelSpec(path=TINY_MODEL_PATH))
    )
    teacher = SGLangTeacher(
        servers=Servers(launch={"model_path": TINY_TEACHER_PATH}, backoff=0.01, health_deadline_s=2.0)
    )
    teacher.setup(student)
    try:
        before = teacher.score(batch).teacher_logprobs
        first = teacher.connection.launched[0].process.pid
        os.kill(first, signal.SIGKILL)
        after = teacher.score(batch).teacher_logprobs  # restarted, scored again: the same teacher, the same numbers
        assert teacher.healing.restarts == 1 and torch.equal(before, after)
        os.kill(teacher.connection.launched[0].process.pid, signal.SIGSTOP)
        assert torch.equal(teacher.score(batch).teacher_logprobs, before) and teacher.healing.restarts == 2
    finally:
        teacher.close()


@pytest.mark.soak
def test_a_launched_vllm_server_killed_between_rollouts_mid_push_or_stopped_is_restarted(tmp_path):
    """The real vLLM server (its API server, engine core and worker: the whole group goes), weights over a process
    group, which the restarted server joins anew."""
    from components.rollout import VLLMRollout
    from lightning_rl.core.models import load_tokenizer
    from tests.fixtures.vllm_server import SERVER_ARGS, TINY_CALC, unavailable, widen_heads
    from tests.support.engines import gap, perturb

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no real vLLM server: {reason}")
    model = str(widen_heads(TINY_CALC, tmp_path / "tiny-calc-wide"))
    policy = load_causal_lm(ModelSpec(path=model))
    tokenizer = load_tokenizer(model)
    enc = tokenizer(["12+3=", "4*5="], return_tensors="pt", padding=True)
    asked = make_prompts(enc.input_ids, enc.attention_mask)
    rollout = VLLMRollout(
        group_size=2,
        max_new_tokens=4,
        servers=Servers(launch=dict(SERVER_ARGS, model=model), backoff=0.05, health_deadline_s=10.0),
        weights=WeightPush(weight_sync="distributed"),
        verify=Verification(every=1),
    )
    rollout.setup(tokenizer)
    try:
        rollout.generate(asked, policy)
        os.killpg(pid(rollout), signal.SIGKILL)  # between rollouts
        perturb(policy, 0.05)
        batch = rollout.generate(asked, policy)
        assert rollout.healing.restarts == 1 and gap(policy, batch) <= 1e-4
        engine = rollout.pusher.engine
        original = engine.push_buckets

        def dying(*args, **kwargs):
            engine.push_buckets = original
            os.killpg(pid(rollout), signal.SIGKILL)
            return original(*args, **kwargs)

        engine.push_buckets = dying  # mid-push
        perturb(policy, 0.05, seed=1)
        rollout.sync_weights(policy)
        assert rollout.healing.restarts == 2
        batch = rollout.generate(asked, policy)
        assert gap(policy, batch) <= 1e-4 and set(batch.versions.tolist()) == {rollout.weight_version}
        os.kill(pid(rollout), signal.SIGSTOP)  # hung
        batch = rollout.generate(asked, policy)
        assert rollout.healing.restarts == 3 and gap(policy, batch) <= 1e-4
    finally:
        rollout.close()
