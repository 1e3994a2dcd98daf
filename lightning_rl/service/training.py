"""The training side: base models loaded once, and one `TrainingModel` per training client.

A LoRA client's model is a `shared_copy` of its base (the base's frozen tensors themselves, no copy) with adapters of
its own injected (peft), so any number of clients train on one base in memory, each with its adapters, gradients and
AdamW state; a full-parameter client (``lora_config`` left out) gets a copy of the whole model. The adapters go where
the SDK's ``LoraConfig`` says: ``train_attn`` the attention projections, ``train_mlp`` the MLP's, ``train_unembed`` the
output head; rank from the SDK, alpha from ``serve --lora_alpha`` (the SDK has no alpha).

``forward_backward`` runs the model on each datum's tokens, takes the log-probs of its targets (fp32, chunked over the
vocabulary: lightning_rl.core.logprobs), hands them to the loss's surrogate and sums (`losses`); the gradients add up
until ``optim_step``, which is ``torch.optim.AdamW`` with the request's learning rate, betas, eps, decoupled weight
decay and gradient-norm clip (0 = none), then clears them.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from lightning_rl.core.logprobs import sampled_logprobs
from lightning_rl.core.lora import LoraSpec, apply_lora
from lightning_rl.core.models import ModelSpec, context_length, freeze, load_causal_lm, load_tokenizer, shared_copy
from lightning_rl.service.codec import Datum, ForwardBackward
from lightning_rl.service.errors import BadRequest
from lightning_rl.service.losses import Loss, loss_batch, loss_of

ATTENTION = ("attn", "attention")
MLP = ("mlp", "feed_forward", "ffn")


@dataclass(frozen=True)
class LoraRequest:
    """The SDK's ``LoraConfig``: rank, seed and where the adapters go."""

    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


class BaseModel:
    """A base model served to clients: loaded once from a local folder, frozen."""

    def __init__(self, path: str):
        given = path
        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"serve --base_models: {given!r} is not a local model folder (no config.json there); give the folder "
                "save_pretrained wrote"
            )
        self.path = str(folder.resolve())
        self.names = {self.path, given, folder.resolve().name}
        self.module = freeze(load_causal_lm(ModelSpec(path=self.path), "serve --base_models"))
        self.tokenizer = load_tokenizer(self.path, "serve --base_models")
        self.vocab_size = int(self.module.get_output_embeddings().weight.shape[0])
        self.context = context_length(self.module.config) or 1_000_000
        self.arch = (self.module.config.architectures or [type(self.module).__name__])[0]

    def lora_targets(self, lora: LoraRequest) -> list[str]:
        """Full names of the linear layers ``lora`` puts adapters on; a kind asked for and absent is a `BadRequest`."""
        head = self.module.get_output_embeddings()
        found: dict[str, list[str]] = {"train_attn": [], "train_mlp": [], "train_unembed": []}
        for name, module in self.module.named_modules():
            if not isinstance(module, nn.Linear):
                continue
            parts = name.lower().split(".")
            if module is head:
                found["train_unembed"].append(name)
            elif any(marker in part for part in parts for marker in ATTENTION):
                found["train_attn"].append(name)
            elif any(marker in part for part in parts for marker in MLP):
                found["train_mlp"].append(name)
        targets = []
        for kind in ("train_attn", "train_mlp", "train_unembed"):
            if getattr(lora, kind):
                if not found[kind]:
                    raise BadRequest(
                        f"lora_config.{kind}: {self.arch} has no such linear layers", f"lora_config.{kind}"
                    )
                targets += found[kind]
        if not targets:
            raise BadRequest(
                "lora_config: at least one of train_mlp, train_attn and train_unembed must be true", "lora_config"
            )
        return targets

    def lora_spec(self, lora: LoraRequest, alpha: float) -> LoraSpec:
        seed = lora.seed if lora.seed is not None else int(torch.randint(0, 2**31 - 1, ()).item())
        targets = sorted(self.lora_targets(lora))
        return LoraSpec(rank=lora.rank, alpha=alpha, dropout=0.0, target_modules=targets, init_seed=seed)

    def client_module(self, spec: LoraSpec | None) -> nn.Module:
        """A client's model: adapters on a `shared_copy` of the base (``spec``), or a trainable copy of it all (None)."""
        if spec is None:
            module = copy.deepcopy(self.module)
            return module.requires_grad_(True)
        return apply_lora(shared_copy(self.module), spec, "lora_config")


