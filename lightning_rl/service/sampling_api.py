"""The sampling calls of the Tinker API: ``create_sampling_session`` (a sampler on a base model or on saved sampler
weights), ``samplers/<id>``, and ``asample`` (``sample`` and ``compute_logprobs``), each request queued on its
sampler's queue; queued requests with the same weights and settings run in one ``generate`` call."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict

from safetensors.torch import load_file

from lightning_rl.core.sampling_params import SamplingParams
from lightning_rl.service.errors import BadRequest, NotFound
from lightning_rl.service.requests import Fields
from lightning_rl.service.sampling import SampleJob, Snapshot

MAX_RECORDED = 65536
"""Sequences recorded per API key for stable_reinforce (``record_stability_info``), the oldest dropped first."""


class SamplerEntry:
    """A sampling client's sampler: the weights it samples with and where they came from."""

    def __init__(self, sampler_id: str, tenant: str, session_id: str, snapshot: Snapshot, model_path: str | None):
        self.id, self.tenant, self.session_id, self.snapshot = sampler_id, tenant, session_id, snapshot
        self.model_path = model_path
        self.used = time.monotonic()


class SamplingAPI:
    def __init__(self, service):
        self.service = service
        self.saved: dict[str, OrderedDict[str, Snapshot]] = {}  # tenant -> tinker path -> the snapshot saved there

    # ------------------------------------------------------------------------------------------------ samplers
    def open(self, tenant: str, session_id: str, sampler_id: str, snapshot: Snapshot, model_path: str | None) -> str:
        """Register a sampler (a sampling client) and its queue; beyond the key's limit the least recently used goes."""
        service = self.service
        with service.lock:
            service.samplers[sampler_id] = SamplerEntry(sampler_id, tenant, session_id, snapshot, model_path)
            mine = sorted((s.used, k) for k, s in service.samplers.items() if s.tenant == tenant)
            evicted = [k for _, k in mine[: max(0, len(mine) - service.limits.max_snapshots_per_key)]]
            for key in evicted:
                del service.samplers[key]
        for key in evicted:
            service.scheduler.close(key, f"sampler {key} was dropped to make room (serve limits.max_snapshots_per_key)")
        service.scheduler.open(sampler_id, tenant, session_id, ordered=False)
        return sampler_id

    def remember(self, tenant: str, path: str, snapshot: Snapshot) -> None:
        saved = self.saved.setdefault(tenant, OrderedDict())
        saved[path] = snapshot
        while len(saved) > self.service.limits.max_snapshots_per_key:
            saved.popitem(last=False)

    def entry(self, tenant: str, sampler_id: str):
        service = self.service
        with service.lock:
            entry = service.samplers.get(sampler_id)
        if entry is None or entry.tenant != tenant:
            raise NotFound(
                f"no sampler {sampler_id!r} for this API key (never made with this key, its session ended, or it was "
                "dropped for newer ones: serve limits.max_snapshots_per_key)",
                "sampling_session_id",
            )
        return entry

    def create_sampling_session(self, tenant: str, body: dict) -> dict:
        service, fields = self.service, Fields(body)
        session = service.sessions.get(tenant, fields.text("session_id"))
        seq = fields.integer("sampling_session_seq_id", low=0)
        model_path, base_name = fields.text("model_path", None), fields.text("base_model", None)
        if model_path is None and base_name is None:
            raise BadRequest("give model_path (saved sampler weights) or base_model", "model_path")
        if model_path is None:
            snapshot = Snapshot(service.base(base_name), None, None)
        else:
            snapshot = self._saved(tenant, model_path)
        sampler_id = self.open(tenant, session.id, f"{session.id}:sample:{seq}", snapshot, model_path)
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def _saved(self, tenant: str, path: str) -> Snapshot:
        """The snapshot saved at ``path`` (kept in memory, or read back from its folder)."""
        service = self.service
        snapshot = self.saved.get(tenant, {}).get(path)
        if snapshot is not None:
            return snapshot
        _, kind, _, target = service.storage.locate(tenant, path)
        if kind == "weights":  # a training state samples too: its trained weights
            checkpoint = service.storage.load_training(target)
            info = checkpoint["tinker"]
            base = service.base(info["base_model"], "model_path")
            spec = None
            if info["lora_spec"] is not None:
                from lightning_rl.core.lora import LoraSpec

                spec = LoraSpec(**info["lora_spec"])
            return Snapshot(base, spec, checkpoint["state_dict"], full=spec is None)
        base_path, spec, tensors = service.storage.load_sampler(target)
        if spec is not None:
            return Snapshot(service.base(base_path, "model_path"), spec, tensors)
        from transformers import AutoConfig

        base = service.base(AutoConfig.from_pretrained(target).name_or_path or str(target), "model_path")
        weights = load_file(target / "model.safetensors")
        params = dict(base.module.named_parameters())
        return Snapshot(base, None, {k: v for k, v in weights.items() if k in params}, full=True)

    def get_sampler(self, tenant: str, sampler_id: str) -> dict:
        entry = self.entry(tenant, sampler_id)
        return {"sampler_id": entry.id, "base_model": entry.snapshot.base.path, "model_path": entry.model_path}

    # ------------------------------------------------------------------------------------------------ sampling
    def asample(self, tenant: str, body: dict) -> dict:
        service, limits, fields = self.service, self.service.limits, Fields(body)
        if fields.text("sampling_session_id", None) is None:
            raise BadRequest(
                "sampling_session_id is required: create a sampling client first (sampling by base_model or "
                "model_path on each request is not offered)",
                "sampling_session_id",
            )
        entry = self.entry(tenant, fields.text("sampling_session_id"))
        base = entry.snapshot.base
        seq_id = fields.integer("seq_id", None)
        prompt = fields.tokens("prompt", base.vocab_size, base.context)
        num_samples = fields.integer("num_samples", 1, low=1, high=limits.max_num_samples)
        for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if fields.integer(name, 0, low=0) > 0:
                raise BadRequest(f"{name} is not offered by this service (top-k log-probs, alternative tokens)", name)
        if body.get("target_prompt_logprobs") is not None:
            raise BadRequest("target_prompt_logprobs is not offered by this service", "target_prompt_logprobs")
        with_prompt = bool(fields.flag("prompt_logprobs", False))
        last_n = fields.integer("prompt_logprobs_last_n", None, low=1, high=max(1, len(prompt) - 1))
        params_fields = fields.object("sampling_params")
        max_tokens = params_fields.integer("max_tokens", service.config.default_max_tokens, low=1)
        if len(prompt) + max_tokens > base.context:
            raise BadRequest(
                f"sampling_params.max_tokens: the prompt's {len(prompt)} tokens and {max_tokens} new ones exceed "
                f"{base.path}'s context of {base.context}",
                "sampling_params.max_tokens",
            )
        top_k = params_fields.integer("top_k", -1, low=-1)
        params = SamplingParams(
            group_size=num_samples,
            max_new_tokens=max_tokens,
            temperature=params_fields.number("temperature", 1.0, low=0.0),
            top_p=params_fields.number("top_p", 1.0, low=1e-9, high=1.0),
            top_k=0 if top_k < 0 else top_k,
            stop_token_ids=self._stop_ids(params_fields.raw("stop", None), base),
        )
        seed = params_fields.integer("seed", None, low=0)
        if seed is not None and service.config.sampler is not None:
            raise BadRequest("sampling_params.seed is honoured by the in-process sampler only", "sampling_params.seed")
        record = bool(fields.flag("record_stability_info", False))
        session_id = entry.session_id
        tag = seq_id if seq_id is not None else secrets.token_hex(8)  # the SDK numbers its requests; others may not
        sequence_ids = [f"{entry.id}:{tag}:{i}" for i in range(num_samples)]
        job = SampleJob(prompt, num_samples, params, seed, with_prompt, last_n, sequence_ids)
        snapshot = entry.snapshot
        entry.used = time.monotonic()
        batch_key = None if seed is not None else (snapshot.id, snapshot.version, params, record)
        payload = (snapshot, job, tenant if record else None)
        request_id = service.queue(entry.id, tenant, session_id, "Sample", payload, self.run, seq_id, batch_key)
        return {"request_id": request_id, "sample_sequence_ids": sequence_ids}

    def run(self, payloads: list[tuple]) -> list:
        """A batch of sample requests of one snapshot and one `SamplingParams` (the scheduler grouped them)."""
        snapshot, jobs = payloads[0][0], [job for _, job, _ in payloads]
        answers = self.service.sampler.run(snapshot, jobs)
        for (_, job, recording_for), answer in zip(payloads, answers):
            if recording_for is not None:
                self._record(recording_for, job.sequence_ids, answer.sequences)
        return answers

    @staticmethod
    def _stop_ids(stop, base) -> tuple[int, ...]:
        """Stop tokens: ids as given, or strings that are each one token of the model's tokenizer."""
        if stop is None:
            return ()
        if isinstance(stop, (str, int)):
            stop = [stop]
        if not isinstance(stop, list):
            raise BadRequest(
                "sampling_params.stop must be a string, a list of strings or a list of token ids",
                "sampling_params.stop",
            )
        if not stop:
            raise BadRequest(
                "sampling_params.stop=[] (no stop at all, not even EOS) is not offered: every response ends at EOS",
                "sampling_params.stop",
            )
        ids = []
        for value in stop:
            if isinstance(value, int) and not isinstance(value, bool):
                ids.append(value)
                continue
            encoded = base.tokenizer.encode(value, add_special_tokens=False) if isinstance(value, str) else []
            if len(encoded) != 1:
                raise BadRequest(
                    f"sampling_params.stop {value!r} is {len(encoded)} tokens of {base.path}'s tokenizer; stop strings "
                    "must each be one token (or pass token ids)",
                    "sampling_params.stop",
                )
            ids.append(encoded[0])
        if any(not 0 <= i < base.vocab_size for i in ids):
            raise BadRequest(
                f"sampling_params.stop holds ids outside 0 .. {base.vocab_size - 1}", "sampling_params.stop"
            )
        return tuple(ids)

    def _record(self, tenant: str, sequence_ids: list[str], sequences) -> None:
        records = self.service.records.setdefault(tenant, OrderedDict())
        for sequence_id, sequence in zip(sequence_ids, sequences):
            records[sequence_id] = (sequence.tokens, sequence.logprobs)
        while len(records) > MAX_RECORDED:
            records.popitem(last=False)
