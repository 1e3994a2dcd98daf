"""`HFRollout`: sampling with transformers' ``generate`` on the policy itself (the embedded default).

Batched, KV-cached, left-padded prompts; ``group_size`` samples per prompt laid out contiguously.
The weights are the trainer's own, so ``sync_weights`` has nothing to copy.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn

from lightning_rl.batch import RolloutBatch

from .base import Rollout, response_mask_from_eos


class HFRollout(Rollout):
    """Sample with ``policy.generate``.

    Set ``top_p``/``top_k`` only knowingly: the trainer mirrors the temperature in its log-probs
    but not a truncation, so with them the ratio's old policy is not the sampler (the module warns).
    """

    def __init__(
        self,
        group_size: int = 8,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_token_ids: list[int] | None = None,
        greedy_baseline: bool = False,
        return_logprobs: bool = False,
        generation_batch_size: int | None = None,
    ):
        """
        Args:
            group_size: responses sampled per prompt (G).
            max_new_tokens: length cap; a response that reaches it without EOS is ``truncated``.
            temperature: sampling temperature; 0 means greedy.
            top_p: nucleus sampling mass (1.0 = off).
            top_k: top-k sampling (0 = off).
            stop_token_ids: extra token ids that end a response, besides the tokenizer's EOS.
            greedy_baseline: also decode one greedy response per prompt, appended to its group and
                flagged ``is_greedy`` (the ReMax baseline); it never enters the loss.
            return_logprobs: fill ``rollout_logprobs`` from the sampler's logits (log_softmax(z / T),
                as SGLang reports them); costs (B, R, V) memory during generation.
            generation_batch_size: sequences per ``generate`` call, in whole groups (at least one prompt's
                group_size samples; None = all at once).
        """
        if group_size < 1 or max_new_tokens < 1:
            raise ValueError(f"HFRollout: group_size ({group_size}) and max_new_tokens ({max_new_tokens}) must be >= 1")
        if temperature < 0:
            raise ValueError(f"HFRollout: temperature must be >= 0, got {temperature}")
        self.group_size = group_size
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.stop_token_ids = list(stop_token_ids or [])
        self.greedy_baseline = greedy_baseline
        self.return_logprobs = return_logprobs
        self.generation_batch_size = generation_batch_size
        self.provides = Rollout.provides | ({"rollout_logprobs"} if return_logprobs else set()) | (
            {"is_greedy", "sample_mask"} if greedy_baseline else set()
        )

    @property
    def eos_ids(self) -> list[int]:
        return [self.eos_token_id, *self.stop_token_ids]

    @torch.no_grad()
    def _generate(self, policy: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, temperature: float, repeats: int = 1):
        """Sample ``repeats`` responses per prompt row (rows of one prompt contiguous). With repeats > 1 every
        prompt but its last token is prefilled once and its KV cache repeated to its samples, so the prompt
        costs one forward pass instead of ``repeats`` (the samples are the same: prefill draws no random numbers)."""
        sample = temperature > 0
        outputs, logits = [], []
        per_call = max(1, (self.generation_batch_size or prompt_ids.shape[0] * repeats) // repeats)  # prompts per generate call
        cache_kw = "cache" if "cache" in inspect.signature(policy.forward).parameters else "past_key_values"
        for i in range(0, prompt_ids.shape[0], per_call):
            ids, mask = prompt_ids[i : i + per_call], prompt_mask[i : i + per_call]
            prefill = {}
            if repeats > 1 and ids.shape[1] > 1:
                positions = (mask.cumsum(-1) - 1).clamp_min(0)
                cache = getattr(policy(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1], use_cache=True), cache_kw)
                cache.batch_repeat_interleave(repeats)
                prefill[cache_kw] = cache
            out = policy.generate(
                input_ids=ids.repeat_interleave(repeats, dim=0),
                attention_mask=mask.repeat_interleave(repeats, dim=0),
                do_sample=sample,
                temperature=temperature if sample else None,
                top_p=self.top_p if sample else None,
                top_k=self.top_k if sample else None,
                max_new_tokens=self.max_new_tokens,
                eos_token_id=self.eos_ids,
                pad_token_id=self.pad_token_id,
                return_dict_in_generate=True,
                output_logits=self.return_logprobs,
                **prefill,
            )
            outputs.append(out.sequences[:, prompt_ids.shape[1] :])  # (b, R_i)
            if self.return_logprobs:
                logits.append(torch.stack(out.logits, dim=1))  # (b, R_i, V) raw, before any warper
        width = max(o.shape[1] for o in outputs)
        response_ids = torch.cat([nn.functional.pad(o, (0, width - o.shape[1]), value=self.pad_token_id) for o in outputs])
        logprobs = None
        if self.return_logprobs:
            t = temperature if sample else 1.0
            logprobs = torch.cat(
                [
                    nn.functional.pad(torch.log_softmax(l.float() / t, -1).gather(-1, o[..., None]).squeeze(-1), (0, width - o.shape[1]))
                    for l, o in zip(logits, outputs)
                ]
            )
        return response_ids, logprobs

    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, policy: nn.Module, greedy: bool = False) -> RolloutBatch:
        n_prompts, g = prompt_ids.shape[0], 1 if greedy else self.group_size
        with_baseline = self.greedy_baseline and not greedy
        was_training = policy.training
        policy.eval()
        try:
            temperature = 0.0 if greedy else self.temperature
            response_ids, logprobs = self._generate(policy, prompt_ids, prompt_mask, temperature, repeats=g)  # (P_n * G, R)
            if with_baseline:
                greedy_ids, greedy_logprobs = self._generate(policy, prompt_ids, prompt_mask, 0.0)
                response_ids = _append_to_groups(response_ids, greedy_ids, g, self.pad_token_id)
                if logprobs is not None:
                    logprobs = _append_to_groups(logprobs, greedy_logprobs, g, 0.0)
        finally:
            policy.train(was_training)
        rows = g + int(with_baseline)
        response_mask, truncated = response_mask_from_eos(response_ids, self.eos_ids)
        is_greedy = (torch.arange(rows, device=prompt_ids.device) == g).repeat(n_prompts) if with_baseline else None
        return RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(rows, dim=0),
            prompt_mask=prompt_mask.repeat_interleave(rows, dim=0),
            response_ids=response_ids,
            response_mask=response_mask,
            rollout_logprobs=None if logprobs is None else logprobs * response_mask,
            truncated=truncated,
            group_ids=torch.arange(n_prompts, device=prompt_ids.device).repeat_interleave(rows),
            is_greedy=is_greedy,
            sample_mask=None if is_greedy is None else (is_greedy == 0).float(),
        )


def _append_to_groups(rows: Tensor, extra: Tensor, g: int, value) -> Tensor:
    """One ``extra`` row after each group of ``g`` rows. Shapes: (P_n * G, R1), (P_n, R2) -> (P_n * (G + 1), max(R1, R2))."""
    width = max(rows.shape[1], extra.shape[1])
    rows = nn.functional.pad(rows, (0, width - rows.shape[1]), value=value).reshape(extra.shape[0], g, width)  # (P_n, G, W)
    extra = nn.functional.pad(extra, (0, width - extra.shape[1]), value=value)
    return torch.cat([rows, extra[:, None]], dim=1).reshape(-1, width)
