#!/usr/bin/env bash
# A host tier on one GPU: a job over more packs than the GPU's KV cache holds, with a host tier (vLLM
# native offloading, or LMCache) or without one, longctx's job against a plain client sending the
# pairs shuffled, on the same server. One VARIANT per call (each starts its own server: 5-6 min).
# Usage: benchmarks/gpu/host-tiers.sh PARTS OUT VARIANT [HOST_GIB=40] [BLOCKS=16847] [PACKS=12] [PACK_TOKENS=48000]
#   The defaults put the job (12 x 48k = 576k tokens) above the GPU's 269,552 tokens (5 packs) and
#   below what GPU + host keep: the tiers are inclusive (every block is written to the host as it is
#   computed), so they keep about the host's 655,360 tokens at 40 GiB (13 packs), not the sum. At
#   HOST_GIB=24 (393,216 tokens, 8 packs: the H200 runs of 2026-12-02, vLLM 0.24.0) the job outgrows the tier.
#   VARIANT: native (--kv-offloading-backend native), lmcache (an `lmcache server` beside vLLM,
#   --kv-offloading-backend lmcache; needs PARTS/lm and PARTS/lmdeps from prepare-wheels.sh), none.
#   BLOCKS: --num-gpu-blocks-override (16,847 blocks of 16 = 269,552 GPU KV tokens, as measured before).
#   PARTS needs p00.., deps/, lx/ and tok/ from prepare-wheels.sh (rt/ is not used), and for lmcache
#   also lm/ and lmdeps/ (prepare-lmcache.sh).
#   BUDGET (seconds, default 570): no measured run starts that would likely end after the script's
#   start + BUDGET - 15 (a device call is cut at 600 s); what was measured is kept.
# Writes OUT/tiers-VARIANT.json (after every run), OUT/plan-VARIANT.json (`longctx plan` for the
# served shape), OUT/tiers-VARIANT-metrics.txt (the engine's offload and by-source counters at the
# end), the server's log (and LMCache's), the log lines about offloading; prints the variant's table.
# Then: python3 benchmarks/host_tiers.py --summarize OUT/tiers-*.json --write (docs/benchmarks.md).
set -eu
START=$(date +%s)
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
PARTS=$(cd "${1:?PARTS}" && pwd); OUT=${2:?OUT}; VARIANT=${3:?VARIANT: native, lmcache or none}
GIB=${4:-40}; BLOCKS=${5:-16847}; PACKS=${6:-12}; TOKENS=${7:-48000}; PORT=8780
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
"$HERE"/install.sh "$PARTS"
export PYTHONPATH=$REPO:/tmp/site:/tmp/site-lm PATH=/tmp/site/bin:/tmp/site-lm/bin:$PATH HF_HUB_OFFLINE=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0
PIDS=""
# shellcheck source=tiers-finish.sh
. "$HERE"/tiers-finish.sh
trap tiers_finish EXIT
case $VARIANT in
  native) TIER="--kv-offloading-backend native --kv-offloading-size $GIB" ;;
  lmcache)
    # LMCache and its requirements the image lacks, behind /tmp/site on the path (vLLM's own versions win).
    if [ ! -f /tmp/site-lm/.ready ]; then
      python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site-lm "$PARTS"/lm/*.whl "$PARTS"/lmdeps/*.whl
      touch /tmp/site-lm/.ready
    fi
    python3 -c "import lmcache, lmcache.c_ops" || { echo "lmcache does not import beside this torch" >&2; exit 3; }
    # vLLM 0.24.0 maps --kv-offloading-backend lmcache to LMCacheMPConnector (multi-process mode,
    # tcp://localhost:5555; vllm/config/vllm.py _post_init_kv_transfer_config) and does not pass the
    # size on: the lmcache server's L1 (GIB of CPU memory) is the host tier.
    setsid lmcache server --l1-size-gb "$GIB" --eviction-policy LRU --port 5555 > /tmp/lmcache-server.log 2>&1 < /dev/null &
    PIDS="$PIDS $!"
    sleep 20
    TIER="--kv-offloading-backend lmcache --kv-offloading-size $GIB" ;;
  none) TIER="" ;;
  *) echo "VARIANT: native, lmcache or none" >&2; exit 2 ;;
esac
PIDS="$PIDS $(SERVE_EXTRA_SITE=$([ "$VARIANT" = lmcache ] && echo /tmp/site-lm) VLLM_EXTRA_ARGS="--num-gpu-blocks-override $BLOCKS $TIER" "$HERE"/serve.sh "$PARTS" $PORT 0.85 131072 | tail -1)"
grep -i -E "offload|cpu_bytes|num_cpu|chunk|lmcache|KV cache size|Available KV" /tmp/vllm-$PORT.log | head -40 > "$OUT/tiers-$VARIANT-log-lines.txt" || true
# longctx plan for the served shape (serve.sh's config), the GPU cache the override leaves (BLOCKS x 16
# tokens x 64 KiB) and this host tier; the job must span more than the GPU holds, less than GPU + host.
KVGIB=$(python3 -c "print($BLOCKS * 16 * 65536 / (1 << 30))")
PLAN=""
if [ "$VARIANT" != none ]; then
  python3 -m longctx plan --config /tmp/llama8b-shape/config.json --kv-cache-dtype fp8 --kv-memory "$KVGIB" \
    --host-memory "$GIB" --context "$TOKENS" --json > "$OUT/plan-$VARIANT.json"
  PLAN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["host_tier"]["tokens"])' "$OUT/plan-$VARIANT.json")
  read -r GPUPACKS KEPT < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["host_tier"]["at_context"][0]
print(r["gpu_packs"], r["together"])' "$OUT/plan-$VARIANT.json")
  echo "host-tiers: GPU $((BLOCKS * 16)) tokens ($GPUPACKS packs), host $PLAN tokens (longctx plan; GPU + host keep" \
    "$KEPT packs of $TOKENS), job $PACKS packs" >&2
  [ "$PACKS" -gt "$GPUPACKS" ] && [ "$PACKS" -le "$KEPT" ] \
    || echo "host-tiers: WARNING the job's $PACKS packs do not lie between the GPU's $GPUPACKS and the $KEPT kept" >&2
fi
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
VER=$(python3 -c 'import vllm; print(vllm.__version__)')
cd "$REPO"/benchmarks
# LMCache's own counters (its HTTP server, :8080) before the runs; the trap reads them at the end.
[ "$VARIANT" = lmcache ] && { curl -sf http://127.0.0.1:8080/metrics > "$OUT/lmcache-metrics-start.txt" || true; }
python3 host_tiers.py --url http://127.0.0.1:$PORT/v1 --variant "$VARIANT" --work /tmp/longctx-tiers \
  --packs "$PACKS" --pack-tokens "$TOKENS" --bytes-per-token 65536 ${PLAN:+--plan-host-tokens $PLAN} \
  ${PLAN:+--host-gib $GIB} --json "$OUT/tiers-$VARIANT.json" --repetitions "${REPETITIONS:-2}" --stop-by $((START + ${BUDGET:-570} - 15)) \
  --where "one $GPU, vLLM $VER, 8B-shaped Llama (random weights, fp8 KV), --num-gpu-blocks-override $BLOCKS ${TIER:-(no host tier)}"
