#!/usr/bin/env bash
# The GPU check on a fresh GPU machine without network: install the carried wheels, refuse to start without CUDA,
# then benchmarks/gpu_check.py's parts in about 9 minutes (the missing figures first: TRL, MoE routing replay, long responses, CUDA tests, bf16 jobs), ending in one table (also $OUT/gpu_check.md).
#
#   bash scripts/gpu_wheels.sh                    # first, on a machine with network: the wheels into .whl/
#   bash benchmarks/gpu_check.sh                  # on the GPU machine (the repository root, .whl/ beside it)
#   bash benchmarks/gpu_check.sh --parts c,d      # a rerun of some parts
#   bash benchmarks/gpu_check.sh --cpu-dry-run    # every part at toy sizes on this CPU (nothing installed)
#
# PYTHON picks the interpreter (default python3: on the lent H200 the one with torch); OUT the folder for the table
# and the log (default /tmp/gpu_check). The package itself is used from the working tree (PYTHONPATH), not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
dry=0
for arg in "$@"; do [ "$arg" = "--cpu-dry-run" ] && dry=1; done

if [ $dry = 0 ]; then
    if ! seen=$("$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA build", torch.version.cuda); assert torch.cuda.is_available()' 2>&1); then
        echo "gpu_check: no CUDA device here ($(echo "$seen" | head -1))." >&2
        echo "It is for the GPU machine; on a CPU run:  bash benchmarks/gpu_check.sh --cpu-dry-run" >&2
        exit 2
    fi
    if ls .whl/*.whl >/dev/null 2>&1; then
        site=/tmp/gpu_check_site
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
        export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
        echo "installed $(ls .whl/*.whl | wc -l) carried wheels into $site"
    else
        echo "gpu_check: no .whl/ here: packages missing on this machine fail the parts that import them (run scripts/gpu_wheels.sh and carry .whl)" >&2
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    fi
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PYTHON" benchmarks/gpu_check.py "$@"
