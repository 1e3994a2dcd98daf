"""Routes from the server samplers: the loopback SGLang server answers them as SGLang 0.5.23 does and their replay
reproduces its log-probs; partial rollouts concatenate them; vLLM 0.32's field is parsed from a recorded answer; the
CPU build of vLLM is refused in one line before any server starts."""

from __future__ import annotations

import base64
import json
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from components.rollout import SGLangRollout
from components.rollout.server.generation import sample
from components.rollout.server.samples import Answer, Request
from components.rollout.server.settings import Servers, Verification, WeightPush
from components.rollout.vllm import generation as vllm_generation
from lightning_rl.core.logprobs import policy_outputs
from lightning_rl.core.models import ModelSpec, load_causal_lm, load_tokenizer
from tests.fixtures.sglang_server import FakeSGLangServer
from tests.helpers import prompts
from tests.support.moe import save_moe

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_routed_experts.json"


@pytest.fixture
def moe_server(tmp_path, monkeypatch):
    import tests.fixtures.sglang_server as loopback

    # no weight push here: the loopback's checkpoint-name map (which fused expert tensors need) is not built
    monkeypatch.setattr(loopback, "_module_names", lambda model: {}, raising=False)
    path = save_moe(tmp_path / "moe", "qwen3_moe")
    srv = FakeSGLangServer(path).start()
    yield srv, path
    srv.stop()


def _sampled(srv, path, **kwargs):
    tokenizer = load_tokenizer(path)
    tokenizer.padding_side = "left"
    rollout = SGLangRollout(
        group_size=2,
        max_new_tokens=6,
        return_routes=True,
        servers=Servers(urls=(srv.url,), backoff=0.01),
        weights=WeightPush(sync_before_first_rollout=False),
        verify=Verification(every=0),
        **kwargs,
    )
    rollout.setup(tokenizer)
    policy = load_causal_lm(ModelSpec(path=path)).eval()
    enc = tokenizer(["12+3=", "7+70=", "1+1="], return_tensors="pt", padding=True)
    try:
        return policy, rollout.generate(prompts(enc["input_ids"], enc["attention_mask"]), policy)
    finally:
        rollout.close()


@pytest.mark.server
def test_loopback_sglang_routes_are_asked_answered_and_replayed(moe_server):
    srv, path = moe_server
    policy, batch = _sampled(srv, path)
    body = srv.generate_calls[-1]
    assert body["return_routed_experts"] is True and body["routed_experts_start_len"] == 0
    item = srv.answers[-1][0]  # SGLang's wire format: raw int32 bytes of (P + n - 1, L, K), no header
    raw = np.frombuffer(base64.b64decode(item["meta_info"]["routed_experts"]), dtype=np.int32)
    assert raw.size == (item["meta_info"]["prompt_tokens"] + len(item["output_ids"]) - 1) * 2 * 2  # requests overlap
    m = batch.response_mask.bool()
    assert batch.routed_experts.shape[2:] == (2, 2) and (batch.routed_experts[m.logical_not()] == -1).all()
    with torch.no_grad():
        replayed = policy_outputs(policy, batch, replay_routes=True).logprobs
        row = int(batch.response_mask.sum(-1).argmax())  # the server samples unseeded: its longest response
        routes = batch.routed_experts.clone()
        routes[row, 0, 1, 0] = next(e for e in range(4) if e not in routes[row, 0, 1].tolist())
        moved = policy_outputs(policy, batch.replace(routed_experts=routes), replay_routes=True).logprobs
    torch.testing.assert_close(replayed[m], batch.rollout_logprobs[m], atol=1e-5, rtol=0)
    assert batch.response_mask[row].sum() > 1 and (moved[row, 1:] - replayed[row, 1:]).abs().max() > 1e-4


def test_a_continued_responses_routes_are_the_concatenation():
    """A response aborted after 2 tokens and continued for 2 more: the continuation asks for the routes from the first
    part's last token on (its first not fed), and the sample's are the first part's followed by them."""
    asked = []
    prompt = [4, 5, 6]

    def generate(url, request, adapter, keep_aborted):
        asked.append(request)
        n_in = len(request.input_ids)
        if len(asked) == 1:  # routes of positions 0..3 (prompt, token 0): rows tagged by position
            return [Answer([7, 8], [-1.0, -1.0], "abort", "1", routes=np.arange(n_in + 1)[:, None].repeat(4, 1))]
        rows = np.arange(request.routes_from, n_in + 1)[:, None].repeat(4, 1)  # positions 4, 5
        return [Answer([9, 10], [-1.0, -1.0], "length", "2", routes=rows)]

    engine = SimpleNamespace(generate=generate, client=SimpleNamespace(gate=SimpleNamespace(sampling=nullcontext),
                             max_retries=3))  # fmt: skip
    request = Request(prompt, 1, 1.0, max_new_tokens=4, routes_from=0)
    (got,) = sample(engine, "http://x", request, 1, partial=True, check_version=False)
    assert asked[1].routes_from == 4 and asked[1].input_ids == prompt + [7, 8]
    assert got.ids == [7, 8, 9, 10] and got.routes[:, 0].tolist() == [0, 1, 2, 3, 4, 5]  # P + 4 - 1 positions


def test_vllm_routed_experts_parsed_from_a_recorded_answer():
    recorded = json.loads(FIXTURE.read_text())
    choice = recorded["response"]["choices"][0]
    request = Request(recorded["request"]["token_ids"], 1, 1.0, max_new_tokens=3, routes_from=0)
    answer = vllm_generation._parse("http://x", choice, request)
    # (3 prompt + 3 sampled - 1) tokens x 2 layers x top-2, as np.save wrote them (uint8), row-major per token
    assert answer.routes.shape == (5, 4) and answer.routes.dtype == np.int64
    assert answer.routes[0].tolist() == [3, 1, 0, 2] and answer.routes[4].tolist() == [3, 0, 0, 1]
    assert vllm_generation.sampling_params(Request([1], 1, 1.0, routes_from=7))["routed_experts_prompt_start"] == 7
    with pytest.raises(vllm_generation.VLLMError, match=r"routed_experts of shape \(5, 2, 2\), expected \(4, "):
        vllm_generation._parse("http://x", choice, Request([4, 5, 6], 1, 1.0, routes_from=1))
    with pytest.raises(vllm_generation.VLLMError, match="start it with --enable-return-routed-experts"):
        vllm_generation._parse("http://x", {**choice, "routed_experts": None}, request)


def test_vllm_routes_on_the_cpu_build_are_refused_before_any_server_starts():
    from components.rollout import VLLMRollout
    from components.rollout.vllm.rollout import cpu_build

    if not cpu_build():
        pytest.skip("vLLM's environment here is not the CPU build")
    with pytest.raises(ValueError, match=r"^VLLMRollout: return_routes needs --enable-return-routed-experts, which "):
        VLLMRollout(return_routes=True, servers=Servers(launch={"model": "x"}))
