"""The training calls of the Tinker API: ``create_model``, ``get_info``, ``forward_backward`` (and ``forward``),
``optim_step``, ``save_weights`` (``save_state``), ``save_weights_for_sampler``, ``load_weights`` and
``unload_model``. Each checks its request now (a bad field is a 400 naming it) and queues the work on the training
client's queue, where it runs in ``seq_id`` order."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_rl.core.lora import LoraSpec
from lightning_rl.service.codec import (
    decode_forward_backward,
    encode_forward_backward_output,
    forward_backward_output_json,
)
from lightning_rl.service.errors import BadRequest, Busy, ServiceError
from lightning_rl.service.futures import JSONAnswer
from lightning_rl.service.losses import loss_named
from lightning_rl.service.requests import Fields
from lightning_rl.service.sampling import Snapshot
from lightning_rl.service.training import LoraRequest, TrainingModel

MAX_RANK = 1024
PER_TOKEN_THRESHOLDS = ("clip_low_threshold", "clip_high_threshold")


@dataclass
class ForwardBackwardAnswer:
    logprobs: list[Tensor]
    metrics: dict[str, float]

    def json(self) -> dict:
        return forward_backward_output_json(self.logprobs, self.metrics)

    def proto(self) -> bytes:
        return encode_forward_backward_output(self.logprobs, self.metrics)


class TrainingAPI:
    def __init__(self, service):
        self.service = service

    # ------------------------------------------------------------------------------------------------ models
    def create_model(self, tenant: str, body: dict) -> dict:
        service, fields = self.service, Fields(body)
        session = service.sessions.get(tenant, fields.text("session_id"))
        seq = fields.integer("model_seq_id", low=0)
        base = service.base(fields.text("base_model"))
        _adam_only(fields.object("optimizer_config", None), "optimizer_config")
        lora_fields = fields.object("lora_config", None)
        lora = None
        if lora_fields is not None:
            lora = LoraRequest(
                rank=lora_fields.integer("rank", low=1, high=MAX_RANK),
                seed=lora_fields.integer("seed", None),
                train_mlp=lora_fields.flag("train_mlp", True),
                train_attn=lora_fields.flag("train_attn", True),
                train_unembed=lora_fields.flag("train_unembed", True),
            )
            base.lora_targets(lora)  # a kind asked for and absent: refused now, not in the future
        model_id = f"{session.id}:train:{seq}"
        return self._create(
            tenant, session, model_id, "CreateModel", lambda: self._build(tenant, session, model_id, base, lora)
        )

    def _create(self, tenant: str, session, model_id: str, kind: str, build) -> dict:
        service = self.service
        with service.lock:
            if model_id in service.created:
                return {"request_id": service.created[model_id], "model_id": model_id}
            live = sum(1 for m in service.models.values() if m.tenant == tenant)
            if live >= service.limits.max_models_per_key:
                raise BadRequest(
                    f"this API key has {live} training clients (serve limits.max_models_per_key): end a session first",
                    "model_seq_id",
                )
            request_id = service.queue(
                service.admin_queue(tenant, session.id), tenant, session.id, kind, None, lambda _: [JSONAnswer(build())]
            )
            service.created[model_id] = request_id
        return {"request_id": request_id, "model_id": model_id}

    def _build(self, tenant, session, model_id, base, lora: LoraRequest | None, spec: LoraSpec | None = None) -> dict:
        service = self.service
        if lora is not None and spec is None:
            spec = base.lora_spec(lora, service.config.lora_alpha)
        model = TrainingModel(model_id, tenant, session.id, base, lora, spec)
        with service.lock:
            service.models[model_id] = model
            session.models.add(model_id)
        service.scheduler.open(model_id, tenant, session.id, ordered=True)
        return {"type": "create_model", "model_id": model_id}

    def get_info(self, tenant: str, body: dict) -> dict:
        model = self.service.model(tenant, Fields(body).text("model_id"))
        base = model.base
        return {
            "type": "get_info",
            "model_id": model.model_id,
            "model_name": base.path,
            "model_data": {"arch": base.arch, "model_name": base.path, "tokenizer_id": base.path},
            "is_lora": model.lora is not None,
            "lora_rank": None if model.lora is None else model.lora.rank,
            "optimizer_config": {"type": "adamw"},
        }

    def unload_model(self, tenant: str, body: dict) -> dict:
        model = self.service.model(tenant, Fields(body).text("model_id"))
        service = self.service

        def unload(_):
            with service.lock:
                service.models.pop(model.model_id, None)
            service.scheduler.close(model.model_id, f"{model.model_id} was unloaded")
            return [JSONAnswer({"type": "unload_model", "model_id": model.model_id})]

        return self._queued(tenant, model, body, "UnloadModel", unload)

    def _queued(self, tenant: str, model: TrainingModel, body: dict, kind: str, run) -> dict:
        seq_id = Fields(body).integer("seq_id", None)
        if seq_id is None:  # a call the SDK does not number runs after what is queued now
            seq_id = self.service.scheduler.next_free(model.model_id)
        request_id = self.service.queue(model.model_id, tenant, model.session_id, kind, None, run, seq_id)
        return {"request_id": request_id, "model_id": model.model_id}

    # ------------------------------------------------------------------------------------------------ training
    def forward_backward(self, tenant: str, body: bytes) -> dict:
        request = decode_forward_backward(body)
        try:
            return self._forward_backward(tenant, request)
        except ServiceError as err:
            if not isinstance(err, Busy):  # a 429 is retried under the same number
                self.service.refused(tenant, request.model_id, request.seq_id)
            raise

    def _forward_backward(self, tenant: str, request) -> dict:
        service, limits = self.service, self.service.limits
        model = service.model(tenant, request.model_id)
        loss, surrogate = loss_named(request.loss_fn, request.config)
        if not request.data:
            raise BadRequest("data holds no datum", "data")
        if len(request.data) > limits.max_datums:
            raise BadRequest(f"data holds {len(request.data)} datums; at most {limits.max_datums} a request", "data")
        total = sum(d.tokens.numel() for d in request.data)
        if total > limits.max_tokens_per_request:
            raise BadRequest(
                f"data holds {total} tokens; at most {limits.max_tokens_per_request} a request (send several)", "data"
            )
        sampled = [self._check_datum(model, loss, d, f"data[{i}]", tenant) for i, d in enumerate(request.data)]
        micro = service.config.micro_batch_tokens

        def run(_):
            logprobs, metrics = model.forward_backward(request, loss, surrogate, sampled, micro)
            return [ForwardBackwardAnswer(logprobs, metrics)]

        kind = "Forward" if request.forward_only else "ForwardBackward"
        request_id = service.queue(model.model_id, tenant, model.session_id, kind, None, run, request.seq_id)
        return {"request_id": request_id, "model_id": model.model_id}

    def _check_datum(self, model: TrainingModel, loss, datum, where: str, tenant: str) -> Tensor | None:
        """Check one datum against the loss and the model; returns its sampled positions (stable_reinforce)."""
        n, base = datum.tokens.numel(), model.base
        if n > base.context:
            raise BadRequest(
                f"{where}.model_input has {n} tokens; {base.path} takes {base.context}", f"{where}.model_input"
            )
        if int(datum.tokens.max()) >= base.vocab_size or int(datum.tokens.min()) < 0:
            raise BadRequest(
                f"{where}.model_input holds token ids outside 0 .. {base.vocab_size - 1}", f"{where}.model_input"
            )
        inputs = datum.inputs
        for name in PER_TOKEN_THRESHOLDS:
            if name in inputs:
                raise BadRequest(
                    f"{where}.loss_fn_inputs.{name}: per-token clip thresholds are not taken; pass one value in "
                    f"loss_fn_config.{name}",
                    f"{where}.loss_fn_inputs.{name}",
                )
        missing = sorted(loss.required - set(inputs))
        if missing:
            raise BadRequest(
                f"{where}.loss_fn_inputs.{missing[0]} is required by {loss.name}",
                f"{where}.loss_fn_inputs.{missing[0]}",
            )
        unknown = sorted(set(inputs) - loss.required - loss.optional)
        if unknown:
            accepted = ", ".join(sorted(loss.required | loss.optional))
            raise BadRequest(
                f"{where}.loss_fn_inputs.{unknown[0]}: {loss.name} takes no such input (it takes {accepted})",
                f"{where}.loss_fn_inputs.{unknown[0]}",
            )
        for name, value in inputs.items():
            field = f"{where}.loss_fn_inputs.{name}"
            if value.dim() != 1 or value.numel() != n:
                raise BadRequest(
                    f"{field} has shape {list(value.shape)}; it must be [{n}], one value per input token", field
                )
            if name == "target_tokens":
                if value.is_floating_point() or int(value.min()) < 0 or int(value.max()) >= base.vocab_size:
                    raise BadRequest(f"{field} must hold token ids 0 .. {base.vocab_size - 1}", field)
            elif not bool(torch.isfinite(value.float()).all()):
                raise BadRequest(f"{field} holds NaN or inf", field)
        if loss.needs_sampled_positions:
            return self._sampled_positions(tenant, datum, where, n)
        return None

    def _sampled_positions(self, tenant: str, datum, where: str, n: int) -> Tensor:
        """stable_reinforce: the positions the datum's provenance names as sampled tokens, and q there from what the
        sampler recorded (``record_stability_info``) when it did, checked against the datum's targets."""
        spans = datum.target_spans
        field = f"{where}.loss_fn_input_spans"
        if spans is None:
            raise BadRequest(
                f"{field}: stable_reinforce needs provenance on every datum (Datum.with_provenance) naming the sampled "
                "sequence behind each target",
                field,
            )
        if sum(s.length for s in spans) != n:
            raise BadRequest(f"{field} cover {sum(s.length for s in spans)} positions; the datum has {n}", field)
        sampled = torch.zeros(n, dtype=torch.long)
        records = self.service.records.get(tenant, {})
        logprobs = datum.inputs.get("logprobs")
        q = torch.zeros(n) if logprobs is None else logprobs.float().clone()
        start = 0
        for span in spans:
            if span.sampled and span.length:
                sampled[start : start + span.length] = 1
                record = records.get(span.sequence_id)
                if record is not None:
                    tokens, recorded = record
                    stop = span.offset + span.length
                    if (
                        stop > len(tokens)
                        or datum.inputs["target_tokens"][start : start + span.length].tolist()
                        != tokens[span.offset : stop]
                    ):
                        raise BadRequest(
                            f"{field}: targets {start} .. {start + span.length - 1} are not tokens {span.offset} .. "
                            f"{stop - 1} of sequence {span.sequence_id} as it was sampled",
                            field,
                        )
                    q[start : start + span.length] = torch.tensor(recorded[span.offset : stop])
                elif logprobs is None:
                    raise BadRequest(
                        f"{field}: sequence {span.sequence_id} was not recorded (sample with record_stability_info) "
                        f"and {where}.loss_fn_inputs.logprobs is not given: q is unknown",
                        field,
                    )
            start += span.length
        outside = datum.inputs["advantages"].float() * (1 - sampled)
        if bool((outside != 0).any()):
            raise BadRequest(
                f"{where}.loss_fn_inputs.advantages: stable_reinforce takes advantages on sampled tokens only; they "
                "are nonzero where the provenance names none",
                f"{where}.loss_fn_inputs.advantages",
            )
        datum.inputs["logprobs"] = q
        return sampled

    def optim_step(self, tenant: str, body: dict) -> dict:
        fields = Fields(body)
        model = self.service.model(tenant, fields.text("model_id"))
        if "adam_params" not in body and "optim_params" not in body:
            other = fields.object("optimizer_params", None)
            kind = other.text("type", "unknown") if other is not None else "none"
            raise BadRequest(
                f"optimizer_params.type {kind!r}: this service steps with Adam (AdamParams) only",
                "optimizer_params.type",
            )
        adam = fields.object("adam_params" if "adam_params" in body else "optim_params")
        step = dict(
            lr=adam.number("learning_rate", 1e-4, low=0.0),
            beta1=adam.number("beta1", 0.9, low=0.0, high=0.999999),
            beta2=adam.number("beta2", 0.95, low=0.0, high=0.999999),
            eps=adam.number("eps", 1e-12, low=0.0),
            weight_decay=adam.number("weight_decay", 0.0, low=0.0),
            clip=adam.number("grad_clip_norm", 0.0, low=0.0),
        )
        if step["eps"] <= 0:
            raise BadRequest("adam_params.eps must be > 0", "adam_params.eps")
        return self._queued(
            tenant, model, body, "OptimStep", lambda _: [JSONAnswer({"metrics": model.optim_step(**step)})]
        )

    # ------------------------------------------------------------------------------------------------ weights
    def save_weights(self, tenant: str, body: dict) -> dict:
        fields = Fields(body)
        model = self.service.model(tenant, fields.text("model_id"))
        name = fields.text("path", None) or f"step-{model.steps:06d}"
        overwrite = fields.flag("overwrite", False)
        storage = self.service.storage
        target = storage.folder(tenant, model.model_id, "weights", name).with_suffix(".ckpt")

        def save(_):
            if target.exists() and not overwrite:
                raise BadRequest(
                    f"path {name!r} exists for {model.model_id}: pass overwrite=True or another name", "path"
                )
            path = storage.save_training(tenant, model, name)
            return [JSONAnswer({"type": "save_weights", "path": path})]

        return self._queued(tenant, model, body, "SaveWeights", save)

    def save_weights_for_sampler(self, tenant: str, body: dict) -> dict:
        service, fields = self.service, Fields(body)
        model = service.model(tenant, fields.text("model_id"))
        name = fields.text("path", None)
        seq = fields.integer("sampling_session_seq_id", None, low=0)
        kind = fields.text("kind", "snapshot")
        if kind not in ("snapshot", "inflight"):
            raise BadRequest(f"kind must be snapshot or inflight, got {kind!r}", "kind")
        if name is None and seq is None:
            raise BadRequest("give path (a name) or sampling_session_seq_id", "path")
        if name is not None:
            service.storage.folder(tenant, model.model_id, "sampler_weights", name)  # checks the name now

        def save(_):
            snapshot = self._snapshot(model, kind)
            answer = {"type": "save_weights_for_sampler"}
            if name is not None:
                answer["path"] = service.storage.save_sampler(tenant, model.model_id, name, snapshot, model.module)
                service.sampling.remember(tenant, answer["path"], snapshot)
            if seq is not None:
                answer["sampling_session_id"] = service.sampling.open(
                    tenant, model.session_id, f"{model.session_id}:sample:{seq}", snapshot, answer.get("path")
                )
            return [JSONAnswer(answer)]

        return self._queued(tenant, model, body, "SaveWeightsForSampler", save)

    def _snapshot(self, model: TrainingModel, kind: str) -> Snapshot:
        state = model.trainable_state()
        if kind == "inflight":
            if model.inflight is None:
                model.inflight = Snapshot(model.base, model.spec, state, full=model.lora is None)
            else:
                model.inflight.update(state)
            return model.inflight
        return Snapshot(model.base, model.spec, state, full=model.lora is None)

    def load_weights(self, tenant: str, body: dict) -> dict:
        service, fields = self.service, Fields(body)
        path = fields.text("path")
        with_optimizer = fields.flag("optimizer", False)
        _, _, _, file = service.storage.locate(tenant, path, "weights")
        if "session_id" in body and body["session_id"] is not None:  # a new client from the checkpoint
            session = service.sessions.get(tenant, fields.text("session_id"))
            model_id = f"{session.id}:train:{fields.integer('model_seq_id', low=0)}"
            _adam_only(fields.object("optimizer_config", None), "optimizer_config")

            def build():
                checkpoint = service.storage.load_training(file)
                info = checkpoint["tinker"]
                base = service.base(fields.text("base_model", info["base_model"]))
                lora = None if info["lora"] is None else LoraRequest(**info["lora"])
                spec = None if info["lora_spec"] is None else LoraSpec(**info["lora_spec"])
                self._build(tenant, session, model_id, base, lora, spec)
                model = service.models[model_id]
                _restore(model, checkpoint, with_optimizer, path)  # the client's request 0: its next is 1
                return {"type": "load_weights", "model_id": model_id, "path": path}

            return self._create(tenant, session, model_id, "LoadWeights", build)
        model = service.model(tenant, fields.text("model_id"))

        def load(_):
            _restore(model, service.storage.load_training(file), with_optimizer, path)
            return [JSONAnswer({"type": "load_weights", "model_id": model.model_id, "path": path})]

        return self._queued(tenant, model, body, "LoadWeights", load)


def _restore(model: TrainingModel, checkpoint: dict, with_optimizer: bool, path: str) -> None:
    model.load_trainable(checkpoint["state_dict"], path)
    if with_optimizer:
        model.optimizer.load_state_dict(checkpoint["optimizer_states"][0])
        model.steps = int(checkpoint["tinker"].get("steps", 0))


def _adam_only(config: Fields | None, field: str) -> None:
    if config is None:
        return
    kind = config.text("type", "adamw")
    if kind != "adamw":
        raise BadRequest(f"{field}.type {kind!r}: this service trains with Adam (adamw) only", f"{field}.type")
