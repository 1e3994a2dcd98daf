"""A weight push while requests run (asynchronous training): without partial rollouts the push waits and every
response comes from one version; with them the requests in flight stop, continue with the new weights, and every
token keeps the version that sampled it and its log-prob under that version."""

from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from components.rollout import SGLangRollout
from components.rollout.server.settings import Servers, Verification, WeightPush
from lightning_rl.core.models import ModelSpec, load_causal_lm
from tests.fixtures.sglang_server import FakeSGLangServer
from tests.helpers import prompts as make_prompts
from tests.support.sglang import check_logprobs_by_version


@pytest.fixture
def server(tiny_model_path):
    srv = FakeSGLangServer(tiny_model_path).start()
    srv.token_delay_s = 0.04
    yield srv
    srv.stop()


def _push_during_generation(server, tokenizer, tiny_model_path, partial: bool):
    torch.manual_seed(0)
    old = load_causal_lm(ModelSpec(path=tiny_model_path))
    new = copy.deepcopy(old)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    rollout = SGLangRollout(
        group_size=4,
        max_new_tokens=12,
        servers=Servers(urls=(server.url,), backoff=0.01),
        weights=WeightPush(partial_rollouts=partial),
        verify=Verification(every=0),
    )
    rollout.setup(tokenizer)
    rollout.prepare(old)  # version 1; from now on pushes overlap requests
    enc = tokenizer(["12+3=", "4*5="], return_tensors="pt", padding=True)
    with ThreadPoolExecutor(1) as pool:
        server.sampling.clear()
        future = pool.submit(rollout.generate, make_prompts(enc.input_ids, enc.attention_mask), old)
        assert server.sampling.wait(30)  # the first request has sampled a token
        time.sleep(2 * server.token_delay_s)  # and a few more: 12 at most, so the push lands mid-request
        rollout.sync_weights(new)  # version 2
        batch = future.result()
    rollout.close()
    return batch, old, new


@pytest.mark.slow
def test_partial_rollouts_continue_with_the_new_weights_token_by_token(server, tokenizer, tiny_model_path):
    batch, old, new = _push_during_generation(server, tokenizer, tiny_model_path, partial=True)
    versions, mask = batch.token_versions, batch.response_mask.bool()
    split = [i for i in range(batch.batch_size) if {1, 2} <= set(versions[i][mask[i]].tolist())]
    assert split, "no response was interrupted by the push"
    for i in range(batch.batch_size):
        row = versions[i][mask[i]]
        assert (row[1:] >= row[:-1]).all()  # old weights first, then the new ones
        assert int(batch.versions[i]) == int(row.min())
    assert (mask.sum(-1)[batch.truncated] == 12).all()  # a continuation counts toward the same max_new_tokens
    check_logprobs_by_version(batch, old, new)
    continuations = [
        c for c in server.generate_calls if c["sampling_params"]["n"] == 1
    ]  # prompt + tokens so far, one each
    assert len(continuations) >= len(split)


@pytest.mark.slow
def test_without_partial_rollouts_the_push_waits_and_each_response_has_one_version(server, tokenizer, tiny_model_path):
    batch, old, new = _push_during_generation(server, tokenizer, tiny_model_path, partial=False)
    mask = batch.response_mask.bool()
    for i in range(batch.batch_size):
        assert len(set(batch.token_versions[i][mask[i]].tolist())) == 1
    assert 1 in batch.versions.tolist()  # the request in flight finished on the weights it started with
    check_logprobs_by_version(batch, old, new)
