#!/usr/bin/env bash
# A lent GPU's few minutes in one command (docs/gpu.md): a transfer check, the CUDA checks, a cost profile of the
# mission's shapes, and static and serving runs of the same shapes held against that profile's replay.
#   benchmarks/gpu_session.sh OUT_DIR            # on the GPU machine, from the repository root, wheels installed
# Steps, each under its own time limit and all within GPU_SESSION_TOTAL_S (default 520), each logged to
# OUT_DIR/session.log whatever the others did:
#   xfer-profile  python -m runner.profile of configs/transfer-synthetic.yaml, compiled, rows 1 -> xfer-profile.json
#   xfer-fp32     launch.py of that config, compiled fp32: the rounds a CPU run of it measured?   -> xfer.tgz
#   profile  python -m runner.profile: steps and prefills at the static run's rows, two caches    -> profile.json
#   static   launch.py, batch 1 and 4, speculative gamma 4 at a set acceptance                    -> static.tgz
#   predict  python -m eval.predict on it with the standalone profile                             -> predict-static.json
#   xfer-bf16, xfer-4bit, xfer-sample   the transfer's config eager in bf16, 4-bit, sampling      -> xfer.tgz
#   load     launch.py under load, concurrency 1 and 4 (eager only: compiled caches take no joins) -> load.tgz
#   profile-long  the same profile eager at rows 1 and 4 and caches to 32k tokens (#55: the KV axis at
#            long contexts, for python -m eval.recommend --context)                                 -> profile-long.json
#   check    benchmarks/gpu_check.py, its budget what is left (rows in order)                     -> gpu-check.json
# The transfer's CPU side runs here beforehand (configs/transfer-synthetic.yaml says how); eval.predict of that
# CPU folder with xfer-profile.json predicts xfer-fp32's speedup. Environment (for a dry run on a CPU):
# GPU_SESSION_DEVICE, _TARGET, _DRAFT, _DTYPE, _TOTAL_S, _CHECKS (the check's rows), _SCALE (a divisor of the
# requests and tokens), _LONG_KV (profile-long's caches, default 2048,8192,32768), _SKIP (steps to skip,
# comma-separated), _COMPILE (1: the profile and the static run compiled, CUDA graphs; the mission's 36-layer shape
# then compiles per width for minutes: cut it with ?layers=).
set -u
OUT="${1:?usage: $0 OUT_DIR}"
mkdir -p "$OUT"
DEVICE="${GPU_SESSION_DEVICE:-cuda:0}"
TARGET="${GPU_SESSION_TARGET:-synthetic:qwen3-4b}"
DRAFT="${GPU_SESSION_DRAFT:-synthetic:qwen3-0.6b}"
DTYPE="${GPU_SESSION_DTYPE:-bfloat16}"
DEADLINE=$(($(date +%s) + ${GPU_SESSION_TOTAL_S:-520}))
SCALE="${GPU_SESSION_SCALE:-1}"
SKIP=",${GPU_SESSION_SKIP:-},"
COMPILE="${GPU_SESSION_COMPILE:-0}"
LOG="$OUT/session.log"
WORK="$(mktemp -d)"
FAILED=""
trap 'rm -rf "$WORK"' EXIT
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-python3}"

step() {  # step NAME LIMIT_S COMMAND...: its output appended to the log, its exit code and seconds after it
    local name=$1 limit=$2 start rc left
    shift 2
    if [[ "$SKIP" == *",$name,"* ]]; then echo "== $name: skipped" >>"$LOG"; return; fi
    left=$((DEADLINE - $(date +%s)))
    if ((left < 20)); then echo "== $name: skipped, ${left} s left" >>"$LOG"; return; fi
    ((limit > left)) && limit=$left
    echo "== $name (limit ${limit}s): $*" >>"$LOG"
    start=$(date +%s)
    timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
    rc=$?
    ((rc == 0)) || FAILED="$FAILED $name"
    echo "== $name: rc $rc, $(($(date +%s) - start)) s" >>"$LOG"
    tail -n 3 "$LOG"
}

if [ "$COMPILE" = 1 ]; then ENGINE=true; ROWS=1,4; else ENGINE=false; ROWS=1,2,3,4; fi
MODELS=(--set "device=$DEVICE" --set "target.model=$TARGET" --set "target.dtype=$DTYPE" --set "draft.model=$DRAFT"
        --set "draft.dtype=$DTYPE" --set "engine.compile=$ENGINE" --set warmup=1 --set repeats=1
        --set "speculative.gamma=[4]")
TOKENS=$((64 / SCALE))
XFER=(--config configs/transfer-synthetic.yaml --set "device=$DEVICE" --set "generation.max_new_tokens=$TOKENS"
      --set "dataset.num_samples=$((8 / SCALE < 2 ? 2 : 8 / SCALE))")
{ date -u; nvidia-smi -L 2>&1; "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda",
torch.version.cuda, "transformers", transformers.__version__, "gpu", torch.cuda.is_available() and
torch.cuda.get_device_name(0))'; } >>"$LOG" 2>&1

