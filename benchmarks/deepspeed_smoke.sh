#!/usr/bin/env bash
# GPU smoke test of the DeepSpeed fragments (configs/strategy/deepspeed.yaml = ZeRO-2, deepspeed_zero3.yaml):
# for each stage, GRPO for STEPS iterations on DEVICES GPUs with a checkpoint every 2 iterations and a
# Hugging Face export at the end of fit; then a run resumed from the middle checkpoint; then checks:
#   * every iteration ran, the losses are finite and the policy moved;
#   * `lightning-rl export` of the final DeepSpeed checkpoint folder == the export written at the end of fit;
#   * the resumed run ends with the straight run's parameters (max |diff| printed; bit-exact on a deterministic GPU).
# Needs: CUDA GPU(s); this repository installed (`pip install -e .`) and `pip install deepspeed`
# (a version with managed_gradient_accumulation: 0.19.8 has it). The policy is a tiny model built locally
# unless MODEL names one (hub id or save_pretrained folder).
#
#   bash benchmarks/deepspeed_smoke.sh                               # all visible GPUs, ZeRO-2 then ZeRO-3
#   DEVICES=2 STAGES=3 MODEL=Qwen/Qwen2.5-0.5B-Instruct bash benchmarks/deepspeed_smoke.sh
#   pytest -m gpu tests/lightning_rl/test_distributed_gpu.py         # DeepSpeed == plain training, to 1e-5
#
# Settings (environment): DEVICES (all GPUs), STAGES ("2 3"), STEPS (4), MODEL (tiny), PYTHON (python),
# MAX_RESUME_DIFF (1e-4), RUN_DIR (runs/deepspeed_smoke). Runs from the repository root. Exit status 0 = passed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
DEVICES=${DEVICES:-$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")}
STAGES=${STAGES:-"2 3"}
STEPS=${STEPS:-4}
MAX_RESUME_DIFF=${MAX_RESUME_DIFF:-1e-4}
RUN_DIR=${RUN_DIR:-runs/deepspeed_smoke}
if [[ "$DEVICES" -lt 1 ]]; then echo "no CUDA GPU visible: DeepSpeed in Lightning runs on CUDA only"; exit 1; fi
mkdir -p "$RUN_DIR"
if [[ -z "${MODEL:-}" ]]; then
  MODEL="$RUN_DIR/tiny"
  "$PYTHON" -c "from lightning_rl.recipes.tiny import save_tiny; save_tiny('$MODEL', hidden_size=64, layers=2, heads=2, seed=0)"
fi
echo "DeepSpeed smoke: $DEVICES GPU(s), stages $STAGES, $STEPS iterations, model $MODEL"

for STAGE in $STAGES; do
  FRAGMENT=configs/strategy/deepspeed.yaml
  [[ "$STAGE" == 3 ]] && FRAGMENT=configs/strategy/deepspeed_zero3.yaml
  OUT="$RUN_DIR/zero$STAGE"
  rm -rf "$OUT"
  common=(
    --config configs/grpo.yaml --config "$FRAGMENT"
    --model.policy.path "$MODEL"
    --model.reward components.reward.FunctionReward --model.reward.init_args.fn tests.lightning_rl.rewards.digit_count
    --model.rollout.init_args.temperature 3.0 --model.loop.micro_batch_size 8
    --data.batch_size 4 --data.val_size 16
    --trainer.devices "$DEVICES" --trainer.val_check_interval 2 --trainer.enable_progress_bar false
  )
  run() {  # run <name> <max_steps> [extra args]: one fit, logs and checkpoints under $OUT/<name>
    local name=$1 steps=$2
    shift 2
    lightning_args=(
      "${common[@]}" --trainer.max_steps "$steps"
      --trainer.default_root_dir "$OUT/$name" --trainer.logger.init_args.save_dir "$OUT/$name"
      --trainer.callbacks lightning.pytorch.callbacks.ModelCheckpoint
      --trainer.callbacks.dirpath "$OUT/$name/checkpoints" --trainer.callbacks.every_n_train_steps 2
      --trainer.callbacks.save_top_k -1 --trainer.callbacks.filename "{step}"
      --trainer.callbacks+=lightning_rl.callbacks.HFExport --trainer.callbacks.dirpath "$OUT/$name/hf_at_end"
      "$@"
    )
    if ! "$PYTHON" -m lightning_rl.cli fit "${lightning_args[@]}" >"$OUT/$name.log" 2>&1; then
      tail -40 "$OUT/$name.log"
      echo "ZeRO-$STAGE $name run failed; log: $OUT/$name.log"
      exit 1
    fi
  }
  echo "== ZeRO-$STAGE: straight run"
  run straight "$STEPS"
  echo "== ZeRO-$STAGE: resumed from step=2"
  run resumed "$STEPS" --ckpt_path "$OUT/straight/checkpoints/step=2.ckpt"

  "$PYTHON" - "$OUT" "$STEPS" "$MAX_RESUME_DIFF" "$MODEL" <<'EOF'
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForCausalLM

from lightning_rl.cli.export import export_checkpoint

out, steps, max_diff, model = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]


def scalars(run: str, tag: str) -> list[float]:
    (version,) = sorted((out / run).glob("**/events.out.tfevents.*"))[-1:]
    events = EventAccumulator(str(version.parent))
    events.Reload()
    return [e.value for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


losses = scalars("straight", "policy/loss")
print(f"policy/loss per iteration: {[round(x, 5) for x in losses]}")
assert len(scalars("straight", "reward/mean")) == steps, "not every iteration ran"
assert losses and all(math.isfinite(x) for x in losses), "missing or non-finite losses"

final = out / "straight" / "checkpoints" / f"step={steps}.ckpt"
written = export_checkpoint(final, out / "exported")  # DeepSpeed folder -> consolidated -> Hugging Face
exported = load_file(written["policy"] / "model.safetensors")
at_end = load_file(out / "straight" / "hf_at_end" / "policy" / "model.safetensors")
assert exported.keys() == at_end.keys()
diff = max((exported[k].float() - at_end[k].float()).abs().max().item() for k in exported)
print(f"export from checkpoint vs export at fit end: max |diff| {diff:.2e}")
assert diff == 0.0, "the checkpoint export and the end-of-fit export disagree"

base = AutoModelForCausalLM.from_pretrained(model).state_dict()
moved = max((exported[k].float() - base[k].float().cpu()).abs().max().item() for k in exported if k in base)
print(f"policy moved from its initial weights by up to {moved:.2e}")
assert moved > 0, "the policy did not change"

resumed = load_file(export_checkpoint(out / "resumed" / "checkpoints" / f"step={steps}.ckpt", out / "exported_resumed")["policy"] / "model.safetensors")
resume_diff = max((exported[k].float() - resumed[k].float()).abs().max().item() for k in exported)
print(f"resumed vs straight: max |parameter diff| {resume_diff:.2e} (limit {max_diff:.0e})")
assert resume_diff <= max_diff, "the resumed run did not continue as the straight run"
print(f"{out.name}: passed")
EOF
done
echo "deepspeed smoke: passed"
