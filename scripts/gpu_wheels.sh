#!/usr/bin/env bash
# Wheels for a GPU machine that has no network (benchmarks/gpu_check.sh installs them there from .whl/).
#
#   bash scripts/gpu_wheels.sh            # download into .whl/ (ignored by git), print sizes against the 64 MiB limit
#   bash scripts/gpu_wheels.sh --verify   # ... then install the pure-Python ones into a scratch folder here and import them
#   EXTRA="pyarrow==26.0.1" bash scripts/gpu_wheels.sh   # more wheels, e.g. when the machine's pyarrow is older than datasets needs
#
# The target is the lent H200 image: CPython 3.12 with torch 2.11 (CUDA 13), lightning 2.6.6, transformers 5.17,
# peft, accelerate, tensorboard, torchmetrics, pyarrow, pandas, rich, tokenizers, safetensors, pytest and
# pytest-timeout. What is listed below is what pyproject.toml's dependencies (and the `bench` extra) need
# beyond that, found by walking their requirements recursively; each version is the one our tests run with
# here. The `dev` extra's W&B / MLflow are left out: only tests/lightning_rl/test_logger_configs.py uses them,
# and the GPU check does not run it. Every wheel is `--no-deps`: a missing requirement must be listed here.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PYTHON=${PYTHON:-python3}
DEST=.whl
WHEELS=(
    jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0  # jsonargparse[signatures]
    omegaconf==2.4.0 antlr4-python3-runtime==4.13.2                        # jsonargparse[omegaconf]; latex2sympy2_extended's parser too
    datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19                      # datasets (needs pyarrow >= 24, fsspec <= 2026.9.0)
    math-verify==0.9.0 latex2sympy2_extended==1.11.0                       # math-verify
    trl==1.16.0                                                            # benchmarks/compare_trl.py (the `bench` extra)
)
# shellcheck disable=SC2206
WHEELS+=(${EXTRA:-})

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$DEST/" "$exclude" 2>/dev/null || echo "/$DEST/" >>"$exclude"
rm -rf "$DEST"
mkdir -p "$DEST"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${WHEELS[@]}"

wheels=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | awk '/\ttotal$/ {s += $1} END {print s}')
limit=$((64 * 1024 * 1024))
echo "== $DEST/: $(ls "$DEST" | wc -l) wheels"
du -b "$DEST"/*.whl | awk '{printf "  %9.1f KiB  %s\n", $1 / 1024, $2}'
printf '== wheels %.1f MiB + working tree %.1f MiB = %.1f MiB of the 64 MiB a device call carries\n' \
    "$(echo "$wheels / 1048576" | bc -l)" "$(echo "$tree / 1048576" | bc -l)" "$(echo "($wheels + $tree) / 1048576" | bc -l)"
if [ $((wheels + tree)) -ge $limit ]; then
    echo "too large for one device call: drop EXTRA wheels or untracked files" >&2
    exit 1
fi

if [ "${1:-}" = "--verify" ]; then
    # the pure-Python wheels only (py3-none-any): they install under this Python too; multiprocess is built per
    # CPython version, so the one here is used for it
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$scratch" "$DEST"/*-py3-none-any.whl
    PYTHONPATH="$scratch" "$PYTHON" - "$scratch" <<'EOF'
import importlib, sys
scratch = sys.argv[1]
names = ["jsonargparse", "docstring_parser", "typeshed_client", "omegaconf", "antlr4", "datasets", "dill", "math_verify",
         "latex2sympy2_extended", "trl", "trl.trainer.grpo_trainer"]
for name in names:
    module = importlib.import_module(name)
    assert module.__file__.startswith(scratch), f"{name} imported from {module.__file__}, not the wheel"
from jsonargparse import ArgumentParser
from math_verify import parse, verify
assert verify(parse("$\\frac{1}{2}$"), parse("0.5"))
print(f"verified: {len(names)} modules import from the wheels under Python {sys.version.split()[0]}")
EOF
fi
