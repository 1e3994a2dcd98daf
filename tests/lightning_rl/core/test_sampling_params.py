"""`SamplingParams`: one immutable value per generate call; its checks replace each rollout's own."""

from __future__ import annotations

import dataclasses

import pytest

from components.rollout import HFRollout, SGLangRollout
from components.rollout.server.settings import Servers
from lightning_rl.core.sampling_params import SamplingParams


def test_rows_and_temperature_per_mode():
    params = SamplingParams(group_size=4, temperature=0.7, stop_token_ids=[5, 6])
    assert params.stop_token_ids == (5, 6) and params.eos_ids(2) == [2, 5, 6]
    assert (params.samples_per_prompt, params.rows_per_prompt, params.sampling_temperature) == (4, 4, 0.7)
    baseline = dataclasses.replace(params, greedy_baseline=True)
    assert (baseline.samples_per_prompt, baseline.rows_per_prompt, baseline.with_baseline) == (4, 5, True)
    greedy = dataclasses.replace(baseline, greedy=True)  # validation: one greedy row, no baseline
    assert (greedy.samples_per_prompt, greedy.rows_per_prompt, greedy.sampling_temperature, greedy.with_baseline) == (
        1,
        1,
        0.0,
        False,
    )


def test_a_value_nobody_changes_in_place():
    params = SamplingParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.group_size = 1
    assert dataclasses.replace(params, group_size=1).group_size == 1 and params.group_size == 8


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"group_size": 0}, r"group_size \(0\) and max_new_tokens \(64\) must be >= 1"),
        ({"max_new_tokens": 0}, r"group_size \(8\) and max_new_tokens \(0\) must be >= 1"),
        ({"temperature": -0.1}, "temperature >= 0"),
        ({"temperature": float("nan")}, "temperature >= 0"),
        ({"top_p": 0.0}, "0 < top_p <= 1"),
        ({"top_k": -1}, "top_k >= 0"),
    ],
)
def test_one_check_for_every_rollout_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
    with pytest.raises(ValueError, match="HFRollout: .*" + message):
        HFRollout(**kwargs)
    with pytest.raises(ValueError, match="SGLangRollout: .*" + message):
        SGLangRollout(servers=Servers(urls=("http://127.0.0.1:1",)), **kwargs)


def test_a_rollout_keeps_its_configured_settings_as_a_value():
    rollout = HFRollout(
        group_size=4, max_new_tokens=6, temperature=0.5, top_k=3, stop_token_ids=[9], greedy_baseline=True
    )
    assert rollout.params == SamplingParams(4, 6, 0.5, 1.0, 3, (9,), False, True)


def test_ignore_eos_leaves_only_the_stop_tokens_to_end_a_response():
    params = SamplingParams(stop_token_ids=[5], ignore_eos=True)
    assert params.eos_ids(2) == [5] and SamplingParams(ignore_eos=True).eos_ids(2) == []
    assert dataclasses.replace(params, ignore_eos=False).eos_ids(2) == [2, 5]
    assert HFRollout(ignore_eos=True).params.ignore_eos and not HFRollout().params.ignore_eos
    assert SGLangRollout(ignore_eos=True, servers=Servers(urls=("http://127.0.0.1:1",))).params.ignore_eos
