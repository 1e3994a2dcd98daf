"""What rollouts share beside their contract (`lightning_rl.core.contracts.Rollout`): sampling settings from init
arguments, the response mask from EOS."""

from __future__ import annotations

from torch import Tensor

from lightning_rl.core.deprecation import moved
from lightning_rl.core.sampling_params import SamplingParams

__getattr__ = moved(__name__, "lightning_rl.core.contracts.rollout", ("Rollout",))


def configured_params(
    who: str,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    stop_token_ids: list[int] | None,
    greedy_baseline: bool,
    ignore_eos: bool = False,
) -> SamplingParams:
    """A rollout's own sampling settings from its constructor's arguments; a bad value is an error naming ``who``."""
    try:
        stop = tuple(stop_token_ids or ())
        return SamplingParams(
            group_size, max_new_tokens, temperature, top_p, top_k, stop, False, greedy_baseline, ignore_eos
        )
    except ValueError as err:
        raise ValueError(f"{who}: {err}") from None


def response_mask_from_eos(response_ids: Tensor, eos_token_ids: list[int]) -> tuple[Tensor, Tensor]:
    """Mask up to and including the first EOS, and the truncated flag. Shapes: (B, R) -> (B, R), (B,).

    Samplers right-pad finished sequences with pad (often == EOS); those tokens were never sampled
    and must not carry advantage, KL or entropy.
    """
    is_eos = response_ids.new_zeros(response_ids.shape, dtype=bool)
    for eos in eos_token_ids:
        is_eos |= response_ids == eos
    eos_before = is_eos.long().cumsum(-1) - is_eos.long()  # EOS count strictly earlier in the row
    response_mask = (eos_before == 0).long()
    truncated = is_eos.sum(-1) == 0
    return response_mask, truncated