class TrainingModel:
    """One training client: its model, its accumulated gradients, its optimizer."""

    def __init__(
        self,
        model_id: str,
        tenant: str,
        session_id: str,
        base: BaseModel,
        lora: LoraRequest | None,
        spec: LoraSpec | None,
    ):
        """``lora``: the SDK's LoRA config (None: full-parameter); ``spec``: the adapters it gives (`BaseModel.lora_spec`)."""
        self.model_id, self.tenant, self.session_id, self.base, self.lora = model_id, tenant, session_id, base, lora
        self.spec = spec
        self.module = base.client_module(spec)
        self.parameters = {n: p for n, p in self.module.named_parameters() if p.requires_grad}
        # the hyper-parameters are each step's (set in optim_step); AdamW's moments are allocated at the first step
        self.optimizer = torch.optim.AdamW(list(self.parameters.values()), lr=0.0, betas=(0.9, 0.95), eps=1e-12)
        self.steps = 0
        self.inflight = None  # the sampling.Snapshot this client's inflight samplers share (kind="inflight")

    @property
    def trainable(self) -> int:
        return sum(p.numel() for p in self.parameters.values())

    def forward_backward(
        self, request: ForwardBackward, loss: Loss, surrogate, sampled: list[Tensor | None], micro_batch_tokens: int
    ) -> tuple[list[Tensor], dict[str, float]]:
        """Per-datum target log-probs (N_i,) and the metrics; gradients accumulate unless ``forward_only``.
        ``sampled``: per datum, (N_i,) 1 on the positions its provenance names sampled (None without provenance)."""
        logprobs: list[Tensor] = []
        total, tokens, sums = 0.0, 0.0, {}
        for group in _micro_batches(request.data, micro_batch_tokens):  # consecutive: the datums' order is kept
            with torch.set_grad_enabled(not request.forward_only):
                ids, valid, inputs, positions = _pad([request.data[i] for i in group], [sampled[i] for i in group])
                logits = self.module(input_ids=ids, attention_mask=valid, use_cache=False).logits  # (b, n, V)
                targets = inputs.pop("target_tokens")  # (b, n)
                token_logprobs = sampled_logprobs(logits, targets)  # (b, n) fp32, with gradient
                batch = loss_batch(loss, targets, valid, inputs, positions)
                value, metrics = loss_of(surrogate, token_logprobs, batch)
                if not request.forward_only:
                    value.backward()
            count = float(batch.loss_mask.sum())
            total, tokens = total + float(value.detach()), tokens + count
            for name, metric in metrics.items():
                sums[name] = sums.get(name, 0.0) + float(metric) * count
            logprobs += [row[:n].detach().clone() for row, n in zip(token_logprobs, valid.sum(-1).tolist())]
        out = {"loss:sum": total}
        out.update({f"{name}:mean": value / max(tokens, 1.0) for name, value in sums.items()})
        return logprobs, out

    def optim_step(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, clip: float) -> dict:
        """One AdamW step on the gradients accumulated since the last, then clears them."""
        for group in self.optimizer.param_groups:
            group.update(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
        params = list(self.parameters.values())
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise BadRequest(
                f"the gradient of {self.model_id} is not finite (norm {float(grad_norm)}); the step was skipped and the "
                "gradients cleared: check the advantages and log-probs sent", "adam_params"
            )  # fmt: skip
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm": float(grad_norm), "learning_rate": lr, "step": float(self.steps)}

    def trainable_state(self) -> dict[str, Tensor]:
        """The weights this client trains (its adapters, or every weight), detached CPU copies."""
        return {name: p.detach().cpu().clone() for name, p in self.parameters.items()}

    def load_trainable(self, state: dict[str, Tensor], where: str) -> None:
        missing = sorted(set(self.parameters) - set(state))
        unexpected = sorted(set(state) - set(self.parameters))
        if missing or unexpected:
            raise BadRequest(
                f"{where}: the checkpoint's weights do not fit this model (missing {missing[:3]}, unexpected "
                f"{unexpected[:3]}): it was saved from another base or LoRA config", "path"
            )  # fmt: skip
        with torch.no_grad():
            for name, p in self.parameters.items():
                if p.shape != state[name].shape:
                    raise BadRequest(
                        f"{where}: {name} is {tuple(state[name].shape)}, the model's {tuple(p.shape)}", "path"
                    )
                p.copy_(state[name])


def _micro_batches(data: list[Datum], budget: int) -> list[list[int]]:
    """Datum indices in consecutive groups whose padded size (count x longest) stays within ``budget`` tokens."""
    groups, current, longest = [], [], 0
    for i, datum in enumerate(data):
        n = datum.tokens.numel()
        if current and max(longest, n) * (len(current) + 1) > budget:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        groups.append(current)
    return groups


def _pad(data: list[Datum], sampled: list[Tensor | None]):
    """Right-padded (b, n) token ids and validity, each input (b, n) (targets long, the rest float), and the sampled
    positions (b, n) or None."""
    n = max(d.tokens.numel() for d in data)
    ids = torch.zeros(len(data), n, dtype=torch.long)
    valid = torch.zeros(len(data), n, dtype=torch.long)
    inputs: dict[str, Tensor] = {}
    for row, datum in enumerate(data):
        length = datum.tokens.numel()
        ids[row, :length], valid[row, :length] = datum.tokens, 1
        for name, value in datum.inputs.items():
            if name not in inputs:
                dtype = torch.long if name == "target_tokens" else torch.float32
                inputs[name] = torch.zeros(len(data), n, dtype=dtype)
            inputs[name][row, :length] = value
    positions = None
    if any(s is not None for s in sampled):
        positions = torch.zeros(len(data), n, dtype=torch.long)
        for row, mask in enumerate(sampled):
            if mask is not None:
                positions[row, : mask.numel()] = mask
    return ids, valid, inputs, positions
