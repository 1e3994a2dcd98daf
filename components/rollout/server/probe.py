"""The probe: a fixed prompt (for a vision-language policy, with a fixed picture) that every server continues greedily
after a push, scored again by the trainer.

The prompt is ``PROMPT_TOKENS`` token ids drawn with a fixed seed (a VLM: the chat of a fixed picture and text, image
tokens expanded by the policy's processor) continued greedily for ``PROBE_TOKENS`` tokens (EOS ignored). After a push
each server writes the continuation and its log-probs (temperature 0: untempered) and the trainer scores the same
tokens in one forward. A server fails the check when

    mean_t |log p_server(y_t | x, y_<t) - log p_trainer(y_t | x, y_<t)|  >  verify_tolerance

or when it answers with another weight version than the one pushed. The tokens are the ones the server finds likely,
so the numerics are those of ``rollout/logprob_diff_mean`` (on the shipped tiny models a bf16 copy differs from fp32
by 0.02-0.06 there). This is the numeric check beside the exact one (`verify`): it sees what a checksum cannot (the
server's kernels, an adapter, a tensor fused with another that did change) and misses a change smaller than the
tolerance. The picture makes the vision tower part of what it sees.

A push staged for another thread (asynchronous training, disk) is checked the other way round: the trainer writes the
continuation when it stages the push (`trainer_continuation`) and the server scores it after the push, since by then
the trainer's weights have moved on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from lightning_rl.core.hf_attributes import is_vision_language, model_config

from .http import ServerError
from .samples import Request, image_data

if TYPE_CHECKING:
    from .engine import Engine

PROMPT_TOKENS, PROBE_TOKENS = 8, 24
PROBE_TEXT = "What is in this picture?"


def probe_prompt(vocab_size: int) -> list[int]:
    """The fixed prompt: ``PROMPT_TOKENS`` ids drawn with a fixed seed from the tokenizer's vocabulary."""
    return torch.randint(vocab_size, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(20240601)).tolist()


def probe_picture():
    """A fixed 56 x 56 picture: a colour gradient with a white square, so every patch differs."""
    from PIL import Image

    pixels = bytes(v for y in range(56) for x in range(56) for v in (4 * x, 4 * y, 255 if 8 <= x < 24 else 60))
    return Image.frombytes("RGB", (56, 56), pixels)


@dataclass(frozen=True)
class Probe:
    """The probe's prompt ids, and for a vision-language policy its picture and the processor's tensors of it."""

    prompt: list[int]
    images: list | None = None
    image_inputs: dict[str, Tensor] | None = None

    @classmethod
    def for_policy(cls, policy: nn.Module, tokenizer) -> "Probe":
        if not is_vision_language(model_config(policy)):
            return cls(probe_prompt(len(tokenizer)))
        from lightning_rl.core.vision import load_processor

        processor = load_processor(policy.name_or_path, tokenizer)
        picture = probe_picture()
        ids, tensors = processor.encode(PROBE_TEXT, [picture])
        return cls(ids, [picture], tensors)

    @property
    def image_data(self) -> list[str] | None:
        return image_data(self.images) if self.images else None


class _Eval:
    """``policy`` in eval mode (no dropout) for the block, then as it was."""

    def __init__(self, policy: nn.Module):
        self.policy, self.was_training = policy, policy.training

    def __enter__(self) -> nn.Module:
        return self.policy.eval()

    def __exit__(self, *exc) -> None:
        self.policy.train(self.was_training)


@torch.no_grad()
def trainer_scores(
    policy: nn.Module, prompt: list[int], continuations: list[list[int]], image_inputs: dict | None = None
) -> Tensor:
    """log p(y_t | x, y_<t) of each continuation under ``policy``, one forward for all. Shape (S, PROBE_TOKENS). A
    collective under FSDP2: every rank runs it with the same continuations."""
    device = next(policy.parameters()).device
    tokens = torch.tensor([prompt + c for c in continuations], device=device)  # (S, P + R)
    with _Eval(policy):
        if image_inputs is None:
            logits = policy(input_ids=tokens).logits[:, len(prompt) - 1 : -1].float()  # (S, R, V)
        else:
            from lightning_rl.core.logprobs import response_logits

            responses = tokens[:, len(prompt) :]  # (S, R)
            prompts = tokens[:, : len(prompt)]  # (S, P)
            logits = response_logits(
                policy,
                prompts,
                torch.ones_like(prompts),
                responses,
                torch.ones_like(responses),
                [image_inputs] * len(continuations),
            ).float()  # (S, R, V)
    return torch.log_softmax(logits, -1).gather(-1, tokens[:, len(prompt) :, None])[..., 0].cpu()  # (S, R)


