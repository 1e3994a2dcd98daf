"""GRPO at a realistic size: ours (in-process sampler, vLLM, asynchronous on vLLM) against TRL's ``GRPOTrainer`` (its
own generation, and vLLM), side by side on the same randomly initialised Qwen2-style policy.

    python benchmarks/engine_scale.py                        # sizes 30m and 80m, 2 seeds, every system
    python benchmarks/engine_scale.py --sizes 30m --seeds 1 --systems ours trl     # a quick look
    python benchmarks/engine_scale.py --sizes toy --seeds 1 --max-new-tokens 16 --systems ours trl   # a check (1 min;
                                                             # vLLM's CPU attention refuses toy's head_dim 16)

Needs TRL 1.16 (the ``bench`` extra) in vLLM's environment: ``make bench-env``. Both TRL rows run there, since
TRL's vLLM path imports vLLM in-process; ours runs in this interpreter and launches vLLM's server from ``.venv-vllm``
(`configs/rollout/vllm.yaml`).

The job, the same for every system: a random Qwen2 of ``QWEN2_SHAPES[size]`` (`benchmarks._common`, built here,
nothing downloaded), the built-in arithmetic prompts, 8 prompts x 8 samples x ``--max-new-tokens`` (128) new tokens
with the end-of-sequence token ignored (ours: ``ignore_eos``; TRL: ``min_new_tokens`` for its own generation and
vLLM's ``ignore_eos``), so every system generates the same number of tokens; temperature 1; fp32; GRPO with one
inner epoch and one mini-batch (on-policy), clip 0.2, token-mean loss, AdamW 1e-6; the reward `char_parity` (the
fraction of a completion's characters with an odd code point: it differs within a group of a random policy's
samples, so no system skips an update). Our in-process sampler draws by ``draw: inverse_cdf`` (one uniform number
per row and step, where ``torch.multinomial`` spends one per vocabulary entry). Per system and seed: one fresh process, ``--warmup`` (1) + ``--iterations``
(3) iterations, timed from the end of the warm-up to the end of the last; seeds alternate over the systems (seed 0:
every system, then seed 1: every system). A system that fails (TRL's vLLM path on vLLM's CPU build) is reported with
the last line of its error and not retried.

Reported per system: samples/s, the split of an iteration (ours: the module's ``time/*_s`` phases; TRL: generation,
the rest of generating and scoring, and the update), peak resident memory of the trainer's process (and of the
vLLM server where one runs), and the achieved FLOP/s of generation (2 N (prompt + new tokens) / generation seconds)
and of the update (6 N T / update seconds), N the weights a token is multiplied by, against the machine's fp32 matrix
rate measured first (a square matmul at the thread count the runs use). The last line is
``ours (best) / TRL (best) samples/s at <size>: <ratio>x`` for the largest size run. Run it with nothing else on the
machine; the load average before and after is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, emit, load_note, matmul_parameters, mean_std, run_worker  # noqa: E402

PROMPTS, GROUP, LR, CLIP = 8, 8, 1e-6, 0.2
SAMPLES = PROMPTS * GROUP
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SYSTEMS = {
    # name: (framework, label, our configs stacked on configs/grpo.yaml | TRL's use_vllm)
    "ours": ("ours", "ours, in-process sampler", []),
    "ours-vllm": ("ours", "ours on vLLM", ["configs/rollout/vllm.yaml"]),
    "ours-vllm-async": ("ours", "ours on vLLM, asynchronous", ["configs/rollout/vllm.yaml", "configs/loop/async.yaml"]),
    "trl": ("trl", "TRL GRPOTrainer", False),
    "trl-vllm": ("trl", "TRL GRPOTrainer + vLLM (colocate)", True),
}


def char_parity(completions, **_) -> list[float]:
    """The fraction of a completion's characters with an odd code point (0 for an empty one): the reward both
    frameworks call, varied within any group of a random policy's samples."""
    return [sum(ord(c) % 2 for c in text) / max(1, len(text)) for text in completions]


