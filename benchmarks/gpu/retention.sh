#!/usr/bin/env bash
# On the GPU machine: `longctx retention` against vLLM 0.24 (serve.sh's 8B-shaped Llama, fp8 KV) whose KV
# cache is capped at BLOCKS blocks of 16 tokens, beside the estimate from the KV size it reports.
# Usage: benchmarks/gpu/retention.sh PARTS OUT [PACK_TOKENS=16000] [PACKS=12] [BLOCKS=8192]
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
PARTS=$(cd "${1:?PARTS}" && pwd); OUT=${2:?OUT}; SIZE=${3:-16000}; PACKS=${4:-12}; BLOCKS=${5:-8192}
PORT=${PORT:-8765}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
"$HERE"/install.sh "$PARTS"
export PYTHONPATH=$REPO:/tmp/site PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
PID=$(VLLM_EXTRA_ARGS="--num-gpu-blocks-override $BLOCKS" "$HERE"/serve.sh "$PARTS" "$PORT" 0.85 65536 | tail -1)
trap 'kill -TERM -- "-$PID" 2>/dev/null; cp /tmp/vllm-$PORT.log "$OUT"/ 2>/dev/null || true' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT"/gpu.txt
python3 -m longctx retention --base-url "http://127.0.0.1:$PORT/v1" --pack-tokens "$SIZE" --packs "$PACKS" \
    --json > "$OUT"/retention-$SIZE.json
python3 -m longctx retention --base-url "http://127.0.0.1:$PORT/v1" --pack-tokens "$SIZE" --packs "$PACKS"
