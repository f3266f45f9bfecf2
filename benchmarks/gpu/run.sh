#!/usr/bin/env bash
# The GPU benchmark in one command, on a machine with one NVIDIA GPU and no network.
# PARTS holds what prepare-wheels.sh made (p00 p01 ..., deps/, lx/, rt/, tok/); OUT gets
# results-LABEL.json and the server's log. Then, anywhere: benchmarks/gpu/report.py OUT/results-*.json
# Usage: benchmarks/gpu/run.sh PARTS OUT [CONTEXTS=32000,105000,max] [MAX_MODEL_LEN=131072] [LABEL=h200]
# ENGINE=sglang: PARTS from prepare-sglang.sh, installed by install-sglang.sh, served by serve-sglang.sh,
# every dispatch strategy run (BENCH_ARGS: more bench_gpu.py options, e.g. --deadline 400 --repeats 1;
# ONLY: bench_gpu.py's --only, row names with spaces, comma-separated).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
PARTS=$(cd "${1:?PARTS}" && pwd); OUT=${2:?OUT}; CONTEXTS=${3:-32000,105000,max}
LEN=${4:-131072}; LABEL=${5:-h200}; PORT=${PORT:-8765}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
ENGINE=${ENGINE:-vllm}
if [ "$ENGINE" = sglang ]; then
    "$HERE"/install-sglang.sh "$PARTS"; SITE=/tmp/site-sgl; SERVE=serve-sglang.sh
    DISPATCHES=lead,together,admitted
    FLAGS="--load-format dummy --context-length $LEN --kv-cache-dtype fp8_e4m3 --chunked-prefill-size 8192 --attention-backend triton --sampling-backend pytorch --disable-cuda-graph --enable-cache-report --enable-metrics --mem-fraction-static 0.85 ${SGLANG_EXTRA_ARGS:-}"
else
    "$HERE"/install.sh "$PARTS"; SITE=/tmp/site; SERVE=serve.sh; DISPATCHES=lead
    FLAGS="--load-format dummy --max-model-len $LEN --kv-cache-dtype fp8 --enable-prefix-caching --enable-chunked-prefill --max-num-batched-tokens 8192 --enable-prompt-tokens-details --gpu-memory-utilization 0.85 --enforce-eager"
fi
# longctx from this checkout (ahead of the lx/ wheel), so what is measured is the code beside this script.
export PYTHONPATH=$REPO:$SITE PATH=$SITE/bin:$PATH HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
PID=""
if ! curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null; then
    PID=$("$HERE"/$SERVE "$PARTS" "$PORT" 0.85 "$LEN" | tail -1)
fi
# Stop only the server this script started, by its PID (its process group: the serve scripts use setsid).
trap '[ -n "$PID" ] && kill -TERM -- "-$PID" 2>/dev/null; cp /tmp/$ENGINE-$PORT.log "$OUT"/ 2>/dev/null || true' EXIT
python3 "$HERE"/bench_gpu.py --base-url "http://127.0.0.1:$PORT/v1" --contexts "$CONTEXTS" --out "$OUT" \
    --flags "$FLAGS" --label "$LABEL" --dispatches "$DISPATCHES" ${ONLY:+--only "$ONLY"} ${BENCH_ARGS:-}
