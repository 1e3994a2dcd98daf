"""Checking that a server holds what was pushed: the log-probs of a probe sequence on the server against the trainer's.

The probe is a fixed prompt of ``PROMPT_TOKENS`` token ids (seeded, the same every time) continued greedily for
``PROBE_TOKENS`` tokens (EOS ignored). After a push the server writes the continuation and its log-probs
(``/generate`` at temperature 0 with ``return_logprob``: ``meta_info.output_token_logprobs``, untempered) and the
trainer scores the same tokens in one forward. A server fails the check when

    mean_t |log p_server(y_t | x, y_<t) - log p_trainer(y_t | x, y_<t)|  >  verify_tolerance

or when it answers with another ``weight_version`` than the one pushed. The tokens are the ones the server finds
likely, so the numerics are those of ``rollout/logprob_diff_mean`` (on the shipped tiny models a bf16 copy differs
from fp32 by 0.02-0.06 there, and by twice that on random tokens). A tensor the server did not load, an adapter it
did not take, a server restarted on old weights move these log-probs further once the trainer has moved away from
them; a stale tensor whose update is still below the tolerance is caught later, as its error grows with every
update after it.

A push staged for another thread (asynchronous training, disk) is checked the other way round: the trainer writes
the continuation when it stages the push (`trainer_continuation`) and the server scores it after the push
(``max_new_tokens: 0``, ``logprob_start_len: 0``: ``meta_info.input_token_logprobs``), since by then the trainer's
weights have moved on.

Why not SGLang's ``/weights_checker`` checksums: it hashes the weights as the server holds them (q/k/v and
gate/up fused, tensor-parallel shards, the vocabulary padded, bf16), with a Triton hash on GPUs; the trainer holds
none of those tensors, so no hash it computes can match.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .client import SGLangClient, SGLangError

PROMPT_TOKENS, PROBE_TOKENS = 8, 24


def probe_prompt(vocab_size: int) -> list[int]:
    """The fixed prompt: ``PROMPT_TOKENS`` ids drawn with a fixed seed from the tokenizer's vocabulary."""
    return torch.randint(vocab_size, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(20240601)).tolist()


class _Eval:
    """``policy`` in eval mode (no dropout) for the block, then as it was."""

    def __init__(self, policy: nn.Module):
        self.policy, self.was_training = policy, policy.training

    def __enter__(self) -> nn.Module:
        return self.policy.eval()

    def __exit__(self, *exc) -> None:
        self.policy.train(self.was_training)


@torch.no_grad()
def trainer_scores(policy: nn.Module, prompt: list[int], continuations: list[list[int]]) -> Tensor:
    """log p(y_t | x, y_<t) of each continuation under ``policy``, one forward for all. Shape (S, PROBE_TOKENS). A
    collective under FSDP2: every rank runs it with the same continuations."""
    device = next(policy.parameters()).device
    tokens = torch.tensor([prompt + c for c in continuations], device=device)  # (S, P + R)
    with _Eval(policy):
        logits = policy(input_ids=tokens).logits[:, len(prompt) - 1 : -1].float()  # (S, R, V)
    return torch.log_softmax(logits, -1).gather(-1, tokens[:, len(prompt) :, None])[..., 0].cpu()  # (S, R)


@torch.no_grad()
def trainer_continuation(policy: nn.Module, prompt: list[int]) -> tuple[list[int], Tensor]:
    """``policy``'s greedy continuation of ``prompt`` and its log-probs (shape (PROBE_TOKENS,)), for a push checked
    after the trainer has moved on. One process only; a forward per token (no cache: the probe is short)."""
    device = next(policy.parameters()).device
    ids = list(prompt)
    with _Eval(policy):
        for _ in range(PROBE_TOKENS):
            ids.append(int(policy(input_ids=torch.tensor([ids], device=device)).logits[0, -1].argmax()))
    continuation = ids[len(prompt) :]
    return continuation, trainer_scores(policy, prompt, [continuation])[0]


def server_continuation(
    client: SGLangClient, url: str, prompt: list[int], lora_name: str | None
) -> tuple[list[int], Tensor, str | None]:
    """The server's greedy continuation of ``prompt``, its log-probs (shape (PROBE_TOKENS,)) and its weight version."""
    params = {"n": 1, "temperature": 0.0, "max_new_tokens": PROBE_TOKENS, "ignore_eos": True}
    meta, ids = _generate(
        client, url, {"input_ids": prompt, "sampling_params": params, "return_logprob": True}, lora_name
    )
    scored = meta.get("output_token_logprobs") or []
    if len(ids) != PROBE_TOKENS or len(scored) != PROBE_TOKENS:
        raise SGLangError(
            f"SGLang server at {url}: the verification probe came back with {len(ids)} tokens for max_new_tokens={PROBE_TOKENS}"
        )
    return [int(t) for t in ids], torch.tensor([float(entry[0]) for entry in scored]), _version(meta)


def server_scores(
    client: SGLangClient, url: str, prompt: list[int], continuation: list[int], lora_name: str | None
) -> tuple[Tensor, str | None]:
    """The server's log p(y_t | x, y_<t) of a given continuation (shape (PROBE_TOKENS,)) and its weight version."""
    body = {
        "input_ids": prompt + continuation,
        "sampling_params": {"n": 1, "max_new_tokens": 0, "temperature": 1.0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    meta, _ = _generate(client, url, body, lora_name)
    scored = meta.get("input_token_logprobs") or []
    if len(scored) != len(prompt) + len(continuation):
        raise SGLangError(
            f"SGLang server at {url}: the verification probe came back with {len(scored)} input log-probs for {len(prompt) + len(continuation)} tokens"
        )
    return torch.tensor([float(entry[0]) for entry in scored[len(prompt) :]]), _version(meta)


def _generate(client: SGLangClient, url: str, body: dict, lora_name: str | None) -> tuple[dict, list]:
    if lora_name is not None:
        body["lora_path"] = lora_name
    answer = client.request(url, "/generate", body)
    item = (answer[0] if isinstance(answer, list) else answer) or {}
    return item.get("meta_info") or {}, item.get("output_ids") or []


def _version(meta: dict) -> str | None:
    served = meta.get("weight_version")
    return None if served is None else str(served)


def check(
    url: str, served: Tensor, expected: Tensor, served_version: str | None, version: str | None, tolerance: float
) -> None:
    """Raise `SGLangError` naming ``url`` when the server's probe log-probs or weight version are not the pushed ones."""
    if version is not None and served_version is not None and served_version != version:
        raise SGLangError(
            f"SGLang server at {url} answers with weight_version {served_version!r} after the push of version {version}: it did not apply it"
        )
    error = (served - expected).abs()  # (PROBE_TOKENS,)
    if not bool(error.mean() <= tolerance):  # also fails on NaN
        raise SGLangError(
            f"SGLang server at {url} does not hold the weights just pushed{f' (version {version})' if version else ''}: on a probe of "
            f"{len(expected)} greedy tokens its log-probs differ from the trainer's by {error.mean().item():.3g} on average (max "
            f"{error.max().item():.3g}), above model.rollout.init_args.verify_tolerance={tolerance:g}. A weight it did not load, an adapter "
            "it did not take, or a restarted server. If the gap is only numerics (a bf16 sampler), set verify_tolerance a few times "
            "rollout/logprob_diff_mean"
        )