# the transfer: the CPU run's models on this device, compiled in fp32 (the rounds must be the CPU's); its eager
# variants (how far bf16, 4-bit and sampling move the rounds) after the static run
step xfer-profile 120 "$PY" -m runner.profile "${XFER[@]}" --set engine.compile=true --rows 1 --kv 64,768 \
    --prompt-tokens 64 --reps 10 --out "$OUT/xfer-profile.json"
step xfer-fp32 120 "$PY" launch.py "${XFER[@]}" --set engine.compile=true --output-dir "$WORK/xfer/fp32"
[ -d "$WORK/xfer" ] && tar czf "$OUT/xfer.tgz" -C "$WORK" xfer

# the profile covers the runs below: the static run's rows (eager: 1-4, which a batch's tail passes through; compiled:
# its capacities), caches from the shortest GSM8K prompt (bytes: the synthetic tokenizer) to the longest prompt and
# its generation
step profile 120 "$PY" -m runner.profile --config configs/gpu-synthetic.yaml "${MODELS[@]}" --rows "$ROWS" \
    --kv 64,768 --prompt-tokens 64 --reps 5 --out "$OUT/profile.json"
step static 150 "$PY" launch.py --config configs/gpu-synthetic.yaml "${MODELS[@]}" --set name=gpu-static \
    --set dataset.num_samples=$((16 / SCALE < 2 ? 2 : 16 / SCALE)) --set "batch_size=[1,4]" \
    --set "speculative.synthetic_acceptance=[0.8]" --set "generation.max_new_tokens=$TOKENS" \
    --output-dir "$WORK/static"
step predict-static 45 "$PY" -m eval.predict "$WORK/static" --costs "$OUT/profile.json" --out "$OUT/predict-static.json"
[ -d "$WORK/static" ] && tar czf "$OUT/static.tgz" -C "$WORK" static
# the transfer's eager variants: bf16, 4-bit (the runner's loader, from the models saved to a folder), sampling
step xfer-bf16 100 "$PY" launch.py "${XFER[@]}" --set target.dtype=bfloat16 --set draft.dtype=bfloat16 \
    --output-dir "$WORK/xfer/bf16"
step xfer-save 40 "$PY" benchmarks/save_synthetic.py configs/transfer-synthetic.yaml "$WORK/models"
step xfer-4bit 110 "$PY" launch.py "${XFER[@]}" --set "target.model=$WORK/models/target" --set target.quantization=4bit \
    --set target.dtype=bfloat16 --set "draft.model=$WORK/models/draft" --set draft.quantization=4bit \
    --set draft.dtype=bfloat16 --output-dir "$WORK/xfer/4bit"
step xfer-sample 60 "$PY" launch.py "${XFER[@]}" --set generation.do_sample=true --output-dir "$WORK/xfer/sample"
[ -d "$WORK/xfer" ] && tar czf "$OUT/xfer.tgz" -C "$WORK" xfer
[ "$COMPILE" = 1 ] && SKIP="$SKIP,load,predict-load,"
step load 150 "$PY" launch.py --config configs/gpu-synthetic.yaml "${MODELS[@]}" --set name=gpu-load \
    --set dataset.num_samples=$((16 / SCALE)) --set "batch_size=[1]" \
    --set "speculative.synthetic_acceptance=[0.8]" --set "generation.max_new_tokens=$TOKENS" \
    --set "load={concurrency: [1, 4], requests: $((16 / SCALE))}" --output-dir "$WORK/load"
step predict-load 45 "$PY" -m eval.predict "$WORK/load" --costs "$OUT/profile.json" --out "$OUT/predict-load.json"
[ -d "$WORK/load" ] && tar czf "$OUT/load.tgz" -C "$WORK" load
# long caches: synthetic weights make a 32k-token cache one prefill; eager (a compiled engine sizes its static caches
# to the longest), at the rows a served batch passes through
step profile-long 90 "$PY" -m runner.profile --config configs/gpu-synthetic.yaml "${MODELS[@]}" \
    --set engine.compile=false --rows 1,4 --kv "${GPU_SESSION_LONG_KV:-2048,8192,32768}" --prompt-tokens 64 --reps 3 \
    --out "$OUT/profile-long.json"

left=$((DEADLINE - $(date +%s) - 40))  # the check's rows start within its budget; the last may run ~40 s more
if ((left > 0)); then
    step check $((left + 40)) "$PY" benchmarks/gpu_check.py --device "$DEVICE" --json "$OUT/gpu-check.json" \
        --budget-s "$left" ${GPU_SESSION_CHECKS:+--only "$GPU_SESSION_CHECKS"}
else
    echo "== check: skipped, no time left" >>"$LOG"
fi
date -u >>"$LOG"
if [ -n "$FAILED" ]; then echo "failed:$FAILED (session.log says why)" | tee -a "$LOG"; exit 1; fi
