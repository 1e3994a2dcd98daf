"""Server teachers (components.teacher.server): the shipped teacher's log-probs of the student's sampled tokens and its
top k, scored by the loopback SGLang server, by a real vLLM server (vLLM's CPU build, launched by the teacher) and by
the same vLLM server's ``/v1/completions``, equal to `HFTeacher`'s on the same model and tokens (fp32); a teacher whose
tokenizer differs refused at setup with the reason; a dead server one error naming its URL; a temperature no server
can give refused."""

from __future__ import annotations

import socket

import pytest
import torch

from components.rollout.completions import CompletionsEngine, CompletionsError
from components.rollout.completions.engine import CompletionsClient
from components.rollout.server.settings import Servers
from components.rollout.sglang import SGLangError
from components.rollout.sglang.engine import SGLangEngine
from components.teacher import TINY_TEACHER_PATH, CompletionsTeacher, HFTeacher, SGLangTeacher, VLLMTeacher
from lightning_rl.core.models import TINY_MODEL_PATH, ModelSpec, load_causal_lm, load_tokenizer
from tests.fixtures.sglang_server import FakeSGLangServer
from tests.helpers import prompts as make_prompts

K = 5


@pytest.fixture(scope="module")
def student():
    return load_tokenizer(TINY_MODEL_PATH)


@pytest.fixture(scope="module")
def batch(student):
    """The shipped student's samples (temperature 1, seeded): left-padded prompts, responses of several lengths, some
    answers wrong (tokens the teacher finds unlikely)."""
    from components.rollout import HFRollout

    torch.manual_seed(0)
    policy = load_causal_lm(ModelSpec(path=TINY_MODEL_PATH)).eval()
    enc = student(["12+3=", "4*5=", "71*23=", "9-40="], return_tensors="pt", padding=True)
    rollout = HFRollout(group_size=4, max_new_tokens=8, temperature=1.0)
    rollout.setup(student)
    out = rollout.generate(make_prompts(enc.input_ids, enc.attention_mask), policy)
    lengths = out.response_mask.sum(-1)
    assert (enc.attention_mask == 0).any() and lengths.min() < lengths.max()
    return out


@pytest.fixture(scope="module")
def in_process(student, batch):
    """HFTeacher's scores of the batch: the shipped teacher in fp32 (its bfloat16 weights, exactly)."""
    teacher = HFTeacher(dtype="float32", top_k=K)
    teacher.setup(student)
    return teacher.score(batch)