def peak_rss_gib(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 2**20  # KiB on Linux


def matmul_rate(threads: int, n: int = 2048, repeats: int = 8) -> float:
    """The machine's fp32 matrix rate at ``threads`` threads, FLOP/s: the best of ``repeats`` square products."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


# ---------------------------------------------------------------------------------------------- workers
def run_ours(args) -> dict:
    import torch
    from lightning import Callback

    from lightning_rl.cli import DEFAULT_TRAINER_CONFIG
    from lightning_rl.cli import main as cli_main

    configs = SYSTEMS[args.system][2]
    # a launched server inherits the environment: alone on the cores while the trainer waits (synchronous), or one
    # core each (asynchronous: both compute at once)
    os.environ["OMP_NUM_THREADS"] = str(args.server_threads)
    torch.set_num_threads(args.threads)
    stamps: list[float] = []
    iterations: list[dict] = []
    tokens: list[tuple[int, int]] = []  # (prompt tokens, response tokens) of each batch the update took

    class Stamp(Callback):
        def on_fit_start(self, trainer, module):
            run = module.update.run

            def counted(batch, *a, **k):
                tokens.append((int(batch.prompt_mask.sum()), int(batch.response_mask.sum())))
                return run(batch, *a, **k)

            module.update.run = counted

        def on_train_batch_end(self, trainer, *_):
            stamps.append(time.perf_counter())
            phases = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("time/")}
            iterations.append({"phases": phases, "tokens": tokens[-1] if tokens else (0, 0)})

    rollout = "--model.rollout.init_args"
    scratch = tempfile.mkdtemp(prefix="bench-ours-")
    cli = cli_main(
        [
            "--config", DEFAULT_TRAINER_CONFIG, "--config", str(ROOT / "configs" / "grpo.yaml"),
            *[a for c in configs for a in ("--config", str(ROOT / c))],
            f"--model.policy.path={args.model}", f"--seed_everything={args.seed}", f"--data.seed={args.seed}",
            f"--data.batch_size={PROMPTS}", f"{rollout}.group_size={GROUP}", f"{rollout}.max_new_tokens={args.max_new_tokens}",
            f"{rollout}.temperature=1.0", f"{rollout}.ignore_eos=true",
            *([f"{rollout}.verify.every={args.verify_every}"] if configs else [f"{rollout}.draw=inverse_cdf"]),
            "--model.reward=components.reward.FunctionReward", "--model.reward.init_args.fn=benchmarks.engine_scale.char_parity",
            "--model.advantage.init_args.bessel=true", "--model.advantage.init_args.eps=1e-4",
            *([] if "configs/loop/async.yaml" in configs else
              [f"--model.surrogate.init_args.eps_low={CLIP}", f"--model.surrogate.init_args.eps_high={CLIP}"]),
            f"--model.optimizer.lr={LR}", "--model.optimizer.max_grad_norm=1.0",
            "--model.loop.ppo_epochs=1", "--model.loop.num_mini_batches=1", f"--model.loop.micro_batch_size={SAMPLES}",
            "--model.loop.log_samples_every_n_steps=0", "--data.val_data=null",
            f"--trainer.max_steps={args.warmup + args.iterations}", "--trainer.logger=false", "--trainer.callbacks=[]",
            "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", f"--trainer.default_root_dir={scratch}", "--trainer.accelerator=cpu",
            "--trainer.precision=32-true",
        ],
        run=False,
    )  # fmt: skip
    cli.trainer.callbacks.append(Stamp())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    timed = iterations[args.warmup :]
    n = matmul_parameters(cli.model.policy)
    phases = {k: statistics.mean(it["phases"].get(k, 0.0) for it in timed) for k in timed[-1]["phases"]}
    prompt, response = (statistics.mean(it["tokens"][i] for it in timed) for i in (0, 1))
    # asynchronous: the server samples in its own process while this one trains; time/rollout_s is only the hand-over
    generate_s = None if "configs/loop/async.yaml" in configs else phases.get("time/rollout_s")
    return {
        "seconds_per_iteration": (stamps[-1] - stamps[args.warmup - 1]) / args.iterations if args.warmup else
        (stamps[-1] - stamps[0]) / (args.iterations - 1),
        "split": {k.split("/")[1][:-2]: round(v, 2) for k, v in sorted(phases.items()) if k != "time/iteration_s"},
        "generation_flops": 2 * n * (prompt + response) / generate_s if generate_s else None,
        "update_flops": 6 * n * (prompt + response) / phases["time/optimize_s"],
        "response_tokens": response,
        "peak_rss_gib": peak_rss_gib(),
        "server_peak_rss_gib": peak_rss_gib(resource.RUSAGE_CHILDREN) if configs else None,
    }  # fmt: skip


def run_trl(args) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    use_vllm = SYSTEMS[args.system][2]
    torch.set_num_threads(args.threads)
    stamps: list[float] = []
    generate: list[float] = []
    generate_and_score: list[float] = []
    tokens: list[tuple[int, int]] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, *_, **__):
            stamps.append(time.perf_counter())

    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    rows = json.loads(Path(args.prompts_file).read_text())
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), seed=args.seed, data_seed=args.seed,
        per_device_train_batch_size=SAMPLES, gradient_accumulation_steps=1, num_generations=GROUP,
        max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, num_iterations=1, epsilon=CLIP, scale_rewards="group", loss_type="dapo",
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch", max_steps=args.warmup + args.iterations, bf16=False, fp16=False,
        gradient_checkpointing=False, use_cpu=True, disable_dropout=True,
        use_vllm=use_vllm, vllm_mode="colocate", vllm_importance_sampling_correction=False,
        generation_kwargs={"ignore_eos": True} if use_vllm else {"min_new_tokens": args.max_new_tokens},
        report_to="none", save_strategy="no", logging_strategy="no", eval_strategy="no", disable_tqdm=True,
        log_completions=False, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model, reward_funcs=char_parity, args=config, processing_class=tokenizer,
        train_dataset=datasets.Dataset.from_list(rows), callbacks=[Stamp()],
    )  # fmt: skip

    def timed(method, into: list[float]):
        def call(*a, **k):
            start = time.perf_counter()
            out = method(*a, **k)
            into.append(time.perf_counter() - start)
            return out

        return call

    trainer._generate = timed(trainer._generate, generate)
    score = trainer._generate_and_score_completions

    def scored(*a, **k):
        start = time.perf_counter()
        out = score(*a, **k)
        generate_and_score.append(time.perf_counter() - start)
        tokens.append((int(out["prompt_mask"].sum()), int(out["completion_mask"].sum())))
        return out

    trainer._generate_and_score_completions = scored
    trainer.train()
    w = args.warmup
    seconds = (stamps[-1] - stamps[w - 1]) / args.iterations if w else (stamps[-1] - stamps[0]) / (args.iterations - 1)
    gen, rest = (
        statistics.mean(generate[w:]),
        statistics.mean(a - b for a, b in zip(generate_and_score[w:], generate[w:])),
    )
    update = seconds - gen - rest
    n = matmul_parameters(model)
    prompt, response = (statistics.mean(t[i] for t in tokens[w:]) for i in (0, 1))
    return {
        "seconds_per_iteration": seconds,
        "split": {"generate": round(gen, 2), "score and advantages": round(rest, 2), "update": round(update, 2)},
        "generation_flops": 2 * n * (prompt + response) / gen,
        "update_flops": 6 * n * (prompt + response) / update,
        "response_tokens": response,
        "peak_rss_gib": peak_rss_gib(),
        "server_peak_rss_gib": None,
    }


# ---------------------------------------------------------------------------------------------- parent
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["30m", "80m"], help="QWEN2_SHAPES entries, smallest first")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1, alternated over the systems")
    parser.add_argument("--warmup", type=int, default=1, help="iterations before the timing")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="the trainer's torch threads (asynchronous: 1)")
    parser.add_argument("--verify-every", type=int, default=2, help="our vLLM runs verify every N-th push")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--system", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--prompts-file", help=argparse.SUPPRESS)
    parser.add_argument("--server-threads", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        emit((run_ours if args.worker == "ours" else run_trl)(args))
        return

    from benchmarks._common import save_random_qwen2
    from lightning_rl.data.tasks import arithmetic_rows

    if any(SYSTEMS[s][0] == "trl" for s in args.systems) and not VLLM_PYTHON.exists():
        raise SystemExit(f"{VLLM_PYTHON} is missing: run `make bench-env`")
    started = time.perf_counter()
    print(f"before: {load_note()}", flush=True)
    peak = matmul_rate(args.threads)
    print(f"fp32 matmul rate, {args.threads} threads: {peak / 1e9:.0f} GFLOP/s", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-engine-scale-"))
    prompts_file = scratch / "prompts.json"
    prompts_file.write_text(json.dumps([{"prompt": r["prompt"]} for r in arithmetic_rows("train")]))
    results: dict[str, dict[str, list[dict]]] = {}
    failed: dict[str, str] = {}  # system -> why it could not run: not retried at later seeds and sizes
    for size in args.sizes:
        model = save_random_qwen2(scratch / size, size)
        results[size] = {s: [] for s in args.systems}
        for seed in range(args.seeds):
            for system in args.systems:
                framework = SYSTEMS[system][0]
                asynchronous = system.endswith("async")
                if system in failed:
                    results[size][system].append({"failed": failed[system]})
                    continue
                common = [f"--worker={framework}", f"--system={system}", f"--seed={seed}", f"--model={model}",
                          f"--prompts-file={prompts_file}", f"--warmup={args.warmup}", f"--iterations={args.iterations}",
                          f"--max-new-tokens={args.max_new_tokens}", f"--threads={1 if asynchronous else args.threads}",
                          f"--server-threads={1 if asynchronous else args.threads}", f"--verify-every={args.verify_every}"]  # fmt: skip
                try:
                    out = run_worker(Path(__file__), common, python=str(VLLM_PYTHON) if framework == "trl" else None)
                except RuntimeError as failure:
                    reason = failed[system] = f"{_reason(str(failure))} ({size}, seed {seed})"
                    print(f"{size} seed {seed} {system}: failed: {reason}", flush=True)
                    results[size][system].append({"failed": reason})
                    continue
                out["samples_per_s"] = SAMPLES / out["seconds_per_iteration"]
                results[size][system].append(out)
                print(f"{size} seed {seed} {system}: {out['samples_per_s']:.2f} samples/s, split {out['split']}, "
                      f"generation {_gflops(out['generation_flops'])}, update {_gflops(out['update_flops'])} GFLOP/s, "
                      f"peak RSS {out['peak_rss_gib']:.2f} GiB", flush=True)  # fmt: skip
    print(f"after: {load_note()}; {(time.perf_counter() - started) / 60:.1f} min in all\n")
    for size in args.sizes:
        table(size, results[size], peak, args)
    largest = args.sizes[-1]
    ours, trl = best(results[largest], "ours"), best(results[largest], "trl")
    if ours and trl:
        print(f"ours (best) / TRL (best) samples/s at {largest}: {ours[1] / trl[1]:.2f}x")


def _reason(failure: str) -> str:
    """The last line of a worker's traceback that names an error: the row's one-line reason."""
    lines = [line.strip() for line in failure.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    return (errors or lines or ["no output"])[-1][:300]


def _gflops(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.1f}"


def _mean(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.mean(values) if values else None


def best(rows: dict[str, list[dict]], framework: str) -> tuple[str, float] | None:
    """(system, mean samples/s) of the framework's fastest system that ran."""
    means = [(s, _mean(runs, "samples_per_s")) for s, runs in rows.items() if SYSTEMS[s][0] == framework]
    means = [(s, v) for s, v in means if v is not None]
    return max(means, key=lambda m: m[1]) if means else None


def table(size: str, rows: dict[str, list[dict]], peak: float, args) -> None:
    print(f"GRPO at {size}: {PROMPTS} prompts x {GROUP} samples x {args.max_new_tokens} new tokens, fp32, {args.seeds} "
          f"seed(s) x {args.iterations} timed iterations; matmul rate {peak / 1e9:.0f} GFLOP/s")  # fmt: skip
    print(
        "| system | samples/s | s/iteration | split (s) | generation, % of matmul | update, % of matmul | peak RSS GiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for system, runs in rows.items():
        ran = [r for r in runs if "failed" not in r]
        if not ran:
            print(f"| {SYSTEMS[system][1]} | did not run: {runs[0]['failed'] if runs else '-'} | | | | | |")
            continue
        split = {k: round(statistics.mean(r["split"].get(k, 0.0) for r in ran), 2) for k in ran[0]["split"]}
        split = ", ".join(f"{k} {v}" for k, v in split.items() if v >= 0.01)
        sps = mean_std([r["samples_per_s"] for r in ran])
        rss = f"{_mean(ran, 'peak_rss_gib'):.2f}"
        if _mean(ran, "server_peak_rss_gib"):
            rss += f" (+ server {_mean(ran, 'server_peak_rss_gib'):.2f})"
        gen, update = _mean(ran, "generation_flops"), _mean(ran, "update_flops")
        print(f"| {SYSTEMS[system][1]} | {sps} | {_mean(ran, 'seconds_per_iteration'):.1f} | {split} | "
              f"{'-' if gen is None else f'{gen / peak:.0%}'} | {update / peak:.0%} | {rss} |")  # fmt: skip


if __name__ == "__main__":
    main()
