"""Exact verification of every push (components/rollout/server/verify.py): the server's checksums before and after the
push against what the trainer changed, names mapped through the engine's fusions; and the probe beside it, with a
picture for a vision-language policy. Against the loopback SGLang server (its /weights_checker hashes as SGLang's
CPU path does)."""

from __future__ import annotations

import pytest
import torch

from components.rollout.server.fingerprints import Fingerprints, digest
from components.rollout.server.settings import Servers, Verification
from components.rollout.server.verify import ServerNames, checksum_finding, stale_tensors
from components.rollout.sglang import SGLangError
from lightning_rl.core.models import ModelSpec, load_causal_lm, load_tokenizer
from tests.fixtures.sglang_server import FakeSGLangServer

FUSIONS = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj"}


def _perturb(policy, scale: float, only: str | None = None, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if only is None or name == only:
                p.add_(scale * torch.randn(p.shape, generator=generator))


@pytest.fixture
def policy(tiny_model_path):
    return load_causal_lm(ModelSpec(path=tiny_model_path))


def test_server_names_go_through_the_fusions_and_a_different_root():
    names = ServerNames(
        [
            "model.layers.0.self_attn.qkv_proj.weight",
            "model.layers.0.mlp.gate_up_proj.weight",
            "model.language_model.layers.1.mlp.down_proj.weight",
            "model.visual.merger.mlp.0.weight",
            "model.norm.weight",
            "model.visual.blocks.0.norm1.weight",
            "model.layers.2.self_attn.qkv_proj.base_layer.weight",
        ],
        FUSIONS,
    )
    assert names("model.layers.0.self_attn.k_proj.weight") == "model.layers.0.self_attn.qkv_proj.weight"
    assert names("model.layers.0.mlp.gate_proj.weight") == "model.layers.0.mlp.gate_up_proj.weight"
    assert names("model.layers.1.mlp.down_proj.weight") == "model.language_model.layers.1.mlp.down_proj.weight"
    assert names("visual.merger.mlp.0.weight") == "model.visual.merger.mlp.0.weight"
    assert names("model.norm.weight") == "model.norm.weight"
    assert names("model.layers.2.self_attn.v_proj.weight") == "model.layers.2.self_attn.qkv_proj.base_layer.weight"
    assert names("lm_head.weight") is None


def test_server_names_refuse_an_ambiguous_suffix():
    """#46 item 6: a mutant that took one of several servers' names a suffix matches survived. Here the pushed
    ``model.layers.0.mlp.down_proj.weight`` ends two of the server's names: none is chosen, so the tensor is reported
    unknown (the exact check then fails loudly) rather than compared with a tensor that is not it."""
    server = ["model.language_model.layers.0.mlp.down_proj.weight", "model.visual.layers.0.mlp.down_proj.weight"]
    names = ServerNames(server, FUSIONS)
    assert names("model.layers.0.mlp.down_proj.weight") is None
    digests = {name: {"tp0": "1"} for name in server}
    assert stale_tensors(["model.layers.0.mlp.down_proj.weight"], digests, digests, FUSIONS) == (
        [],
        ["model.layers.0.mlp.down_proj.weight"],
    )


def test_server_names_try_the_suffix_one_level_below_the_pushed_name():
    """#46 item 6: a mutant that started the suffix search one level deeper survived: ``model.norm.weight`` has one
    suffix below its root, ``norm.weight``, which is the server's ``model.language_model.norm.weight`` (a vision-language
    server roots its language model there)."""
    names = ServerNames(["model.language_model.norm.weight", "model.visual.blocks.0.norm1.weight"], FUSIONS)
    assert names("model.norm.weight") == "model.language_model.norm.weight"
    assert names("model.embed_tokens.weight") is None


def test_a_tensor_counts_as_stale_when_its_server_checksum_did_not_move():
    before = {"a.qkv_proj.weight": {"tp0": "1"}, "a.o_proj.weight": {"tp0": "2"}, "a.norm.weight": {"tp0": "3"}}
    after = {"a.qkv_proj.weight": {"tp0": "1"}, "a.o_proj.weight": {"tp0": "9"}, "a.norm.weight": {"tp0": "3"}}
    stale, unknown = stale_tensors(["a.k_proj.weight", "a.o_proj.weight", "b.x.weight"], before, after, FUSIONS)
    assert stale == [("a.k_proj.weight", "a.qkv_proj.weight", ["tp0"])] and unknown == ["b.x.weight"]  # norm: unchanged


def test_each_rank_of_a_server_is_compared_on_its_own_and_named():
    """#46 item 3: the ranks' digests of a name were joined in one string, so a push that rank 0 loaded and rank 1 did
    not still 'changed'. Two replicas of two tensor-parallel ranks: rank tp1 of replica dp1 kept o_proj."""
    ranks = ["dp0:pp0:tp0", "dp0:pp0:tp1", "dp1:pp0:tp0", "dp1:pp0:tp1"]
    before = {"a.o_proj.weight": dict(zip(ranks, "abcd")), "a.norm.weight": dict(zip(ranks, "eeee"))}
    after = {"a.o_proj.weight": dict(zip(ranks, "wxyd")), "a.norm.weight": dict(zip(ranks, "ffff"))}
    stale, unknown = stale_tensors(["a.o_proj.weight", "a.norm.weight"], before, after, FUSIONS)
    assert stale == [("a.o_proj.weight", "a.o_proj.weight", ["dp1:pp0:tp1"])] and unknown == []
    finding = checksum_finding(SGLangError, "http://gen:30000", ["a.o_proj.weight"], before, after, FUSIONS)
    assert finding == (
        "1 of the 1 tensors the trainer changed kept their checksum on the server: a.o_proj.weight on rank dp1:pp0:tp1"
    )


def test_vllms_checksums_are_read_per_rank(tmp_path):
    """vLLM 0.32's /weight_checker answers one flat dict keyed ``dp<i>:pp<i>:pcp<i>:tp<i>:<name>`` over every worker
    (entrypoints/rl/online/api_router.py, v1/worker/gpu_worker.py); a recorded two-rank answer, rank tp1 stale."""
    from components.rollout.vllm.client import VLLMClient
    from components.rollout.vllm.engine import VLLMEngine

    answers = iter(
        [
            {"checksums": {"dp0:pp0:pcp0:tp0:model.norm.weight": "a0", "dp0:pp0:pcp0:tp1:model.norm.weight": "b0"}},
            {"checksums": {"dp0:pp0:pcp0:tp0:model.norm.weight": "a1", "dp0:pp0:pcp0:tp1:model.norm.weight": "b0"}},
        ]
    )

    class Recorded(VLLMClient):
        def request(self, url, path, body=None, **kwargs):
            assert path == "/weight_checker" and body == {"action": "checksum"}
            return next(answers)

    engine = VLLMEngine(Recorded(1.0, 0, 0.0))
    before, after = engine.checksums("http://gen:8000"), engine.checksums("http://gen:8000")
    assert before == {"model.norm.weight": {"dp0:pp0:pcp0:tp0": "a0", "dp0:pp0:pcp0:tp1": "b0"}}
    stale, _ = stale_tensors(["model.norm.weight"], before, after, engine.fusions)
    assert stale == [("model.norm.weight", "model.norm.weight", ["dp0:pp0:pcp0:tp1"])]


@pytest.mark.server
def test_a_push_one_tensor_parallel_rank_did_not_load_fails_naming_that_rank(tiny_model_path, policy, tokenizer):
    """#46 items 3 and 6: the loopback server answers for two tensor-parallel ranks, as SGLang does (one
    /weights_checker entry per rank); rank 1 loads nothing after the first push. Its digests did not move while rank
    0's did: the push fails naming rank 1 (keeping only rank 0's checksums, a mutant that survived, passes it)."""
    server = FakeSGLangServer(tiny_model_path, tp_size=2).start()
    try:
        assert [r["parallelism_info"]["tp_rank"] for r in server.weights_checker({})["ranks"]] == [0, 1]
        rollout = _rollout(tokenizer, server.url)
        try:
            rollout.sync_weights(policy)
            _perturb(policy, 0.02)
            rollout.sync_weights(policy)  # both ranks loaded it: passes
            server.stale_ranks = {1}
            _perturb(policy, 0.02, seed=1)
            with pytest.raises(
                SGLangError,
                match=rf"{server.url} does not hold the weights just pushed \(version 3\): (\d+) of the \1 tensors the "
                r"trainer changed kept their checksum on the server: [\w.]+ on rank dp0:pp0:tp1, ",
            ) as failed:
                rollout.sync_weights(policy)
            assert "tp0" not in str(failed.value)
        finally:
            rollout.close()
    finally:
        server.stop()


def test_a_digest_sees_the_changes_a_bf16_server_sees():
    t = torch.tensor([1.0, 2.0, 3.0])
    assert digest(t) == digest(t + 1e-6)  # below bf16's resolution at 1.0 (2**-8): a bf16 server holds the same
    assert digest(t) != digest(t + torch.tensor([0.0, 0.0, 0.05]))
    before, after = Fingerprints(), Fingerprints()
    before.add([("a", t), ("b", t)])
    after.add([("a", t), ("b", t * 2), ("c", t)])
    assert after.changed_since(before) == ["b", "c"] and after.changed_since(None) is None


def test_what_a_digest_change_says_of_an_fp16_server_is_what_the_docstring_says():
    """#46 item 5: the docstring said a change seen here is seen by an fp16 server too. 1 + 2^-8 +- 1e-5 is a
    counterexample: two bf16 values (a change here), one fp16 value (none there): a false alarm, never a miss."""
    below, above = torch.tensor([1 + 2**-8 - 1e-5]), torch.tensor([1 + 2**-8 + 1e-5])
    assert below.to(torch.bfloat16).item() == 1.0 and above.to(torch.bfloat16).item() == 1 + 2**-7
    assert below.half().item() == above.half().item() == 1 + 2**-8
    assert digest(below) != digest(above)
    tiny = torch.tensor([2e-8, 1e-8])  # below fp16's smallest subnormal / 2: zero there, two values in bf16
    assert digest(tiny[:1]) != digest(tiny[1:]) and tiny.half().tolist() == [0.0, 0.0]


def _rollout(tokenizer, url, **kwargs):
    from components.rollout import SGLangRollout

    rollout = SGLangRollout(servers=Servers(urls=(url,), backoff=0.01), **kwargs)
    rollout.setup(tokenizer)
    return rollout


def test_a_stale_norm_tensor_is_named_by_the_checksums_where_the_default_probe_misses_it(server, policy, tokenizer):
    """#35 item 5: at verify_tolerance 0.1 one stale norm tensor went unseen after an update; the checksums name it."""
    stale = "model.layers.1.post_attention_layernorm.weight"
    server.keep_stale = {stale}
    for checksums in (False, True):
        rollout = _rollout(tokenizer, server.url, verify=Verification(checksums=checksums))
        try:
            rollout.sync_weights(policy)  # the first push: nothing to compare with yet
            _perturb(policy, 0.02, seed=int(checksums))
            if not checksums:
                rollout.sync_weights(policy)  # the probe alone passes: the stale norm's gap is below its tolerance
                assert not torch.equal(server.model.state_dict()[stale], policy.state_dict()[stale])
                continue
            with pytest.raises(
                SGLangError,
                match=rf"{server.url} does not hold the weights just pushed \(version 2\): 1 of the \d+ tensors the "
                rf"trainer changed kept their checksum on the server: {stale}\. It did not load",
            ):
                rollout.sync_weights(policy)
            assert rollout.pusher.state.failed
        finally:
            rollout.close()


def test_a_server_that_loads_the_weights_but_not_the_version_fails_verification(server, policy, tokenizer):
    """The weight-version check of the verification (a mutant that disables it survived the suite, #35 item 5): the
    weights arrive, so checksums and probe agree; only the version says the server did not take the push."""
    server.keep_version = True
    rollout = _rollout(tokenizer, server.url, verify=Verification(tolerance=1e-4))
    try:
        with pytest.raises(
            SGLangError, match=rf"{server.url} answers with weight_version 'default' after the push of version 1"
        ):
            rollout.sync_weights(policy)
    finally:
        rollout.close()


def test_the_checksums_of_a_server_are_read_before_and_after_each_push(server, policy, tokenizer):
    rollout = _rollout(tokenizer, server.url)
    try:
        for scale in (0.0, 0.01, 0.01):
            _perturb(policy, scale)
            rollout.sync_weights(policy)
        # the first push has nothing to compare with: two checksum reads for each later one
        assert server.calls.count("/weights_checker") == 4
        rollout.close()
        probe_only = _rollout(tokenizer, server.url, verify=Verification(checksums=False))
        probe_only.sync_weights(policy)
        probe_only.sync_weights(policy)
        assert server.calls.count("/weights_checker") == 4
        probe_only.close()
    finally:
        rollout.close()


@pytest.fixture
def vlm_server(tiny_vlm_path):
    srv = FakeSGLangServer(tiny_vlm_path).start()
    yield srv
    srv.stop()


@pytest.mark.server
@pytest.mark.parametrize("checksums", [True, False])
def test_a_stale_vision_tower_tensor_is_caught(vlm_server, tiny_vlm_path, checksums):
    """#35 item 5: with train_vision a stale merger weight was never seen, even at verify_tolerance 1e-6, because the
    probe had no picture. The checksums name it; the probe, now with a picture, sees it too."""
    from lightning_rl.core.models import vision_prefixes

    policy = load_causal_lm(ModelSpec(path=tiny_vlm_path, train_vision=True))
    merger = next(n for n, _ in policy.named_parameters() if "merger.mlp.0.weight" in n)
    assert any(merger.startswith(p) for p in vision_prefixes(policy))
    vlm_server.keep_stale = {merger}
    rollout = _rollout(
        load_tokenizer(tiny_vlm_path), vlm_server.url, verify=Verification(checksums=checksums, tolerance=1e-4)
    )
    try:
        rollout.sync_weights(policy)
        _perturb(policy, 0.05, only=merger)  # the vision tower alone moved: text-only log-probs cannot see it
        message = (
            r"kept their checksum on the server: visual\.merger\.mlp\.0\.weight \(the server's model\.visual\.merger"
            if checksums
            else r"on a probe of 24 greedy tokens its log-probs differ from the trainer's"
        )
        with pytest.raises(SGLangError, match=rf"{vlm_server.url} does not hold the weights just pushed.*{message}"):
            rollout.sync_weights(policy)
    finally:
        rollout.close()
