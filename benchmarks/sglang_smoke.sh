#!/usr/bin/env bash
# GPU smoke test of SGLangRollout: start a real SGLang server with a small model, run a few GRPO iterations
# against it, and check that the trainer and the sampler agree on the log-probs after each weight sync.
#
# Needs: a CUDA GPU; this repository installed (`pip install -e .`); sglang in some environment. SGLang pins
# its own torch, so it usually lives in a separate virtualenv: point SGLANG_PYTHON at that interpreter.
#
#   SGLANG_PYTHON=/opt/sglang-env/bin/python MODEL=Qwen/Qwen2.5-0.5B-Instruct bash benchmarks/sglang_smoke.sh
#   WEIGHT_SYNC=tensor bash benchmarks/sglang_smoke.sh   # CUDA IPC instead of a checkpoint on disk (same GPU)
#   WEIGHT_SYNC=distributed SERVER_GPU=1 bash benchmarks/sglang_smoke.sh   # an NCCL group: the server on a GPU of its own
#   MODE=launch bash benchmarks/sglang_smoke.sh          # let SGLangRollout start and stop the server itself
#
# Settings (environment): MODEL (hub id or local save_pretrained dir; default Qwen/Qwen2.5-0.5B-Instruct),
# SGLANG_PYTHON (default: python), PORT (30000), STEPS (3), MAX_DIFF (0.05: bf16 server vs fp32 trainer),
# ACCELERATOR (gpu), MEM_FRACTION (0.4: leaves room for training on the same GPU), SERVER_ARGS (extra flags).
# Runs from the repository root; writes under ${RUN_DIR:-runs/sglang_smoke}. Exit status 0 = passed.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
SGLANG_PYTHON=${SGLANG_PYTHON:-python}
PORT=${PORT:-30000}
STEPS=${STEPS:-3}
MAX_DIFF=${MAX_DIFF:-0.05}
ACCELERATOR=${ACCELERATOR:-gpu}
MEM_FRACTION=${MEM_FRACTION:-0.4}
WEIGHT_SYNC=${WEIGHT_SYNC:-disk}
MODE=${MODE:-connect}
RUN_DIR=${RUN_DIR:-runs/sglang_smoke}
TRAIN_PYTHON=${TRAIN_PYTHON:-python}
mkdir -p "$RUN_DIR"

server_pid=""
cleanup() { if [[ -n "$server_pid" ]]; then kill -TERM -- "-$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi; }
trap cleanup EXIT

if [[ "$MODE" == connect ]]; then
  echo "starting SGLang: $SGLANG_PYTHON -m sglang.launch_server --model-path $MODEL --port $PORT"
  # setsid: the server and its scheduler/detokenizer processes form one group, stopped together on exit
  # SERVER_GPU: NCCL (weight_sync: distributed) refuses two ranks on one GPU, so the server gets its own
  env ${SERVER_GPU:+CUDA_VISIBLE_DEVICES=$SERVER_GPU} setsid "$SGLANG_PYTHON" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 --port "$PORT" \
    --mem-fraction-static "$MEM_FRACTION" --skip-tokenizer-init ${SERVER_ARGS:-} >"$RUN_DIR/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 600); do  # /health_generate answers once the server can generate one token
    if curl -sf "http://127.0.0.1:$PORT/health_generate" >/dev/null; then break; fi
    if ! kill -0 "$server_pid" 2>/dev/null; then echo "SGLang exited; see $RUN_DIR/server.log"; tail -20 "$RUN_DIR/server.log"; exit 1; fi
    sleep 1
  done
  curl -sf "http://127.0.0.1:$PORT/health_generate" >/dev/null || { echo "SGLang not healthy after 600 s"; exit 1; }
  ROLLOUT_ARGS=(--model.rollout.init_args.servers.urls "[http://127.0.0.1:$PORT]")
else
  ROLLOUT_ARGS=(--model.rollout.init_args.servers.urls "[]" --model.rollout.init_args.servers.launch_python "$SGLANG_PYTHON"
    --model.rollout.init_args.servers.launch "{model_path: $MODEL, port: $PORT, mem_fraction_static: $MEM_FRACTION, skip_tokenizer_init: true}")
fi

PRECISION=$([[ "$ACCELERATOR" == gpu ]] && echo bf16-mixed || echo 32-true)
"$TRAIN_PYTHON" - "$MODEL" "$STEPS" "$MAX_DIFF" "$ACCELERATOR" "$PRECISION" "$WEIGHT_SYNC" "$RUN_DIR" "${ROLLOUT_ARGS[@]}" <<'EOF'
import sys

from lightning_rl.cli import main

model, steps, max_diff, accelerator, precision, weight_sync, run_dir, *rollout_args = sys.argv[1:]
cli = main(
    [
        "fit",
        "--config", "configs/grpo.yaml",
        "--config", "configs/rollout/sglang.yaml",
        *rollout_args,
        "--model.rollout.init_args.weights.weight_sync", weight_sync,
        "--model.rollout.init_args.max_new_tokens", "32",
        "--model.policy.path", model,
        # a reward that varies within every group, so every iteration updates the policy and syncs the weights
        "--model.reward", "components.reward.FunctionReward",
        "--model.reward.init_args.fn", "tests.components.test_sglang_rollout.completion_length",
        "--model.optimizer.lr", "1e-6",
        "--data.batch_size", "4",
        "--trainer.max_steps", steps,
        "--trainer.accelerator", accelerator,
        "--trainer.devices", "1",
        "--trainer.precision", precision,
        "--trainer.default_root_dir", run_dir,
        "--trainer.logger.init_args.save_dir", run_dir,
        "--trainer.callbacks.init_args.dirpath", f"{run_dir}/checkpoints",
    ]
)  # fmt: skip
metrics = {k: float(v) for k, v in cli.trainer.logged_metrics.items()}
diff_mean, diff_max = metrics["rollout/logprob_diff_mean"], metrics["rollout/logprob_diff_max"]
print(f"iterations {cli.trainer.global_step}, weight version {cli.model.rollout.weight_version}")
print(f"rollout/logprob_diff_mean {diff_mean:.2e}  rollout/logprob_diff_max {diff_max:.2e}  time/rollout_s {metrics.get('time/rollout_s', 0):.2f}s  time/sync_s {metrics.get('time/sync_s', 0):.2f}s")
assert cli.trainer.global_step == int(steps), "not every iteration ran"
assert cli.model.rollout.weight_version == int(steps) + 1, "a weight sync was skipped (degenerate batch?)"
assert diff_mean < float(max_diff), f"trainer and sampler disagree: mean |log-prob diff| {diff_mean} >= {max_diff}"
print("sglang smoke: passed")
EOF
