"""`lightning-rl serve` driven by the official ``tinker`` SDK from other processes (tests/support/tinker_clients.py):
supervised training, the importance-sampling gradient against fp64, errors in the SDK's shape, checkpoints, clients
sharing the base, and a killed client."""

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from tests.support.tinker_service import KEY, ROOT, client_command, client_env, run_client

pytest.importorskip("tinker", reason="the official tinker SDK (a dev dependency on Python >= 3.11)")
pytestmark = [pytest.mark.slow, pytest.mark.server]


def test_an_sft_loop_on_cross_entropy_lowers_the_loss(service):
    from lightning_rl.core.models import TINY_MODEL_PATH

    result = run_client(service, "sft", model=TINY_MODEL_PATH, steps=12)
    losses = result["losses"]
    assert result["datums"] == 32 and len(losses) == 12
    assert losses[-1] < 0.5 * losses[0] and result["final"] < losses[-1], (
        losses
    )  # the step after the last lowered it too


def test_importance_sampling_logprobs_are_ours_and_its_gradient_is_the_fp64_one(service):
    """The service's log-probs are the trainer's (`policy_logprobs`, as `lightning-rl fit` computes them) and its
    gradient equals the fp64 gradient of -sum_t exp(log pi - log q) A over the given tokens as closely as fp32
    arithmetic can."""
    from lightning_rl.core.batch import RolloutBatch
    from lightning_rl.core.logprobs import policy_logprobs
    from lightning_rl.core.models import TINY_MODEL_PATH

    result = run_client(service, "importance_sampling", model=TINY_MODEL_PATH)
    model = service.service.models[result["model_id"]]  # the session is still open: the client did not close it
    sent = result["sent"]
    # ours: the trainer's forward on (prompt, response) rows, as fit scores a sampled batch
    for datum, answered in zip(sent, result["logprobs"]):
        ob_len = datum["ob_len"]
        prompt, response = datum["model_input"][: ob_len + 1], datum["targets"][ob_len:]
        batch = RolloutBatch(
            response_ids=torch.tensor([response]),
            response_mask=torch.ones(1, len(response), dtype=torch.long),
            prompt_ids=torch.tensor([prompt]),
            prompt_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )
        with torch.no_grad():
            ours, _ = policy_logprobs(model.module, batch)
        torch.testing.assert_close(torch.tensor(answered[ob_len:]), ours[0], rtol=0, atol=1e-6)
    # the reference: the same weights in float64, the loss written out; and the same in plain float32 (the floor)
    total, reference = _is_gradient(model.module, sent, torch.float64)
    _, plain = _is_gradient(model.module, sent, torch.float32)
    assert result["metrics"]["loss:sum"] == pytest.approx(total, rel=1e-5, abs=1e-5)
    served = {n: p.grad.double() for n, p in model.module.named_parameters() if p.requires_grad}
    assert served.keys() == reference.keys()
    scale = max(float(g.abs().max()) for g in reference.values())
    assert scale > 1e-2  # a gradient to compare, not zeros
    # fp32 against fp64: the service's gradient is as close to the fp64 one as the same loss written out in plain fp32
    # (measured 1.0x to 1.3x its error; 1e-6 to 2e-6 of the largest entry, which fp32 cannot beat on entries of ~10)
    error = max(float((served[n] - g).abs().max()) for n, g in reference.items())
    floor = max(float((plain[n] - g).abs().max()) for n, g in reference.items())
    assert error <= 2 * floor + 1e-7, (error, floor, scale)
    # and every entry to 1e-6 absolute, 1e-5 relative, or 1e-5 of the largest entry: a wrong ratio, sign or token is
    # off by ~1e-1 of it
    for name, g in reference.items():
        torch.testing.assert_close(
            served[name], g, rtol=1e-5, atol=max(1e-6, 1e-5 * scale), msg=lambda m: f"{name}: {m}"
        )


def _is_gradient(module, sent: list[dict], dtype: torch.dtype) -> tuple[float, dict]:
    """-sum_t exp(log pi - log q) A over every datum sent, on a copy of ``module`` in ``dtype``: the loss and the
    gradient of each trained weight (float64)."""
    reference = copy.deepcopy(module).to(dtype)
    params = {n: p for n, p in reference.named_parameters() if p.requires_grad}
    total = 0.0
    for datum in sent:
        logits = reference(input_ids=torch.tensor([datum["model_input"]]), use_cache=False).logits[0]  # (N, V)
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(datum["targets"])[:, None]).squeeze(-1)  # (N,)
        q, a = torch.tensor(datum["q"], dtype=dtype), torch.tensor(datum["a"], dtype=dtype)
        loss = -(torch.exp(logp - q) * a).sum()
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.double() for n, p in params.items()}


