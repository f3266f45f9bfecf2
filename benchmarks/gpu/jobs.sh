#!/usr/bin/env bash
# The job benchmark on one GPU: two replicas sharing it, each with a KV cache that holds
# only a few packs, longctx's job runner against a plain client sending the pairs in a shuffled order.
# Run after install.sh (run.sh does it); stops the replicas it started.
# Usage: benchmarks/gpu/jobs.sh PARTS OUT [PACKS=10] [PACK_TOKENS=40000] [KV_BLOCKS=8192] [LABEL=h200]
# ENGINE=sglang: two SGLang replicas (after install-sglang.sh) with the same KV size in tokens,
# --max-total-tokens KV_BLOCKS*16 (vLLM's block is 16 tokens, SGLang's page 1); HICACHE=RATIO adds
# --enable-hierarchical-cache --hicache-ratio RATIO (a host tier RATIO times the GPU's). Each
# replica's /metrics is read before and after (OUT/metrics-LABEL.json: the sglang:cached_tokens_total
# deltas by cache_source, from tiers.py). REPETITIONS (default 2) runs of each client. PORTS (default
# "8771 8772"): the replicas' ports; a replica already answering there is used as it is (not stopped).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
PARTS=$(cd "${1:?PARTS}" && pwd); OUT=${2:?OUT}; PACKS=${3:-10}; TOKENS=${4:-40000}
BLOCKS=${5:-8192}; LABEL=${6:-h200}; ENGINE=${ENGINE:-vllm}; REPETITIONS=${REPETITIONS:-2}
PORTS=${PORTS:-8771 8772}; set -- $PORTS; A=$1; B=$2
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
SITE=/tmp/site; [ "$ENGINE" = sglang ] && SITE=/tmp/site-sgl
export PYTHONPATH=$REPO:$SITE PATH=$SITE/bin:$PATH HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
PIDS=""
trap 'for p in $PIDS; do kill -TERM -- "-$p" 2>/dev/null; done; for p in $A $B; do cp /tmp/$ENGINE-$p.log "$OUT"/$ENGINE-$p-$LABEL.log 2>/dev/null; done; true' EXIT
# One after the other: the second measures the GPU memory the first left free.
for port in $A $B; do
    if curl -sf http://127.0.0.1:$port/v1/models >/dev/null; then
        continue
    elif [ "$ENGINE" = sglang ]; then
        EXTRA="--max-total-tokens $((BLOCKS * 16))"
        [ -n "${HICACHE:-}" ] && EXTRA="$EXTRA --enable-hierarchical-cache --hicache-ratio $HICACHE"
        PIDS="$PIDS $(SGLANG_EXTRA_ARGS="$EXTRA" "$HERE"/serve-sglang.sh "$PARTS" $port 0.5 65536 | tail -1)"
    else
        PIDS="$PIDS $(VLLM_EXTRA_ARGS="--num-gpu-blocks-override $BLOCKS" "$HERE"/serve.sh "$PARTS" $port 0.42 65536 | tail -1)"
    fi
done
if [ "$ENGINE" = sglang ]; then
    VERSION="SGLang $(python3 -c 'import sglang; print(sglang.__version__)')"
    FLAGS="\`--max-total-tokens $((BLOCKS * 16))${HICACHE:+ --enable-hierarchical-cache --hicache-ratio $HICACHE}\`, serve-sglang.sh's flags"
    for port in $A $B; do curl -sf http://127.0.0.1:$port/metrics > "$OUT"/.before-$port || true; done
else
    VERSION="vLLM $(python3 -c 'import vllm; print(vllm.__version__)')"
    FLAGS="\`--num-gpu-blocks-override $BLOCKS\`"
fi
python3 "$REPO"/benchmarks/jobs.py --urls http://127.0.0.1:$A/v1,http://127.0.0.1:$B/v1 \
    --work /tmp/longctx-jobs --packs "$PACKS" --pack-tokens "$TOKENS" --repetitions "$REPETITIONS" \
    --json "$OUT/jobs-$LABEL.json" --where "one $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $VERSION (two replicas on it, 8B-shaped Llama with random weights, fp8 KV, $FLAGS)"
if [ "$ENGINE" = sglang ]; then
    for port in $A $B; do curl -sf http://127.0.0.1:$port/metrics > "$OUT"/.after-$port || true; done
    python3 "$HERE"/tiers.py "$OUT"/.before-$A "$OUT"/.after-$A "$OUT"/.before-$B "$OUT"/.after-$B \
        > "$OUT/metrics-$LABEL.json"
    rm -f "$OUT"/.before-* "$OUT"/.after-*
fi
