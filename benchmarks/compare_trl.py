"""GRPO learning per second: lightning_rl's ``fit`` against TRL's ``GRPOTrainer``, side by side.

    python benchmarks/compare_trl.py                      # 30 iterations, seed 0: ours, TRL
    python benchmarks/compare_trl.py --seeds 3            # ours, TRL, ours, TRL, ours, TRL (seeds 0, 1, 2)
    python benchmarks/compare_trl.py --steps 3 --eval-prompts 64   # a functional check in about a minute
    python benchmarks/compare_trl.py --model random-qwen2-0.5b --max-new-tokens 256 --precision bf16 \
        --accelerator gpu --reward odd_length --steps 6 --eval-prompts 0   # a GPU-sized policy (benchmarks/gpu_check.sh)

Needs the ``bench`` extra (``pip install -e ".[bench]"``: TRL). Both runs get the same job:

* the same causal LM (``--model``, default the shipped tiny-arith policy, which starts near 30% held-out
  accuracy; ``random-qwen2-0.5b``: a randomly initialised model of Qwen2.5-0.5B's shape built here,
  `benchmarks._common.save_random_qwen2`), the same task (``lightning_rl.data.tasks.arithmetic_rows``:
  train split for training, the first ``--eval-prompts`` of the held-out test split for evaluation);
* GRPO with 8 prompts x 8 samples per iteration, ``--max-new-tokens`` (8), temperature 1 (no top-k / top-p),
  beta 0 (no reference model), one inner epoch and one mini-batch (on-policy: neither recomputes old
  log-probs), clip 0.2, token-mean loss over the batch (TRL ``loss_type="dapo"``; with one micro-batch
  of 64 it equals ``bnpo``), AdamW lr 1e-4 constant, gradient clipping at 1.0, fp32 weights (``--precision
  bf16``: bf16 autocast for both, Lightning's ``bf16-mixed`` and TRL's ``bf16=True``), no gradient
  checkpointing, the same device (``--accelerator``) and torch thread count;
* group-std advantages computed the same way: TRL divides by the sample std (Bessel) + 1e-4, so our
  ``GroupNormalized`` runs with ``bessel=true, eps=1e-4`` here (the GRPO preset uses the population std);
* reward: exact match of the stripped completion with the answer (our ``ExactMatch``; for TRL a
  reward function doing the same comparison); ``--reward odd_length`` (1 for a completion of odd length)
  for a random policy, which never answers right: its groups still differ, so both sides run every update;
* held-out accuracy: after training, both policies are evaluated by the same code, ours
  (``HFRollout.generate`` with greedy settings + ``ExactMatch``, as validation does).

Overheads: neither run logs to disk, checkpoints or validates during training (ours: no logger, no
checkpoint callback, no validation data, no progress bar; TRL: ``report_to="none"``,
``save_strategy="no"``, ``logging_strategy="no"``, ``eval_strategy="no"``, tqdm off). Each framework
still computes its own in-loop metrics, as it would in a real run.

Timing: each run is a fresh Python process (runs alternate A/B/A/B in one invocation, so slow
drifts of the machine hit both). Seconds per iteration are measured from the end of one
iteration to the end of the next (everything in between counts: data, generation, reward, loss,
backward, optimizer, callbacks), skipping the first ``--warmup`` iterations; samples/s =
64 / (seconds per iteration). On a GPU each run also reports its peak allocated memory, and ours the model
FLOPs utilisation of its update phase: MFU = 6 N T / (t_update x peak), N the weights a token is multiplied by
(`benchmarks._common.matmul_parameters`: every linear layer and the LM head, not the embedding lookup), T the real
prompt + response tokens of the iteration's batch, t_update the module's ``time/optimize_s`` (forward, backward,
clipping and the AdamW step of the one mini-batch), peak ``--peak-tflops`` (790: the bf16 matrix product measured
on the H200 this was written for); attention's score and value products (~2% at 0.5B and 264 tokens) are left
out. The process CPU time per iteration is reported beside it: with
``--threads 1`` it is the work each framework does and barely moves when other processes share the
cores, while wall time can be several times off (with more threads, OpenMP spin-waiting makes even
CPU time unreliable). On a loaded machine the script says so: rerun it on a quiet one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (  # noqa: E402
    ROOT,
    emit,
    greedy_accuracy,
    load_note,
    matmul_parameters,
    mean_std,
    run_worker,
    save_random_qwen2,
)

PROMPTS, GROUP, LR, TEMPERATURE, CLIP = 8, 8, 1e-4, 1.0, 0.2
SAMPLES = PROMPTS * GROUP
RANDOM_MODELS = {"random-qwen2-0.5b": "0.5b", "random-qwen2-toy": "toy"}  # --model names built here (save_random_qwen2)


def odd_length(completions, **_):
    """1 for a completion of odd length: a reward a random policy's samples differ in (exact match never rewards them)."""
    return [float(len(c) % 2) for c in completions]


