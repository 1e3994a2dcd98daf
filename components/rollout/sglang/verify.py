"""Checking that a server holds what was pushed: the sampler's log-probs of a fixed token sequence against the trainer's.

After a push, each server scores a probe of ``PROBE_TOKENS`` token ids (seeded, the same every time) with
``/generate {input_ids, sampling_params: {n: 1, max_new_tokens: 0, temperature: 1}, return_logprob,
logprob_start_len: 0}``: its ``meta_info.input_token_logprobs`` are log p(x_t | x_<t) for t >= 1 (the first entry has none). The
trainer computes the same with one forward of the policy. The server fails the check when

    mean_t |log p_server(x_t | x_<t) - log p_trainer(x_t | x_<t)|  >  tolerance

or when it answers with another ``weight_version`` than the one pushed. A tensor the server did not load, an
adapter it did not take, a server restarted on old weights: each moves these log-probs far more than the numerics
of the same weights do (fp32: ~1e-6; bf16 sampler against an fp32 trainer: ~1e-2). A stale tensor whose update was
below the tolerance is not caught at that push, but its error grows with every update the trainer makes after.

Why not SGLang's ``/weights_checker`` checksums: it hashes the weights as the server holds them (q/k/v and
gate/up fused, tensor-parallel shards, the vocabulary padded, bf16), with a Triton hash on GPUs; the trainer holds
none of those tensors, so no hash it computes can match.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .client import SGLangClient, SGLangError

PROBE_TOKENS = 32


def probe_ids(vocab_size: int) -> list[int]:
    """The fixed probe: ``PROBE_TOKENS`` ids drawn with a fixed seed from the tokenizer's vocabulary."""
    generator = torch.Generator().manual_seed(20240601)
    return torch.randint(vocab_size, (PROBE_TOKENS,), generator=generator).tolist()


@torch.no_grad()
def trainer_logprobs(policy: nn.Module, ids: list[int]) -> Tensor:
    """log p(x_t | x_<t), t = 1..T-1, under ``policy`` in eval mode (no dropout). Shape (T - 1,). A collective under
    FSDP2: every rank runs it."""
    device = next(policy.parameters()).device
    tokens = torch.tensor([ids], device=device)  # (1, T)
    was_training = policy.training
    policy.eval()
    try:
        logits = policy(input_ids=tokens).logits[0, :-1].float()  # (T - 1, V)
    finally:
        policy.train(was_training)
    return torch.log_softmax(logits, -1).gather(-1, tokens[0, 1:, None])[:, 0].cpu()  # (T - 1,)


def server_logprobs(client: SGLangClient, url: str, ids: list[int], lora_name: str | None) -> tuple[Tensor, str | None]:
    """The server's log p(x_t | x_<t), t = 1..T-1 (shape (T - 1,)), and the weight version it answered with."""
    body = {"input_ids": ids, "sampling_params": {"n": 1, "max_new_tokens": 0, "temperature": 1.0}, "return_logprob": True, "logprob_start_len": 0}
    if lora_name is not None:
        body["lora_path"] = lora_name
    answer = client.request(url, "/generate", body)
    meta = (answer[0] if isinstance(answer, list) else answer or {}).get("meta_info") or {}
    scored = meta.get("input_token_logprobs") or []
    if len(scored) != len(ids) or any(int(entry[1]) != t for entry, t in zip(scored, ids)):
        raise SGLangError(f"SGLang server at {url}: the verification probe came back with {len(scored)} input log-probs for {len(ids)} tokens")
    served = meta.get("weight_version")
    return torch.tensor([float(entry[0]) for entry in scored[1:]]), None if served is None else str(served)


def check(url: str, served: Tensor, expected: Tensor, served_version: str | None, version: str | None, tolerance: float) -> None:
    """Raise `SGLangError` naming ``url`` when the server's probe log-probs or weight version are not the pushed ones."""
    if version is not None and served_version is not None and served_version != version:
        raise SGLangError(f"SGLang server at {url} answers with weight_version {served_version!r} after the push of version {version}: it did not apply it")
    error = (served - expected).abs()  # (T - 1,)
    if not bool(error.mean() <= tolerance):  # also fails on NaN
        raise SGLangError(
            f"SGLang server at {url} does not hold the weights just pushed{f' (version {version})' if version else ''}: on a fixed probe of "
            f"{len(expected) + 1} tokens its log-probs differ from the trainer's by {error.mean().item():.3g} on average (max {error.max().item():.3g}), "
            f"above model.rollout.init_args.verify_tolerance={tolerance:g}. A weight it did not load, an adapter it did not take, or a "
            "restarted server. If the gap is only numerics (a bf16 sampler), set verify_tolerance a few times rollout/logprob_diff_mean"
        )
