#!/usr/bin/env bash
# The embedded default job: GRPO on the built-in arithmetic task with the shipped tiny model, on CPU.
# Reports held-out greedy accuracy before and after RL with the project's own `validate`.
#   CONFIG=configs/dr_grpo.yaml RUN=runs/dr_grpo bash scripts/default_job.sh   # any other preset
set -euo pipefail
CONFIG=${CONFIG:-configs/grpo.yaml}
RUN=${RUN:-runs/grpo}
# each fit writes its own $RUN/version_N; $RUN/latest/checkpoints links to the newest run's, so last.ckpt below is this run's

echo "== held-out greedy accuracy of the shipped policy (before RL)"
lightning-rl validate --config "$CONFIG" --trainer.logger=false

echo "== RL (tensorboard --logdir runs)"
lightning-rl fit --config "$CONFIG"

echo "== held-out greedy accuracy after RL"
lightning-rl validate --config "$CONFIG" --trainer.logger=false --ckpt_path "$RUN/latest/checkpoints/last.ckpt"