def exact_match(completions, answer, **_):
    """The same comparison as components.reward.ExactMatch (TRL's side)."""
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


def _uses_cuda(accelerator: str) -> bool:
    import torch

    return accelerator == "gpu" or (accelerator == "auto" and torch.cuda.is_available())


def _peak_gib() -> float | None:
    import torch

    return (
        torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    )


def _eval_rows(n: int) -> list[dict]:
    from lightning_rl.data.tasks import arithmetic_rows

    return arithmetic_rows("test")[:n]


def steady_seconds(stamps: list[list[float]], warmup: int) -> tuple[float, float]:
    """Mean (wall, process CPU) seconds per iteration from end-of-iteration stamps, skipping ``warmup`` iterations."""
    if len(stamps) <= warmup + 1:
        raise ValueError(
            f"need more than {warmup + 1} iterations to time (got {len(stamps)}); raise --steps or lower --warmup"
        )
    n = len(stamps) - 1 - warmup
    return (stamps[-1][0] - stamps[warmup][0]) / n, (stamps[-1][1] - stamps[warmup][1]) / n


# ---------------------------------------------------------------------------------------------- workers
def run_ours(args) -> dict:
    import torch
    from lightning import Callback

    from lightning_rl.cli import DEFAULT_TRAINER_CONFIG
    from lightning_rl.cli import main as cli_main

    torch.set_num_threads(args.threads)
    stamps: list[tuple[float, float]] = []
    update: list[tuple[int, float]] = []  # (prompt + response tokens, seconds of the optimize phase) per iteration
    tokens: list[int] = []

    class Stamp(Callback):
        def on_fit_start(self, trainer, module):
            run = module.update.run

            def counted(batch, *a, **k):
                tokens.append(int(batch.prompt_mask.sum() + batch.response_mask.sum()))
                return run(batch, *a, **k)

            module.update.run = counted

        def on_train_batch_end(self, trainer, *_):
            stamps.append((time.perf_counter(), time.process_time()))
            update.append((tokens[-1] if tokens else 0, float(trainer.callback_metrics.get("time/optimize_s", 0.0))))

    reward = (
        ["--model.reward=components.reward.FunctionReward", "--model.reward.init_args.fn=benchmarks.compare_trl.odd_length"]
        if args.reward == "odd_length" else []
    )  # fmt: skip
    scratch = tempfile.mkdtemp(prefix="bench-ours-")
    start = time.perf_counter()
    cli = cli_main(
        [
            "--config", DEFAULT_TRAINER_CONFIG, "--config", str(ROOT / "configs" / "grpo.yaml"),
            f"--model.policy.path={args.model}", f"--seed_everything={args.seed}", f"--data.seed={args.seed}",
            f"--data.batch_size={PROMPTS}", f"--model.rollout.init_args.group_size={GROUP}",
            f"--model.rollout.init_args.max_new_tokens={args.max_new_tokens}", f"--model.rollout.init_args.temperature={TEMPERATURE}",
            "--model.advantage.init_args.bessel=true", "--model.advantage.init_args.eps=1e-4",
            f"--model.surrogate.init_args.eps_low={CLIP}", f"--model.surrogate.init_args.eps_high={CLIP}",
            f"--model.optimizer.lr={LR}", "--model.optimizer.max_grad_norm=1.0",
            "--model.loop.ppo_epochs=1", "--model.loop.num_mini_batches=1", f"--model.loop.micro_batch_size={SAMPLES}",
            "--model.loop.log_samples_every_n_steps=0", "--data.val_data=null",
            f"--trainer.max_steps={args.steps}", "--trainer.logger=false", "--trainer.callbacks=[]",
            "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", f"--trainer.default_root_dir={scratch}",
            f"--trainer.accelerator={args.accelerator}", f"--trainer.precision={'bf16-mixed' if args.precision == 'bf16' else '32-true'}",
            *reward,
        ],
        run=False,
    )  # fmt: skip
    cli.trainer.callbacks.append(Stamp())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    total = time.perf_counter() - start
    timed = update[args.warmup + 1 :]  # the iterations the samples/s are taken over
    flops = 6 * matmul_parameters(cli.model.policy) * sum(t for t, _ in timed)
    mfu = flops / max(1e-9, sum(s for _, s in timed)) / (args.peak_tflops * 1e12) if timed else None
    peak = _peak_gib()
    accuracy = _accuracy(cli.model.policy, cli.model.tokenizer, args)
    return {"stamps": stamps, "total_s": total, "accuracy": accuracy, "peak_gib": peak, "mfu": mfu,
            "update_s": statistics.mean(s for _, s in timed) if timed else None,
            "update_tokens": statistics.mean(t for t, _ in timed) if timed else None}  # fmt: skip


