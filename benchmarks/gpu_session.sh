#!/usr/bin/env bash
# The planned GPU session (benchmarks/gpu_session.py, docs/gpu.md), its output also logged to OUT_DIR/session.log:
#   benchmarks/gpu_session.sh OUT_DIR [--dry-run | --only STEPS | --skip STEPS ...]
#   benchmarks/gpu_session.sh --plan
set -o pipefail
if [ "${1:-}" = "--plan" ]; then exec "${PYTHON:-python3}" "$(dirname "$0")/gpu_session.py" --plan; fi
OUT="${1:?usage: $0 OUT_DIR [options of benchmarks/gpu_session.py] | --plan}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
"${PYTHON:-python3}" "$(dirname "$0")/gpu_session.py" "$@" 2>&1 | tee "$OUT/session.log"
