"""`Service`: the Tinker API's state and its calls, below HTTP (app.py maps routes to these methods).

Each call takes the caller's tenant (the digest of its API key) and its parsed body and returns a JSON answer, or
raises a `ServiceError`. Calls that compute (create a model, forward_backward, optim_step, save, load, sample) queue a
job and answer ``{"request_id": ...}`` at once; ``retrieve_future`` fetches the result. What the SDK calls first
(``client/config``, ``client/dynamic_config``, ``create_session``) sets the SDK's switches: API keys, not JWTs
(``pjwt_auth_enabled: false``); plain protobuf bodies (``proto_compress_fwdbwd: false``: zstd is still read if sent);
one ``retrieve_future`` poll per request; custom losses run in the client.
"""

from __future__ import annotations

import logging
import threading

import torch

from lightning_rl.service.checkpoints import Storage
from lightning_rl.service.config import ServeConfig
from lightning_rl.service.errors import BadRequest, NotFound
from lightning_rl.service.futures import FutureStore, Pending
from lightning_rl.service.sampling import Sampler
from lightning_rl.service.sampling_api import SamplerEntry, SamplingAPI
from lightning_rl.service.scheduler import Job, Scheduler
from lightning_rl.service.sessions import Sessions
from lightning_rl.service.training import BaseModel, TrainingModel
from lightning_rl.service.training_api import TrainingAPI

log = logging.getLogger(__name__)

CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "proto_compress_fwdbwd": False,
    "use_pyqwest_transport": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
    "parallel_fwdbwd_chunks": True,
}
"""The SDK's switches (``ClientConfigResponse``), as this service answers them."""

DYNAMIC_CONFIG = {"refresh_interval_sec": 300, "sample_cancel_enabled": True, "sample_cancel_max_batch_size": 64}