@torch.no_grad()
def trainer_continuation(
    policy: nn.Module, prompt: list[int], image_inputs: dict | None = None
) -> tuple[list[int], Tensor]:
    """``policy``'s greedy continuation of ``prompt`` and its log-probs (shape (PROBE_TOKENS,)), for a push checked
    after the trainer has moved on. One process only; a forward per token (no cache: the probe is short)."""
    device = next(policy.parameters()).device
    ids = list(prompt)
    with _Eval(policy):
        for _ in range(PROBE_TOKENS):
            if image_inputs is None:
                logits = policy(input_ids=torch.tensor([ids], device=device)).logits[0, -1]
            else:
                logits = _image_step(policy, prompt, ids[len(prompt) :], image_inputs, device)
            ids.append(int(logits.argmax()))
    continuation = ids[len(prompt) :]
    return continuation, trainer_scores(policy, prompt, [continuation], image_inputs)[0]


def _image_step(policy: nn.Module, prompt: list[int], response: list[int], image_inputs: dict, device) -> Tensor:
    """The logits of the next token after ``prompt`` (with its images) and ``response``, positions as the trainer
    scores them. Shape (V,)."""
    from lightning_rl.core.logprobs import response_logits

    prompts = torch.tensor([prompt], device=device)  # (1, P)
    responses = torch.tensor([response + [0]], device=device)  # (1, R + 1): a placeholder for the token predicted
    return response_logits(
        policy, prompts, torch.ones_like(prompts), responses, torch.ones_like(responses), [image_inputs]
    )[0, -1]


def server_continuation(
    engine: Engine, url: str, probe: Probe, adapter: str | None
) -> tuple[list[int], Tensor, str | None]:
    """The server's greedy continuation of the probe, its log-probs (shape (PROBE_TOKENS,)) and its weight version."""
    request = Request(
        probe.prompt, n=1, temperature=0.0, max_new_tokens=PROBE_TOKENS, images=probe.image_data, ignore_eos=True
    )
    (answer,) = engine.generate(url, request, adapter, keep_aborted=False)
    if len(answer.ids) != PROBE_TOKENS or len(answer.logprobs) != PROBE_TOKENS:
        raise engine.client.fail(
            url,
            f": the verification probe came back with {len(answer.ids)} tokens for max_new_tokens={PROBE_TOKENS}",
        )
    return answer.ids, torch.tensor(answer.logprobs), answer.weight_version


def check_version(error: type[ServerError], url: str, served_version: str | None, version: str | None) -> None:
    if version is not None and served_version is not None and served_version != version:
        raise error(
            f"{error.engine} server at {url} answers with weight_version {served_version!r} after the push of version "
            f"{version}: it did not apply it"
        )


def probe_finding(served: Tensor, expected: Tensor, tolerance: float) -> str | None:
    """What the probe says (None: the server's log-probs are the trainer's, within ``tolerance``)."""
    gap = (served - expected).abs()  # (PROBE_TOKENS,)
    if bool(gap.mean() <= tolerance):  # NaN fails
        return None
    return (
        f"on a probe of {len(expected)} greedy tokens its log-probs differ from the trainer's by {gap.mean().item():.3g} "
        f"on average (max {gap.max().item():.3g}), above model.rollout.init_args.verify.tolerance={tolerance:g}"
    )


def check_probe(
    error: type[ServerError],
    url: str,
    served: Tensor,
    expected: Tensor,
    served_version: str | None,
    version: str | None,
    tolerance: float,
) -> None:
    """Raise ``error`` naming ``url`` when the server's probe log-probs or weight version are not the pushed ones."""
    from .verify import verdict

    check_version(error, url, served_version, version)
    failure = verdict(error, url, version, {"probe": probe_finding(served, expected, tolerance)})
    if failure is not None:
        raise failure
