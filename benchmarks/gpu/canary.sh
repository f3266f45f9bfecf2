#!/usr/bin/env bash
# The cache canary on one GPU: vLLM 0.24 without and then with native CPU offloading, each with a
# small GPU KV cache (KV_BLOCKS blocks of 16 tokens) so the canary's fill pushes the probe's blocks out
# of it: to the CPU tier when offloading is on (the host-tier path forced), gone when it is off.
# Run after install.sh (run.sh does it); stops each server it started (by its PID), one at a time.
# Usage: benchmarks/gpu/canary.sh PARTS OUT [KV_BLOCKS=4096] [OFFLOAD_GIB=16] [REPEATS=3] [LABEL=h200]
#   SETTINGS="gpu-only native-offload" (the default) picks which of the two servers run, in that order.
# Then: python3 benchmarks/canary.py --section OUT/canary-*-LABEL.json --write
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
PARTS=$(cd "${1:?PARTS}" && pwd); OUT=${2:?OUT}; BLOCKS=${3:-4096}; GIB=${4:-16}; REPEATS=${5:-3}
LABEL=${6:-h200}; PORT=${PORT:-8781}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
"$HERE"/install.sh "$PARTS"
export PYTHONPATH=$REPO:/tmp/site PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
PID=""
trap '[ -n "$PID" ] && kill -TERM -- "-$PID" 2>/dev/null; cp /tmp/vllm-$PORT.log "$OUT"/ 2>/dev/null || true' EXIT
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
VERSION=$(python3 -c 'import vllm; print(vllm.__version__)')
# 1.5x the GPU cache: every probe block is pushed out, whatever the eviction order.
FILL=$((BLOCKS * 16 * 3 / 2))
for setting in ${SETTINGS:-gpu-only native-offload}; do
    EXTRA="--num-gpu-blocks-override $BLOCKS"
    [ "$setting" = native-offload ] && EXTRA="$EXTRA --kv-offloading-backend native --kv-offloading-size $GIB"
    PID=$(VLLM_EXTRA_ARGS="$EXTRA" "$HERE"/serve.sh "$PARTS" "$PORT" 0.85 65536 | tail -1)
    python3 "$REPO"/benchmarks/canary.py --base-url "http://127.0.0.1:$PORT/v1" --label "$setting" \
        --flags "$EXTRA" --repeats "$REPEATS" --host-tier --fill-tokens "$FILL" \
        --where "one $GPU, vLLM $VERSION (8B-shaped Llama with random weights, fp8 KV)" \
        --json "$OUT/canary-$setting-$LABEL.json"
    cp /tmp/vllm-$PORT.log "$OUT/vllm-canary-$setting.log" 2>/dev/null || true
    kill -TERM -- "-$PID" 2>/dev/null || true; PID=""
    # The next server takes the same port and the whole GPU: wait until this one is gone.
    for _ in $(seq 1 60); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null || break; sleep 2; done
    sleep 5
done
python3 "$REPO"/benchmarks/canary.py --section "$OUT"/canary-*-"$LABEL".json
