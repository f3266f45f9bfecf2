#!/usr/bin/env bash
# Issue 14's job benchmark on one GPU: two vLLM replicas sharing it, each with a KV cache that holds
# only a few packs, longctx's job runner against a plain client sending the pairs in a shuffled order.
# Run after install.sh (run.sh does it); stops the replicas it started.
# Usage: benchmarks/gpu/jobs.sh PARTS OUT [PACKS=10] [PACK_TOKENS=40000] [KV_BLOCKS=8192] [LABEL=h200]
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
PARTS=$(cd "${1:?PARTS}" && pwd); OUT=${2:?OUT}; PACKS=${3:-10}; TOKENS=${4:-40000}
BLOCKS=${5:-8192}; LABEL=${6:-h200}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=$REPO:/tmp/site PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
PIDS=""
trap 'for p in $PIDS; do kill -TERM -- "-$p" 2>/dev/null; done; cp /tmp/vllm-877[12].log "$OUT"/ 2>/dev/null || true' EXIT
# One after the other: the second measures the GPU memory the first left free.
for port in 8771 8772; do
    PIDS="$PIDS $(VLLM_EXTRA_ARGS="--num-gpu-blocks-override $BLOCKS" "$HERE"/serve.sh "$PARTS" $port 0.42 65536 | tail -1)"
done
python3 "$REPO"/benchmarks/jobs.py --urls http://127.0.0.1:8771/v1,http://127.0.0.1:8772/v1 \
    --work /tmp/longctx-jobs --packs "$PACKS" --pack-tokens "$TOKENS" --repetitions 2 \
    --json "$OUT/jobs-$LABEL.json" --where "one $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), vLLM $(python3 -c 'import vllm; print(vllm.__version__)') (two replicas on it, 8B-shaped Llama with random weights, fp8 KV, \`--num-gpu-blocks-override $BLOCKS\`)"
