"""A sampler call in flight ends when its caller asks (components.rollout.interrupt): HFRollout within a decoding step."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from components.rollout import HFRollout
from components.rollout.interrupt import SamplingInterrupted, check_interrupted, interruptible
from tests.helpers import prompts


def test_hf_sampling_ends_within_a_step_of_the_stop_and_runs_whole_without_one(tokenizer):
    from lightning_rl.recipes.tiny import build_tiny_llama

    policy = build_tiny_llama(tokenizer, hidden_size=32, layers=2, heads=2, seed=0, max_positions=4096)
    rollout = HFRollout(group_size=2, max_new_tokens=3000, temperature=1.0, return_logprobs=True)
    rollout.setup(tokenizer)
    rollout.eos_token_id = -1  # no token ends a response: every call runs its max_new_tokens
    batch = prompts([tokenizer.encode("12+3=", add_special_tokens=False)] * 2)
    torch.manual_seed(0)
    whole = rollout.generate(batch, policy, rollout.params.__class__(group_size=2, max_new_tokens=40))
    assert whole.response_ids.shape == (4, 40)  # no stop asked: the call runs to its end

    asked = threading.Event()
    threading.Timer(0.5, asked.set).start()
    start = time.monotonic()
    with pytest.raises(SamplingInterrupted), interruptible(asked.is_set):
        rollout.generate(batch, policy)  # 3,000 steps: several seconds
    ended = time.monotonic()
    assert asked.is_set() and ended - start < 1.5  # measured: a few ms after the stop (one decoding step)


def test_the_stop_is_per_thread_and_restored_after_the_block():
    with interruptible(lambda: True):
        with pytest.raises(SamplingInterrupted):
            check_interrupted()
        other = []
        thread = threading.Thread(target=lambda: other.append(check_interrupted()))
        thread.start()
        thread.join()
        assert other == [None]  # another thread's sampler call is not this caller's
        with interruptible(lambda: False):
            check_interrupted()
        with pytest.raises(SamplingInterrupted):
            check_interrupted()
    check_interrupted()
