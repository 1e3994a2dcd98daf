"""The two engines the contract tests run against, behind one face: the loopback SGLang server (a process of its own,
tests/fixtures/sglang_server.py) and the run's real vLLM server (tests/fixtures/vllm_server.py), both serving the
shipped tiny tool-using policy (vLLM: the same function with wider attention heads, its ``model``), or both serving the
shipped mixture of experts (``MOE``, heads of 32 dimensions already)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

from components.rollout.server.settings import Servers
from lightning_rl.core.logprobs import policy_logprobs

REPO = Path(__file__).resolve().parents[2]
MODEL = str(REPO / "lightning_rl/assets/tiny-calc")
MOE = str(REPO / "lightning_rl/assets/tiny-arith-moe")


class Engine:
    """``url`` and ``model`` (the checkpoint it serves: the trainer's policy); ``make(**kwargs)`` a rollout on it
    (closed by the fixture); ``stale(names)`` while the block runs, the pushed tensors ``names`` (checkpoint names) do
    not reach the server's weights; ``kill`` / ``restart`` the server."""

    name: str
    url: str
    model: str
    config: str  # the rollout fragment a fit stacks
    error: type[Exception]

    def __init__(self):
        from lightning_rl.core.models import load_tokenizer

        self.tokenizer, self.made = load_tokenizer(self.model), []

    def rollout_class(self):
        raise NotImplementedError

    def make(self, servers: Servers = Servers(), **kwargs):
        """A rollout on this engine's server (``servers``' other settings kept), retrying after 50 ms."""
        rollout = self.rollout_class()(servers=replace(servers, urls=(self.url,), backoff=0.05), **kwargs)
        rollout.setup(self.tokenizer)
        self.made.append(rollout)
        return rollout

    def fit_args(self) -> list[str]:
        return ["--config", str(REPO / self.config), f"--model.rollout.init_args.servers.urls=[{self.url}]"]

    def close(self) -> None:
        for rollout in self.made:
            rollout.close()


class LoopbackSGLang(Engine):
    name, config = "sglang", "configs/rollout/sglang.yaml"

    def __init__(self, process, model: str = MODEL):
        self.process, self.url, self.model = process, process.url, model
        super().__init__()
        from components.rollout.sglang import SGLangError

        self.error = SGLangError

    def rollout_class(self):
        from components.rollout import SGLangRollout

        return SGLangRollout

    @contextmanager
    def stale(self, names: list[str]):
        self.process.get("/loopback_fault", {"keep_stale": names})  # the server's loader skips them
        try:
            yield
        finally:
            self.process.get("/loopback_fault", {"keep_stale": []})

    def kill(self) -> None:
        self.process.process.kill()
        self.process.process.wait()

    def restart(self) -> None:
        """A new server process at the same address, in the place of the old one (whoever holds it stops the new)."""
        from tests.fixtures.sglang_server import ServerProcess

        self.process.stop()
        restarted = ServerProcess(self.model, port=self.process.port, env={"OMP_NUM_THREADS": "1"})
        self.process.__dict__.update(vars(restarted))


class RealVLLM(Engine):
    name, config = "vllm", "configs/rollout/vllm.yaml"

    def __init__(self, shared):
        self.shared, self.url, self.model = shared, shared.url, shared.model
        super().__init__()
        from components.rollout.vllm import VLLMError

        self.error = VLLMError

    def rollout_class(self):
        from components.rollout import VLLMRollout

        return VLLMRollout

    def fit_args(self) -> list[str]:
        return [*super().fit_args(), "--model.rollout.init_args.servers.launch", "null"]

    @contextmanager
    def stale(self, names: list[str]):
        """The push leaves ``names`` out after recording them as sent: the server keeps their old values (vLLM keeps
        what a push does not carry), as a loader that skipped them would."""
        from components.rollout.server import buckets

        original = buckets.WeightBuckets.__iter__

        def leaving_out(self):
            for bucket in original(self):
                yield [(n, t) for n, t in bucket if n not in names]

        buckets.WeightBuckets.__iter__ = leaving_out
        try:
            yield
        finally:
            buckets.WeightBuckets.__iter__ = original

    def kill(self) -> None:
        self.shared.kill()

    def restart(self) -> None:
        self.shared.restart()


def gaps(policy, batch, temperature: float = 1.0, truncation=None) -> Tensor:
    """|trainer - engine| log-prob of each sampled token (fp32 both; 0 on padding), the trainer's under the sampler's
    ``truncation`` (None: untruncated). Shape: (B, R)."""
    with torch.no_grad():
        trainer = policy_logprobs(policy.eval(), batch, temperature, truncation=truncation)[0]
    return ((trainer - batch.rollout_logprobs) * batch.response_mask).abs()


def gap(policy, batch, temperature: float = 1.0, truncation=None) -> float:
    """Largest |trainer - engine| log-prob over the sampled tokens (fp32 both)."""
    return float(gaps(policy, batch, temperature, truncation).max())


def perturb(policy, scale: float, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
