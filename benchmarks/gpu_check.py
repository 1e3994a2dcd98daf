"""The GPU check: the CUDA path run, checked and measured on one GPU in one call of about 9 minutes, ending in one
table (printed last, and written with the whole log to ``--out``). Start it through benchmarks/gpu_check.sh, which
installs the carried wheels (scripts/gpu_wheels.sh) and refuses to start where there is no CUDA device.

    bash benchmarks/gpu_check.sh                   # every part, on the GPU
    bash benchmarks/gpu_check.sh --parts c,d       # some parts (a rerun)
    bash benchmarks/gpu_check.sh --cpu-dry-run     # every part at toy sizes on CPU: what the GPU run executes, end to end

Each part runs in processes of its own under a time budget of its own, within the whole call's (``--budget``); a
part the time left does not cover is skipped with the reason, and one that overruns is stopped and reported with
what it finished, so the call always ends with the table:

The parts run in the order of the figures still missing (``--parts`` picks and orders them):

  c  trl    benchmarks/compare_trl.py on a random Qwen2 of Qwen2.5-0.5B's shape built here, 8 prompts x 8 samples x
            256 new tokens, bf16: samples/s of ours and TRL 1.16's GRPOTrainer, peak GPU memory, and the model FLOPs
            utilisation of our update phase against the bf16 matrix rate measured at the start
  m  moe    benchmarks/routing_replay.py on the tiny mixture-of-experts policy, the sampler in bf16 and the trainer in
            fp32, routing replay off and on: route agreement and the trainer/sampler log-prob gap (skipped, saying so,
            where the benchmark is not in the tree)
  d  long   benchmarks/long_responses.py on CUDA: token-budget packed micro-batches against padded ones (trainer),
            dropping finished rows against keeping them (sampler): tokens/s, peak memory, same gradients / tokens
  a  tests  ``pytest -m gpu``, the slow memory-release test first: SGLangRollout with a loopback server it starts on
            the same GPU, the server's memory released and resumed between rollouts, and ``weights.weight_sync: tensor``
            (CUDA IPC handles); every preset for 2 iterations on CUDA in bf16-mixed, and asynchronous GRPO (a round
            sampled ahead on a thread of its own); DDP and FSDP2 on NCCL train as one GPU and resume exactly
  b  jobs   the default job (validate, fit configs/grpo.yaml, validate the last checkpoint; scripts/default_job.sh)
            and the same for configs/ppo_rlhf.yaml, on CUDA in bf16-mixed: held-out greedy accuracy, seconds (each
            fit stops at its share of the budget, ``trainer.max_time``, if its 200 iterations take longer)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import RESULT_PREFIX, ROOT, emit  # noqa: E402

# the slow memory-release test runs first, alone (it has never been reached on a device); then the rest, most telling first:
# a part stopped by its budget still reports these
MEMORY_RELEASE_TEST = (
    "tests/components/test_sglang_rollout.py::test_memory_is_released_between_rollouts_and_resumed_before_use"
)
GPU_TESTS = [
    "tests/components/test_sglang_colocated.py",
    "tests/lightning_rl/test_distributed_gpu.py",
    "tests/lightning_rl/loop/test_async.py",
    "tests/test_presets.py",
    "tests/components/test_sglang_rollout.py",
]
CPU_TWINS = [  # the dry run's stand-ins for the CUDA tests: the same tests on CPU
    "tests/components/test_sglang_colocated.py::test_a_colocated_server_samples_each_update_of_the_trainers_policy[cpu-disk]",
    "tests/test_presets.py::test_preset_trains_two_iterations[grpo-cpu]",
    "tests/test_presets.py::test_preset_trains_two_iterations[ppo_rlhf-cpu]",
]
JOBS = ["configs/grpo.yaml", "configs/ppo_rlhf.yaml"]
# seconds per part on the GPU, and at the dry run's toy sizes on a loaded 2-core CPU
BUDGETS = {"c": 160, "m": 70, "d": 50, "a": 150, "b": 90}
DRY_BUDGETS = {"c": 900, "m": 600, "d": 400, "a": 900, "b": 900}
NAMES = {"c": "trl", "m": "moe", "d": "long", "a": "tests", "b": "jobs"}
ORDER = "cmdab"
RESERVE_S = 10  # kept back for the table
JOB_OVERHEAD_S = 30  # a job's imports, CUDA start and its two validate commands, besides the fit


class Check:
    """The call's deadline, its log, and the table's rows."""

    def __init__(self, out: Path, budget: float, dry_run: bool):
        self.out, self.dry_run = out, dry_run
        self.deadline = time.monotonic() + budget
        self.log = open(out / "gpu_check.log", "a", buffering=1)
        self.rows: list[tuple[str, str, str, str]] = []

    def left(self) -> float:
        return self.deadline - time.monotonic() - RESERVE_S

    def row(self, part: str, what: str, result: str, seconds: float | str = "") -> None:
        seconds = f"{seconds:.0f}" if isinstance(seconds, float) else seconds
        self.rows.append((f"{part} {NAMES[part]}", what, result, seconds))
        say(f"   {what}: {result}")

    def run(self, command: list[str], budget: float, cwd: Path = ROOT) -> tuple[int | None, list[dict], str, float]:
        """``command`` in a process group of its own, its output appended to the log; stopped (the whole group) after
        ``budget`` seconds. Returns (exit code or None when stopped, its result lines, its output, seconds)."""
        self.log.write(f"\n$ {' '.join(command)}   (budget {budget:.0f} s, in {cwd})\n")
        start = time.monotonic()
        with tempfile.TemporaryFile("w+") as output:
            process = subprocess.Popen(
                command, cwd=cwd, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, text=True
            )
            try:
                code = process.wait(timeout=max(1.0, budget))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                code = None
            output.seek(0)
            text = output.read()
        self.log.write(text)
        results = [
            json.loads(line[len(RESULT_PREFIX) :]) for line in text.splitlines() if line.startswith(RESULT_PREFIX)
        ]
        return code, results, text, time.monotonic() - start

    def failed(self, part: str, what: str, code: int | None, text: str, seconds: float, budget: float) -> None:
        if code is None:
            self.row(part, what, f"stopped at its budget ({budget:.0f} s)", seconds)
        else:
            last = [line for line in text.splitlines() if line.strip()][-1:] or ["(no output)"]
            self.row(part, what, f"FAILED (exit {code}): {last[0][:160]}", seconds)
        say(
            f"--- the last lines of its output (all of it: {self.out / 'gpu_check.log'})\n"
            + "\n".join(text.splitlines()[-25:])
        )


def say(text: str) -> None:
    print(text, flush=True)


# ---------------------------------------------------------------------------------------------- before the parts
def machine(dry_run: bool) -> tuple[list[str], float]:
    """Lines describing the machine and the packages, and the bf16 matrix rate (TFLOP/s) measured on the GPU."""
    import importlib.metadata as metadata

    import torch

    lines = [
        f"date (UTC): {datetime.now(timezone.utc):%Y-%m-%d %H:%M}",
        f"python {sys.version.split()[0]}, torch {torch.__version__}",
    ]
    peak = 790.0  # the H200's bf16 matrix product measured on this workplace's machines (769-798 TFLOP/s)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(
            f"device: {props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability {props.major}.{props.minor}, CUDA {torch.version.cuda}"
        )
        peak = bf16_matmul_tflops()
        lines.append(f"bf16 matrix product 8192^3, mean of 10 after 3 warm-ups: {peak:.0f} TFLOP/s (the MFU's peak)")
    else:
        lines.append(
            f"device: none (CPU dry run; the MFU is taken against {peak:.0f} TFLOP/s, the H200's measured bf16 rate)"
        )
    versions = []
    for name in (
        "lightning",
        "transformers",
        "peft",
        "accelerate",
        "trl",
        "datasets",
        "pyarrow",
        "fsspec",
        "huggingface_hub",
        "jsonargparse",
    ):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} MISSING")
    lines.append("packages: " + ", ".join(versions))
    return lines, peak


def bf16_matmul_tflops(n: int = 8192, repeats: int = 10) -> float:
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000
    del a, b
    torch.cuda.empty_cache()  # the parts run in processes of their own: this one keeps no memory on the GPU
    return 2 * n**3 * repeats / seconds / 1e12


def import_problems() -> list[str]:
    """The modules the parts import that fail to import here, each with its error."""
    import importlib

    problems = []
    for name in ("jsonargparse", "omegaconf", "math_verify", "datasets", "trl", "lightning_rl.cli", "components"):
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 -- any failure to import is the news here
            problems.append(f"{name}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    return problems


# ---------------------------------------------------------------------------------------------- the parts
def part_tests(check: Check, budget: float) -> None:
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-v", "-rfE", "--timeout=150"]
    runs = [
        ("the memory-release test", [*base, "-m", "gpu", MEMORY_RELEASE_TEST]),
        ("pytest -m gpu", [*base, "-m", "gpu", *GPU_TESTS, "--deselect", MEMORY_RELEASE_TEST]),
    ]
    if check.dry_run:  # every CUDA test skips here; their CPU twins run the same code up to the device
        runs.append(("the CUDA tests' CPU twins", [*base, *CPU_TWINS]))
    for i, (what, command) in enumerate(runs):
        share = min(budget, check.left()) / (len(runs) - i)
        code, _, text, seconds = check.run(command, share)
        budget -= seconds
        outcomes = re.findall(r"^(tests/\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", text, flags=re.M)
        counts = {o: sum(1 for _, x in outcomes if x == o) for o in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
        result = ", ".join(f"{n} {o.lower()}" for o, n in counts.items() if n) or "nothing ran"
        bad = [name.split("::", 1)[-1] for name, o in outcomes if o in ("FAILED", "ERROR")]
        if bad:
            result += " -- " + "; ".join(bad[:6]) + (" ..." if len(bad) > 6 else "")
        if code is None:
            result += f" (stopped at its budget, {share:.0f} s)"
        elif code not in (0, 5) and not bad:
            result += f" (pytest exit {code})"
        check.row("a", what, result, seconds)
        if bad or code not in (0, 5):
            say("--- failures (the whole output is in the log)\n" + "\n".join(text.splitlines()[-40:]))


def part_jobs(check: Check, budget: float) -> None:
    for i, config in enumerate(JOBS):
        share = min(budget / (len(JOBS) - i), check.left())
        label = "default job (configs/grpo.yaml)" if i == 0 else config
        if share < 20:
            check.row("b", label, "skipped: no time left in the budget")
            continue
        scratch = Path(tempfile.mkdtemp(prefix="gpu-check-job-"))  # its runs/ folder
        fit_s = max(
            10.0, share - JOB_OVERHEAD_S
        )  # the fit stops there (Lightning's max_time) and still writes last.ckpt
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "job",
            "--config",
            str(ROOT / config),
            f"--fit-seconds={fit_s:.0f}",
        ]
        code, results, text, seconds = check.run(
            [*command, *(["--cpu-dry-run"] if check.dry_run else [])], share, cwd=scratch
        )
        budget -= seconds
        got = {k: v for r in results for k, v in r.items()}
        if "after" in got:
            check.row("b", f"{label}, {got['iterations']} of {got['max_steps']} iterations (fit capped at {fit_s:.0f} s), {got['precision']}",
                      f"held-out accuracy {got['before']:.3f} -> {got['after']:.3f} ({got['val_prompts']} prompts); fit {got['fit_s']:.1f} s, "
                      f"job {got['job_s']:.1f} s", seconds)  # fmt: skip
        else:
            check.failed(
                "b",
                label + (f" (accuracy before: {got['before']:.3f})" if "before" in got else ""),
                code,
                text,
                seconds,
                share,
            )


def job_worker(config: str, dry_run: bool, fit_seconds: int) -> None:
    """The default job's three commands (scripts/default_job.sh), in this process, in bf16-mixed on the GPU; the fit
    runs its 200 iterations or stops after ``fit_seconds`` (``trainer.max_time``), whichever comes first."""
    import yaml

    from lightning_rl.cli import main

    hardware = ["--trainer.accelerator=cpu"] if dry_run else ["--trainer.accelerator=gpu", "--trainer.devices=1"]
    hardware += ["--trainer.precision=bf16-mixed", "--trainer.enable_progress_bar=false"]
    days, rest = divmod(int(fit_seconds), 86400)
    stop = f"--trainer.max_time={days:02d}:{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"  # DD:HH:MM:SS
    toy = ["--trainer.max_steps=2", "--data.batch_size=4", "--data.val_size=8"] if dry_run else []
    folder = yaml.safe_load(Path(config).read_text())["trainer"]["default_root_dir"]
    start = time.perf_counter()
    cli = main(["validate", "--config", config, "--trainer.logger=false", *hardware, *toy])
    emit({"before": float(cli.trainer.callback_metrics["val/reward"]), "precision": "bf16-mixed"})
    fit_start = time.perf_counter()
    cli = main(["fit", "--config", config, *hardware, *toy, stop])
    emit(
        {
            "fit_s": time.perf_counter() - fit_start,
            "iterations": cli.trainer.global_step,
            "max_steps": cli.trainer.max_steps,
        }
    )
    cli = main(
        [
            "validate",
            "--config",
            config,
            "--trainer.logger=false",
            *hardware,
            *toy,
            "--ckpt_path",
            f"{folder}/latest/checkpoints/last.ckpt",
        ]
    )
    val_prompts = len(cli.datamodule.val_rows[0]) if getattr(cli.datamodule, "val_rows", None) else None
    emit(
        {
            "after": float(cli.trainer.callback_metrics["val/reward"]),
            "job_s": time.perf_counter() - start,
            "val_prompts": val_prompts,
        }
    )


def part_trl(check: Check, budget: float, peak: float, steps: int) -> None:
    budget = min(budget, check.left())
    size = (
        ["--model=random-qwen2-toy", "--max-new-tokens=16", "--accelerator=cpu", "--steps=3", "--warmup=1", "--threads=2"]
        if check.dry_run else ["--model=random-qwen2-0.5b", "--max-new-tokens=256", "--accelerator=gpu", f"--steps={steps}", "--warmup=1", "--threads=8"]
    )  # fmt: skip
    command = [
        sys.executable,
        "benchmarks/compare_trl.py",
        *size,
        "--precision=bf16",
        "--reward=odd_length",
        "--eval-prompts=0",
        f"--peak-tflops={peak:.1f}",
    ]
    what = (
        "GRPO 8 prompts x 8 samples x "
        + ("16" if check.dry_run else "256")
        + " new tokens, bf16, random Qwen2 "
        + ("toy" if check.dry_run else "0.5B")
    )
    code, results, text, seconds = check.run(command, budget)
    if not results:
        return check.failed("c", what, code, text, seconds, budget)
    r = results[-1]
    check.row(
        "c",
        what + ": samples/s, ours / TRL 1.16 GRPOTrainer",
        f"{r['ours_samples_per_s']:.1f} / {r['trl_samples_per_s']:.1f} = {r['ratio']:.2f}x",
        seconds,
    )
    if r["ours_peak_gib"] is not None:
        check.row(
            "c", "peak GPU memory allocated, ours / TRL", f"{r['ours_peak_gib']:.1f} / {r['trl_peak_gib']:.1f} GiB"
        )
    if r["ours_mfu"] is not None:
        check.row("c", "model FLOPs utilisation of our update phase",
                  f"{r['ours_mfu']:.1%} = 6 N T / (t x {peak:.0f} TFLOP/s), T = {r['ours_update_tokens']:,.0f} prompt + response tokens, "
                  f"t = {r['ours_update_s']:.3f} s per iteration; N = every linear layer's weights and the LM head")  # fmt: skip


def part_moe(check: Check, budget: float) -> None:
    budget = min(budget, check.left())
    script = ROOT / "benchmarks" / "routing_replay.py"
    what = "tiny MoE, sampler bf16, trainer fp32, GRPO: log-prob gap with / without routing replay"
    if not script.is_file():
        return check.row(
            "m", what, "skipped: benchmarks/routing_replay.py is not in this tree (routing replay not landed)"
        )
    size = ["--iterations=2", "--random-model", "--val-batches=1"] if check.dry_run else ["--iterations=10"]
    code, _, text, seconds = check.run([sys.executable, str(script), "--seeds", "0", *size], budget)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    ratio = [line for line in lines if line.startswith("logprob gap with / without routing replay:")]
    if not ratio:
        return check.failed("m", what, code, text, seconds, budget)
    # the table's rows: | off | max gap | mean gap | agreeing | disagreeing | route agreement | accuracy |
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith(("| off", "| on"))]
    shown = "; ".join(f"{r[0]}: max gap {r[1]}, route agreement {r[5]}" for r in rows if len(r) >= 6)
    check.row("m", what, ratio[-1].rsplit(":", 1)[1].strip() + (f" ({shown})" if shown else ""), seconds)


def part_long(check: Check, budget: float) -> None:
    budget = min(budget, check.left())
    size = (
        ["--device=cpu", "--batch=8", "--group=4", "--max-len=48", "--hidden=64", "--layers=2", "--budget=256"]
        if check.dry_run else ["--device=cuda", "--batch=64", "--group=8", "--max-len=1024", "--hidden=1024", "--layers=8", "--budget=16384"]
    )  # fmt: skip
    code, results, text, seconds = check.run(
        [sys.executable, "benchmarks/long_responses.py", "--repeats=1", *size], budget
    )
    shape = " ".join(size[1:])
    if not results:
        return check.failed("d", f"long responses ({shape})", code, text, seconds, budget)
    r = results[-1]
    t, s = r["trainer"], r["sampler"]
    check.row("d", f"trainer phases tokens/s, packed (budget) / padded ({shape})",
              f"{t['packed_tokens_per_s']:,.0f} / {t['padded_tokens_per_s']:,.0f} = {t['ratio']:.2f}x; peak {t['packed_peak_mib']:,.0f} / "
              f"{t['padded_peak_mib']:,.0f} MiB; gradients {'equal' if t['same'] else 'DIFFER'}", seconds)  # fmt: skip
    check.row("d", "sampler tokens/s, dropping finished rows / keeping them",
              f"{s['drop_tokens_per_s']:,.0f} / {s['keep_tokens_per_s']:,.0f} = {s['ratio']:.2f}x; peak {s['drop_peak_mib']:,.0f} / "
              f"{s['keep_peak_mib']:,.0f} MiB; tokens {'the same' if s['same'] else 'DIFFER'}")  # fmt: skip


# ---------------------------------------------------------------------------------------------- the call
def table(check: Check, header: list[str]) -> str:
    title = "GPU check" + (
        " -- CPU DRY RUN at toy sizes: the numbers mean nothing, only that every part runs" if check.dry_run else ""
    )
    lines = [f"## {title}", "", *[f"- {h}" for h in header], "", "| part | what | result | s |", "|---|---|---|---|"]
    lines += [f"| {p} | {w} | {r.replace('|', '/')} | {s} |" for p, w, r, s in check.rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=ORDER, help=f"which parts, in this order (default {ORDER}), e.g. c,d")
    parser.add_argument(
        "--budget", type=float, default=None, help="seconds for the whole call (default 520 on a GPU, 3600 dry)"
    )
    parser.add_argument(
        "--out", default=os.environ.get("OUT") or "/tmp/gpu_check", help="folder for gpu_check.md and gpu_check.log"
    )
    parser.add_argument("--cpu-dry-run", action="store_true", help="every part at toy sizes on CPU")
    parser.add_argument("--budgets", default="", help="seconds per part instead of the defaults, e.g. a=60,c=140")
    parser.add_argument(
        "--trl-steps", type=int, default=5, help="part c's timed iterations per framework (after one warm-up)"
    )
    parser.add_argument("--worker", choices=["job"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--fit-seconds", type=int, default=60, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return job_worker(args.config, args.cpu_dry_run, args.fit_seconds)

    import torch

    if not args.cpu_dry_run and not torch.cuda.is_available():
        raise SystemExit(
            f"gpu_check: torch {torch.__version__} sees no CUDA device; this is for the GPU machine (here: --cpu-dry-run)"
        )
    parts = [p for p in args.parts.replace(",", "") if p in NAMES]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    total = args.budget or (3600 if args.cpu_dry_run else 520)
    check = Check(out, total, args.cpu_dry_run)
    header, peak = machine(args.cpu_dry_run)
    for line in header:
        say(line)
    problems = import_problems()
    if problems:
        header.append(
            "IMPORT FAILURES (carry the missing wheels: scripts/gpu_wheels.sh, EXTRA=... for a newer one): "
            + "; ".join(problems)
        )
        say(header[-1])
    budgets = dict(DRY_BUDGETS if args.cpu_dry_run else BUDGETS)
    budgets.update(
        {k.strip(): float(v) for k, v in (item.split("=") for item in args.budgets.split(",") if item.strip())}
    )
    for part in parts:
        budget = budgets[part]
        if check.left() < 20:
            check.row(part, NAMES[part], f"skipped: {max(0, check.left() + RESERVE_S):.0f} s left of the call's budget")
            continue
        say(f"== part {part} ({NAMES[part]}), budget {min(budget, check.left()):.0f} s")
        if part == "a":
            part_tests(check, budget)
        elif part == "b":
            part_jobs(check, budget)
        elif part == "c":
            part_trl(check, budget, peak, args.trl_steps)
        elif part == "m":
            part_moe(check, budget)
        else:
            part_long(check, budget)
    header.append(
        f"parts {''.join(parts)} took {total - (check.deadline - time.monotonic()):.0f} s of the call's {total:.0f} s; log: {out / 'gpu_check.log'}"
    )
    text = table(check, header)
    (out / "gpu_check.md").write_text(text + "\n")
    say("\n" + text)


if __name__ == "__main__":
    main()