def _accuracy(policy, tokenizer, args) -> float | None:
    return (
        greedy_accuracy(policy, tokenizer, _eval_rows(args.eval_prompts), args.max_new_tokens)
        if args.eval_prompts
        else None
    )


def run_trl(args) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lightning_rl.core.models import load_tokenizer
    from lightning_rl.data.tasks import arithmetic_rows

    torch.set_num_threads(args.threads)
    stamps: list[tuple[float, float]] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, *_, **__):
            stamps.append((time.perf_counter(), time.process_time()))

    start = time.perf_counter()
    tokenizer = load_tokenizer(args.model)  # left padding, as ours
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), seed=args.seed, data_seed=args.seed,
        per_device_train_batch_size=SAMPLES, gradient_accumulation_steps=1, num_generations=GROUP,
        max_completion_length=args.max_new_tokens, temperature=TEMPERATURE, top_p=1.0, top_k=0,
        beta=0.0, num_iterations=1, epsilon=CLIP, scale_rewards="group", loss_type="dapo",
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch", max_steps=args.steps, bf16=args.precision == "bf16", fp16=False, gradient_checkpointing=False,
        use_cpu=not _uses_cuda(args.accelerator), use_vllm=False, disable_dropout=True,
        report_to="none", save_strategy="no", logging_strategy="no", eval_strategy="no", disable_tqdm=True,
        log_completions=False, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model, reward_funcs=odd_length if args.reward == "odd_length" else exact_match, args=config, processing_class=tokenizer,
        train_dataset=datasets.Dataset.from_list(arithmetic_rows("train")), callbacks=[Stamp()],
    )  # fmt: skip
    trainer.train()
    total = time.perf_counter() - start
    peak = _peak_gib()
    accuracy = _accuracy(trainer.accelerator.unwrap_model(trainer.model), tokenizer, args)
    return {"stamps": stamps, "total_s": total, "accuracy": accuracy, "peak_gib": peak}


