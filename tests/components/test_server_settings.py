"""A server rollout's (and teacher's) settings as three typed objects (components/rollout/server/settings.py): the
constructor takes them whole, one part holds each, and each checks itself naming its key."""

from __future__ import annotations

import inspect

import pytest

from components.rollout import SGLangRollout, VLLMRollout
from components.rollout.server.rollout import ServerRollout
from components.rollout.server.settings import Servers, Verification, WeightPush
from components.teacher import CompletionsTeacher, SGLangTeacher

URL = "http://127.0.0.1:9"  # nothing is contacted: construction only


def test_the_rollout_takes_its_sampling_settings_and_three_settings_objects():
    parameters = inspect.signature(ServerRollout.__init__).parameters
    assert len(parameters) - 1 <= 12  # self aside; it took 39 flat arguments
    assert {name: parameters[name].annotation for name in ("servers", "weights", "verify")} == {
        "servers": "Servers",
        "weights": "WeightPush",
        "verify": "Verification",
    }


@pytest.mark.parametrize("rollout_class", [SGLangRollout, VLLMRollout])
def test_each_settings_object_is_held_by_the_one_part_that_reads_it(rollout_class):
    servers, weights, verify = Servers(urls=(URL,)), WeightPush(bucket_mb=64), Verification(every=3)
    rollout = rollout_class(servers=servers, weights=weights, verify=verify)
    assert rollout.connection.servers is servers
    assert rollout.pusher.weights is weights
    assert rollout.pusher.verification is verify
    assert not hasattr(rollout.connection, "push")  # the engine's weight calls receive the push settings


def test_a_teacher_takes_servers_alone():
    assert "weights" not in inspect.signature(SGLangTeacher.__init__).parameters
    servers = Servers(urls=(URL,), max_retries=0)
    teacher = CompletionsTeacher(servers=servers, top_k=2)
    assert teacher.connection.servers is servers and teacher.urls == [URL]


def test_urls_are_a_tuple_without_a_trailing_slash():
    assert Servers(urls=f"{URL}/").urls == (URL,)  # one URL, in Python
    assert Servers(urls=[f"{URL}/", "http://h:2"]).urls == (URL, "http://h:2")
    assert WeightPush(weight_update_urls=[f"{URL}/"]).weight_update_urls == (URL,)
    assert WeightPush(weight_update_urls=[]).weight_update_urls is None  # none listed: every server


@pytest.mark.parametrize(
    "settings, message",
    [
        (Servers(), "set exactly one of servers.urls (running servers) or servers.launch"),
        (Servers(urls=(URL,), max_concurrency=0), "servers.max_concurrency (0) >= 1"),
        (Servers(launch={"port": 1}, launch_servers=2), "servers.launch_servers 2 needs a port each"),
        (WeightPush(bucket_mb=0), "weights.group_backend nccl/gloo/null and weights.bucket_mb > 0"),
        (WeightPush(lora_sync="both"), "weights.lora_sync must be 'adapter' or 'merged'"),
        (Verification(tolerance=0), "need verify.every >= 0 and verify.tolerance > 0"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_rollout_and_its_key(settings, message):
    given = {"servers": Servers(urls=(URL,)), "weights": WeightPush(), "verify": Verification()}
    given[{Servers: "servers", WeightPush: "weights", Verification: "verify"}[type(settings)]] = settings
    with pytest.raises(ValueError) as err:
        SGLangRollout(**given)
    assert str(err.value).startswith("SGLangRollout: ") and message in str(err.value)
