#!/usr/bin/env bash
# The embedded default job: GRPO on the built-in arithmetic task with the shipped tiny model, on CPU.
# The fit validates on held-out prompts before its first iteration and after its last, and ends with its summary:
# held-out greedy accuracy before -> after, iterations, wall time, where the checkpoint is.
#   CONFIG=configs/dr_grpo.yaml bash scripts/default_job.sh   # any other preset
set -euo pipefail
CONFIG=${CONFIG:-configs/grpo.yaml}
lightning-rl fit --config "$CONFIG"