# ---------------------------------------------------------------------------------------------- parent
def main() -> None:
    from lightning_rl.core.models import TINY_MODEL_PATH

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="RL iterations per run (each: 8 prompts x 8 samples)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1; each seed runs ours then TRL")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the timing")
    parser.add_argument("--eval-prompts", type=int, default=500, help="held-out prompts for greedy accuracy (0: none)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in both runs")
    parser.add_argument(
        "--model",
        default=TINY_MODEL_PATH,
        help=f"a causal LM directory with the task's tokenizer, or one of {sorted(RANDOM_MODELS)}",
    )
    parser.add_argument("--max-new-tokens", type=int, default=8, help="response length cap")
    parser.add_argument(
        "--precision", choices=["32", "bf16"], default="32", help="fp32, or bf16 autocast over fp32 weights"
    )
    parser.add_argument(
        "--accelerator",
        choices=["auto", "cpu", "gpu"],
        default="auto",
        help="where both run (auto: the GPU if there is one)",
    )
    parser.add_argument(
        "--reward",
        choices=["exact", "odd_length"],
        default="exact",
        help="exact match, or odd_length for a random policy",
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=790.0, help="the device's bf16 matrix rate, for the MFU of our update"
    )
    parser.add_argument("--worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        emit((run_ours if args.worker == "ours" else run_trl)(args))
        return

    import torch

    from lightning_rl.core.models import ModelSpec, load_causal_lm, load_tokenizer

    torch.set_num_threads(args.threads)
    print(f"before: {load_note()}", flush=True)
    if args.model in RANDOM_MODELS:
        shape = RANDOM_MODELS[args.model]
        args.model = save_random_qwen2(tempfile.mkdtemp(prefix="bench-qwen2-"), shape)
        print(f"a random Qwen2 of shape {shape} built in {args.model}", flush=True)
    initial = (
        _accuracy(load_causal_lm(ModelSpec(path=args.model)), load_tokenizer(args.model), args)
        if args.eval_prompts
        else None
    )
    if initial is not None:
        print(
            f"held-out greedy accuracy of the initial policy ({args.eval_prompts} prompts): {initial:.3f}", flush=True
        )
    common = [f"--steps={args.steps}", f"--warmup={args.warmup}", f"--eval-prompts={args.eval_prompts}", f"--threads={args.threads}",
              f"--model={args.model}", f"--max-new-tokens={args.max_new_tokens}", f"--precision={args.precision}",
              f"--accelerator={args.accelerator}", f"--reward={args.reward}", f"--peak-tflops={args.peak_tflops}"]  # fmt: skip
    results: dict[str, list[dict]] = {"ours": [], "trl": []}
    for seed in range(args.seeds):
        for name in ("ours", "trl"):  # A/B/A/B: ours, TRL, ours, TRL, ...
            out = run_worker(Path(__file__), [f"--worker={name}", f"--seed={seed}", *common])
            out["seconds_per_step"], out["cpu_per_step"] = steady_seconds(out["stamps"], args.warmup)
            out["samples_per_s"] = SAMPLES / out["seconds_per_step"]
            out["samples_per_cpu_s"] = SAMPLES / out["cpu_per_step"]
            results[name].append(out)
            mfu = "" if out.get("mfu") is None else f", update MFU {out['mfu']:.1%}"
            print(
                f"seed {seed} {name:4s}: {out['seconds_per_step']:.3f} s/iteration ({out['cpu_per_step']:.3f} CPU s), "
                f"{out['samples_per_s']:.1f} samples/s, held-out accuracy {_num(out['accuracy'])}, peak {_num(out['peak_gib'], '.1f')} GiB{mfu} "
                f"(whole run {out['total_s']:.1f} s)",
                flush=True,
            )
    print(f"after: {load_note()}\n")
    summary = summarise(results, args, initial)
    emit(summary)  # the line benchmarks/gpu_check.py reads


def _num(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _values(runs: list[dict], key: str) -> list[float]:
    return [r[key] for r in runs if r.get(key) is not None]


def summarise(results: dict[str, list[dict]], args, initial: float | None) -> dict:
    """Print the table; return its numbers (means over seeds)."""
    speed = [o["samples_per_s"] / t["samples_per_s"] for o, t in zip(results["ours"], results["trl"])]
    cpu_speed = [o["samples_per_cpu_s"] / t["samples_per_cpu_s"] for o, t in zip(results["ours"], results["trl"])]
    print(f"GRPO, {PROMPTS} prompts x {GROUP} samples, max_new_tokens {args.max_new_tokens}, {args.steps} iterations "
          f"({args.steps * SAMPLES} samples), {args.seeds} seed(s), {args.threads} threads, precision {args.precision}")  # fmt: skip
    print("| | samples/s | s/iteration | CPU s/iteration | held-out accuracy | peak GPU GiB | update MFU |")
    print("|---|---|---|---|---|---|---|")
    for name, label in (("ours", "lightning_rl"), ("trl", "TRL GRPOTrainer")):
        rs = results[name]
        accuracy, peak, mfu = _values(rs, "accuracy"), _values(rs, "peak_gib"), _values(rs, "mfu")
        print(f"| {label} | {mean_std([r['samples_per_s'] for r in rs])} | {mean_std([r['seconds_per_step'] for r in rs])} | "
              f"{mean_std([r['cpu_per_step'] for r in rs])} | {mean_std(accuracy) if accuracy else '-'} | "
              f"{mean_std(peak) if peak else '-'} | {mean_std(mfu) if mfu else '-'} |")  # fmt: skip
    ours_acc, trl_acc = _values(results["ours"], "accuracy"), _values(results["trl"], "accuracy")
    gap = statistics.mean(ours_acc) - statistics.mean(trl_acc) if ours_acc and trl_acc else None
    print(f"| ratio (ours / TRL) | {mean_std(speed)} | | {mean_std(cpu_speed)} (samples per CPU second) | "
          f"{'-' if gap is None else f'{gap:+.3f} (difference)'} | | |")  # fmt: skip
    if initial is not None:
        print(f"initial policy held-out accuracy: {initial:.3f}")

    def mean(name: str, key: str) -> float | None:
        values = _values(results[name], key)
        return statistics.mean(values) if values else None

    return {
        "ours_samples_per_s": mean("ours", "samples_per_s"), "trl_samples_per_s": mean("trl", "samples_per_s"),
        "ratio": statistics.mean(speed), "ours_peak_gib": mean("ours", "peak_gib"), "trl_peak_gib": mean("trl", "peak_gib"),
        "ours_mfu": mean("ours", "mfu"), "ours_update_s": mean("ours", "update_s"), "ours_update_tokens": mean("ours", "update_tokens"),
        "ours_accuracy": mean("ours", "accuracy"), "trl_accuracy": mean("trl", "accuracy"), "initial_accuracy": initial,
    }  # fmt: skip


if __name__ == "__main__":
    main()