def test_errors_come_back_in_the_sdks_shape_naming_the_field(service):
    from lightning_rl.core.models import TINY_MODEL_PATH

    found = run_client(service, "errors", model=TINY_MODEL_PATH)
    kind, message = found["base_model"]
    assert kind == "BadRequestError" and "base_model 'no/such-model' is not served here" in message
    kind, message = found["missing_input"]
    assert (
        kind == "BadRequestError" and "data[0].loss_fn_inputs.advantages is required by importance_sampling" in message
    )
    kind, message = found["optimizer"]
    assert kind == "BadRequestError" and "optimizer_params.type 'dimuon'" in message and "Adam" in message
    assert found["after"]["loss:sum"] > 0  # the refused requests' numbers were skipped (this service waits 600 s)


def test_states_reload_with_their_optimizer_sampler_weights_sample_and_export_writes_the_model(service, tmp_path):
    from lightning_rl.core.models import TINY_MODEL_PATH

    result = run_client(service, "save_and_load", model=TINY_MODEL_PATH)
    assert result["state"] == f"tinker://{result['model_id']}/weights/after-one"
    torch.testing.assert_close(torch.tensor(result["after"]), torch.tensor(result["before"]), rtol=0, atol=1e-6)
    original, restored = (service.service.models[k] for k in (result["model_id"], result["restored_id"]))
    # AdamW's moments came back with the weights
    before = original.optimizer.state_dict()["state"]
    after = restored.optimizer.state_dict()["state"]
    assert before.keys() == after.keys() and len(before) > 0
    for key in before:
        torch.testing.assert_close(after[key]["exp_avg"], before[key]["exp_avg"])
    # the sampler saved under a name scores as the trained model does
    assert result["sampler_logprobs"][0] is None
    torch.testing.assert_close(
        torch.tensor(result["sampler_logprobs"][-len(result["before"]) :]),
        torch.tensor(result["before"]),
        rtol=0,
        atol=1e-5,
    )
    # the training state is our checkpoint format: lightning-rl export writes a model that loads alone
    from transformers import AutoModelForCausalLM

    from lightning_rl.service.checkpoints import tenant_of

    _, _, _, ckpt = service.service.storage.locate(tenant_of(KEY), result["state"])
    subprocess.run(
        [sys.executable, "-m", "lightning_rl.command", "export", str(ckpt), str(tmp_path / "hf")],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "policy", dtype=torch.float32).eval()
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, original.module(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_lora_clients_share_one_base_each_with_its_own_adapters_and_optimizer(service):
    from lightning_rl.core.models import TINY_MODEL_PATH

    result = run_client(service, "shared_clients", model=TINY_MODEL_PATH, clients=3)
    base = service.service.bases[0].module
    models = [service.service.models[k] for k in result["model_ids"]]
    base_storage = {p.data_ptr() for p in base.parameters()}
    for model in models:
        frozen = [p for p in model.module.parameters() if not p.requires_grad]
        assert frozen and {p.data_ptr() for p in frozen} <= base_storage  # the base's tensors, not copies
        assert all(p.data_ptr() not in base_storage for p in model.parameters.values())
    first, second = models[0], models[1]
    names = sorted(first.parameters)
    assert not torch.equal(first.parameters[names[0]], second.parameters[names[0]])  # each its own adapters
    states = [m.optimizer.state_dict()["state"] for m in models]
    assert all(len(s) == len(first.parameters) for s in states)  # each stepped its own AdamW
    b = next(i for i, name in enumerate(first.parameters) if "lora_B" in name)  # lora_A's first gradient is 0 (B = 0)
    assert float(states[0][b]["exp_avg"].abs().max()) > 0
    assert not torch.equal(states[0][b]["exp_avg"], states[1][b]["exp_avg"])


def test_a_client_killed_mid_request_leaves_the_others_working(service):
    """A client killed while its large forward_backward runs, and one that dies halfway through sending a body: the
    next client's forward_backward still succeeds."""
    from lightning_rl.core.models import TINY_MODEL_PATH

    doomed = subprocess.Popen(
        client_command("slow_request", model=TINY_MODEL_PATH), cwd=ROOT, env=client_env(service),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        queued = json.loads(doomed.stdout.readline())["queued"]
        deadline = time.monotonic() + 120
        while service.service.scheduler.depth(queued) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.service.scheduler.depth(queued) > 0  # its work is queued or running
    finally:
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait()
    with socket.create_connection(("127.0.0.1", service.port)) as half:  # a body cut off after its first bytes
        half.sendall(
            b"POST /api/v1/optim_step HTTP/1.1\r\nHost: x\r\nX-API-Key: " + KEY.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n{\"model_id\": "
        )  # fmt: skip
    result = run_client(service, "one_step", model=TINY_MODEL_PATH, timeout=600)
    assert result["metrics"]["loss:sum"] > 0