@pytest.fixture(scope="module")
def loopback():
    servers = [FakeSGLangServer(TINY_TEACHER_PATH).start() for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


def _assert_equal_scores(served, expected, batch) -> None:
    """Equal on every response token (<= 1e-4 per token, fp32), zero after each response's end."""
    mask = batch.response_mask.bool()
    assert served.teacher_logprobs.dtype == torch.float32 and served.teacher_logprobs.shape == batch.response_ids.shape
    assert float((served.teacher_logprobs - expected.teacher_logprobs)[mask].abs().max()) <= 1e-4
    assert (served.teacher_logprobs[~mask] == 0).all()
    assert served.teacher_topk_ids.shape == (*batch.response_ids.shape, K)
    assert torch.equal(served.teacher_topk_ids[mask], expected.teacher_topk_ids[mask])
    assert float((served.teacher_topk_logprobs - expected.teacher_topk_logprobs)[mask].abs().max()) <= 1e-4
    # the batch holds tokens the teacher finds unlikely, not only its own choices
    assert float(expected.teacher_logprobs[mask].min()) < -5


@pytest.mark.server
def test_an_sglang_teacher_scores_the_students_tokens_as_the_in_process_teacher(loopback, student, batch, in_process):
    teacher = SGLangTeacher(top_k=K, servers=Servers(urls=tuple(s.url for s in loopback)))
    teacher.setup(student)
    served = teacher.score(batch)
    _assert_equal_scores(served, in_process, batch)
    assert teacher.provides == {"teacher_logprobs", "teacher_topk_ids", "teacher_topk_logprobs"}
    assert teacher.shard_unit is None
    from types import SimpleNamespace

    from lightning_rl.roster import TEACHER

    urls = ", ".join(s.url for s in loopback)
    assert TEACHER.note(SimpleNamespace(teacher=teacher)) == f"scored by SGLang at {urls}"  # what --dry_run says
    # one prefill-only request per sample, spread over both servers: the prompt unpadded, the response up to its end,
    # input log-probs from the prompt's last token on, the top k
    calls = [c for s in loopback for c in s.generate_calls]
    assert len(calls) == batch.batch_size and all(len(s.generate_calls) == batch.batch_size // 2 for s in loopback)
    first = loopback[0].generate_calls[0]
    prompt = batch.prompt_ids[0][batch.prompt_mask[0].bool()].tolist()
    response = batch.response_ids[0, : int(batch.response_mask[0].sum())].tolist()
    assert first["input_ids"] == prompt + response and first["logprob_start_len"] == len(prompt) - 1
    assert first["sampling_params"]["max_new_tokens"] == 0 and first["top_logprobs_num"] == K
    teacher.close()


def test_a_teacher_without_top_k_returns_the_sampled_tokens_log_probs_only(loopback, student, batch, in_process):
    teacher = SGLangTeacher(servers=Servers(urls=(loopback[0].url,)))
    teacher.setup(student)
    served = teacher.score(batch)
    assert served.teacher_topk_ids is None and teacher.provides == {"teacher_logprobs"}
    mask = batch.response_mask.bool()
    assert float((served.teacher_logprobs - in_process.teacher_logprobs)[mask].abs().max()) <= 1e-4
    assert "top_logprobs_num" not in loopback[0].generate_calls[-1]
    teacher.close()


def test_a_tempered_teacher_is_refused_because_servers_return_raw_log_probs(loopback, student, batch, in_process):
    with pytest.raises(ValueError) as err:
        VLLMTeacher(temperature=0.7, servers=Servers(urls=("http://127.0.0.1:1",)))
    assert "a server returns raw log-probs of given tokens, log_softmax(z)" in str(err.value)
    assert "components.teacher.HFTeacher" in str(err.value)
    # what a server returns is the teacher at temperature 1, far from a tempered one: passing it on would be wrong
    tempered = HFTeacher(dtype="float32", temperature=0.7)
    tempered.setup(student)
    mask = batch.response_mask.bool()
    assert float((tempered.score(batch).teacher_logprobs - in_process.teacher_logprobs)[mask].abs().max()) > 0.5


@pytest.fixture
def swapped_teacher(tmp_path):
    """A teacher checkpoint whose tokenizer reads the ids of "0" and "1" as the other digit."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from lightning_rl.recipes.tiny import build_char_tokenizer, build_tiny_llama

    vocab = build_char_tokenizer().get_vocab()
    core = Tokenizer(models.WordLevel(vocab={**vocab, "0": vocab["1"], "1": vocab["0"]}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    shuffled = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    build_tiny_llama(shuffled, hidden_size=32, layers=1, heads=2).save_pretrained(tmp_path)
    shuffled.save_pretrained(tmp_path)
    server = FakeSGLangServer(str(tmp_path)).start()
    yield server, vocab
    server.stop()


@pytest.mark.server
def test_a_teacher_whose_tokenizer_differs_is_refused_at_setup_with_the_reason(swapped_teacher, student):
    server, vocab = swapped_teacher
    teacher = SGLangTeacher(servers=Servers(urls=(server.url,)))
    with pytest.raises(ValueError) as err:  # the tokenizer of the path the server names (/model_info)
        teacher.setup(student)
    message = str(err.value)
    assert (
        f"model.teacher.init_args: the teacher's tokenizer ({server.model_path}) differs from the policy's" in message
    )
    assert f"e.g. id {vocab['0']} is '0' to the policy, '1' to the teacher" in message
    assert not teacher.connection.open  # refused: nothing left connected
    # a tokenizer named in the config is the one
    named = SGLangTeacher(tokenizer=TINY_MODEL_PATH, servers=Servers(urls=(server.url,)))
    named.setup(student)
    named.close()


@pytest.mark.server
def test_a_server_whose_path_is_not_here_is_compared_through_its_tokenize(
    swapped_teacher, loopback, student, monkeypatch
):
    monkeypatch.setattr(SGLangEngine, "model_path", lambda self, url: "/on/the/inference/node/teacher")
    server, vocab = swapped_teacher
    with pytest.raises(ValueError) as err:
        SGLangTeacher(servers=Servers(urls=(server.url,))).setup(student)
    message = str(err.value)
    assert f"the teacher's tokenizer ({server.url}/tokenize) differs from the policy's" in message
    # each of the policy's tokens as text on its own: the teacher reads "0" and "1" as the other's id
    assert (
        f"2 of 15 tokens of the policy's vocabulary it reads as another id (e.g. '0' is id {vocab['0']} to the "
        in message
    )
    same = SGLangTeacher(servers=Servers(urls=(loopback[0].url,)))
    same.setup(student)  # the same tokenizer passes
    same.close()
    monkeypatch.setattr(SGLangEngine, "tokenize", lambda self, url, text: (_ for _ in ()).throw(SGLangError("404")))
    with pytest.raises(ValueError) as err:
        SGLangTeacher(servers=Servers(urls=(loopback[0].url,))).setup(student)
    assert "cannot compare the teacher's tokenizer with the policy's" in str(err.value)
    assert "Set model.teacher.init_args.tokenizer" in str(err.value)


@pytest.mark.server
@pytest.mark.parametrize(
    "fault, problem",
    [
        ("positive", r"log-prob 0\.7 for the given token at position 0"),
        ("null", r"top-5 log-probs \[[^]]*nan[^]]*\] at position 0"),  # SGLang writes NaN and inf as null
        ("duplicate", r"token id \d+ twice in the top 5 at position 0"),
        ("outside", r"top-k token id 21 at position 0, outside the policy's vocabulary \(0\.\.17\)"),
    ],
)
def test_a_teacher_answer_no_model_gives_fails_naming_the_server(loopback, student, batch, fault, problem):
    """Before, each was taken as it came: NaN in the KL, mass counted twice, an index error deep in the loss."""
    server = loopback[0]
    teacher = SGLangTeacher(top_k=K, servers=Servers(urls=(server.url,)))
    teacher.setup(student)
    server.corrupt_scores = fault
    try:
        with pytest.raises(SGLangError, match=problem) as err:
            teacher.score(batch)
    finally:
        server.corrupt_scores = None
        teacher.close()
    assert str(err.value).startswith(
        f"SGLang server at {server.url} (model.teacher.init_args) answered scores no teacher can give: "
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_teacher_server_that_is_not_there_is_one_error_naming_its_url(student):
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(SGLangError) as err:
        SGLangTeacher(servers=Servers(urls=(url,), max_retries=1, backoff=0.01)).setup(student)
    message = str(err.value)
    assert message.startswith(f"SGLang server at {url}: GET /health_generate failed after 2 attempt(s)")
    assert message.endswith("Check model.teacher.init_args.servers.urls.")


@pytest.mark.slow
def test_a_teacher_server_that_dies_fails_the_scoring_with_one_error_naming_its_url(student, batch):
    from tests.fixtures.sglang_server import ServerProcess

    process = ServerProcess(TINY_TEACHER_PATH, env={"OMP_NUM_THREADS": "1"})
    teacher = SGLangTeacher(servers=Servers(urls=(process.url,), max_retries=1, backoff=0.01, server_wait_s=0))
    try:
        teacher.setup(student)
        process.process.kill()
        process.process.wait()
        with pytest.raises(SGLangError) as err:
            teacher.score(batch)
    finally:
        teacher.close()
        process.stop()
    message = str(err.value)
    assert message.startswith(f"SGLang server at {process.url}: POST /generate failed after 2 attempt(s)")
    assert "Check model.teacher.init_args.servers.urls." in message


def _completions(answer: dict) -> CompletionsEngine:
    """A CompletionsEngine whose server answers ``answer`` to every request."""
    client = CompletionsClient(1.0, 0, 0.0)
    client.request = lambda url, path, payload=None, **kw: answer
    engine = CompletionsEngine(client)
    engine.served_model = "teacher"
    return engine


def test_completions_read_token_ids_and_refuse_a_top_k_named_by_text():
    """vLLM's ``/v1/completions`` answer to echo with ``return_tokens_as_token_ids`` (entry 0 has no log-prob), and the
    same answer with tokens named by their text, as OpenAI's API names them."""
    top = [None, {"token_id:5": -0.1, "token_id:7": -2.5}, {"token_id:9": -0.5, "token_id:6": -3.0, "token_id:4": -1.0}]
    named = {
        "tokens": ["token_id:4", "token_id:5", "token_id:9"],
        "token_logprobs": [None, -0.1, -0.5],
        "top_logprobs": top,
    }
    scored = _completions({"choices": [{"logprobs": named}]}).score("http://t", [4], [5, 9], None, None, top_k=2)
    assert scored.logprobs == [-0.1, -0.5]
    assert scored.top_ids == [[5, 7], [9, 4]] and scored.top_logprobs == [[-0.1, -2.5], [-0.5, -1.0]]
    as_text = {**named, "tokens": ["1", "2", "6"], "top_logprobs": [None, {"2": -0.1}, {"6": -0.5, "3": -1.0}]}
    engine = _completions({"choices": [{"logprobs": as_text}]})
    assert engine.score("http://t", [4], [5, 9], None, None).logprobs == [-0.1, -0.5]  # by position: no ids needed
    with pytest.raises(CompletionsError) as err:
        engine.score("http://t", [4], [5, 9], None, None, top_k=2)
    assert "names its top tokens by text, not id" in str(err.value) and "set top_k 0" in str(err.value)
    with pytest.raises(ValueError, match="started with its own command"):
        CompletionsTeacher(servers=Servers(launch={"model": "x"}))


# ---------------------------------------------------------------------------------------------- a real vLLM server

VLLM = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]
"""Where the run's vLLM server lives: one xdist worker, one vLLM server at a time."""


@pytest.fixture(scope="module")
def vllm_teacher(student):
    """The shipped teacher on a vLLM server the teacher launches (fp32, no compilation, a small KV cache)."""
    from tests.fixtures.vllm_server import unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no real vLLM server: {reason}")
    teacher = VLLMTeacher(
        top_k=K,
        servers=Servers(
            launch={"dtype": "float32", "enforce_eager": True, "max_model_len": 64, "kv_cache_memory_bytes": 64 * 2**20}
        ),
    )
    teacher.setup(student)
    yield teacher
    teacher.close()


@pytest.mark.parametrize("route", [pytest.param(r, marks=VLLM) for r in ("generate", "completions")])
def test_a_vllm_teacher_scores_the_students_tokens_as_the_in_process_teacher(
    vllm_teacher, route, student, batch, in_process
):
    """Prompt log-probs on vLLM's token-in route (the teacher it launched), and the same server's /v1/completions."""
    teacher = vllm_teacher
    if route == "completions":
        teacher = CompletionsTeacher(top_k=K, servers=Servers(urls=(vllm_teacher.urls[0],)))
        teacher.setup(student)
        assert teacher.connection.engine.served_model == TINY_TEACHER_PATH  # the first model /v1/models lists
    _assert_equal_scores(teacher.score(batch), in_process, batch)


@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_vllms_tokenize_compares_the_teachers_tokenizer_when_its_path_is_not_here(vllm_teacher, student, monkeypatch):
    monkeypatch.setattr(CompletionsEngine, "model_path", lambda self, url: "/on/the/inference/node/teacher")
    answers = {}
    tokenize = CompletionsEngine.tokenize
    monkeypatch.setattr(
        CompletionsEngine, "tokenize", lambda self, url, text: answers.setdefault(text, tokenize(self, url, text))
    )
    teacher = CompletionsTeacher(servers=Servers(urls=(vllm_teacher.urls[0],)))
    teacher.setup(student)  # vLLM's /tokenize reads each of the policy's tokens as the policy's id
    teacher.close()
    assert len(answers) == 15 and answers["7"] == student("7", add_special_tokens=False).input_ids
    # the shipped teacher's tokenizer, loaded as Qwen2's, drops a lone space (its byte-level pre-tokenizer): no verdict
    assert answers[" "] == [] and all(len(ids) == 1 for text, ids in answers.items() if text != " ")


@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_a_launched_vllm_teacher_that_dies_is_one_error_naming_its_url_and_its_log(vllm_teacher, batch):
    """Last in this file: it ends the module's server."""
    import os
    import signal
    from dataclasses import replace

    url = vllm_teacher.urls[0]
    vllm_teacher.connection.client.max_retries, vllm_teacher.connection.client.backoff = 1, 0.01
    vllm_teacher.connection.servers = replace(vllm_teacher.connection.servers, max_restarts=0)  # no restart
    os.killpg(vllm_teacher.connection.server.process.pid, signal.SIGKILL)
    vllm_teacher.connection.server.process.wait()
    with pytest.raises(Exception) as err:
        vllm_teacher.score(batch)
    message = str(err.value)
    assert type(err.value).__name__ == "VLLMError" and "\n" not in message
    assert message.startswith(f"VLLMTeacher: the vLLM server at {url} is down (The vLLM server launched by the teacher")
    assert "exited with code -9) and its restarts are spent (0 of max_restarts=0)" in message and "Log: " in message
