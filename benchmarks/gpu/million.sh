#!/usr/bin/env bash
# On the GPU machine: a million-token pack on one GPU, its cold prefill and cached follow-ups
# (million_probe.py), and the engine's own per-request pieces at 1M ids (million_split.py).
# Usage: million.sh STEP ENGINE [OUT]
#   STEP:   stash (copy the carried parts folder, $PARTS_IN, into /tmp/parts-ENGINE: a device call
#           carries at most 64 MiB, so the parts come over several calls) |
#           up (install, start the server unless one answers on PORT) |
#           probe (million_probe.py at TOKENS, the server's KV lines and GPU memory beside it) |
#           split (million_split.py in the engine's interpreter) |
#           stop (stop the server this script started, keep its log in OUT)
#   ENGINE: vllm (parts from prepare-wheels.sh) or sglang (parts from prepare-sglang.sh)
# SHAPE (default 1b: a Llama-3.2-1B shape, 16 KiB of fp8 KV a token) and LEN (default 1250000) reach
# the serve scripts; VLLM_EXTRA_ARGS / SGLANG_EXTRA_ARGS too (e.g. --prefix-caching-hash-algo xxhash);
# LABEL names those options in the output; TOKENS (default 1000000), FOLLOW_UPS (5), MODES
# (ids,spaced,session,bare) reach the probe. The server runs on (setsid) between the calls of one
# warm machine; its PID is kept in /tmp/million-ENGINE.pid.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
STEP=${1:?STEP}; ENGINE=${2:?ENGINE}; OUT=${3:-${OUT:-/tmp/million-out}}; mkdir -p "$OUT"
PARTS=/tmp/parts-$ENGINE; PORT=${PORT:-8765}; LABEL=${LABEL:-default}
export SHAPE=${SHAPE:-1b} LEN=${LEN:-1250000}
if [ "$ENGINE" = sglang ]; then SITE=/tmp/site-sgl; else SITE=/tmp/site; fi
export PYTHONPATH=$REPO:$SITE PATH=$SITE/bin:$PATH HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 \
  PYTHONUNBUFFERED=1 VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
URL=http://127.0.0.1:$PORT/v1
case "$STEP" in
stash)
    mkdir -p "$PARTS"; cp -r "${PARTS_IN:?PARTS_IN}"/. "$PARTS"/; du -sh "$PARTS"/* ;;
up)
    if [ "$ENGINE" = sglang ]; then "$HERE"/install-sglang.sh "$PARTS"; else "$HERE"/install.sh "$PARTS"; fi
    if ! curl -sf "$URL/models" >/dev/null; then
        started=$(date +%s)
        if [ "$ENGINE" = sglang ]; then
            "$HERE"/serve-sglang.sh "$PARTS" "$PORT" 0.85 "$LEN" | tail -1 > /tmp/million-$ENGINE.pid
        else
            "$HERE"/serve.sh "$PARTS" "$PORT" 0.85 "$LEN" | tail -1 > /tmp/million-$ENGINE.pid
        fi
        echo "server up in $(( $(date +%s) - started )) s"
    fi ;;
probe)
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/gpu-$ENGINE-$LABEL.csv" || true
    status=0
    python3 "$HERE"/million_probe.py --base-url "$URL" --tokens "${TOKENS:-1000000}" \
        --follow-ups "${FOLLOW_UPS:-5}" --modes "${MODES:-ids,spaced,session,bare}" --server-label "$LABEL" \
        ${PROBE_ARGS:-} --out "$OUT/million-$ENGINE-$LABEL.json" || status=$?
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$OUT/gpu-$ENGINE-$LABEL.csv" || true
    grep -hE "GPU KV cache size|Available KV cache memory|Maximum concurrency|max_total_num_tokens|KV Cache is allocated|Memory pool end|model weights|Model loading took" \
        /tmp/"$ENGINE"-"$PORT".log > "$OUT/kv-lines-$ENGINE-$LABEL.txt" 2>/dev/null || true
    # longctx plan for the served shape: from the GPU's memory and the weights the server loaded, and
    # from the KV memory the server logged (vLLM); what the server allocated is in kv-lines.
    M=/tmp/llama$SHAPE-shape
    GPU_GIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{printf "%.2f", $1/1024}')
    WEIGHTS=$(grep -oE "(Model loading took|weight, avail mem=.*mem usage=) ?[0-9.]+ GiB" /tmp/"$ENGINE"-"$PORT".log | grep -oE "[0-9.]+ GiB" | head -1 | cut -d' ' -f1)
    KV_GIB=$(grep -oE "Available KV cache memory: [0-9.]+ GiB" /tmp/"$ENGINE"-"$PORT".log | grep -oE "[0-9.]+" | tail -1)
    python3 -m longctx plan --config "$M" --gpu-memory "$GPU_GIB" --weights "${WEIGHTS:-2}" \
        --gpu-memory-utilization 0.85 --context "${TOKENS:-1000000}" --json > "$OUT/plan-$ENGINE-$LABEL.json" || true
    [ -n "$KV_GIB" ] && python3 -m longctx plan --config "$M" --kv-memory "$KV_GIB" --context "${TOKENS:-1000000}" \
        --json > "$OUT/plan-kv-$ENGINE-$LABEL.json" || true
    exit $status ;;
split)
    python3 "$HERE"/million_split.py --engine "$ENGINE" --tokens "${TOKENS:-1000000}" --out "$OUT/split-$ENGINE.json" ;;
stop)
    [ -f /tmp/million-$ENGINE.pid ] && kill -TERM -- "-$(cat /tmp/million-$ENGINE.pid)" 2>/dev/null || true
    rm -f /tmp/million-$ENGINE.pid; sleep 3; cp /tmp/"$ENGINE"-"$PORT".log "$OUT/server-$ENGINE-$LABEL.log" 2>/dev/null || true ;;
*) echo "unknown step $STEP" >&2; exit 2 ;;
esac
