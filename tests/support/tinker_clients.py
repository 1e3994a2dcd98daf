"""Clients of `lightning-rl serve` written with the official ``tinker`` SDK, each run in a process of its own by the
service's tests (``python -m tests.support.tinker_clients <name> '<json arguments>'``, with ``TINKER_BASE_URL`` and
``TINKER_API_KEY`` set): each prints one JSON line, ``RESULT {...}``, that the test reads."""

from __future__ import annotations

import json
import sys
import time

import tinker
import torch
from tinker import types

from lightning_rl.data.tasks import arithmetic_rows


def _supervised(tokenizer, row: dict) -> types.Datum:
    """The prompt and its answer then EOS; only the answer's tokens (and EOS) are trained on."""
    prompt = tokenizer.encode(row["prompt"])
    full = prompt + tokenizer.encode(row["answer"]) + [tokenizer.eos_token_id]
    weights = [0.0] * (len(prompt) - 1) + [1.0] * (len(full) - len(prompt))
    return types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={"target_tokens": full[1:], "weights": weights},
    )


def sft(model: str, steps: int = 12, rows: int = 32, lr: float = 1e-3) -> dict:
    """Supervised fine-tuning with cross_entropy: the summed loss before each step, and a forward-only one at the end."""
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(base_model=model, rank=8, seed=0).result()
    tokenizer = client.get_tokenizer()
    data = [_supervised(tokenizer, row) for row in arithmetic_rows("train")[:rows]]
    losses = []
    for _ in range(steps):
        fwd_bwd = client.forward_backward(data, "cross_entropy")
        optim = client.optim_step(types.AdamParams(learning_rate=lr))
        losses.append(fwd_bwd.result().metrics["loss:sum"])
        optim.result()
    final = client.forward(data, "cross_entropy").result()
    service.close("success").result()
    return {"losses": losses, "final": final.metrics["loss:sum"], "datums": len(final.loss_fn_outputs)}


def importance_sampling(model: str, seed: int = 0) -> dict:
    """One forward_backward with importance_sampling on sampled sequences, no optim_step: the gradient stays on the
    server for the test to read. Returns what it sent and the log-probs the service answered."""
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(base_model=model, rank=4, seed=seed).result()
    tokenizer = client.get_tokenizer()
    sampler = client.save_weights_and_get_sampling_client().result()
    generator = torch.Generator().manual_seed(seed)
    sent = []
    for row in arithmetic_rows("test")[:4]:
        prompt = types.ModelInput.from_ints(tokenizer.encode(row["prompt"]))
        for sequence in sampler.sample(prompt, 2, types.SamplingParams(max_tokens=6, seed=seed)).result().sequences:
            ob_len = prompt.length - 1
            tokens = sequence.tokens
            q = [0.0] * ob_len + [lp - 0.3 * float(torch.rand((), generator=generator)) for lp in sequence.logprobs]
            advantages = [0.0] * ob_len + torch.randn(len(tokens), generator=generator).tolist()
            sent.append(
                {
                    "model_input": prompt.to_ints() + tokens[:-1],
                    "targets": [0] * ob_len + tokens,
                    "q": q,
                    "a": advantages,
                    "ob_len": ob_len,
                }
            )
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(s["model_input"]),
            loss_fn_inputs={"target_tokens": s["targets"], "logprobs": s["q"], "advantages": s["a"]},
        )
        for s in sent
    ]
    out = client.forward_backward(data, loss_fn="importance_sampling").result()
    logprobs = [o["logprobs"].tolist() for o in out.loss_fn_outputs]
    return {"model_id": client.model_id, "sent": sent, "logprobs": logprobs, "metrics": out.metrics}


def slow_request(model: str, datums: int = 256, length: int = 60) -> dict:
    """Queue a large forward_backward and wait for it (the test kills this process while it runs)."""
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(base_model=model, rank=8).result()
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints([3 + i % 10] * length),
            loss_fn_inputs={"target_tokens": [4] * length, "weights": [1.0] * length},
        )
        for i in range(datums)
    ]
    futures = [client.forward_backward(data, "cross_entropy") for _ in range(4)]
    print(json.dumps({"queued": client.model_id}), flush=True)
    return {"results": [f.result().metrics for f in futures]}


def one_step(model: str) -> dict:
    """A fresh client's forward_backward and optim_step, timed."""
    start = time.monotonic()
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(base_model=model, rank=4).result()
    datum = _supervised(client.get_tokenizer(), arithmetic_rows("train")[0])
    metrics = client.forward_backward([datum], "cross_entropy").result().metrics
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    service.close("success").result()
    return {"metrics": metrics, "seconds": time.monotonic() - start}


