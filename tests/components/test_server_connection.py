"""`Connection` (components/rollout/server/connection.py): what a launch starts."""

from __future__ import annotations

import os

import pytest

from components.rollout import SGLangRollout
from components.rollout.server.settings import Servers
from components.rollout.sglang.engine import SGLangEngine


def test_a_launch_that_names_no_checkpoint_serves_the_policys(tokenizer, tiny_model_path):
    launched = {}

    class Capturing(SGLangEngine):
        @classmethod
        def command(cls, launch, python):
            launched.update(launch)
            raise RuntimeError("not started")

    class Rollout(SGLangRollout):
        engine_type = Capturing

    with pytest.raises(RuntimeError, match="not started"):
        Rollout(servers=Servers(launch={"mem_fraction_static": 0.5})).setup(tokenizer)  # the tokenizer is the policy's
    assert launched == {"mem_fraction_static": 0.5, "model_path": os.path.abspath(tiny_model_path)}
    with pytest.raises(RuntimeError, match="not started"):
        Rollout(servers=Servers(launch={"model_path": "/elsewhere"})).setup(tokenizer)
    assert launched["model_path"] == "/elsewhere"  # named: kept


@pytest.mark.server
@pytest.mark.parametrize("engine", ["SGLang", "vLLM"])
def test_a_launch_on_a_port_another_server_holds_is_refused_before_anything_is_sent(tokenizer, tiny_model_path, engine):
    """Before, the other server's /health passed the launch: the run sampled there and pushed its weights into it."""
    from components.rollout import VLLMRollout
    from components.rollout.server.http import ServerError
    from tests.fixtures.sglang_server import FakeSGLangServer
    from tests.fixtures.vllm_server import unavailable

    if engine == "vLLM" and unavailable() is not None:
        pytest.skip(f"no vLLM environment to name in the launch command: {unavailable()}")
    other = FakeSGLangServer(tiny_model_path).start()  # another run's server
    port = other.httpd.server_address[1]
    model = {"model_path": tiny_model_path} if engine == "SGLang" else {"model": tiny_model_path}
    rollout = (SGLangRollout if engine == "SGLang" else VLLMRollout)(
        servers=Servers(launch={**model, "port": port}, backoff=0.01)
    )
    try:
        with pytest.raises(ServerError) as err:
            rollout.setup(tokenizer)
    finally:
        rollout.close()
        other.stop()
    assert str(err.value) == (
        f"{engine} server at http://127.0.0.1:{port}: another process already listens on port {port} "
        "(another run's server?), and the rollout would sample there and push its weights into it. Leave launch.port "
        "out (a free port is picked) or choose a free one"
    )
    assert not other.generate_calls and other.weight_version == "default"


@pytest.mark.slow
@pytest.mark.server
def test_a_server_that_took_the_port_after_the_launch_is_not_taken_for_the_launched_one(
    tokenizer, tiny_model_path, tmp_path, monkeypatch
):
    """The port was free when checked, then another server took it before the launched one bound it: its /health
    answers, but the socket on the port is not the launched process group's."""
    from components.rollout.server import launch
    from components.rollout.sglang import SGLangError
    from tests.fixtures.sglang_server import FakeSGLangServer, fake_sglang_package
    from tests.helpers import pythonpath

    fake_sglang_package(tmp_path)
    monkeypatch.setenv("PYTHONPATH", pythonpath(tmp_path))
    other = FakeSGLangServer(tiny_model_path).start()
    port = other.httpd.server_address[1]
    monkeypatch.setattr(launch, "port_taken", lambda url: False)  # the check ran before the other server bound
    rollout = SGLangRollout(servers=Servers(launch={"model_path": tiny_model_path, "port": port}, backoff=0.01))
    try:
        with pytest.raises(SGLangError, match=r"is not the server the rollout launched \(another run's server took"):
            rollout.setup(tokenizer)
        assert rollout.connection.server is None  # the launched one was stopped
        assert launch.listens_here(other.url, os.getpgid(0)) is True  # this process's own server is found as its own
    finally:
        rollout.close()
        other.stop()
    assert not other.generate_calls and other.weight_version == "default"