class Service:
    """Base models, sessions, training clients, samplers, their queues and futures."""

    def __init__(self, config: ServeConfig):
        if not config.base_models:
            raise ValueError("serve: give at least one local model folder (--base_models)")
        if config.sampler is not None and len(config.base_models) != 1:
            raise ValueError(
                "serve: a sampler server serves one model: give one --base_models entry with --sampler, "
                f"not {len(config.base_models)}"
            )
        self.config, self.limits = config, config.limits
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        self.bases = [BaseModel(path) for path in config.base_models]
        self.storage = Storage(config.checkpoint_dir)
        self.sessions = Sessions(config.session_timeout_s, config.limits.max_sessions_per_key)
        self.futures = FutureStore(config.future_ttl_s)
        self.scheduler = Scheduler(config.limits.max_queued_per_client, gap_s=config.seq_gap_s)
        self.sampler = Sampler(config.sampler, self.bases)
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, SamplerEntry] = {}
        self.records: dict[str, dict[str, tuple[list[int], list[float]]]] = {}  # tenant -> sequence id -> sampled
        self.created: dict[str, str] = {}  # model id -> the request that creates it (a resent create gets it back)
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="tinker-service-reaper", daemon=True)
        self._reaper.start()
        self.training, self.sampling = TrainingAPI(self), SamplingAPI(self)

    def close(self) -> None:
        self._stop.set()
        self.scheduler.stop()
        self.sampler.close()

    # ------------------------------------------------------------------------------------------------ lookups
    def base(self, name: str, field: str = "base_model") -> BaseModel:
        for base in self.bases:
            if name in base.names:
                return base
        served = ", ".join(sorted(b.path for b in self.bases))
        raise BadRequest(f"{field} {name!r} is not served here; this service serves {served}", field)

    def model(self, tenant: str, model_id: str) -> TrainingModel:
        with self.lock:
            model = self.models.get(model_id)
        if model is None or model.tenant != tenant:
            raise NotFound(
                f"no training client {model_id!r} for this API key (it was never created with this key, or its "
                "session ended)",
                "model_id",
            )
        return model

    def queue(self, key: str, tenant: str, session_id: str, kind: str, job_payload, runner, seq_id=None,
              batch_key=None) -> str:  # fmt: skip
        """Queue a job on ``key``'s queue; returns the request id the client polls."""
        future = self.futures.create(tenant, session_id, kind)
        return self.scheduler.submit(key, Job(future, job_payload, runner, seq_id, batch_key))

    def refused(self, tenant: str, model_id, seq_id) -> None:
        """A numbered request of ``tenant``'s training client ``model_id`` was refused: its number will not come, and
        the client's later requests do not wait for it."""
        with self.lock:
            model = self.models.get(model_id) if isinstance(model_id, str) else None
        if model is not None and model.tenant == tenant and isinstance(seq_id, int):
            self.scheduler.skip(model_id, seq_id)

    def admin_queue(self, tenant: str, session_id: str) -> str:
        """A session's queue of model creations (unordered, beside its models' own queues)."""
        key = f"{session_id}:admin"
        self.scheduler.open(key, tenant, session_id, ordered=False)
        return key

    # ------------------------------------------------------------------------------------------------ session calls
    def client_config(self, tenant: str, body: dict) -> dict:
        return dict(CLIENT_CONFIG)

    def dynamic_config(self, tenant: str, body: dict) -> dict:
        return dict(DYNAMIC_CONFIG)

    def telemetry(self, tenant: str, body: dict) -> dict:
        return {"status": "accepted"}  # the SDK's usage events: not kept

    def health(self, tenant: str, body: dict) -> dict:
        return {"status": "ok"}

    def capabilities(self, tenant: str, body: dict) -> dict:
        models = [
            {"model_name": b.path, "max_context_length": b.context, "trainable": True, "sampleable": True}
            for b in self.bases
        ]
        return {"supported_models": models}

    def create_session(self, tenant: str, body: dict) -> dict:
        metadata = body.get("user_metadata") if isinstance(body.get("user_metadata"), dict) else {}
        session = self.sessions.create(tenant, metadata)
        log.info("session %s opened", session.id)
        return {"type": "create_session", "session_id": session.id, "info_message": None}

    def heartbeat(self, tenant: str, body: dict) -> dict:
        session_id = body.get("session_id")
        if not isinstance(session_id, str):
            raise BadRequest("session_id is required", "session_id")
        self.sessions.beat(tenant, session_id)
        return {"type": "session_heartbeat"}

    def finish_session(self, tenant: str, session_id: str, body: dict) -> dict:
        session = self.sessions.get(tenant, session_id, live=False)
        reason = body.get("reason", {}).get("type", "success") if isinstance(body.get("reason"), dict) else "success"
        self.end(session, str(reason))
        return {}

    def end(self, session, reason: str) -> None:
        """End ``session``: its queued requests fail, its models and samplers go (the work running finishes)."""
        self.sessions.finish(session, reason)
        self.scheduler.close_session(session.id, f"session {session.id} ended ({reason}) before this request ran")
        with self.lock:
            for model_id in [k for k, m in self.models.items() if m.session_id == session.id]:
                del self.models[model_id]
            for sampler_id in [k for k, s in self.samplers.items() if s.session_id == session.id]:
                del self.samplers[sampler_id]
        self.futures.drop_session(session.id)
        log.info("session %s ended (%s)", session.id, reason)

    def queues(self, tenant: str, body: dict) -> dict:
        """Every queue of this key's clients and its depth (requests accepted and not finished)."""
        return {"queues": self.scheduler.depths(tenant)}

    # ------------------------------------------------------------------------------------------------ futures
    def future(self, tenant: str, body: dict) -> Pending:
        request_id = body.get("request_id")
        if not isinstance(request_id, str):
            raise BadRequest("request_id is required", "request_id")
        return self.futures.get(tenant, request_id)

    def try_again(self, future: Pending) -> dict:
        with self.lock:
            waiting = sum(self.scheduler.depths(future.tenant).values())
        return {
            "type": "try_again",
            "request_id": future.request_id,
            "queue_state": "active",
            "queue_state_reason": f"{waiting} requests of this API key are queued or running",
        }

    def cancel(self, tenant: str, body: dict) -> dict:
        """The SDK gave up on a sample: if it has not started, it never will."""
        future = self.future(tenant, body)
        future.fail("cancelled by the client", "user")
        return {}

    # ------------------------------------------------------------------------------------------------ upkeep
    def _reap(self) -> None:
        while not self._stop.wait(1.0):
            for session in self.sessions.stale():
                self.end(session, "expired")
            self.futures.expire()
            self.sessions.forget_finished(self.config.future_ttl_s)