def shared_clients(model: str, clients: int = 2) -> dict:
    """Several LoRA clients in one session, each trained one step; their model ids (the session stays open)."""
    service = tinker.ServiceClient()
    made = [service.create_lora_training_client(base_model=model, rank=4, seed=i).result() for i in range(clients)]
    rows = arithmetic_rows("train")
    for i, client in enumerate(made):
        datum = _supervised(client.get_tokenizer(), rows[i])
        client.forward_backward([datum], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    return {"model_ids": [c.model_id for c in made]}


def errors(model: str) -> dict:
    """Requests the service must refuse, each with the SDK's exception class name and message."""
    service = tinker.ServiceClient()
    found = {}

    def attempt(name, call):
        try:
            call()
            found[name] = None
        except Exception as err:  # noqa: BLE001 (the test reads the class and the message)
            found[name] = [type(err).__name__, str(err)]

    attempt("base_model", lambda: service.create_lora_training_client(base_model="no/such-model", rank=4).result())
    client = service.create_lora_training_client(base_model=model, rank=4).result()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([3, 4, 5]),
        loss_fn_inputs={"target_tokens": [4, 5, 1], "logprobs": [0.0] * 3},
    )
    attempt("missing_input", lambda: client.forward_backward([datum], "importance_sampling").result())
    attempt("optimizer", lambda: client.optim_step(types.DimuonParams(learning_rate=1e-3)).result())
    # the two refused requests took numbers: the client's next ones still run
    datum = _supervised(client.get_tokenizer(), arithmetic_rows("train")[0])
    found["after"] = client.forward_backward([datum], "cross_entropy").result().metrics
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    return found


def save_and_load(model: str) -> dict:
    """Train a step, save the training state and sampler weights, then a new client from the state (with optimizer)
    and a sampler from the saved weights; forward log-probs of each, and the paths."""
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(base_model=model, rank=4, seed=1).result()
    tokenizer = client.get_tokenizer()
    datum = _supervised(tokenizer, arithmetic_rows("train")[3])
    client.forward_backward([datum], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    state = client.save_state("after-one").result().path
    sampler_path = client.save_weights_for_sampler("w1").result().path
    before = client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    restored = service.create_training_client_from_state_with_optimizer(state).result()
    after = restored.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    sampler = service.create_sampling_client(model_path=sampler_path).result()
    scored = sampler.compute_logprobs(datum.model_input.append_int(datum.loss_fn_inputs["target_tokens"].tolist()[-1]))
    return {
        "state": state,
        "sampler_path": sampler_path,
        "before": before,
        "after": after,
        "sampler_logprobs": scored.result(),
        "model_id": client.model_id,
        "restored_id": restored.model_id,
    }


def refused() -> dict:
    """Every call of a client whose key the service was not started with: the SDK's exception for each."""
    found = {}
    try:
        service = tinker.ServiceClient()
        found["create_lora_training_client"] = None
        service.create_lora_training_client(base_model="tiny-arith", rank=4).result()
    except Exception as err:  # noqa: BLE001 (the test reads the class and the message)
        found["error"] = [type(err).__name__, str(err)]
    return found


def owner(model: str) -> dict:
    """A client that trains a step and saves its state and sampler weights; its ids and paths (the session stays open
    until it expires, so they stay live for another key to try)."""
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(base_model=model, rank=4, seed=2).result()
    datum = _supervised(client.get_tokenizer(), arithmetic_rows("train")[5])
    client.forward_backward([datum], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    state = client.save_state("mine").result().path
    sampler_path = client.save_weights_for_sampler("mine").result().path
    return {"model_id": client.model_id, "state": state, "sampler_path": sampler_path}


def trespass(state: str, sampler_path: str) -> dict:
    """Another key's client reaching for the owner's weights: a training client from its state, a sampler on its
    sampler weights. The SDK's exception for each (None where it got through)."""
    service = tinker.ServiceClient()
    found = {}
    for name, call in [
        ("from_state", lambda: service.create_training_client_from_state(state).result()),
        ("with_optimizer", lambda: service.create_training_client_from_state_with_optimizer(state).result()),
        ("sampler", lambda: service.create_sampling_client(model_path=sampler_path).result()),
    ]:
        try:
            call()
            found[name] = None
        except Exception as err:  # noqa: BLE001 (the test reads the class and the message)
            found[name] = [type(err).__name__, str(err)]
    return found


def oversized(model: str, tokens: int) -> dict:
    """A forward_backward whose body is past the service's size limit, then a small one: the SDK's exception for the
    first and the loss of the second."""
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(base_model=model, rank=4).result()
    big = types.Datum(
        model_input=types.ModelInput.from_ints([3 + i % 10 for i in range(tokens)]),
        loss_fn_inputs={"target_tokens": [4] * tokens, "weights": [1.0] * tokens},
    )
    try:
        client.forward_backward([big], "cross_entropy").result()
        refused = None
    except Exception as err:  # noqa: BLE001 (the test reads the class and the message)
        refused = [type(err).__name__, str(err), getattr(err, "status_code", None)]
    datum = _supervised(client.get_tokenizer(), arithmetic_rows("train")[0])
    small = client.forward_backward([datum], "cross_entropy").result().metrics
    service.close("success").result()
    return {"refused": refused, "small": small}


def main() -> None:
    name, arguments = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    result = globals()[name](**arguments)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
